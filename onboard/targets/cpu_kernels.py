"""What vLLM's CPU build can run, for the checks that warn before an engine starts.

The facts and where they come from are in docs/vllm-cpu-notes.md; which
quantization schemes the cpu target runs is data in ``profiles.yaml``.
"""

from __future__ import annotations

# The CPU MLA decode kernel's only latent size (kv_lora_rank + qk_rope_head_dim):
# DeepSeek's 512 + 64. Other sizes fail deep inside ('Unsupported block size: 16').
CPU_MLA_LATENT = 576
