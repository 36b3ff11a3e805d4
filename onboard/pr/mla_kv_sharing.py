"""The vLLM core change that lets an MLA layer read an earlier MLA layer's cache.

Released vLLM refuses cross-layer KV sharing for MLA: ``MLACommonImpl`` and the
CPU MLA backend raise "KV sharing is not supported for MLA", ``MLAAttention``
takes no sharing target, and the model runner gives every MLA layer its own
cache (it recognises a sharing layer only when it is an ``Attention``). The
change wires MLA the way vLLM wires GQA sharing:

- ``MLAAttention`` takes ``kv_sharing_target_layer_name``, checks that it names
  an earlier ``MLAAttention`` with the same latent width, and then writes no
  cache: its ``update_kv_cache`` returns at once (the one place both of its
  write paths, the direct call and the ``unified_mla_kv_cache_update`` op, go
  through; the plugin's runtime patch of the released vLLM wraps the same
  method). The caller passes the target's
  ``kv_c_normed`` and ``k_pe`` of the current tokens (the prefill path reads
  them; the decode path reads the shared cache). The layer's own ``kv_b_proj``
  (its W_UK / W_UV) is untouched: each layer expands the shared latent with its
  own up-projection.
- ``GPUModelRunner.get_kv_cache_spec`` (which the CPU model runner inherits)
  treats a sharing ``MLAAttention`` as it treats a sharing ``Attention``: no
  ``KVCacheSpec`` of its own, an entry in ``shared_kv_cache_layers``, so the
  cache is allocated once per target and bound to both layers.
- The two refusals go: the attention impl never receives the target (the layer
  handles sharing), so an impl has nothing to refuse.

Each edit is an exact text replacement (``Edit`` op ``replace``) against the
pinned release; a moved anchor is an error naming the file.
"""

from __future__ import annotations

from onboard.pr.edits import Edit

MLA_ATTENTION = "vllm/model_executor/layers/attention/mla_attention.py"
CPU_MLA = "vllm/v1/attention/backends/mla/cpu_mla.py"
GPU_MODEL_RUNNER = "vllm/v1/worker/gpu_model_runner.py"

_REFUSAL = """\
        if kv_sharing_target_layer_name is not None:
            raise NotImplementedError("KV sharing is not supported for MLA")
"""

_IMPL_NOTE = """\
        # Cross-layer KV sharing is handled by MLAAttention, which never passes a
        # target here: a sharing layer writes no cache and reads its target's.
        assert kv_sharing_target_layer_name is None
"""


_SIGNATURE_OLD = """\
        prefill_backend_cls: type[MLAPrefillBackend] | None = None,
        **extra_impl_args,
    ):
        super().__init__()
        self.num_heads = num_heads
"""
_SIGNATURE_NEW = """\
        prefill_backend_cls: type[MLAPrefillBackend] | None = None,
        kv_sharing_target_layer_name: str | None = None,
        **extra_impl_args,
    ):
        super().__init__()
        self.num_heads = num_heads
        # Read the latent cache of this earlier MLA layer; write none.
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
"""

_TARGET_CHECK_OLD = """\
        if prefix in compilation_config.static_forward_context:
            raise ValueError(f"Duplicate layer name: {prefix}")
        compilation_config.static_forward_context[prefix] = self
"""
_TARGET_CHECK_NEW = """\
        if prefix in compilation_config.static_forward_context:
            raise ValueError(f"Duplicate layer name: {prefix}")
        if kv_sharing_target_layer_name is not None:
            target = compilation_config.static_forward_context.get(
                kv_sharing_target_layer_name
            )
            if not isinstance(target, MLAAttention):
                raise ValueError(
                    f"KV sharing target {kv_sharing_target_layer_name} of "
                    f"{prefix} is not an earlier MLA attention layer"
                )
            if target.head_size != self.head_size:
                raise ValueError(
                    f"KV sharing target {kv_sharing_target_layer_name} "
                    f"caches {target.head_size} values per token, "
                    f"{prefix} expects {self.head_size}"
                )
        compilation_config.static_forward_context[prefix] = self
"""

