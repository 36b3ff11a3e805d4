"""What to quantize, decided from the spec and the checkpoint's headers alone.

Every tensor of the checkpoint is matched against the spec's tensor-name layout
(its roles, with ``{layer}`` / ``{expert}``). The weights of the decoder's linear
projections are quantized; everything else is copied unchanged: embeddings, the
output head, norms, MoE routers and their bias, the shared-expert gate, a
linear-attention layer's convolution, decay parameters (``A_log``, ``dt_bias``),
gated norm and b/a projections, MTP heads
(``model.layers.{num_hidden_layers + i}``, unless asked), whatever the spec's
``keep_unquantized`` names, and any tensor no role explains. Linear modules left
in 16 bits are listed in the config's ``ignore`` so that vLLM builds them
unquantized.

The selection also fixes the output files before any data is read: the same shard
names as the input, and in each, every output tensor's dtype, shape and offset.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from onboard.config_json import read_config_json
from onboard.errors import InputError
from onboard.fsutil import INDEX_FILE, read_weight_map
from onboard.quantize import st_io
from onboard.quantize.kernels import output_tensors
from onboard.quantize.layout import TensorLayout, detect_layout, match_role
from onboard.quantize.schemes import Scheme
from onboard.spec.layouts import (
    COMPONENT_KEPT,
    FUSED_ROLES,
    LINEAR_ROLES,
    ROLES,
    SHARING_UNUSED_LINEARS,
    STACKED_EXPERT_PARAMS,
    STACKED_EXPERT_ROLES,
)

if TYPE_CHECKING:
    from onboard.spec.model import ModelSpec

# Decoder projections that are quantized (vLLM builds them as quantizable layers).
# Linear modules that always stay in 16 bits (and go to the config's ignore list).
KEPT_LINEAR_ROLES = (
    "lm_head",
    "router",
    "shared_expert_gate",
    *COMPONENT_KEPT,
)

# Why stacked experts (checkpoint.fused: experts) are copied unchanged.
STACKED_EXPERTS_KEPT = "stacked experts (3-D), kept in 16 bits"

# Projections vLLM loads as one fused layer; NVFP4 needs one global scale for each
# such set (vLLM's qkv_proj, gate_up_proj / w13, and MLA's fused_qkv_a_proj).
FUSED_SETS = (
    ("q_proj", "k_proj", "v_proj"),
    ("gate_proj", "up_proj"),
    ("shared_gate_proj", "shared_up_proj"),
    ("expert_gate_proj", "expert_up_proj"),
    ("q_a_proj", "kv_a_proj"),
    # Qwen3.5's split projections load into vLLM's one in_proj_qkvz.
    ("linear_in_proj_qkv", "linear_in_proj_z"),
)


@dataclass
class Quantized:
    """One weight to quantize."""

    module: str
    role: str
    layer: int | None
    src: st_io.TensorInfo
    shard: str
    fused_key: tuple | None = None  # weights with equal keys share a global scale


@dataclass
class ShardSelection:
    name: str
    path: Path
    tensors: list[st_io.TensorInfo]
    outputs: list[st_io.OutTensor] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


@dataclass
class Selection:
    model_dir: Path
    scheme: Scheme
    shards: list[ShardSelection]
    quantized: dict[str, Quantized]  # by tensor name (module + ".weight")
    ignore: list[str]  # Linear modules kept in 16 bits
    kept: dict[str, str]  # tensor name -> why it is copied unchanged
    fused: dict[tuple, list[str]]  # fused key -> tensor names
    tensor_shard: dict[str, str]
    config: dict
    layout: TensorLayout
    warnings: list[str] = field(default_factory=list)

    def fused_partners(self, name: str) -> list[str]:
        q = self.quantized[name]
        if q.fused_key is None:
            return [name]
        return self.fused[q.fused_key]

    def shard(self, name: str) -> ShardSelection:
        return self._shards_by_name[name]

    def info(self, tensor: str) -> st_io.TensorInfo:
        """Where an input tensor's bytes are."""
        return self._infos[tensor]

    @cached_property
    def _shards_by_name(self) -> dict[str, ShardSelection]:
        return {s.name: s for s in self.shards}

    @cached_property
    def _infos(self) -> dict[str, st_io.TensorInfo]:
        return {t.name: t for s in self.shards for t in s.tensors}


