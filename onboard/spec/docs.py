"""Render docs/spec.md from the pydantic models, so the reference never drifts.

Regenerate with ``python -m onboard.spec.docs > docs/spec.md``; a test fails when
the committed file differs.
"""

from __future__ import annotations

import types
import typing

import annotated_types
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from onboard.components.base import (
    MAX_EXPERTS,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_LAYERS,
    MAX_WIDTH,
)
from onboard.components.indexer import MAX_INDEX_TOPK
from onboard.spec.layouts import LAYOUT_PRESETS, ROLES
from onboard.spec.loader import (
    MAX_DEPTH,
    MAX_INT_DIGITS,
    MAX_NODES,
    MAX_PROBLEMS,
    MAX_SPEC_BYTES,
    VALUE_ECHO_CHARS,
)
from onboard.spec.model import MAX_ARCHITECTURE, MAX_NAME, ModelSpec
from onboard.spec.rules import GENERATED_NAMES

_INTRO = """\
# The model spec

One YAML file describes a model: its identity, dimensions, attention, MLP, MTP
heads, checkpoint tensor names, and what the launch wants (quantized variants,
speculative decoding, hardware targets). `onboard spec check SPEC` validates it
and reports every problem as `FILE:LINE:COL: field.path: message`;
`onboard spec schema` prints its JSON Schema for editors; `onboard spec from-hf
config.json -o SPEC` infers one from a Hugging Face config.

Bundled examples: `model_specs/dense-gqa.yaml`, `model_specs/deepseek-v3-style.yaml`,
`model_specs/novel-launch.yaml`.

Unknown keys are errors (with a did-you-mean). Strings that reach generated Python
(`architecture`, `model_type`, `name`) must be plain identifiers. Values are
strict: `true`/`false` only where a boolean is meant (a boolean is no number, so
`topk: true` is refused, not read as 1), numbers unquoted (an integer is taken
where a float is meant). A merge key (`<<: *anchor`) may be followed by keys that
override the merged ones; a key written twice in one mapping is refused.

This page is generated from `onboard/spec/model.py` by
`python -m onboard.spec.docs > docs/spec.md`.
"""