_UPDATE_OLD = """\
        k_scale: torch.Tensor,
    ) -> None:
        cache = self.hisparse_cache
"""
_UPDATE_NEW = """\
        k_scale: torch.Tensor,
    ) -> None:
        # A KV-sharing layer reads its target's cache as written.
        if self.kv_sharing_target_layer_name is not None:
            return
        cache = self.hisparse_cache
"""

_IMPL_REFUSAL_OLD = """\
        q_pad_num_heads: int | None = None,
    ) -> None:
        if kv_sharing_target_layer_name is not None:
            raise NotImplementedError("KV sharing is not supported for MLA")
"""
_IMPL_REFUSAL_NEW = """\
        q_pad_num_heads: int | None = None,
    ) -> None:
        # Cross-layer KV sharing is handled by MLAAttention, which never passes a
        # target here: a sharing layer writes no cache and reads its target's.
        assert kv_sharing_target_layer_name is None
"""

_RUNNER_SPEC_OLD = """\
            if isinstance(attn_module, Attention) and (
                kv_tgt_layer := attn_module.kv_sharing_target_layer_name
            ):
"""
_RUNNER_SPEC_NEW = """\
            if isinstance(attn_module, (Attention, MLAAttention)) and (
                kv_tgt_layer := attn_module.kv_sharing_target_layer_name
            ):
"""

_RUNNER_IMPORT_OLD = """\
from vllm.model_executor.layers.attention import Attention
"""
_RUNNER_IMPORT_NEW = """\
from vllm.model_executor.layers.attention import Attention, MLAAttention
"""


def _edit(path: str, name: str, key: str) -> Edit:
    return Edit(path, "replace", _OLD[name], key, _NEW[name])


_OLD = {
    "SIGNATURE": _SIGNATURE_OLD,
    "TARGET_CHECK": _TARGET_CHECK_OLD,
    "UPDATE": _UPDATE_OLD,
    "IMPL_REFUSAL": _IMPL_REFUSAL_OLD,
    "RUNNER_SPEC": _RUNNER_SPEC_OLD,
    "RUNNER_IMPORT": _RUNNER_IMPORT_OLD,
}
_NEW = {
    "SIGNATURE": _SIGNATURE_NEW,
    "TARGET_CHECK": _TARGET_CHECK_NEW,
    "UPDATE": _UPDATE_NEW,
    "IMPL_REFUSAL": _IMPL_REFUSAL_NEW,
    "RUNNER_SPEC": _RUNNER_SPEC_NEW,
    "RUNNER_IMPORT": _RUNNER_IMPORT_NEW,
}
# The CPU backend refuses in the same words as MLACommonImpl.
_OLD["CPU_REFUSAL"] = _REFUSAL
_NEW["CPU_REFUSAL"] = _IMPL_NOTE


def mla_kv_sharing_edits() -> list[Edit]:
    """The edits of the core change, in file order."""
    return [
        _edit(
            MLA_ATTENTION,
            "SIGNATURE",
            "self.kv_sharing_target_layer_name = kv_sharing_target_layer_name",
        ),
        _edit(
            MLA_ATTENTION,
            "TARGET_CHECK",
            "KV sharing target {kv_sharing_target_layer_name} of",
        ),
        _edit(
            MLA_ATTENTION,
            "UPDATE",
            "        if self.kv_sharing_target_layer_name is not None:\n"
            "            return\n"
            "        cache = self.hisparse_cache",
        ),
        _edit(
            MLA_ATTENTION,
            "IMPL_REFUSAL",
            "Cross-layer KV sharing is handled by MLAAttention",
        ),
        _edit(
            CPU_MLA, "CPU_REFUSAL", "Cross-layer KV sharing is handled by MLAAttention"
        ),
        _edit(
            GPU_MODEL_RUNNER,
            "RUNNER_SPEC",
            "isinstance(attn_module, (Attention, MLAAttention))",
        ),
        _edit(
            GPU_MODEL_RUNNER,
            "RUNNER_IMPORT",
            "from vllm.model_executor.layers.attention import Attention, MLAAttention",
        ),
    ]