def _marks(layout: TensorLayout) -> tuple[set[str], set[str], list[re.Pattern]]:
    """The spec's keep_unquantized entries: roles, module paths, regexes."""
    roles: set[str] = set()
    paths: set[str] = set()
    regexes: list[re.Pattern] = []
    for i, entry in enumerate(layout.keep_unquantized):
        if entry.startswith("re:"):
            try:
                regexes.append(re.compile(entry[3:]))
            except re.error as exc:
                raise InputError(
                    f"spec keep_unquantized[{i}]: bad regular expression: {exc}"
                ) from None
        elif entry in ROLES:
            roles.add(entry)
        elif "." in entry:
            paths.add(entry)
        else:
            raise InputError(
                f"spec keep_unquantized[{i}]: {entry!r} is neither a role "
                f"({', '.join(LINEAR_ROLES)}), a module path nor `re:REGEX`"
            )
    return roles, paths, regexes


def quantized_reason(model_dir: Path, config: dict) -> str | None:
    """Where the checkpoint says it is already quantized: config.json's
    quantization_config, or NVIDIA ModelOpt's hf_quant_config.json beside it
    (its releases state their quantization there only); None if nowhere."""
    if "quantization_config" in config:
        qc = config["quantization_config"]
        method = qc.get("quant_method", "?") if isinstance(qc, dict) else "?"
        return (
            f"{model_dir / 'config.json'}: quantization_config: the checkpoint is "
            f"already quantized ({method})"
        )
    if (model_dir / "hf_quant_config.json").is_file():
        return (
            f"{model_dir / 'hf_quant_config.json'}: the checkpoint is already "
            "quantized (NVIDIA ModelOpt)"
        )
    return None


def refuse_quantized(model_dir: Path, config: dict) -> None:
    """InputError where the checkpoint is already quantized (quantized_reason)."""
    reason = quantized_reason(model_dir, config)
    if reason is not None:
        raise InputError(f"{reason}; quantize the 16-bit checkpoint")


def read_checkpoint(model_dir: Path) -> tuple[list[ShardSelection], dict]:
    """Shard files (validated headers) and config.json of a checkpoint directory."""
    if not model_dir.is_dir():
        raise InputError(f"{model_dir}: not a directory")
    config_path = model_dir / "config.json"
    config = read_config_json(config_path)
    refuse_quantized(model_dir, config)
    index_path = model_dir / INDEX_FILE
    if index_path.exists():
        # Output shards are named after these: only plain names in model_dir.
        weight_map = read_weight_map(index_path)
        names = sorted(set(weight_map.values()))
    else:
        weight_map = None
        names = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not names:
        raise InputError(f"{model_dir}: no .safetensors files")
    shards = []
    for name in names:
        path = model_dir / name
        if not path.is_file():
            raise InputError(f"{index_path}: names {name}, which is missing")
        infos, _meta = st_io.read_header(path)
        shards.append(ShardSelection(name, path, infos))
    if weight_map is not None:
        have = {t.name: s.name for s in shards for t in s.tensors}
        for tensor, shard in weight_map.items():
            if have.get(tensor) != shard:
                raise InputError(
                    f"{index_path}: {tensor} is indexed in {shard} but "
                    f"{'missing' if tensor not in have else 'found in ' + have[tensor]}"
                )
    return shards, config


def _kda_layers(spec: ModelSpec | None) -> frozenset[int]:
    """The Kimi delta attention layers of ``spec`` (none without a spec)."""
    lin = spec.linear_attention if spec is not None else None
    if lin is None or lin.type != "kimi_delta":
        return frozenset()
    assert spec is not None
    kinds = spec.layer_attention_types()
    return frozenset(i for i, k in enumerate(kinds) if k == "linear_attention")


