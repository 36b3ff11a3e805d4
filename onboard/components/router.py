"""The MoE router: how each token picks its experts and weighs their outputs.

A linear layer gives one logit per expert; the router scores them (``softmax``,
``sigmoid`` as DeepSeek-V3, or ``sqrtsoftplus``, ``sqrt(softplus(logit))``, as
DeepSeek-V4), takes the top-k, optionally renormalises the k
weights (``norm_topk_prob``) and scales the routed experts' sum
(``routed_scaling_factor``). Variants:

- bias correction (DeepSeek-V3's ``noaux_tc``): a per-expert bias added to the
  scores for the choice only (``e_score_correction_bias``);
- grouped top-k (DeepSeek-V3): the experts in ``n_group`` groups, the choice
  made within the ``topk_group`` best groups;
- a biased router (gpt-oss): a bias on the logits, which changes both the choice
  and the weights;
- the weight on the input (Llama-4): the routing weight scales the chosen
  expert's input instead of its output (top-1 routing).

vLLM runs all of them in ``FusedMoE`` (its ``scoring_func``, ``renormalize``,
``use_grouped_topk``, ``e_score_correction_bias``, ``routed_scaling_factor`` and
``apply_router_weight_on_input`` arguments). This module owns the router's spec
section, its rules, its config.json keys (written and read), its plan node and
its code (vLLM's routing arguments, the reference's Router class); its tensors
stay with the MoE block, whose checkpoint paths depend on the layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import Field

from onboard.components.base import (
    Component,
    ConfigProblem,
    ExpertCount,
    Report,
    Section,
    cpu_kernel_has,
)

if TYPE_CHECKING:
    from onboard.arch.config_keys import ConfigKeys
    from onboard.spec.model import ModelSpec

# topk_method: how a DeepSeek-family config names its routing (noaux_tc: the
# bias-corrected choice; group_limited_greedy: grouped top-k; greedy: plain).
TOPK_METHODS = ("noaux_tc", "greedy", "group_limited_greedy")
Scoring = Literal["softmax", "sigmoid", "sqrtsoftplus"]
SCORINGS = get_args(Scoring)
# vLLM 0.32's CPU kernel for sqrtsoftplus routing (biased_topk_cpu, in the kernel
# build vLLM loads where the CPU has AMX, vllm/_C; not in _C_AVX2 or _C_AVX512)
# takes these expert counts and top-k only ("biased_topk_cpu: unsupported
# num_experts 8", measured).
CPU_SQRTSOFTPLUS_EXPERTS = (64, 128, 256, 384)
CPU_SQRTSOFTPLUS_TOP_K = (6, 8)
# What a config without the key means (a key set to null is no default).
_DEFAULTS = {"scoring_func": "softmax", "routed_scaling_factor": 1.0}


class RouterFields(Section):
    scoring: Scoring = Field(
        "softmax",
        description="Expert scoring function: `softmax`, `sigmoid` (DeepSeek-V3) "
        "or `sqrtsoftplus`, sqrt(softplus(logit)) (DeepSeek-V4; needs "
        "bias_correction and no expert groups).",
    )
    norm_topk_prob: bool = Field(
        True, description="Renormalise the top-k weights to sum to one."
    )
    bias_correction: bool = Field(
        False,
        description="Per-expert bias added to the scores for selection only "
        "(DeepSeek-V3 `e_score_correction_bias`, `noaux_tc`).",
    )
    num_groups: ExpertCount | None = Field(
        None, description="Grouped top-k: number of expert groups (null: ungrouped)."
    )
    topk_groups: ExpertCount | None = Field(
        None, description="Grouped top-k: groups kept per token."
    )
    routed_scaling_factor: float = Field(
        1.0, gt=0, description="Multiplier on the routed experts' output."
    )
    bias: bool = Field(
        False,
        description="The router's linear layer has a bias, added to the logits "
        "before the top-k: it changes which experts are chosen and their weights "
        "(gpt-oss; unlike bias_correction, which steers the choice only).",
    )
    weight_on_input: bool = Field(
        False,
        description="Each chosen expert's routing weight scales the expert's "
        "input instead of its output: expert(weight x) rather than weight "
        "expert(x) (Llama-4; vLLM's apply_router_weight_on_input). Needs "
        "num_experts_per_tok 1 and no renormalisation.",
    )


@dataclass(frozen=True)
class Router:
    scoring: str  # softmax | sigmoid
    norm_topk_prob: bool
    bias_correction: bool
    # The correction bias stored as [1, num_experts] (checkpoint.router_bias_2d).
    bias_2d: bool
    num_groups: int | None
    topk_groups: int | None
    routed_scaling_factor: float
    bias: bool = False  # on the router's logits (gpt-oss)
    weight_on_input: bool = False  # scales the expert's input (Llama-4)

    @property
    def grouped(self) -> bool:
        return self.num_groups is not None


@dataclass(frozen=True)
class RouterKeys:
    """What the router's fragments print: its plan node, and the config keys its
    settings are read from (None: the model takes the node's value, or computes
    without: a scaling factor of 1)."""

    node: Router
    renormalize: str | None  # norm_topk_prob
    scoring: str | None  # scoring_func
    # Grouped top-k (the reference's: wherever the config it reads has groups).
    grouped: bool
    n_group: str | None
    topk_group: str | None
    scaling: str | None  # routed_scaling_factor
    # The reference's docstring of its Router.
    doc: str = ""


class _Router(Component):
    name = "router"
    label = "the MoE router"
    host = "moe"
    extends = "mlp.moe.router"
    Fields = RouterFields
    Node = Router
    # Written among the MoE block's keys (after its layer placement).
    config_place = "moe"
    # vLLM's FusedMoE arguments, in both MoE blocks; the reference's Router
    # class, before the MoE block's.
    vllm_slots = ("moe.routing",)
    hf_slots = ("moe.router_class",)
    config_aliases = {
        "norm_topk_prob": ("norm_topk_prob", "moe_renormalize"),  # Kimi Linear's
        "scoring_func": ("scoring_func",),
        "topk_method": ("topk_method",),
        "n_group": ("n_group", "num_expert_group"),
        "topk_group": ("topk_group",),
        "routed_scaling_factor": ("routed_scaling_factor",),
        "moe_router_bias": ("moe_router_bias",),  # a bias on the router's logits
        # the routing weight scales the expert's input (Llama-4)
        "moe_router_weight_on_input": ("moe_router_weight_on_input",),
    }
    concept_fields = {
        "norm_topk_prob": ("mlp.moe.router.norm_topk_prob",),
        "scoring_func": ("mlp.moe.router.scoring",),
        "topk_method": ("mlp.moe.router.bias_correction",),
        "n_group": ("mlp.moe.router.num_groups",),
        "topk_group": ("mlp.moe.router.topk_groups",),
        "routed_scaling_factor": ("mlp.moe.router.routed_scaling_factor",),
        "moe_router_bias": ("mlp.moe.router.bias",),
        "moe_router_weight_on_input": ("mlp.moe.router.weight_on_input",),
    }
    # A checkpoint's tensors show the correction bias and the logits' bias.
    visible = ("topk_method", "moe_router_bias")

    def present(self, spec: ModelSpec) -> bool:
        return spec.mlp.moe is not None

    def rules(self, spec: ModelSpec, report: Report) -> None:
        moe = spec.mlp.moe
        if moe is None:
            return
        r = moe.router
        where = ("mlp", "moe", "router")
        if r.weight_on_input:
            on_input = (*where, "weight_on_input")
            # vLLM's fused MoE scales the input once per token (its
            # apply_router_weight_on_input is for top-1 routing only).
            if moe.num_experts_per_tok != 1:
                report(
                    on_input,
                    "the routing weight scales the expert's input only with top-1 "
                    f"routing (num_experts_per_tok is {moe.num_experts_per_tok})",
                )
            if r.norm_topk_prob:
                report(
                    on_input,
                    "with one expert per token renormalising makes every weight 1: "
                    "set norm_topk_prob: false",
                )
            for field, off in (
                ("routed_scaling_factor", 1.0),
                ("bias_correction", False),
            ):
                if getattr(r, field) != off:
                    report(on_input, f"not generated beside router.{field}")
            if moe.swiglu_limit is not None:
                report(on_input, "not generated beside the clamped SwiGLU")
        if r.scoring == "sqrtsoftplus":
            # vLLM routes it with the correction bias (its CPU kernel
            # biased_topk_cpu, the GPU's FusedTopKBiasRouter) or a hash table,
            # never grouped (vllm/model_executor/layers/fused_moe/router/
            # cpu_router.py), as DeepSeek-V4 does.
            scoring = (*where, "scoring")
            if not r.bias_correction:
                report(scoring, "sqrtsoftplus routing needs bias_correction: true")
            if r.num_groups is not None:
                report(scoring, "sqrtsoftplus routing is not generated with groups")
        if (r.num_groups is None) != (r.topk_groups is None):
            report(
                (*where, "topk_groups" if r.topk_groups is None else "num_groups"),
                "grouped top-k needs both num_groups and topk_groups",
            )
        elif r.num_groups is not None and r.topk_groups is not None:
            if moe.num_experts % r.num_groups:
                report(
                    (*where, "num_groups"),
                    f"num_groups ({r.num_groups}) must divide num_experts "
                    f"({moe.num_experts})",
                )
            elif r.topk_groups > r.num_groups:
                report(
                    (*where, "topk_groups"),
                    f"topk_groups ({r.topk_groups}) exceeds num_groups "
                    f"({r.num_groups})",
                )
            elif moe.num_experts_per_tok > r.topk_groups * (
                moe.num_experts // r.num_groups
            ):
                report(
                    (*where, "topk_groups"),
                    f"top-k ({moe.num_experts_per_tok}) exceeds the experts in the "
                    f"{r.topk_groups} kept groups",
                )

    def cpu_engine_limit(self, spec: ModelSpec) -> str | None:
        moe = spec.mlp.moe
        if moe is None or moe.router.scoring != "sqrtsoftplus":
            return None
        if not cpu_kernel_has("biased_topk_cpu"):
            return (
                "the cpu engine cannot route sqrtsoftplus on this CPU: vLLM 0.32's "
                "kernel for it (biased_topk_cpu) is only in the kernel build it "
                "loads on CPUs with AMX (vllm/_C; not in _C_AVX2 or _C_AVX512)"
            )
        e, k = moe.num_experts, moe.num_experts_per_tok
        if e in CPU_SQRTSOFTPLUS_EXPERTS and k in CPU_SQRTSOFTPLUS_TOP_K:
            return None
        return (
            f"the cpu engine cannot route sqrtsoftplus over {e} experts, top-{k}: "
            "vLLM 0.32's CPU kernel (biased_topk_cpu) takes "
            f"{', '.join(map(str, CPU_SQRTSOFTPLUS_EXPERTS))} experts and top-k "
            f"{' or '.join(map(str, CPU_SQRTSOFTPLUS_TOP_K))} ('biased_topk_cpu: "
            f"unsupported num_experts {e}')"
        )

    def plan(self, spec: ModelSpec, layer: int | None) -> Router:
        moe = spec.mlp.moe
        assert moe is not None
        r = moe.router
        return Router(
            scoring=r.scoring,
            norm_topk_prob=r.norm_topk_prob,
            bias_correction=r.bias_correction,
            bias_2d=r.bias_correction and spec.checkpoint.router_bias_2d,
            num_groups=r.num_groups,
            topk_groups=r.topk_groups,
            routed_scaling_factor=r.routed_scaling_factor,
            bias=r.bias,
            weight_on_input=r.weight_on_input,
        )

    def vllm_context(self, node: Router, keys: ConfigKeys) -> RouterKeys:
        scoring = keys.find("scoring_func", node.scoring)
        if scoring in keys.unset:
            # Written for vLLM's in-tree model only: transformers' class has no
            # such key, its code hard-codes the value, and so does the generated
            # model (a checkpoint as transformers saves it does not have the key).
            scoring = None
        return self._keys(node, keys, node.grouped, scoring, check=True)

    def reference_context(self, node: Router, keys: ConfigKeys) -> RouterKeys:
        # Grouped wherever the config onboard writes has groups, one group
        # included (then the same choice as plain top-k), so the reference reads
        # what it says; transformers' config of a family it ships may leave
        # n_group unset.
        grouped = node.grouped or (
            not keys.family_code and keys.find("n_group") is not None
        )
        keyed = self._keys(node, keys, grouped, keys.find("scoring_func"), check=False)
        return replace(keyed, doc=_reference_doc(node, grouped))

    @staticmethod
    def _keys(
        node: Router, keys: ConfigKeys, grouped: bool, scoring: str | None, check: bool
    ) -> RouterKeys:
        """The keys of the node's settings, each required to hold the node's
        value where ``check`` (the vLLM model's), or only present."""

        def key(concept: str, value: Any, needed: bool = True) -> str | None:
            value = value if check else None
            return keys.need(concept, value) if needed else keys.find(concept, value)

        scaled = node.routed_scaling_factor != 1.0
        return RouterKeys(
            node=node,
            renormalize=key("norm_topk_prob", node.norm_topk_prob, needed=False),
            scoring=scoring,
            grouped=grouped,
            n_group=key("n_group", node.num_groups) if grouped else None,
            topk_group=key("topk_group", node.topk_groups) if grouped else None,
            scaling=key("routed_scaling_factor", node.routed_scaling_factor)
            if scaled
            else None,
        )

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        moe = spec.mlp.moe
        assert moe is not None
        r = moe.router
        out: dict[str, Any] = {
            "norm_topk_prob": r.norm_topk_prob,
            "scoring_func": r.scoring,
            "topk_method": "noaux_tc"
            if r.bias_correction
            else ("group_limited_greedy" if r.num_groups else "greedy"),
            # Ungrouped = one group, kept (as DeepSeek-V2-Lite's config says):
            # vLLM's DeepSeek MoE always routes grouped and reads
            # getattr(config, "n_group", 1), which gives None once transformers
            # declares the key, and its CPU router then fails `assert
            # self.topk_group is not None`.
            "n_group": r.num_groups or 1,
            "topk_group": r.topk_groups or 1,
            "routed_scaling_factor": r.routed_scaling_factor,
        }
        # Written only where set, so configs of specs without them are unchanged.
        if r.bias:
            out["moe_router_bias"] = True
        if r.weight_on_input:
            out["moe_router_weight_on_input"] = True
        return out

    def facts(self, spec: ModelSpec) -> dict[str, Any]:
        moe = spec.mlp.moe
        if moe is None:
            return {}
        r = moe.router
        return {
            "topk_method": "noaux_tc" if r.bias_correction else None,
            "scoring_func": r.scoring,
            "norm_topk_prob": r.norm_topk_prob,
            "moe_router_bias": r.bias,
            "moe_router_weight_on_input": r.weight_on_input,
        }

    def read(self, get: Callable[[str, Any], Any]) -> dict[str, Any]:
        # Every key is read (marked understood) before any is refused: a dense
        # config's router keys (class defaults) mean nothing.
        keys = {c: get(c, _DEFAULTS.get(c)) for c in self.config_aliases}
        if not get("n_routed_experts", None):
            return {}
        scoring = keys["scoring_func"]
        method = keys["topk_method"]
        groups, topk_groups = keys["n_group"], keys["topk_group"]
        if groups in (None, 1) and topk_groups in (None, 1):
            groups = topk_groups = None  # one group is plain top-k
        problems = []
        if scoring not in SCORINGS:
            problems.append(
                f"scoring_func={scoring!r}: not one of {', '.join(SCORINGS)}"
            )
        if method not in (None, *TOPK_METHODS):
            problems.append(
                f"topk_method={method!r}: not one of {', '.join(TOPK_METHODS)}"
            )
        if method == "greedy" and groups is not None:
            problems.append(
                f"topk_method=greedy with n_group={groups}: transformers ignores "
                "the groups but vLLM applies them"
            )
        if method == "group_limited_greedy" and groups is None:
            problems.append(
                "topk_method=group_limited_greedy: needs n_group and topk_group"
            )
        if keys["norm_topk_prob"] is None:
            problems.append("norm_topk_prob: required, but the config does not set it")
        fields = {
            "scoring": scoring,
            "norm_topk_prob": keys["norm_topk_prob"],
            # vLLM adds e_score_correction_bias exactly when topk_method is noaux_tc.
            "bias_correction": method == "noaux_tc",
            "num_groups": groups,
            "topk_groups": topk_groups,
            "routed_scaling_factor": keys["routed_scaling_factor"],
            "bias": bool(keys["moe_router_bias"]),
            "weight_on_input": bool(keys["moe_router_weight_on_input"]),
        }
        if problems:
            raise ConfigProblem(*problems, read=fields)
        return fields


def _reference_doc(node: Router, grouped: bool) -> str:
    doc = "Scores the experts for each token and keeps the top k.\n\n"
    doc += f"Scores are the {node.scoring} of the router logits"
    doc += " (the linear layer has a bias)." if node.bias else "."
    if node.bias_correction:
        doc += (
            " A per-expert bias (e_score_correction_bias) is added to them to choose"
            " the experts, but not to weigh them."
        )
    if grouped:
        how = "its two best experts" if node.bias_correction else "its best expert"
        doc += (
            f" Experts come in groups; a group is scored by {how}, and only the"
            " topk_groups best groups are eligible."
        )
    if node.norm_topk_prob:
        doc += " The top-k weights are renormalised to sum to one."
    if node.routed_scaling_factor != 1.0:
        doc += " The weights are multiplied by routed_scaling_factor."
    if node.weight_on_input:
        doc += " Each chosen expert's weight scales the expert's input, not its output."
    return doc


COMPONENT = _Router()
