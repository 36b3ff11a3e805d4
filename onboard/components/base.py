"""What a component is: one primitive of an architecture, and everything about it.

A component owns, for its primitive: its spec fields (a pydantic mixin of the spec
section it extends) and the rules across them; its plan node (frozen, typed, built
once from the spec); the config.json keys it writes and reads; its checkpoint
roles and tensors (shapes and tiny initialisation, which the tiny writer,
preflight and the proof read); whether quantization may compress them; and its
code: template fragments for the vLLM model and the Hugging Face reference,
printed at the slots its host component's templates offer, from a typed context.

The stages call the hooks of the components a spec has
(:func:`onboard.components.present`). A component module is found by its
package (one ``COMPONENT`` per module of :mod:`onboard.components`): adding a
primitive is its module, its fragments and its tests.

Component modules import nothing of the stages. A hook receives what the stage
hands it (the spec, a plan layer, the config keys), named by type under
``TYPE_CHECKING`` only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict

if TYPE_CHECKING:
    from onboard.arch.config_keys import ConfigKeys
    from onboard.arch.plan import Layer
    from onboard.spec.model import ModelSpec


# A cross-field rule reports (path in the spec, message), as onboard.spec.rules.
Report = Callable[[tuple[str | int, ...], str], None]
# A target rule reports (level "warning" or "error", path in the spec, message),
# as onboard.targets.check.
TargetReport = Callable[[str, tuple[str | int, ...], str], None]


# The concept under which a component's read() finds the per-layer attention
# kinds the spec reader made of the config ("full_attention", "linear_attention",
# ...; None where the config states none), whichever keys stated them
# (layer_types, full_attention_interval, ...).
LAYER_TYPES = "attention.layer_types"


class ConfigProblem(ValueError):
    """What a component's read() finds wrong with a config.json, one message per
    argument (reported with the config's other problems, never a traceback);
    ``read``: the fields read all the same, which the reader checks further
    (against the family's code), so that every problem is reported at once."""

    def __init__(self, *messages: str, read: dict[str, Any] | None = None) -> None:
        super().__init__(*messages)
        self.read = read or {}


def is_int(value: Any) -> bool:
    """An integer of a parsed config (JSON's true and false are no integers)."""
    return isinstance(value, int) and not isinstance(value, bool)


def read_positive(get: Callable[[str, Any], Any], concept: str, default: Any) -> Any:
    """A positive number read from a config.json (the default where the config
    has none): anything else is the config's problem, located by its key."""
    value = get(concept, default)
    if value is None:
        return default
    # A boolean is no number (though true == 1).
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigProblem(f"{concept}={value!r}: must be a positive number")
    return default if value == default else value


def cpu_kernel_has(op: str) -> bool:
    """Whether the CPU kernel build vLLM loads on this machine (by its CPU's
    features: vllm/platforms/cpu.py import_kernels) has op ``op``."""
    import torch
    from vllm import _custom_ops  # noqa: F401  (loads this CPU's kernel build)

    try:
        return getattr(torch.ops._C, op) is not None
    except (AttributeError, RuntimeError):
        return False


class Section(BaseModel):
    """A spec section: unknown keys are errors (with a did-you-mean from the
    loader), never ignored; infinity and NaN mean nothing in a spec and would
    reach generated code. Values are strict: a boolean is no integer (`topk:
    true` is not 1), a number no string and 0/1 no boolean; an integer is a
    float where a float is wanted."""

    model_config = ConfigDict(
        extra="forbid", validate_default=True, allow_inf_nan=False, strict=True
    )


# Upper bounds (docs/spec.md, "Limits"): token ids, positions and windows are int32
# in vLLM; counts and widths stop at a few times the largest released model, so a
# typo cannot make a stage loop for hours or allocate terabytes.
INT32_MAX = 2**31 - 1
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024
MAX_HIDDEN = 65536
MAX_WIDTH = 1 << 20  # MLP and expert widths, latent ranks
MAX_EXPERTS = 4096

PositiveInt = Annotated[int, Field(gt=0, le=INT32_MAX)]
LayerIndex = Annotated[int, Field(ge=0, lt=MAX_LAYERS)]
LayerCount = Annotated[int, Field(gt=0, le=MAX_LAYERS)]
HeadCount = Annotated[int, Field(gt=0, le=MAX_HEADS)]
HeadDim = Annotated[int, Field(gt=0, le=MAX_HEAD_DIM)]
Width = Annotated[int, Field(gt=0, le=MAX_WIDTH)]
ExpertCount = Annotated[int, Field(gt=0, le=MAX_EXPERTS)]


def _not_a_boolean(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("a layer index, not a boolean")
    return value


# A layer index as a mapping key (attention.kv_sharing): strict but for the
# string a JSON dump makes of an integer key ("5"); never a boolean.
LayerKey = Annotated[
    int, BeforeValidator(_not_a_boolean), Strict(False), Field(ge=0, lt=MAX_LAYERS)
]


def spec_dim(spec: ModelSpec, label: str) -> Any:
    """A dimension by its label: a spec field's dotted path (its value, None
    where unset), or a product of them and numbers ("2 × hidden_size",
    "attention.indexer.num_heads × attention.indexer.head_dim")."""
    if " × " not in label:
        return _spec_value(spec, label)
    return math.prod(_spec_value(spec, field) for field in label.split(" × "))


def _spec_value(spec: ModelSpec, field: str) -> Any:
    if field.isdigit():
        return int(field)
    value: Any = spec
    for part in field.split("."):
        value = getattr(value, part)
    return value


@dataclass(frozen=True)
class Role:
    """A checkpoint module a component adds to each decoder layer."""

    path: str  # its path in every layout preset, with {layer}
    # Its place in the reference's module tree below a decoder layer: the
    # containers it sits in (("attn",): the attention module).
    slot: tuple[str, ...]
    # A Linear that quantization may compress (else it stays 16-bit).
    linear: bool = True
    # A Linear that quantization keeps in 16 bits all the same (named in the
    # quantization config's ignore list).
    kept: bool = False
    # A parameter of the module at ``path`` (the tensor is ``path.param``), not a
    # module of its own (attention sinks).
    param: str | None = None
    # Kept in 16 bits and checked byte for byte by the quant check under this
    # name (onboard.validate.check_quant); None: nothing to guard.
    guard: str | None = None
    # The boolean spec field that decides whether the role's tensor exists (the
    # fix a checkpoint mismatch suggests), and the spec fields its shape is
    # made of, dim by dim (what a shape mismatch names).
    spec_field: str | None = None
    dims: tuple[str, ...] = ()
    # The serving plan's weight group and how tensor parallelism lays it out
    # ("tp": split over the ranks, "replicated": whole on each).
    group: str = "attention"
    shard: str = "tp"

    def shape(self, spec: ModelSpec) -> tuple[int, ...]:
        """Its tensor's shape in a checkpoint of ``spec``, by :attr:`dims`."""
        return tuple(spec_dim(spec, d) for d in self.dims)


@dataclass(frozen=True)
class TensorPlan:
    """One checkpoint tensor: its name, shape and how it is initialised.

    ``init`` is ``normal`` (std ``WEIGHT_STD``), ``ones``, ``zeros`` (a norm
    that scales by 1 + weight), ``bias``, ``a_log`` (a linear-attention layer's log
    decay rates), ``conv`` (its convolution), ``router_bias``, ``sinks``, ``head``
    (scaled output head), ``head_norm`` (a norm carrying the head's scale, tied
    embeddings; with ``+1`` appended, of a 1 + weight norm) or ``copy:<name>`` (same
    values as another tensor, e.g. MTP heads sharing the output head).
    """

    name: str
    shape: tuple[int, ...]
    init: str
    layer: int | None  # decoder layer (MTP heads count on), None for global tensors


@dataclass(frozen=True)
class Delta:
    """A component a spec states its own way where a family vLLM ships states it
    another, bridged where the weights load (onboard.spec.bases): the family's
    tensor is the checkpoint's plus ``shift``, for the tensors of ``roles``
    (onboard.spec.layouts)."""

    # The converted tensors, as the generated code names them ("offset_norms").
    name: str
    # What differs, completed with the family's architecture, for docstrings:
    # "its RMSNorms scale by weight, where {family}'s scale by 1 + weight".
    description: str
    roles: tuple[str, ...]
    shift: float


class Component:
    """One primitive. Subclasses set the class attributes they need and override
    the hooks their primitive has; the defaults contribute nothing."""

    # Its name: the key of its plan node, config concepts and template contexts.
    name: ClassVar[str]
    # What it is, as a noun phrase ("attention sinks"): summaries list it.
    label: ClassVar[str] = ""
    # Where its plan node lives: a layer's attention (Attention.parts), the
    # layer itself ("layer": the residual stream, Layer.stream), a layer's token
    # mixer ("mixer": linear attention, Layer.mixer), a layer's MLP ("mlp": the
    # dense MLP, Layer.mlp), the MoE block ("moe": the router, MoEMLP.router) or
    # the model ("model": MTP heads).
    host: ClassVar[str] = "attention"
    # The spec section whose fields it adds ("attention.mla"; "": the spec's
    # top level), and those fields.
    extends: ClassVar[str | None] = None
    Fields: ClassVar[type[Section] | None] = None
    # Its plan node's type (attention.part(Node) finds the node in a layer).
    Node: ClassVar[type | None] = None
    # Checkpoint roles: role name -> Role.
    roles: ClassVar[Mapping[str, Role]] = MappingProxyType({})
    # Whether only onboard's generated reference computes the primitive for a new
    # model type: a tensor path of its roles that does not fit the reference's
    # module tree is then refused. False (the dense MLP): the vLLM model renames
    # what it loads, and generate explains the missing reference instead
    # (onboard.spec.rules.FEATURE_TREE_ROLES).
    reference_only: ClassVar[bool] = True
    # Slices of head_dim rows each query head's q_proj rows carry after the
    # query (the output gate's: 1).
    q_slices: ClassVar[int] = 0
    # Plain attributes its reference code sets on a module (no module may take
    # one of these names).
    attributes: ClassVar[tuple[str, ...]] = ()
    # config.json: concept -> every key families use for it, canonical first
    # (by default, each concept of concept_fields under its own name only);
    # and concept -> the spec fields it comes from (what a mismatch names).
    config_aliases: ClassVar[Mapping[str, tuple[str, ...]]] = MappingProxyType({})
    concept_fields: ClassVar[Mapping[str, tuple[str, ...]]] = MappingProxyType({})
    # Where config.json lists its keys: beside the model's dimensions ("dims"),
    # among the attention's keys ("attention"), beside the norms' eps ("norm"),
    # among the MoE block's ("moe"), among the model-wide keys ("model"), after
    # the attention's and rope's ("mixers") or last ("other"); by default, where
    # the section it extends is.
    config_place: ClassVar[str] = ""
    # Reference code: what the attention's softmax core takes from the module
    # beside q, k, v, the mask and the scale (the component's fragment at slot
    # ``attend`` defines that core).
    attend_inputs: ClassVar[tuple[str, ...]] = ()
    # config.json concepts whose value a checkpoint's tensor names show
    # (spec from-hf finds them from the tensors, onboard.reference.infer).
    visible: ClassVar[tuple[str, ...]] = ()
    # Where the primitive is one spec field that one config.json key states:
    # the field's path ("attention.sinks") and the key's concept. Then, unless
    # overridden, present() is the field set, config() writes its value and
    # read() takes it back; config_aliases and concept_fields follow.
    field: ClassVar[str | None] = None
    concept: ClassVar[str | None] = None
    # The slots of the host's templates its fragments fill (slot "gqa.init":
    # templates/components/<name>/vllm_init.py.j2, hf_init.py.j2), and the
    # fragment templates they make: slot -> template.
    vllm_slots: ClassVar[tuple[str, ...]] = ()
    hf_slots: ClassVar[tuple[str, ...]] = ()
    vllm_fragments: ClassVar[Mapping[str, str]] = MappingProxyType({})
    hf_fragments: ClassVar[Mapping[str, str]] = MappingProxyType({})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.concept and "config_aliases" not in cls.__dict__:
            assert cls.field is not None, cls.name
            cls.config_aliases = {cls.concept: (cls.concept,)}
            cls.concept_fields = {cls.concept: (cls.field,)}
        elif "concept_fields" in cls.__dict__ and "config_aliases" not in cls.__dict__:
            # Each concept under its own name only.
            cls.config_aliases = {c: (c,) for c in cls.concept_fields}
        if not cls.config_place:
            section = (cls.extends or "").split(".")[0]
            cls.config_place = section if section in ("attention", "norm") else "other"
        for model in ("vllm", "hf"):
            if f"{model}_slots" in cls.__dict__:
                fragments = {
                    slot: f"components/{cls.name}/{model}_{slot.rpartition('.')[2]}"
                    ".py.j2"
                    for slot in getattr(cls, f"{model}_slots")
                }
                setattr(cls, f"{model}_fragments", fragments)
        # Class tables are read by every stage: none may change them.
        tables = ("roles", "config_aliases", "concept_fields")
        for table in (*tables, "vllm_fragments", "hf_fragments"):
            own = cls.__dict__.get(table)
            if isinstance(own, dict):
                setattr(cls, table, MappingProxyType(own))

    def value(self, spec: ModelSpec) -> Any:
        """The value of :attr:`field` in ``spec`` (None where a section on its
        path is absent)."""
        assert self.field is not None, self.name
        node: Any = spec
        for part in self.field.split("."):
            node = getattr(node, part)
            if node is None:
                return None
        return node

    def _is_flag(self) -> bool:
        assert self.Fields is not None and self.field is not None
        return (
            self.Fields.model_fields[self.field.rpartition(".")[2]].annotation is bool
        )

    def present(self, spec: ModelSpec) -> bool:
        """Whether ``spec`` has this primitive (its :attr:`field` set)."""
        if self.field is None:
            return False
        value = self.value(spec)
        return value is not None and value is not False

    def rules(self, spec: ModelSpec, report: Report) -> None:
        """Report what the primitive cannot be beside the rest of ``spec``, and
        its fields that ``spec`` sets without the primitive (called for every
        component, present or not)."""

    def cpu_engine_limit(self, spec: ModelSpec) -> str | None:
        """Why vLLM's CPU engine cannot start a model with the primitive as
        ``spec`` has it, naming vLLM's file (None: it can; called where the spec
        has it)."""
        return None

    def target_rules(
        self, spec: ModelSpec, gpus: list[str], report: TargetReport
    ) -> None:
        """Report what the spec's hardware targets cannot run of the primitive
        (``gpus``: the spec's GPU targets; called where the spec has it)."""

    def plan(self, spec: ModelSpec, layer: int | None) -> Any:
        """Its plan node in decoder layer ``layer``'s attention (None: an MTP
        block), or None where the layer does not have it."""
        return None

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        """What config.json holds for it: concept -> value (written under the
        concept's canonical key)."""
        return {self.concept: self.value(spec)} if self.concept else {}

    def facts(self, spec: ModelSpec) -> dict[str, Any]:
        """Its config concepts as ``spec`` states them, present or not: what a
        family's code may fix without a key (concept -> value)."""
        return {}

    def read(self, get: Callable[[str, Any], Any]) -> dict[str, Any]:
        """Its spec fields from a config.json: field -> value (empty where the
        config says nothing of it). ``get(concept, default)`` reads a concept
        under any of its keys, and marks them read."""
        if self.concept is None:
            return {}
        assert self.field is not None
        value = get(self.concept, None)
        leaf = self.field.rpartition(".")[2]
        if self._is_flag():
            return {leaf: True} if value else {}
        return {} if value is None else {leaf: value}

    def tensors(self, spec: ModelSpec, layer: Layer) -> list[TensorPlan]:
        """Its tensors in one decoder block."""
        return []

    def shrink(self, section: dict[str, Any]) -> None:
        """Its fields in the seconds-sized copy of a spec (onboard.spec.shrink),
        in place: ``section`` is the dumped spec section it extends."""

    def remap_layers(
        self, section: dict[str, Any], position: Mapping[int, int]
    ) -> None:
        """Its per-layer fields for the layers the tiny copy keeps, in place:
        ``position`` maps each kept layer to its new index."""

    def code_context(self, node: Any, keys: ConfigKeys) -> Any:
        """What its fragments print, from its plan node: both models' unless
        one overrides its own below."""
        return node

    def vllm_context(self, node: Any, keys: ConfigKeys) -> Any:
        """What its vLLM fragments print, from its plan node."""
        return self.code_context(node, keys)

    def reference_context(self, node: Any, keys: ConfigKeys) -> Any:
        """What its reference fragments print, from its plan node."""
        return self.code_context(node, keys)

    def describe(self, node: Any) -> str | None:
        """What it does to its attention, as a phrase ("a learned sink logit per
        head in each softmax"), which the attention's docstrings print (None:
        nothing to say)."""
        return None

    def family_delta(self, data: dict[str, Any]) -> Delta | None:
        """Where some family vLLM ships states this component another way that
        loading the weights can bridge: ``data`` (the spec, dumped) is changed in
        place to the family's statement and the bridge returned; None where there
        is none (onboard.spec.bases)."""
        return None

    def checkpoint_roles(self, spec: ModelSpec) -> tuple[str, ...]:
        """The roles of its own a checkpoint of ``spec`` has (called where the
        spec has it): all of them unless its form picks some."""
        return tuple(self.roles)

    def param_dims(
        self, spec: ModelSpec, role: str, param: str
    ) -> list[tuple[str, int]] | None:
        """The dims of tensor ``param`` of its role ``role``, each with its label
        (the spec fields it is made of), where they are more than a product of
        spec fields per dim (None: :attr:`Role.dims` say them)."""
        return None

    def checkpoint_hint(
        self, spec: ModelSpec, role: str
    ) -> tuple[str, list[str]] | None:
        """What to check in ``spec`` where a checkpoint's tensors of its role
        ``role`` differ from the spec's: the fix and the spec fields it names
        (None: the role's :attr:`Role.spec_field` or nothing)."""
        return None

    def tensor_name(self, spec: ModelSpec, role: str, layer: int) -> str:
        """The checkpoint module path of one of its roles at ``layer``."""
        return spec.tensor_path(role).format(layer=layer)


class ModelWide(Component):
    """A primitive every model has, stated by top-level spec fields with one
    config.json key each (``concept_fields``) and neutral at their defaults
    (the embeddings' factors, the logits' transforms): its plan node is the
    plan's own, and its keys are written among the model-wide ones where not
    neutral, read back as a flag or a positive number."""

    host = "model"
    extends = ""
    config_place = "model"

    def present(self, spec: ModelSpec) -> bool:
        return True

    def _fields(self) -> dict[str, str]:
        """Concept -> its spec field."""
        return {concept: f for concept, (f,) in self.concept_fields.items()}

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        assert self.Fields is not None
        defaults = self.Fields.model_fields
        return {
            concept: getattr(spec, f)
            for concept, f in self._fields().items()
            if getattr(spec, f) != defaults[f].default
        }

    def read(self, get: Callable[[str, Any], Any]) -> dict[str, Any]:
        assert self.Fields is not None
        out: dict[str, Any] = {}
        for concept, f in self._fields().items():
            field = self.Fields.model_fields[f]
            if field.annotation is bool:
                value = get(concept, False)
                if not isinstance(value, bool):
                    raise ConfigProblem(f"{concept}={value!r}: must be true or false")
            else:
                value = read_positive(get, concept, field.default)
            if value != field.default:
                out[f] = value
        return out
