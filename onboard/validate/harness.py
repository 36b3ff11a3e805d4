"""`onboard validate`: run the checks against one engine and write the results.

One :class:`RunContext` per run holds the spec, the prompts, the engine (started
once, shared by every check) and the reference. Checks are functions
``(ctx, name) -> Check`` registered in :data:`CHECKS` by name or by prefix
(``quant:<scheme>``, ``spec-decode:<method>``), so later checks plug in beside
``accuracy`` and reuse the same engine and reference outputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import json
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onboard.config_json import read_config_json
from onboard.errors import InputError
from onboard.fsutil import INDEX_FILE, atomic_write_text, read_weight_map
from onboard.runtime.compare import GreedyOutput, judge_accuracy
from onboard.runtime.engine import (
    Engine,
    EngineDied,
    EngineLoadError,
    EngineOptions,
    Plugin,
    engine_state_options,
    read_plugin,
)
from onboard.runtime.prompts import PROMPTS
from onboard.runtime.reference import (
    Reference,
    ReferenceUnavailable,
    load_reference,
    run_reference,
    tokenize_prompts,
)
from onboard.spec.model import QUANT_SCHEMES, SPEC_METHODS, TARGETS, ModelSpec
from onboard.targets.cpu_kernels import cpu_engine_limit
from onboard.validate.results import Check, ValidationResult

MAX_NEW_TOKENS = 32
MAX_MODEL_LEN = 256


def longrope_context(spec: ModelSpec) -> int | None:
    """The context within which vLLM and transformers rotate alike under
    LongRoPE, or None for another rope. vLLM's Phi3LongRoPEScaledRotaryEmbedding
    takes the long factors for every position of every request once the
    engine's max_model_len exceeds original_max_position_embeddings (vLLM's
    default max_model_len for LongRoPE is original_max_position_embeddings);
    transformers' Phi3 (and the reference) choose per forward pass, by its
    largest position + 1. Within original_max_position_embeddings both take
    the short factors, so the accuracy check runs there (docs/validation.md)."""
    scaling = spec.rope.scaling
    if scaling is None or scaling.type != "longrope":
        return None
    return scaling.original_max_position_embeddings


# Config fields that must agree between the checkpoint and the spec.
_CONFIG_FIELDS = ("hidden_size", "num_hidden_layers", "vocab_size")


@dataclass
class RunContext:
    spec: ModelSpec
    model_dir: Path
    out_dir: Path
    work_dir: Path
    plugin: Plugin | None
    hf_dir: Path | None
    prompts: list[list[int]]
    prompt_note: str
    max_new_tokens: int = MAX_NEW_TOKENS
    options: EngineOptions | None = None
    engine: Engine | None = None
    engine_failure: dict[str, Any] | None = None
    reference: Reference | None = None
    reference_error: str | None = None
    # Per prompt: (prompt log-softmax rows, greedy continuation).
    reference_outputs: list[tuple[Any, GreedyOutput]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    # Artifacts of earlier pipeline stages that checks read: quantized checkpoints
    # by scheme (quant:<scheme>) and the speculators output (spec-decode:<method>).
    quantized: dict[str, Path] = field(default_factory=dict)
    speculators_dir: Path | None = None
    # How the engine ran the model where that is not the model's own path (sparse
    # MLA on CPU: "dense-equivalent" and its context bound).
    path: dict[str, Any] = field(default_factory=dict)

    def engine_options(self, **changes: Any) -> EngineOptions:
        """The options of the run's main engine, with ``changes`` applied (e.g.
        ``extra={"speculative_config": ...}``, ``model_dir=...``, ``env={...}``)."""
        assert self.options is not None
        return dataclasses.replace(self.options, **changes)

    @contextlib.contextmanager
    def extra_engine(self, label: str, options: EngineOptions) -> Iterator[Engine]:
        """Start one more engine (a check that needs other engine arguments than
        the main one), wait until it is ready, and close it afterwards. Its log is
        ``OUT/logs/engine-<label>.log``; a load failure raises EngineLoadError."""
        engine = Engine(
            options,
            self.work_dir / f"engine-{label}",
            self.out_dir / "logs" / f"engine-{label}.log",
        )
        engine.start()
        try:
            engine.wait_ready()
            yield engine
        finally:
            engine.close()

    @property
    def model_code(self) -> str:
        if self.plugin is None:
            return "vLLM's in-tree model classes"
        return f"the generated plugin {self.plugin.package}"


CheckRunner = Callable[[RunContext, str], Check]


def run_accuracy(ctx: RunContext, name: str) -> Check:
    if ctx.engine_failure is not None:
        return _load_failure_check(ctx, name)
    if ctx.reference is None:
        return Check.not_run(name, f"no reference: {ctx.reference_error}")
    assert ctx.engine is not None and ctx.engine.info is not None
    t0 = time.perf_counter()
    reply = ctx.engine.greedy(ctx.prompts, ctx.max_new_tokens, prompt_logprobs=True)
    ctx.timings["engine_generate_s"] = time.perf_counter() - t0
    outputs = reply["outputs"]
    verdict = judge_accuracy(
        [o["prompt_logprobs"] for o in outputs],
        [lp for lp, _ in ctx.reference_outputs],
        [GreedyOutput(o["token_ids"], o["logprobs"]) for o in outputs],
        [greedy for _, greedy in ctx.reference_outputs],
    )
    model_class = ctx.engine.info["model_class"]
    problems = []
    if ctx.plugin is not None and not model_class.startswith(ctx.plugin.package + "."):
        problems.append(
            f"vLLM instantiated {model_class}, not the generated class from "
            f"{ctx.plugin.package}: the plugin did not take effect"
        )
    metrics = {
        **verdict.metrics,
        "engine_dtype": ctx.options.dtype if ctx.options else "float32",
        "model_code": ctx.model_code,
        "generated_class_instantiated": ctx.plugin is not None and not problems,
        "prompts": ctx.prompt_note,
        **ctx.path,
        "timings": dict(ctx.timings),
    }
    details = "\n".join([verdict.details, *problems])
    status = "passed" if verdict.passed and not problems else "failed"
    return Check(name, status, metrics, details)


def dense_equivalent(
    config: dict[str, Any],
    prompts: list[list[int]],
    max_new_tokens: int,
    note: str,
) -> tuple[list[list[int]], int, str, dict[str, Any], dict[str, Any]]:
    """Sparse MLA on the CPU engine: vLLM's CPU platform has no sparse attention
    ("Sparse Attention is not supported on CPU"), so the engine runs the generated
    model with the config's index_topk set to 0, which the generated model reads
    as dense MLA (0, not null: transformers' own configs of the families,
    strict dataclasses, take an int only), on contexts (prompt
    plus generated tokens) no longer than index_topk, where the top-k holds every
    token and sparse attention is dense attention. The reference keeps its
    indexer. Returns the prompts, max_new_tokens, the prompt note, the engine's
    extra arguments and the accuracy check's path metrics."""
    topk = int(config["index_topk"])
    new = max(1, min(max_new_tokens, topk // 2))
    prompts = [p[: topk - new] for p in prompts]
    note = (
        f"{note}; cut to {topk - new} tokens + {new} generated <= index_topk "
        f"{topk} (dense-equivalent)"
    )
    extra = {"hf_overrides": {"index_topk": 0}}
    path = {"path": "dense-equivalent", "context_bound": topk}
    return prompts, new, note, extra, path


def _load_failure_check(ctx: RunContext, name: str) -> Check:
    failure = ctx.engine_failure or {}
    lines = [f"vLLM could not load {ctx.model_dir} through {ctx.model_code}:"]
    lines.append(f"  {failure.get('error')}")
    metrics: dict[str, Any] = {"engine_error": failure.get("error")}
    weights = failure.get("weights")
    if weights:
        unmatched = weights["unmatched_checkpoint_tensors"]
        unloaded = weights["unloaded_model_parameters"]
        metrics.update(
            checkpoint_tensors=weights["checkpoint_tensors"],
            model_parameters=weights["model_parameters"],
            unmatched_checkpoint_tensors=unmatched,
            unloaded_model_parameters=unloaded,
        )
        lines.append(
            f"{len(unmatched)} of {weights['checkpoint_tensors']} checkpoint tensors "
            "match no model parameter:"
        )
        # First sentence of each reason here; the full text is in the metrics.
        lines += [
            f"  {n}  ({why.split('. ')[0][:120]})"
            for n, why in _first(sorted(unmatched.items()))
        ]
        lines += _more(len(unmatched))
        if unloaded is not None:
            lines.append(
                f"{len(unloaded)} of {weights['model_parameters']} model parameters "
                "got no checkpoint tensor:"
            )
            lines += [f"  {n}" for n in _first(unloaded)]
            lines += _more(len(unloaded))
        lines.append(
            "Fix: make the spec's checkpoint.layout / checkpoint.tensor_names name "
            "the checkpoint's tensors (`onboard spec check SPEC --checkpoint DIR` "
            "compares them without starting an engine)."
        )
    elif failure.get("diagnosis_error"):
        lines.append(f"(weight diagnosis failed: {failure['diagnosis_error']})")
    if ctx.reference_error:
        lines.append(f"The reference could not load it either: {ctx.reference_error}")
    if failure.get("log_excerpt") and not weights:
        lines.append("Engine traceback (last lines):")
        lines += ["  " + s for s in failure["log_excerpt"].splitlines()[-12:]]
    return Check(name, "failed", metrics, "\n".join(lines))


def _first(items, n: int = 20):
    return list(items)[:n]


def _more(count: int, n: int = 20) -> list[str]:
    return [f"  ... and {count - n} more (all in metrics)"] if count > n else []


# Exact names, then "prefix:" for parameterised checks. Each check other than
# accuracy lives in its own module (``run(ctx, name) -> Check``), imported when a
# run asks for it.
CHECKS: dict[str, CheckRunner | str] = {
    "accuracy": run_accuracy,
    "kv-cache": "onboard.validate.check_kv_cache:run",
    "speed": "onboard.validate.check_speed:run",
    "tensor-parallel": "onboard.validate.check_tensor_parallel:run",
    "indexer": "onboard.validate.check_indexer:run",
    "quant:": "onboard.validate.check_quant:run",
    "spec-decode:": "onboard.validate.check_spec_decode:run",
}
_PARAMS = {"quant:": QUANT_SCHEMES, "spec-decode:": SPEC_METHODS}


def checks_for_spec(spec: ModelSpec) -> list[str]:
    """The checks `onboard new-model` runs: accuracy, the KV-cache accounting, the
    indexer of sparse MLA, one per quantization scheme and speculative method the
    spec lists, then tensor parallelism and speed."""
    names = ["accuracy", "kv-cache"]
    if spec.attention.indexer is not None:
        # Sparse MLA beyond the top-k, tensor by tensor (the CPU engine runs dense).
        names.append("indexer")
    names += [f"quant:{scheme}" for scheme in spec.quantization]
    names += [f"spec-decode:{s.method}" for s in spec.speculators]
    names += ["tensor-parallel", "speed"]
    return list(dict.fromkeys(names))


def parse_checks(text: str | None) -> list[str]:
    names = [c.strip() for c in (text or "accuracy").split(",") if c.strip()]
    for name in names:
        prefix = name.split(":", 1)[0] + ":" if ":" in name else None
        if name in CHECKS and not name.endswith(":"):
            continue
        if prefix in _PARAMS and name[len(prefix) :] in _PARAMS[prefix]:
            continue
        known = [c for c in CHECKS if not c.endswith(":")] + [
            f"{p}{{{'|'.join(v)}}}" for p, v in _PARAMS.items()
        ]
        every = [c for c in CHECKS if not c.endswith(":")] + [
            p + v for p, values in _PARAMS.items() for v in values
        ]
        close = difflib.get_close_matches(name, every, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise InputError(
            f"--checks: unknown check {name!r}{hint} (known: {', '.join(known)})"
        )
    if "accuracy" not in names:
        names.insert(0, "accuracy")  # the run's verdict rests on it
    return list(dict.fromkeys(names))


def _runner(name: str) -> CheckRunner:
    runner = CHECKS.get(name) or CHECKS[name.split(":", 1)[0] + ":"]
    if isinstance(runner, str):
        module, _, attr = runner.partition(":")
        runner = getattr(importlib.import_module(module), attr)
    return runner


def _run_check(ctx: RunContext, name: str) -> Check:
    # A check that breaks (e.g. the engine dies mid-request) is a failed check with
    # the reason, not a traceback; the engine log says more.
    try:
        return _runner(name)(ctx, name)
    except (EngineDied, TimeoutError, RuntimeError) as exc:
        log = ctx.engine.log_path if ctx.engine else None
        cause = (engine_error(log) if log else None) or getattr(exc, "error", None)
        metrics = {"error": f"{type(exc).__name__}: {exc}"}
        if cause:
            metrics["engine_error"] = cause
        return Check(
            name,
            "failed",
            metrics,
            f"the check could not complete: {type(exc).__name__}: {exc}\n"
            + (f"The engine's own error: {cause}\n" if cause else "")
            + f"(engine log: {log or 'none'})",
        )


# An exception line of vLLM's worker or engine-core log: "(Worker pid=1) ERROR
# 12-03 16:49:18 [multiproc_executor.py:1063] RuntimeError: Unsupported ...".
_LOGGED_ERROR = re.compile(r"\bERROR\b.*?\] ((?:\w+\.)*\w*(?:Error|Exception): .+)$")


def engine_error(log_path: Path) -> str | None:
    """The first exception vLLM's processes logged (the root cause of an engine
    that died under a request), if the log has one."""
    try:
        text = Path(log_path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        found = _LOGGED_ERROR.search(line)
        if found and "EngineDeadError" not in found.group(1):
            return found.group(1).strip()[:300]
    return None


def _preflight(
    spec: ModelSpec, model_dir: Path, log: Callable[[str], None], in_tree: bool
) -> None:
    """Compare the checkpoint's headers with the spec before any engine starts."""
    from onboard.checkpoint.preflight import preflight

    report = preflight(spec, model_dir, in_tree=in_tree)
    if not report.ok:
        raise InputError(
            f"{model_dir}: the checkpoint does not match the spec (preflight, no "
            "engine started):\n" + "\n".join(report.lines())
        )
    log(f"preflight: checkpoint headers match the spec ({model_dir})")


def check_inputs(spec: ModelSpec, model_dir: Path) -> dict[str, Any]:
    """The checkpoint's config.json, after checking it is the spec's model."""
    if not model_dir.is_dir():
        raise InputError(f"{model_dir}: no such directory")
    config_path = model_dir / "config.json"
    config = read_config_json(config_path)
    if not any(model_dir.glob("*.safetensors")):
        raise InputError(f"{model_dir}: no *.safetensors weights")
    if (model_dir / INDEX_FILE).is_file():
        # Also without preflight: the engine opens every shard the index names.
        read_weight_map(model_dir / INDEX_FILE)
    problems = []
    if spec.architecture not in (config.get("architectures") or []):
        problems.append(
            f"architectures is {config.get('architectures')} but the spec says "
            f"{spec.architecture!r}"
        )
    if config.get("model_type") != spec.model_type:
        problems.append(
            f"model_type is {config.get('model_type')!r} but the spec says "
            f"{spec.model_type!r}"
        )
    for key in _CONFIG_FIELDS:
        if key in config and config[key] != getattr(spec, key):
            problems.append(
                f"{key} is {config[key]} but the spec says {getattr(spec, key)}"
            )
    if problems:
        raise InputError(
            "checkpoint does not match the spec:\n"
            + "\n".join(f"{config_path}: {p}" for p in problems)
        )
    return config


def validate(
    model_dir: Path,
    spec_path: Path,
    target: str,
    out_dir: Path,
    *,
    generated: Path | None = None,
    checks: str | None = None,
    vllm_in_tree: bool = False,
    installed_plugin: bool = False,
    max_new_tokens: int = MAX_NEW_TOKENS,
    preflight: bool = True,
    quantized: dict[str, Path] | None = None,
    speculators_dir: Path | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> ValidationResult:
    """Validate MODEL_DIR against SPEC on TARGET; write validation.json and
    report.html into OUT_DIR and return the result."""
    from onboard.spec import load_spec
    from onboard.validate.report import write_report

    t_total = time.perf_counter()
    spec = load_spec(spec_path)
    if target not in TARGETS:
        raise InputError(
            f"--target: unknown target {target!r} (known: {', '.join(TARGETS)})"
        )
    names = parse_checks(checks)
    model_dir = Path(model_dir).resolve()
    config = check_inputs(spec, model_dir)
    if preflight:
        _preflight(spec, model_dir, log, vllm_in_tree)
    if generated is not None and not (Path(generated) / "plugin").is_dir():
        raise InputError(f"{generated}: no plugin/ directory (run `onboard generate`)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = ValidationResult(target=target, model_dir=str(model_dir))

    def not_run(reason: str) -> ValidationResult:
        result.checks = [Check.not_run(name, reason) for name in names]
        result.write(out_dir)
        write_report(result, out_dir, spec)
        return result

    if target != "cpu":
        return not_run(
            f"target {target} needs its hardware; this machine runs the cpu target "
            "only: write what to run there with `onboard validate MODEL --spec SPEC "
            f"--target {target} --emit DIR`, then read its results back with "
            "`--ingest DIR`"
        )
    cpu_limit = cpu_engine_limit(spec)
    if cpu_limit is not None:
        # A limit of vLLM's CPU build, not a fault of the model: the GPU targets'
        # emitted run script covers these checks.
        return not_run(f"not run on cpu: {cpu_limit}")

    with tempfile.TemporaryDirectory(prefix="onboard-validate-") as tmp:
        work_dir = Path(tmp)
        plugin, hf_dir = _model_code(spec, generated, vllm_in_tree, work_dir, log)
        if installed_plugin and not vllm_in_tree:
            from onboard.runtime.engine import installed_plugin as find_installed
            from onboard.spec.naming import dist_name

            plugin = find_installed(dist_name(spec))
            log(f"loading the installed plugin {plugin.dist_name} ({plugin.root})")
        prompts, note = tokenize_prompts(model_dir, PROMPTS, spec.vocab_size)
        max_pos = int(config.get("max_position_embeddings") or MAX_MODEL_LEN)
        max_pos = min(max_pos, longrope_context(spec) or max_pos)
        limit = max_pos - max_new_tokens
        prompts = [p[:limit] for p in prompts]
        extra: dict[str, Any] = {}
        path: dict[str, Any] = {}
        if spec.attention.indexer is not None:
            prompts, max_new_tokens, note, extra, path = dense_equivalent(
                config, prompts, max_new_tokens, note
            )
        ctx = RunContext(
            spec=spec,
            model_dir=model_dir,
            out_dir=out_dir,
            work_dir=work_dir,
            plugin=plugin,
            hf_dir=hf_dir,
            prompts=prompts,
            prompt_note=note,
            max_new_tokens=max_new_tokens,
            quantized=dict(quantized or {}),
            speculators_dir=speculators_dir,
        )
        options = EngineOptions(
            model_dir=model_dir,
            plugin=plugin,
            max_model_len=min(max_pos, max(MAX_MODEL_LEN, limit + max_new_tokens)),
            extra=extra,
            **engine_state_options(spec),
        )
        ctx.options = options
        ctx.path = path
        result.cpu_compat = list(options.compat)
        engine = Engine(options, work_dir / "engine", out_dir / "logs" / "engine.log")
        log(f"starting the vLLM engine (log: {engine.log_path})")
        engine.start()
        try:
            # The reference runs here while the engine boots in its own process.
            _run_reference(ctx, work_dir, log)
            _wait_for_engine(ctx, engine, log)
            result.vllm_model_class = (
                ctx.engine.info["model_class"] if ctx.engine and ctx.engine.info else ""
            )
            result.reference = ctx.reference.description if ctx.reference else ""
            for name in names:
                log(f"running check {name}")
                result.checks.append(_run_check(ctx, name))
        finally:
            engine.close()
    total = time.perf_counter() - t_total
    accuracy = result.check("accuracy")
    if accuracy is not None and "timings" in accuracy.metrics:
        accuracy.metrics["timings"]["validate_total_s"] = total
    result.write(out_dir)
    write_report(result, out_dir, spec)
    return result


def _model_code(
    spec: ModelSpec,
    generated: Path | None,
    vllm_in_tree: bool,
    work_dir: Path,
    log: Callable[[str], None],
) -> tuple[Plugin | None, Path | None]:
    """The plugin vLLM must load (None: its in-tree classes) and the HF reference
    code directory, generating both when no GEN_DIR was given."""
    if vllm_in_tree:
        hf = Path(generated) / "hf" if generated else None
        return None, hf
    if generated is None:
        from onboard.generate import write_model_code

        generated = work_dir / "generated"
        log(f"generating the model code into {generated}")
        write_model_code(spec, generated)
    generated = Path(generated)
    return read_plugin(generated / "plugin"), generated / "hf"


def _run_reference(ctx: RunContext, work_dir: Path, log: Callable[[str], None]) -> None:
    t0 = time.perf_counter()
    try:
        ctx.reference = load_reference(ctx.model_dir, ctx.spec, ctx.hf_dir, work_dir)
    except ReferenceUnavailable as exc:
        ctx.reference_error = str(exc)
        log(f"no reference: {exc}")
        return
    log(f"reference: {ctx.reference.description}")
    ctx.reference_outputs = [
        run_reference(ctx.reference.model, ids, ctx.max_new_tokens)
        for ids in ctx.prompts
    ]
    ctx.timings["reference_s"] = time.perf_counter() - t0
    # Free the reference's memory before the engine serves requests.
    ctx.reference.model = None


def _wait_for_engine(ctx: RunContext, engine: Engine, log: Callable[[str], None]):
    try:
        info = engine.wait_ready()
    except EngineLoadError as exc:
        ctx.engine_failure = exc.failure
        ctx.timings["engine_start_s"] = exc.failure.get("start_s", 0.0)
        log(f"the engine failed to load the model: {exc}")
        return
    except (EngineDied, TimeoutError) as exc:
        ctx.engine_failure = {"error": str(exc)}
        log(f"the engine did not start: {exc}")
        return
    ctx.engine = engine
    # What the engine reported (class, KV-cache layout), for people and later checks.
    atomic_write_text(engine.log_path.with_suffix(".json"), json.dumps(info, indent=2))
    ctx.timings["engine_start_s"] = info["start_s"]
    ctx.timings["engine_import_s"] = info["import_s"]
    log(f"engine ready in {info['start_s']:.1f} s: {info['model_class']}")