_RULES = """\
## Cross-field rules

Checked after the fields themselves (`onboard/spec/rules.py`), all reported at once:

- GQA: `num_heads` divisible by `num_kv_heads`; without `head_dim`, `hidden_size`
  divisible by `num_heads`; `head_dim x partial_rotary_factor` an even integer.
- MLA: the `mla` section is present; GQA-only fields (`num_kv_heads`, `head_dim`,
  sliding windows, `qk_norm`, `qkv_bias`, partial rotary, `sinks`) are absent;
  `qk_rope_head_dim` even.
- Rope: `truncate` only with yarn scaling.
- Sliding windows: `layer_types` has one entry per layer; `layer_types` and
  `sliding_window_pattern` are exclusive; sliding layers need `sliding_window`.
- KV sharing: the layer exists; its target is an earlier layer that owns its cache
  (not itself sharing) and has the same window type. With MLA the shared cache is
  the target's compressed latent and rope key: the sharing layer has no
  `kv_a_proj` / `kv_a_norm` of its own (its checkpoint tensors, if stored, are
  unused) and keeps its own queries, `kv_b_proj` and `o_proj` (vLLM absorbs each
  layer's W_UK / W_UV from that layer's `kv_b_proj`, so per-layer up-projections
  of a shared latent need no other change). Released vLLM 0.32 refuses it: the
  vLLM core change is in the PR tree (docs/pr.md) and the generated plugin
  patches the released engine at import (docs/generate.md); generated for MLA
  without rope scaling, in a pre-norm RMSNorm block, without MTP (and without an
  output gate, a residual_multiplier, linear-attention layers,
  `llama_4_scaling` or a whole-head rope model type): `spec check` refuses the
  rest at the field that makes it.
- Sparse MLA's indexer: MLA with a `q_lora_rank`; `head_dim` at least
  `qk_rope_head_dim` (and, beside a GPU target, a multiple of 128: `spec check`'s
  target check); `shared_layers` each once, in increasing order, among layers
  1..num_hidden_layers-1; not beside linear attention, NoPE layers, or (with
  shared layers) KV sharing or MTP heads.
- Linear attention: `layer_types` marks its layers (not all of them); Gated
  DeltaNet's value heads a multiple of its key heads; Kimi delta attention has
  one kind of head and one head dim, `norm.eps` 1e-5 and a float32 state
  (vLLM's KDA layer fixes both); rmsnorm, silu, `placement: pre`.
- MoE: top-k <= experts; at least one MoE layer; `dense_layers` exist; grouped top-k
  needs both `num_groups` (dividing `num_experts`) and `topk_groups` (<= groups,
  keeping at least top-k experts); shared-expert options need a shared expert.
- gpt-oss's experts: `swiglu_alpha` and `swiglu_limit` together, at 1.702 and 7.0
  (vLLM's swigluoai kernel fixes them); the clamped SwiGLU and `expert_bias` need
  the experts stacked as gpt-oss stores them (`checkpoint.fused: [experts]`,
  `checkpoint.experts_format: gpt_oss`; swigluoai reads gate and up interleaved,
  as those tensors hold them), which needs the clamped SwiGLU, and no shared
  experts, MTP heads, bias correction or expert groups (not generated); both
  stacked roles name one module there (as with `experts_format: parameters`,
  Mistral-4's). `experts_format` other than `linear` needs `experts` in
  `checkpoint.fused`.
- `attention.llama_4_scaling` (Mistral-4's position-dependent query scaling)
  needs MLA; beside a rope scaling with `original_max_position_embeddings`, the
  two agree (Mistral-4's config holds one).
- Dense layers (including a dense MTP block) need `mlp.intermediate_size`.
- MTP: `mtp.mlp: moe` needs `mlp.moe`.
- Checkpoint overrides: known role, one the model has (an override of a role the
  model lacks is refused, not ignored), exactly the placeholders the role needs, a
  dotted module path of letters, digits and `_` (no format specs such as
  `{layer:04}`, no Python keywords, no leading `_`, no attribute the reference's
  modules set, such as a linear-attention mixer's `A_log` and `dt_bias`), at
  most 200 characters, no path shared by two roles the model uses, and every
  path fitting the module tree of the generated Hugging Face reference (a role
  inside its block's module, e.g. an indexer role inside the indexer; an
  attention sink on the attention module itself).
- `keep_unquantized`: each entry a role, a module path or `re:` with a regular
  expression that compiles.
- Names: the architecture, and the classes named after its prefix
  (`<Prefix>Model`, `<Prefix>Config`, `<Prefix>Attention`, ...), may not be a name
  the generated files import, nor a Python builtin (`ValueError`, ...): RESERVED.
- Speculators: each method once; `mtp` needs an `mtp` section and a draft length
  that is a multiple of the heads (or at most their number).
"""


_LIMITS = f"""\
## Limits

Bounds on what one spec can make onboard do, so that a typo fails in
milliseconds instead of looping for hours or allocating terabytes:

- the file: a regular file of at most {MAX_SPEC_BYTES} bytes, at most
  {MAX_NODES} YAML nodes once aliases are expanded (each use of an alias counts as
  a copy), nested at most {MAX_DEPTH} deep, integers of at most {MAX_INT_DIGITS}
  digits; no alias inside its own anchor;
- numbers: the ranges in the tables above (token ids, positions and windows fit
  int32, as vLLM stores them; layers up to {MAX_LAYERS}, heads up to {MAX_HEADS},
  head dims up to {MAX_HEAD_DIM}, hidden size up to {MAX_HIDDEN}, widths up to
  {MAX_WIDTH}, experts up to {MAX_EXPERTS}, the indexer's top-k up to
  {MAX_INDEX_TOPK}: the generated model keeps that many token ids per batched
  token); no `.inf` or `.nan` anywhere;
- names: `name` and `model_type` at most {MAX_NAME} characters, `architecture` at
  most {MAX_ARCHITECTURE}: the generated module, package and class names derive
  from them, and past that an import or class line of the generated files cannot
  fit vLLM's line length 88;
- messages: at most {MAX_PROBLEMS} problems are listed, then a count of the rest;
  a value is echoed up to {VALUE_ECHO_CHARS} characters; control characters
  (terminal escapes, newlines) in keys and values are printed escaped.
"""