def make_selection(
    model_dir: Path,
    spec: ModelSpec | None,
    scheme: Scheme,
    *,
    include_mtp: bool = False,
) -> Selection:
    """The selection for ``spec``'s checkpoint in ``model_dir``; without a spec, for the
    layout the checkpoint's names and config.json show (see layout.py)."""
    shards, config = read_checkpoint(model_dir)
    if spec is not None:
        layout = TensorLayout.of_spec(spec)
    else:
        names = (t.name for s in shards for t in s.tensors)
        layout = detect_layout(config, names, str(model_dir / "config.json"))
    patterns = layout.role_patterns()
    mark_roles, mark_paths, mark_regexes = _marks(layout)
    n_layers = layout.num_hidden_layers
    kda_layers = _kda_layers(spec)
    quantized: dict[str, Quantized] = {}
    kept: dict[str, str] = {}
    ignore: set[str] = {layout.path("lm_head")}
    tensor_shard: dict[str, str] = {}

    for shard in shards:
        for t in shard.tensors:
            tensor_shard[t.name] = shard.name
            module, _, param = t.name.rpartition(".")
            role, match = match_role(patterns, module)
            layer = (
                int(match["layer"]) if match and "layer" in match.groupdict() else None
            )
            if layer in kda_layers and role in ("q_proj", "k_proj", "v_proj", "o_proj"):
                # Kimi Linear's attention and KDA layers share these paths.
                role = f"kda_{role}"
            linear = param == "weight" and len(t.shape) == 2
            why = None
            if role is None:
                why = "no role of the spec's layout"
            elif role in STACKED_EXPERT_ROLES:
                # Every expert of a layer in one 3-D tensor: copied unchanged
                # (the compressed-tensors format quantizes per Linear module),
                # and each expert listed in `ignore` (below).
                why = STACKED_EXPERTS_KEPT
            elif role not in LINEAR_ROLES:
                why = f"role {role}"
            elif not linear:
                why = f"{param} of {role}"
            elif layer is not None and layer >= n_layers and not include_mtp:
                why = "MTP head"
            elif role in SHARING_UNUSED_LINEARS and layer in layout.kv_sharing:
                # The layer reads an earlier layer's cache: vLLM never loads or runs
                # its own K/V (MLA: latent) projections, nor could calibration.
                why = "KV-sharing layer's unused K/V"
            elif (
                role in mark_roles
                or module in mark_paths
                or any(rx.search(module) for rx in mark_regexes)
            ):
                why = "spec keep_unquantized"
            if why is not None:
                kept[t.name] = why
                if linear and (
                    role is None or role in LINEAR_ROLES + KEPT_LINEAR_ROLES
                ):
                    if role != "embed":
                        ignore.add(module)
                if role in STACKED_EXPERT_ROLES and len(t.shape) == 3:
                    experts = stacked_expert_modules(module, role, param, t.shape[0])
                    ignore.update(experts)
                continue
            _check_quantizable(t, shard, scheme, role)
            fused_key = None
            if scheme.global_scale:
                for members in FUSED_SETS:
                    if role in members:
                        # Same layer (and expert): the key drops the role.
                        fused_key = (members, tuple(sorted(match.groupdict().items())))
            quantized[t.name] = Quantized(module, role, layer, t, shard.name, fused_key)

    if not quantized:
        raise InputError(
            f"{model_dir}: no tensor matches a linear role of the "
            f"{layout.layout!r} layout; is this the spec of this checkpoint?"
        )
    fused: dict[tuple, list[str]] = {}
    for name, q in quantized.items():
        if q.fused_key is not None:
            fused.setdefault(q.fused_key, []).append(name)
    warnings = _block_warnings(scheme, quantized, config) if scheme.block else []
    for shard in shards:
        for t in shard.tensors:
            if t.name in quantized:
                shard.outputs.extend(
                    st_io.OutTensor(n, d, s)
                    for n, d, s in output_tensors(
                        scheme, quantized[t.name].module, t.shape, t.dtype
                    )
                )
            else:
                shard.outputs.append(st_io.OutTensor(t.name, t.dtype, t.shape))
    return Selection(
        model_dir,
        scheme,
        shards,
        quantized,
        sorted(ignore),
        kept,
        fused,
        tensor_shard,
        config,
        layout,
        warnings,
    )


