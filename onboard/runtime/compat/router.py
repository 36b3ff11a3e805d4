"""The CPU MoE router's plain top-k path.

Without expert groups, vLLM 0.32's CPU router (``CPURouter._compute_routing``)
takes softmax scores only and ignores a score-correction bias and the routed
scaling factor (``assert self.scoring_func == "softmax"``); on GPU, vLLM routes
the same configuration with its biased top-k router. Its grouped path takes all
three: with every expert in one group it is the same routing (the one group is
always kept), so the shim sends those configurations there. DeepSeek-V4's
``sqrtsoftplus`` routing has a CPU kernel of its own (``biased_topk_cpu``),
which the shim leaves to vLLM.
"""

from __future__ import annotations

LIMITATION = (
    "vLLM 0.32's CPU MoE router routes without expert groups by plain softmax "
    "top-k only (no sigmoid scores, correction bias or routed scaling); its "
    "grouped path with one group computes the same routing"
)


def install() -> None:
    from vllm.model_executor.layers.fused_moe.router import cpu_router

    original = cpu_router.CPURouter._compute_routing
    if getattr(original, "onboard_shim", False):
        return

    def _compute_routing(self, hidden_states, router_logits, indices_type, **kw):
        plain = not self.use_grouped_topk and self.custom_routing_function is None
        # sqrtsoftplus (DeepSeek-V4) has its own CPU kernel, which takes the
        # bias and the scaling: vLLM routes it.
        if (
            plain
            and self.scoring_func != "sqrtsoftplus"
            and (
                self.scoring_func == "sigmoid"
                or self.e_score_correction_bias is not None
                or self.routed_scaling_factor != 1.0
            )
        ):
            return cpu_router._grouped_topk(
                gating_output=router_logits,
                topk=self.top_k,
                renormalize=self.renormalize,
                num_expert_group=1,
                topk_group=1,
                scoring_func=self.scoring_func,
                routed_scaling_factor=self.routed_scaling_factor,
                e_score_correction_bias=self.e_score_correction_bias,
            )
        return original(self, hidden_states, router_logits, indices_type, **kw)

    _compute_routing.onboard_shim = True
    cpu_router.CPURouter._compute_routing = _compute_routing
