"""Linear attention: the token mixer of the layers ``attention.layer_types`` marks
``linear_attention``, which keeps a recurrent state per sequence instead of a
KV cache. Two kinds: Gated DeltaNet (Qwen3-Next's, Qwen3.5's) and Kimi delta
attention (Kimi Linear's).

This module owns the ``linear_attention`` section and its rules, the config.json
keys (Qwen3-Next's ``linear_num_key_heads``... for Gated DeltaNet, Kimi Linear's
``linear_num_heads``... for KDA), the plan nodes and what vLLM allocates for
them, and the layers' checkpoint tensors. Its code is the fragments under
``templates/components/{linear_attention,gated_deltanet,kimi_delta}/``.

No component extends this section (one that did would need the registry to
compose it, as the spec's own sections are).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from onboard.components.base import (
    LAYER_TYPES,
    Component,
    ConfigProblem,
    HeadCount,
    HeadDim,
    Report,
    Role,
    Section,
    TensorPlan,
)
from onboard.errors import printable

if TYPE_CHECKING:
    from onboard.arch.config_keys import ConfigKeys
    from onboard.arch.plan import Layer
    from onboard.spec.model import ModelSpec


class LinearAttention(Section):
    """The linear-attention token mixer of the layers `attention.layer_types` marks
    `linear_attention`: a recurrent state per sequence instead of a KV cache."""

    type: Literal["gated_deltanet", "kimi_delta"] = Field(
        "gated_deltanet",
        description="`gated_deltanet`: Gated DeltaNet as Qwen3-Next has it. q, k and "
        "v pass a causal depthwise convolution with SiLU; q and k are "
        "L2-normalised; per value head and token the state S (key x value) decays "
        "by exp(g), g = -exp(A_log) * softplus(a + dt_bias), and takes the delta "
        "rule update S += k (beta (v - S^T k))^T with beta = sigmoid(b); the output "
        "S^T q / sqrt(key_head_dim) is RMS-normalised per head, multiplied by "
        "SiLU(z) and projected by out_proj. `kimi_delta`: Kimi delta attention as "
        "Kimi Linear has it: the same delta rule with one decay per key channel "
        "instead of per head, g = -exp(A_log) * softplus(f_b(f_a(x)) + dt_bias) "
        "(a low-rank forget gate, rank head_dim); q, k and v have their own "
        "convolutions (q_conv1d, k_conv1d, v_conv1d); beta = sigmoid(b_proj(x)); the "
        "output is RMS-normalised per head, multiplied by sigmoid(g_b(g_a(x))) (a "
        "low-rank output gate) and projected by o_proj. Its heads are both key and "
        "value heads (num_key_heads = num_value_heads, key_head_dim = "
        "value_head_dim).",
    )
    num_key_heads: HeadCount = Field(description="Query/key heads.")
    num_value_heads: HeadCount = Field(
        description="Value heads (a multiple of num_key_heads: each key head serves "
        "num_value_heads / num_key_heads of them); one recurrent state each."
    )
    key_head_dim: HeadDim = Field(description="Per-head query/key dims.")
    value_head_dim: HeadDim = Field(description="Per-head value dims.")
    conv_kernel_size: Annotated[int, Field(ge=2, le=64)] = Field(
        4, description="Width of the short causal convolution over q, k and v."
    )
    projections: Literal["grouped", "split"] = Field(
        "grouped",
        description="(gated_deltanet) How the checkpoint stores the input "
        "projections: `grouped` "
        "(Qwen3-Next) as in_proj_qkvz and in_proj_ba, rows interleaved per key "
        "head (q, k, then that head's v and z; its b, then its a); `split` "
        "(Qwen3.5) as in_proj_qkv (all q, all k, all v), in_proj_z, in_proj_b and "
        "in_proj_a.",
    )
    state_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Dtype of the recurrent state in the serving engine's cache "
        "(vLLM `mamba_ssm_cache_dtype`); the convolution state has the model's "
        "dtype.",
    )


class LinearAttentionFields(Section):
    linear_attention: LinearAttention | None = Field(
        None,
        description="The token mixer of `linear_attention` layers; required when "
        "attention.layer_types has one.",
    )


# ---- plan nodes ----------------------------------------------------------------


@dataclass(frozen=True)
class LinearStateShapes:
    """The recurrent state one sequence keeps in one linear-attention layer, in
    vLLM's layout: the convolution's last inputs and the per-head state."""

    conv: tuple[int, int]  # (channels, kernel - 1 + speculative tokens)
    recurrent: tuple[int, ...]

    def bytes(self, conv_dtype_bytes: int, state_dtype_bytes: int) -> int:
        conv = self.conv[0] * self.conv[1] * conv_dtype_bytes
        recurrent = 1
        for n in self.recurrent:
            recurrent *= n
        return conv + recurrent * state_dtype_bytes


class _Recurrent:
    """What a linear-attention mixer shares: a recurrent state per sequence
    instead of a KV cache, and none of softmax attention's per-layer features."""

    linear = True
    window = None
    kv_source = None
    rope = False
    conv_dim: int  # channels of the short convolution(s)
    conv_kernel_size: int

    @property
    def sliding(self) -> bool:
        return False

    def recurrent_shape(self, tp: int) -> tuple[int, ...]:
        """One sequence's recurrent state on one tensor-parallel rank."""
        raise NotImplementedError

    def state_shapes(self, tp: int = 1, num_speculative: int = 0) -> LinearStateShapes:
        """Per sequence and tensor-parallel rank, as vLLM allocates it
        (MambaStateShapeCalculator): speculative decoding widens the
        convolution state by the draft tokens."""
        return LinearStateShapes(
            conv=(self.conv_dim // tp, self.conv_kernel_size - 1 + num_speculative),
            recurrent=self.recurrent_shape(tp),
        )


@dataclass(frozen=True)
class GatedDeltaNet(_Recurrent):
    """Gated DeltaNet (Qwen3-Next's linear attention): a short causal convolution
    over q, k and v, then the gated delta rule over one recurrent state per value
    head. It caches no K/V: each sequence keeps the convolution's last inputs and
    the states, whatever its length."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel_size: int
    projections: Literal["grouped", "split"]  # checkpoint layout of the projections
    state_dtype: Literal["float32", "bfloat16"]

    kind = "gated_deltanet"

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: q, k and v."""
        return 2 * self.key_dim + self.value_dim

    def recurrent_shape(self, tp: int) -> tuple[int, ...]:
        # gated_delta_net_state_shape: [value heads, value dim, key dim].
        return (self.num_value_heads // tp, self.value_head_dim, self.key_head_dim)


@dataclass(frozen=True)
class KimiDeltaAttention(_Recurrent):
    """Kimi delta attention (Kimi Linear's linear attention): Gated DeltaNet's
    delta rule with one decay per key channel instead of per head, from a low-rank
    forget gate; q, k and v have a short causal convolution each, and the output
    passes a gated norm with a low-rank sigmoid gate. One recurrent state per head,
    no K/V cache."""

    num_heads: int
    head_dim: int
    conv_kernel_size: int
    state_dtype: Literal["float32", "bfloat16"]

    kind = "kimi_delta"

    @property
    def projection_dim(self) -> int:
        """Rows of each of the q, k and v projections (and their convolutions)."""
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the three convolutions together: q, k and v."""
        return 3 * self.projection_dim

    def recurrent_shape(self, tp: int) -> tuple[int, ...]:
        # kda_state_shape: one convolution state for q, k and v together, and a
        # [head_dim, head_dim] state per head.
        return (self.num_heads // tp, self.head_dim, self.head_dim)


# The linear-attention token mixers.
LinearMixer = GatedDeltaNet | KimiDeltaAttention


@dataclass(frozen=True)
class LinearAttentionCode:
    """What both models' code prints of the linear-attention layers: the kind,
    and the config.json attributes that hold its sizes (a Kimi delta attention
    head is a key and a value head, of one head dim)."""

    kda: bool  # Kimi delta attention, else Gated DeltaNet
    # Gated DeltaNet's projections interleaved per key head (Qwen3-Next), not
    # split (Qwen3.5).
    grouped: bool
    num_key_heads: str
    num_value_heads: str
    key_head_dim: str
    value_head_dim: str
    conv_kernel_size: str
    layer_types: str  # the per-layer kinds

    def layer_rule(self, index: str) -> str:
        """Whether layer ``index`` (of ``config``) is a linear-attention layer."""
        return f'config.{self.layer_types}[{index}] == "linear_attention"'


# ---- checkpoint roles ------------------------------------------------------------

_LAYER = "model.layers.{layer}"


def _role(path: str, slot: tuple[str, ...] = ("linear",), **kw: Any) -> Role:
    # vLLM's GDN and KDA layers split their projections, convolutions and
    # per-head parameters over the tensor-parallel ranks (shard "tp").
    kw.setdefault("group", "linear attention")
    return Role(f"{_LAYER}.{path}", slot, **kw)


# Which of the layers' Linear modules quantization may compress (linear=True,
# kept=False) and which it keeps in 16 bits (kept=True): Gated DeltaNet's b/a
# projections give each value head's decay and update rate (two numbers per
# head and token, the most sensitive inputs of the recurrence), and vLLM's layer
# notes that blockwise FP8 does not fit their few rows. Kimi delta attention's
# forget gate (f_a, f_b: the per-channel decay), beta projection and output gate
# (g_a, g_b) are the same kind of few-row, per-token rates; its q, k and v
# projections stay with them because vLLM's KDA layer runs q, k, v, beta and f_a
# as one merged Linear (in_proj_qkvgfab), which takes one quantization scheme for
# all its parts. The quant check guards every kept tensor byte for byte.
_GDN_RATES = {"kept": True, "guard": "linear attention"}
_GDN_STATE = {"linear": False, "guard": "linear attention"}
_KDA_KEPT = {"kept": True, "guard": "kimi delta attention"}
_KDA_STATE = {"linear": False, "guard": "kimi delta attention"}
_NORM = {"linear": False, "guard": "norms", "shard": "replicated", "group": "norms"}

# Gated DeltaNet (Qwen3-Next's names): the mixer module itself holds A_log and
# dt_bias; its projections are grouped (Qwen3-Next) or split (Qwen3.5).
GDN_ROLES = {
    "linear_attn": _role("linear_attn", (), **_GDN_STATE),
    "linear_conv1d": _role("linear_attn.conv1d", **_GDN_STATE),
    "linear_norm": Role(f"{_LAYER}.linear_attn.norm", ("linear",), **_NORM),
    "linear_out_proj": _role("linear_attn.out_proj"),
}
GDN_PROJECTIONS = {
    "grouped": {
        "linear_in_proj_qkvz": _role("linear_attn.in_proj_qkvz"),
        "linear_in_proj_ba": _role("linear_attn.in_proj_ba", **_GDN_RATES),
    },
    "split": {
        "linear_in_proj_qkv": _role("linear_attn.in_proj_qkv"),
        "linear_in_proj_z": _role("linear_attn.in_proj_z"),
        "linear_in_proj_b": _role("linear_attn.in_proj_b", **_GDN_RATES),
        "linear_in_proj_a": _role("linear_attn.in_proj_a", **_GDN_RATES),
    },
}
# Kimi delta attention (Kimi Linear's names): the mixer sits at self_attn and
# holds A_log and dt_bias; q, k and v have a convolution each; the forget gate
# (f_a, f_b) and the output gate (g_a, g_b) are low rank, their first halves
# replicated on every rank.
_KDA_REPLICATED = {
    **_KDA_KEPT,
    "group": "linear attention, replicated (KDA f_a/g_a)",
    "shard": "replicated",
}
KDA_ROLES = {
    "kda_attn": _role("self_attn", (), **_KDA_STATE),
    "kda_q_proj": _role("self_attn.q_proj", **_KDA_KEPT),
    "kda_k_proj": _role("self_attn.k_proj", **_KDA_KEPT),
    "kda_v_proj": _role("self_attn.v_proj", **_KDA_KEPT),
    "kda_q_conv1d": _role("self_attn.q_conv1d", **_KDA_STATE),
    "kda_k_conv1d": _role("self_attn.k_conv1d", **_KDA_STATE),
    "kda_v_conv1d": _role("self_attn.v_conv1d", **_KDA_STATE),
    "kda_f_a_proj": _role("self_attn.f_a_proj", **_KDA_REPLICATED),
    "kda_f_b_proj": _role("self_attn.f_b_proj", **_KDA_KEPT),
    "kda_b_proj": _role("self_attn.b_proj", **_KDA_KEPT),
    "kda_g_a_proj": _role("self_attn.g_a_proj", **_KDA_REPLICATED),
    "kda_g_b_proj": _role("self_attn.g_b_proj", **_KDA_KEPT),
    "kda_o_norm": Role(f"{_LAYER}.self_attn.o_norm", ("linear",), **_NORM),
    "kda_o_proj": _role("self_attn.o_proj"),
}
# The parameters of the mixer module itself (no ``.weight``).
MIXER_PARAMS = ("A_log", "dt_bias")
# The mixer module's role of each kind.
MIXER_ROLE = {"gated_deltanet": "linear_attn", "kimi_delta": "kda_attn"}


def roles_of(kind: str, projections: str) -> tuple[str, ...]:
    """The roles of a linear-attention layer of type ``kind`` (its projection
    layout, for Gated DeltaNet)."""
    if kind == "kimi_delta":
        return tuple(KDA_ROLES)
    return (*GDN_ROLES, *GDN_PROJECTIONS[projections])


# ---- config.json -------------------------------------------------------------------

# Gated DeltaNet's concepts (Qwen3-Next's keys) and the section fields they fill.
GDN_CONCEPTS = {
    "linear_num_key_heads": "num_key_heads",
    "linear_num_value_heads": "num_value_heads",
    "linear_key_head_dim": "key_head_dim",
    "linear_value_head_dim": "value_head_dim",
    "linear_conv_kernel_dim": "conv_kernel_size",
}
# vLLM's Kimi delta attention layer builds its output norm (FusedRMSNormGated)
# with that class's default eps, not the config's rms_norm_eps.
KDA_OUTPUT_NORM_EPS = 1e-5
_SECTION = "linear_attention"
_Path = tuple[str | int, ...]


class _LinearAttention(Component):
    name = "linear_attention"
    label = "linear attention"
    host = "mixer"
    extends = ""
    Fields = LinearAttentionFields
    config_place = "mixers"
    config_aliases = {
        **{concept: (concept,) for concept in GDN_CONCEPTS},
        "linear_projections": ("linear_projections",),  # grouped | split
        # gated_deltanet | kimi_delta (a family's code fixes it: Kimi Linear's)
        "linear_attention_type": ("linear_attention_type",),
        # Kimi delta attention (Kimi Linear's names): one kind of head
        "linear_num_heads": ("linear_num_heads",),
        "linear_head_dim": ("linear_head_dim",),
        "mamba_ssm_dtype": ("mamba_ssm_dtype",),  # the recurrent state's dtype
    }
    concept_fields = {
        **{c: (f"{_SECTION}.{f}",) for c, f in GDN_CONCEPTS.items()},
        "linear_projections": (f"{_SECTION}.projections",),
        "mamba_ssm_dtype": (f"{_SECTION}.state_dtype",),
        "linear_attention_type": (f"{_SECTION}.type",),
        "linear_num_heads": (
            f"{_SECTION}.num_key_heads",
            f"{_SECTION}.num_value_heads",
        ),
        "linear_head_dim": (f"{_SECTION}.key_head_dim", f"{_SECTION}.value_head_dim"),
    }
    roles = {**GDN_ROLES, **GDN_PROJECTIONS["grouped"], **GDN_PROJECTIONS["split"]}
    roles.update(KDA_ROLES)

    def present(self, spec: ModelSpec) -> bool:
        return spec.linear_attention is not None

    def checkpoint_roles(self, spec: ModelSpec) -> tuple[str, ...]:
        lin = spec.linear_attention
        assert lin is not None
        return roles_of(lin.type, lin.projections)

    # -- config.json

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        lin = spec.linear_attention
        assert lin is not None
        if lin.type == "kimi_delta":
            return {
                "linear_attention_type": lin.type,
                "linear_num_heads": lin.num_key_heads,
                "linear_head_dim": lin.key_head_dim,
                "linear_conv_kernel_dim": lin.conv_kernel_size,
                "mamba_ssm_dtype": lin.state_dtype,
            }
        out = {c: getattr(lin, f) for c, f in GDN_CONCEPTS.items()}
        if lin.projections != "grouped":
            out["linear_projections"] = lin.projections
        out["mamba_ssm_dtype"] = lin.state_dtype
        return out

    def read(self, get: Callable[[str, Any], Any]) -> dict[str, Any]:
        # Every key is read (understood) with or without linear layers; a
        # family's class defaults for them mean nothing without one.
        kind = get("linear_attention_type", "gated_deltanet")
        kinds = get(LAYER_TYPES, None)
        if kind == "kimi_delta":
            section, problems = _read_kimi_delta(get)
        else:
            section, problems = _read_gated_deltanet(get)
            if kind != "gated_deltanet":
                problems.insert(
                    0,
                    "linear_attention_type: gated_deltanet or kimi_delta, got "
                    + printable(repr(kind), 120),
                )
        if not kinds or "linear_attention" not in kinds:
            return {}
        read = {_SECTION: section}
        if problems:
            raise ConfigProblem(*problems, read=read)
        return read

    # -- rules

    def rules(self, spec: ModelSpec, report: Report) -> None:
        lin, att = spec.linear_attention, spec.attention
        types = att.layer_types or []
        linear = [i for i, kind in enumerate(types) if kind == "linear_attention"]
        where: _Path = (_SECTION,)
        if lin is None:
            if linear:
                report(
                    ("attention", "layer_types"),
                    f"layers {linear} are linear_attention but the spec has no "
                    "linear_attention section",
                )
            return
        if not linear:
            report(
                where,
                "no layer is linear_attention: mark them in attention.layer_types "
                "(or drop the section)",
            )
            return
        if len(linear) == len(types):
            report(
                ("attention", "layer_types"),
                "every layer is linear_attention; a model of linear-attention layers "
                "only is not generated (keep at least one attention layer)",
            )
        if lin.type == "kimi_delta":
            _kimi_delta_rules(spec, report)
        elif lin.num_value_heads % lin.num_key_heads:
            report(
                where + ("num_value_heads",),
                f"num_value_heads ({lin.num_value_heads}) must be a multiple of "
                f"num_key_heads ({lin.num_key_heads})",
            )
        if att.type == "mla" and lin.type == "gated_deltanet":
            report(where, "Gated DeltaNet layers beside MLA layers are not generated")
        # vLLM's GDN layer reads these from the model's settings (rms_norm_eps for
        # its gated norm, hidden_act for its convolution, whose CPU kernel applies
        # SiLU or nothing); transformers' Qwen3-Next reads the same keys.
        if spec.norm.type != "rmsnorm":
            report(("norm", "type"), "linear-attention layers need rmsnorm")
        if spec.activation != "silu":
            report(
                ("activation",),
                "linear-attention layers need silu: their convolution uses the "
                "model's activation, and vLLM's CPU kernel applies SiLU or none",
            )
        if spec.norm.placement != "pre":
            report(("norm", "placement"), "linear-attention layers need placement pre")
        for i in spec.rope.nope_layers:
            if i in linear:
                report(
                    ("rope", "nope_layers"),
                    f"layer {i} is linear_attention, which has no rope to leave out",
                )

    # -- plan and tensors

    def plan(self, spec: ModelSpec, layer: int | None) -> LinearMixer | None:
        """The one mixer every linear-attention layer has (``layer`` aside)."""
        lin = spec.linear_attention
        if lin is None:
            return None
        if lin.type == "kimi_delta":
            return KimiDeltaAttention(
                num_heads=lin.num_key_heads,
                head_dim=lin.key_head_dim,
                conv_kernel_size=lin.conv_kernel_size,
                state_dtype=lin.state_dtype,
            )
        return GatedDeltaNet(
            num_key_heads=lin.num_key_heads,
            num_value_heads=lin.num_value_heads,
            key_head_dim=lin.key_head_dim,
            value_head_dim=lin.value_head_dim,
            conv_kernel_size=lin.conv_kernel_size,
            projections=lin.projections,
            state_dtype=lin.state_dtype,
        )

    def tensors(self, spec: ModelSpec, layer: Layer) -> list[TensorPlan]:
        mixer = layer.mixer
        if not isinstance(mixer, GatedDeltaNet | KimiDeltaAttention):
            return []
        table = _dims(mixer, spec.hidden_size)
        return [
            TensorPlan(
                f"{self.tensor_name(spec, role, layer.index)}.{param}",
                tuple(n for _, n in _param_dims(table, role, param)),
                init,
                layer.index,
            )
            for role, param, init in _tensors_of(mixer)
        ]

    # -- code

    def code_context(self, node: LinearMixer, keys: ConfigKeys) -> LinearAttentionCode:
        if isinstance(node, KimiDeltaAttention):
            heads = keys.need("linear_num_heads", node.num_heads)
            dim = keys.need("linear_head_dim", node.head_dim)
            sizes = (heads, heads, dim, dim)
        else:
            sizes = (
                keys.need("linear_num_key_heads", node.num_key_heads),
                keys.need("linear_num_value_heads", node.num_value_heads),
                keys.need("linear_key_head_dim", node.key_head_dim),
                keys.need("linear_value_head_dim", node.value_head_dim),
            )
        return LinearAttentionCode(
            isinstance(node, KimiDeltaAttention),
            isinstance(node, GatedDeltaNet) and node.projections == "grouped",
            *sizes,
            conv_kernel_size=keys.need("linear_conv_kernel_dim", node.conv_kernel_size),
            layer_types=keys.need("layer_types"),
        )

    # -- preflight

    def checkpoint_hint(
        self, spec: ModelSpec, role: str
    ) -> tuple[str, list[str]] | None:
        lin = spec.linear_attention
        if role in GDN_PROJECTIONS["grouped"] or role in GDN_PROJECTIONS["split"]:
            return (
                "check linear_attention.projections (the spec says "
                f"{lin.projections if lin else 'none'}; grouped: in_proj_qkvz and "
                "in_proj_ba, split: in_proj_qkv, in_proj_z, in_proj_b and in_proj_a)",
                [f"{_SECTION}.projections"],
            )
        if role in GDN_ROLES:
            return (
                "the checkpoint's linear-attention layers differ from the spec's: "
                "check attention.layer_types (and the linear_attention section)",
                ["attention.layer_types"],
            )
        return None

    def param_dims(
        self, spec: ModelSpec, role: str, param: str
    ) -> list[tuple[str, int]] | None:
        mixer = self.plan(spec, None)
        if mixer is None:
            return None
        return _param_dims(_dims(mixer, spec.hidden_size), role, param)


_Dim = tuple[str, int]
_LA = f"{_SECTION}."


def _dims(mixer: LinearMixer, hidden_size: int) -> dict[str, tuple[_Dim, ...]]:
    """Each role's dims, labelled by the spec fields they are made of: the one
    statement of the layer's shapes, which the tensors and the preflight read."""
    h = ("hidden_size", hidden_size)
    if isinstance(mixer, KimiDeltaAttention):
        return _kimi_delta_dims(mixer, h)
    return _gated_deltanet_dims(mixer, h)


def _param_dims(
    table: dict[str, tuple[_Dim, ...]], role: str, param: str
) -> list[_Dim] | None:
    """The dims of tensor ``param`` of ``role`` (None: not a role of the table)."""
    dims = table.get(role)
    if dims is None:
        return None
    one = ("1", 1)
    if role == "kda_attn":
        # Kimi Linear's A_log [1, 1, heads, 1], dt_bias one value per channel.
        return [one, one, dims[0], one] if param == "A_log" else [dims[1]]
    if param in ("bias", *MIXER_PARAMS):
        # A linear's bias has its output size, a norm's its size; Gated
        # DeltaNet's A_log and dt_bias one value per value head.
        return [dims[0]]
    return list(dims)


# A layer's tensors in checkpoint order: (role, parameter, tiny initialisation).
# The mixer module holds A_log and dt_bias itself.
_MIXER_TENSORS = {
    "gated_deltanet": [
        ("linear_conv1d", "weight", "conv"),
        ("linear_attn", "A_log", "a_log"),
        ("linear_attn", "dt_bias", "ones"),
        ("linear_norm", "weight", "ones"),
        ("linear_out_proj", "weight", "normal"),
    ],
    "kimi_delta": [
        *((f"kda_{p}_proj", "weight", "normal") for p in "qkv"),
        *((f"kda_{p}_conv1d", "weight", "conv") for p in "qkv"),
        ("kda_attn", "A_log", "a_log"),
        ("kda_attn", "dt_bias", "ones"),
        # the forget gate, beta, the output gate
        *(
            (f"kda_{r}_proj", "weight", "normal")
            for r in ("f_a", "f_b", "b", "g_a", "g_b")
        ),
        ("kda_o_norm", "weight", "ones"),
        ("kda_o_proj", "weight", "normal"),
    ],
}


def _tensors_of(mixer: LinearMixer) -> list[tuple[str, str, str]]:
    """The layer's tensors: Gated DeltaNet's input projections as stored, first."""
    if isinstance(mixer, KimiDeltaAttention):
        return _MIXER_TENSORS["kimi_delta"]
    projections = [(r, "weight", "normal") for r in GDN_PROJECTIONS[mixer.projections]]
    return projections + _MIXER_TENSORS["gated_deltanet"]


def _kimi_delta_dims(m: KimiDeltaAttention, h: _Dim) -> dict[str, tuple[_Dim, ...]]:
    heads = (f"{_LA}num_key_heads", m.num_heads)
    dim = (f"{_LA}num_key_heads × {_LA}key_head_dim", m.projection_dim)
    rank = (f"{_LA}key_head_dim", m.head_dim)
    conv = (dim, ("1", 1), (f"{_LA}conv_kernel_size", m.conv_kernel_size))
    return {
        "kda_q_proj": (dim, h),
        "kda_k_proj": (dim, h),
        "kda_v_proj": (dim, h),
        "kda_q_conv1d": conv,
        "kda_k_conv1d": conv,
        "kda_v_conv1d": conv,
        "kda_f_a_proj": (rank, h),
        "kda_f_b_proj": (dim, rank),
        "kda_b_proj": (heads, h),
        "kda_g_a_proj": (rank, h),
        "kda_g_b_proj": (dim, rank),
        "kda_o_norm": (rank,),
        "kda_o_proj": (h, dim),
        # A_log: one value per head; dt_bias: one per key channel.
        "kda_attn": (heads, dim),
    }


def _gated_deltanet_dims(m: GatedDeltaNet, h: _Dim) -> dict[str, tuple[_Dim, ...]]:
    vh = (f"{_LA}num_value_heads", m.num_value_heads)
    key_dim = f"{_LA}num_key_heads × {_LA}key_head_dim"
    value_dim = (f"{_LA}num_value_heads × {_LA}value_head_dim", m.value_dim)
    conv = (f"2 × {key_dim} + {value_dim[0]}", m.conv_dim)
    qkvz = (f"2 × ({key_dim} + {value_dim[0]})", 2 * (m.key_dim + m.value_dim))
    return {
        "linear_in_proj_qkvz": (qkvz, h),
        "linear_in_proj_ba": ((f"2 × {vh[0]}", 2 * m.num_value_heads), h),
        "linear_in_proj_qkv": (conv, h),
        "linear_in_proj_z": (value_dim, h),
        "linear_in_proj_b": (vh, h),
        "linear_in_proj_a": (vh, h),
        "linear_conv1d": (
            conv,
            ("1", 1),
            (f"{_LA}conv_kernel_size", m.conv_kernel_size),
        ),
        "linear_attn": (vh,),  # A_log and dt_bias: one value per value head
        "linear_norm": ((f"{_LA}value_head_dim", m.value_head_dim),),
        "linear_out_proj": (h, value_dim),
    }


def _read_gated_deltanet(
    get: Callable[[str, Any], Any],
) -> tuple[dict[str, Any], list[str]]:
    """Gated DeltaNet's section from Qwen3-Next's keys, and what is missing."""
    values = {field: get(concept, None) for concept, field in GDN_CONCEPTS.items()}
    problems = [
        f"{concept}: required, as some layers are linear_attention"
        for concept, field in GDN_CONCEPTS.items()
        if values[field] is None and field != "conv_kernel_size"
    ]
    if values["conv_kernel_size"] is None:
        values.pop("conv_kernel_size")
    section = {
        "type": "gated_deltanet",
        **values,
        "projections": get("linear_projections", "grouped"),
        "state_dtype": get("mamba_ssm_dtype", "float32"),
    }
    return section, problems


def _read_kimi_delta(
    get: Callable[[str, Any], Any],
) -> tuple[dict[str, Any], list[str]]:
    """Kimi delta attention's section: its heads are key and value heads."""
    heads, dim = get("linear_num_heads", None), get("linear_head_dim", None)
    conv = get("linear_conv_kernel_dim", None)
    problems = [
        f"{concept}: required, as some layers are linear_attention"
        for concept, value in (("linear_num_heads", heads), ("linear_head_dim", dim))
        if value is None
    ]
    section = {
        "type": "kimi_delta",
        "num_key_heads": heads,
        "num_value_heads": heads,
        "key_head_dim": dim,
        "value_head_dim": dim,
        "state_dtype": get("mamba_ssm_dtype", "float32"),
    }
    if conv is not None:
        section["conv_kernel_size"] = conv
    return section, problems


def _kimi_delta_rules(spec: ModelSpec, report: Report) -> None:
    """Kimi delta attention's heads are key and value heads at once."""
    lin = spec.linear_attention
    assert lin is not None
    where: _Path = (_SECTION,)
    if lin.num_value_heads != lin.num_key_heads:
        report(
            where + ("num_value_heads",),
            f"kimi_delta has one kind of head: num_value_heads ({lin.num_value_heads})"
            f" must equal num_key_heads ({lin.num_key_heads})",
        )
    if lin.value_head_dim != lin.key_head_dim:
        report(
            where + ("value_head_dim",),
            f"kimi_delta has one head dim: value_head_dim ({lin.value_head_dim}) must "
            f"equal key_head_dim ({lin.key_head_dim})",
        )
    if spec.norm.eps != KDA_OUTPUT_NORM_EPS:
        report(
            ("norm", "eps"),
            f"vLLM's Kimi delta attention layer normalises its output with eps "
            f"{KDA_OUTPUT_NORM_EPS} whatever rms_norm_eps says; kimi_delta needs "
            f"norm.eps {KDA_OUTPUT_NORM_EPS:g}",
        )
    if lin.state_dtype != "float32":
        report(
            where + ("state_dtype",),
            "vLLM's Kimi delta attention layer keeps its recurrent state in "
            "float32; kimi_delta needs state_dtype float32",
        )
    if lin.projections != "grouped":
        report(
            where + ("projections",),
            "projections applies to gated_deltanet; kimi_delta stores q, k and v apart",
        )


COMPONENT = _LinearAttention()
