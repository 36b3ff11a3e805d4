"""onboard: day-0 vLLM support for a new LLM architecture from one model spec."""

__version__ = "0.1.0"

# The one vLLM release the templates target (see onboard/vllm_compat.py).
VLLM_VERSION = "0.32.0"