def _type_name(annotation) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0]) + _range(
            [m for a in args[1:] for m in getattr(a, "metadata", [a])],
            args[0] is int,
        )
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"map {_type_name(args[0])} -> {_type_name(args[1])}"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    return getattr(annotation, "__name__", str(annotation))


def _range(metadata: list, integer: bool) -> str:
    """`` (1 to 1024)`` from a field's bounds (annotated_types Gt/Ge/Lt/Le)."""
    low = high = None
    for m in metadata:
        if isinstance(m, annotated_types.Gt):
            low = m.gt + 1 if integer else f"> {m.gt}"
        elif isinstance(m, annotated_types.Ge):
            low = m.ge if integer else f">= {m.ge}"
        elif isinstance(m, annotated_types.Lt):
            high = m.lt - 1 if integer else f"< {m.lt}"
        elif isinstance(m, annotated_types.Le):
            high = m.le if integer else f"<= {m.le}"
    if low is None and high is None:
        return ""
    if high is None:
        return f" ({low} or more)" if integer else f" ({low})"
    if low is None:
        return f" (up to {high})" if integer else f" ({high})"
    return f" ({low} to {high})" if integer else f" ({low}, {high})"


def _default(field) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "**required**"
    value = field.default_factory() if field.default_factory else field.default
    if isinstance(value, BaseModel):
        return "(section defaults)"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _models(model: type[BaseModel], seen: list[type[BaseModel]]) -> None:
    if model in seen:
        return
    seen.append(model)
    for field in model.model_fields.values():
        for inner in _nested(field.annotation):
            _models(inner, seen)


def _nested(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _nested(a)]


def render_spec_docs() -> str:
    models: list[type[BaseModel]] = []
    _models(ModelSpec, models)
    parts = [_INTRO]
    for model in models:
        title = "ModelSpec (top level)" if model is ModelSpec else model.__name__
        parts.append(f"## {title}\n\n{(model.__doc__ or '').strip()}\n")
        rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            desc = (field.description or "").replace("|", "\\|")
            kind = _type_name(field.annotation) + _range(
                field.metadata, field.annotation is int
            )
            rows.append(f"| `{name}` | {kind} | {_default(field)} | {desc} |")
        parts.append("\n".join(rows) + "\n")
    parts.append(
        _RULES.replace("RESERVED", ", ".join(f"`{n}`" for n in sorted(GENERATED_NAMES)))
    )
    parts.append(_LIMITS)
    parts.append(_layouts_table())
    return "\n".join(parts)


def _layouts_table() -> str:
    names = list(LAYOUT_PRESETS)
    rows = [
        "## Checkpoint layouts",
        "",
        "Module path of each role per preset (`checkpoint.layout`); a tensor is the",
        "path plus `.weight` / `.bias` / `.e_score_correction_bias`. Override single",
        "roles with `checkpoint.tensor_names`. `router_bias` is the module holding",
        "`.e_score_correction_bias`: the router's (wherever `router` is) unless",
        "overridden, e.g. to the MoE block itself (`model.layers.{layer}.mlp`,",
        "EXAONE-MoE) or a module of its own (`model.layers.{layer}.mlp.moe_statics`,",
        "ERNIE-4.5-MoE, with `checkpoint.router_bias_2d` for its [1, num_experts]).",
        "`sinks` is the attention module, which holds the `.sinks` parameter",
        "(`attention.sinks`). With `checkpoint.experts_format: gpt_oss` both stacked",
        "roles are the one module of stacked experts, whose tensors are",
        "`.gate_up_proj`, `.down_proj` and their `_bias` (`parameters`: the first",
        "two). MTP head `i` uses layer",
        "`num_hidden_layers + i`, with a full decoder block under the same layer",
        "prefix.",
        "",
        "| role | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for role in ROLES:
        base = LAYOUT_PRESETS["llama"][role]
        cells = [f"`{base}`"] + [
            "same"
            if LAYOUT_PRESETS[n][role] == base
            else f"`{LAYOUT_PRESETS[n][role]}`"
            for n in names[1:]
        ]
        rows.append(f"| `{role}` | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(render_spec_docs(), end="")