def stacked_expert_modules(
    module: str, role: str, param: str, experts: int
) -> list[str]:
    """The Linear names vLLM's fused MoE layer looks up in a quantization config
    for the experts of a stacked tensor: it loads ``<block>.input_linear`` into
    ``<block>.experts`` (vLLM's granitemoe.py, and onboard's generated models;
    gpt-oss's ``<block>.experts`` holds ``gate_up_proj`` and ``down_proj``
    itself) and asks for ``<block>.experts.<e>.gate_proj`` / ``up_proj`` /
    ``down_proj``; all of them ignored, it builds the layer unquantized."""
    block = module.rpartition(".")[0]
    # Granite: the role's own module; gpt-oss: one module, the parameter says.
    gate_up = (
        role == "experts_gate_up_proj"
        if param == "weight"
        else param == STACKED_EXPERT_PARAMS["experts_gate_up_proj"]
    )
    leaves = ("gate_proj", "up_proj") if gate_up else ("down_proj",)
    return [f"{block}.experts.{e}.{leaf}" for e in range(experts) for leaf in leaves]


def _block_warnings(
    scheme: Scheme, quantized: dict[str, Quantized], config: dict
) -> list[str]:
    """vLLM's fp8-block rule for fused layers: every member but the last (and both
    of an expert's gate/up) a multiple of the block's rows. The checkpoint is still
    what compressed-tensors and llm-compressor write; vLLM refuses to load it. A
    projection the checkpoint stores fused is split by vLLM the same way."""
    bh = scheme.block[0]
    bad: dict[str, int] = {}
    for q in quantized.values():
        rows = q.src.shape[0]
        for part, part_rows in _fused_parts(q.role, rows, config):
            if part_rows % bh:
                bad.setdefault(part, part_rows)
        for members in FUSED_SETS:
            if q.role in members and rows % bh:
                last = members[-1] if not q.role.startswith("expert_") else None
                if q.role != last:
                    bad.setdefault(q.role, rows)
    return [
        f"fp8-block: {role} has {rows} rows, not a multiple of {bh}: vLLM fuses "
        f"{' + '.join(next(m for m in FUSED_SETS if role in m))} into one layer "
        "and will refuse to load this checkpoint (the file itself is what "
        "compressed-tensors and llm-compressor write)"
        for role, rows in sorted(bad.items())
    ]


def _fused_parts(role: str, rows: int, config: dict) -> list[tuple[str, int]]:
    """The members of a projection stored as one tensor (checkpoint.fused) whose
    rows must be whole blocks: gate (gate_up_proj, shared_gate_up_proj), q and k
    (qkv_proj, sized from config.json's heads and head_dim)."""
    if role in ("gate_up_proj", "shared_gate_up_proj"):
        return [(FUSED_ROLES[role][0], rows // 2)]
    if role != "qkv_proj":
        return []
    heads, kv_heads = (
        config.get(k) for k in ("num_attention_heads", "num_key_value_heads")
    )
    hidden, head_dim = config.get("hidden_size"), config.get("head_dim")
    if not isinstance(heads, int) or heads < 1:
        return []
    if not isinstance(head_dim, int) and isinstance(hidden, int):
        head_dim = hidden // heads
    if not isinstance(head_dim, int):
        return []
    kv_heads = kv_heads if isinstance(kv_heads, int) else heads
    return [("q_proj", heads * head_dim), ("k_proj", kv_heads * head_dim)]


def _check_quantizable(
    t: st_io.TensorInfo, shard: ShardSelection, scheme: Scheme, role: str
) -> None:
    where = f"{shard.path}: {t.name}"
    if t.dtype not in st_io.FLOAT_INPUTS:
        raise InputError(
            f"{where}: dtype {t.dtype}; quantize a 16- or 32-bit float checkpoint"
        )
    rows, cols = t.shape
    m = scheme.input_multiple
    if cols % m:
        raise InputError(
            f"{where}: {scheme.name} quantizes input features in groups of {m}, "
            f"but {role} has {cols} (shape {list(t.shape)}); choose another scheme "
            f"or keep it in 16 bits (spec keep_unquantized: [{role}])"
        )
