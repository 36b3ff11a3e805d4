"""The vLLM engine, in its own process, answering JSON requests.

Run by :mod:`onboard.runtime.engine` as
``python -m onboard.runtime.engine_worker CONFIG_JSON RESULT_FD``. It builds ONE
``vllm.LLM`` for the whole validation run (its engine core runs in this process;
tensor parallelism adds one worker process per rank), reports what the engine
instantiated, and serves requests read from stdin, one JSON object per line,
writing one JSON line per reply to RESULT_FD. stdout/stderr carry vLLM's own logs
(the parent sends them to a file).

Messages (worker -> parent):
  {"event": "ready", "start_s", "import_s", "model_class", "kv_cache"}
  {"event": "load_failed", "start_s", "error", "log_excerpt", "weights"}
Requests (parent -> worker), each answered {"ok": true, ...} or {"ok": false, "error"}:
  {"op": "generate", "prompts": [[ids], ...], "sampling": {SamplingParams kwargs}}
  {"op": "metrics"}    (vLLM's counters; needs disable_log_stats=False)
  {"op": "rpc", "function": "module:name", "args": [...]}  (collective_rpc)
  {"op": "shutdown"}

What runs inside vLLM's own processes (through ``LLM.apply_model`` and
``collective_rpc``) lives in :mod:`onboard.runtime.engine_probes`: this module runs
as ``__main__``, whose functions would not unpickle there.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

from onboard.runtime.engine_probes import (
    diagnose_weights,
    kv_cache_info,
    model_class_name,
    short,
)

# vLLM log lines look like "(Worker pid=1) ERROR 11-30 06:17:55 [file.py:953] text".
_LOG_PREFIX = re.compile(
    r"^(\(\S+ pid=\d+\) )?(ERROR|WARNING|INFO|DEBUG) \S+ \S+ (\[\S+\]) "
)
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit))(: .*)?$")


def root_cause(log_text: str) -> tuple[str | None, str]:
    """The first exception line of the first traceback vLLM logged, and that
    traceback (the engine-core and worker processes log theirs before the
    front end raises its generic "Engine core initialization failed")."""
    # Only what vLLM logged as an error: warnings may carry harmless tracebacks.
    errors = _logged_errors(log_text)
    lines = [_LOG_PREFIX.sub("", line) for line in errors or log_text.splitlines()]
    start = next(
        (i for i, line in enumerate(lines) if line.startswith("Traceback")), None
    )
    if start is None:
        return None, ""
    for i in range(start + 1, len(lines)):
        if _EXC_LINE.match(lines[i]):
            end = i + 1 + len(_continuation(errors, i))
            cause = " ".join(line.strip() for line in lines[i:end])
            return cause, "\n".join(lines[start:end])
    return None, "\n".join(lines[start:])


def _logged_errors(log_text: str) -> list[str]:
    """The lines vLLM logged at level ERROR."""
    return [line for line in log_text.splitlines() if " ERROR " in line[:60]]


def _continuation(errors: list[str], i: int) -> list[str]:
    """The further lines of a multi-line exception message at ``errors[i]`` (e.g.
    vLLM's "Failed to find a kernel ... Reasons:" and one line per kernel): the
    lines that follow from the same process and log call."""
    source = _source(errors[i]) if i < len(errors) else None
    out = []
    for line in errors[i + 1 :]:
        if source is None or _source(line) != source:
            break
        text = _LOG_PREFIX.sub("", line)
        if text.startswith("Traceback") or not text.strip():
            break
        out.append(text)
    return out


def _source(line: str) -> tuple[str, str] | None:
    match = _LOG_PREFIX.match(line)
    return (match.group(1) or "", match.group(3)) if match else None


class _Replies:
    def __init__(self, fd: int):
        self._out = os.fdopen(fd, "w", buffering=1)

    def send(self, message: dict) -> None:
        self._out.write(json.dumps(message) + "\n")
        self._out.flush()


def inspect_classes_here() -> None:
    """vLLM inspects a plugin's lazily registered model class in a fresh process
    that imports vLLM again (``_run_in_subprocess`` in
    vllm/model_executor/models/registry.py), so as not to initialise CUDA in the
    caller: about 12 s on 2 cores for each new model file. On the CPU platform
    there is no CUDA to keep out of this process: inspect the class here."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.model_executor.models import registry

    if callable(getattr(registry, "_run_in_subprocess", None)):
        registry._run_in_subprocess = lambda fn: fn()


def _build_llm(config: dict, **overrides):
    from vllm import LLM

    inspect_classes_here()
    return LLM(model=config["model"], **{**config["engine_kwargs"], **overrides})


def _load_failed(config: dict, exc: BaseException, start_s: float) -> dict:
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(0.5)  # let worker processes finish writing their logs
    log_text = Path(config["log_path"]).read_text(errors="replace")
    # Worker processes (tensor parallelism) log their errors; the engine core
    # runs in this process, where the exception itself carries the traceback.
    logged = _logged_errors(log_text)
    cause, traceback_text = root_cause(log_text) if logged else (None, "")
    if cause is None:
        cause, traceback_text = root_cause("".join(traceback.format_exception(exc)))
    message = {
        "event": "load_failed",
        "start_s": start_s,
        "error": cause or f"{type(exc).__name__}: {exc}",
        "log_excerpt": traceback_text[-6000:],
        "weights": None,
        "diagnosis_error": None,
    }
    # A failure while loading weights gets the per-tensor diagnosis.
    if config.get("diagnose_weights", True) and "load_weights" in traceback_text:
        try:
            llm = _build_llm(config, load_format="dummy")
            message["weights"] = llm.collective_rpc(
                functools.partial(diagnose_weights, config["model"])
            )[0]
            llm.llm_engine.engine_core.shutdown()
        except Exception as diag_exc:
            message["diagnosis_error"] = short(f"{type(diag_exc).__name__}: {diag_exc}")
    return message


def _generate(llm, request: dict) -> dict:
    from vllm import SamplingParams

    params = SamplingParams(**request.get("sampling", {}))
    prompts = [{"prompt_token_ids": ids} for ids in request["prompts"]]
    t0 = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    results = []
    for out in outputs:
        completion = out.outputs[0]
        results.append(
            {
                "token_ids": list(completion.token_ids),
                "logprobs": _logprob_dicts(completion.logprobs),
                "prompt_logprobs": _logprob_dicts(out.prompt_logprobs),
            }
        )
    return {"outputs": results, "time_s": elapsed}


def _logprob_dicts(entries) -> list | None:
    if entries is None:
        return None
    return [
        None if step is None else {str(t): lp.logprob for t, lp in step.items()}
        for step in entries
    ]


def _metrics(llm) -> dict:
    values = {}
    for metric in llm.get_metrics():
        value = getattr(metric, "value", None)
        if value is None:
            value = getattr(metric, "values", None)
        values[metric.name] = value
    return {"metrics": values}


def _rpc(llm, request: dict) -> list:
    """Run ``request["function"]`` ("module:name", importable in vLLM's processes)
    in every vLLM worker with ``request["args"]``; the workers' results."""
    import importlib

    module, _, name = request["function"].partition(":")
    function = getattr(importlib.import_module(module), name)
    return llm.collective_rpc(function, args=tuple(request.get("args", ())))


def _kv_cache(llm) -> dict:
    try:
        info = llm.collective_rpc(kv_cache_info)[0]
    except Exception as exc:  # the accuracy check must not depend on this
        return {"error": short(f"{type(exc).__name__}: {exc}")}
    cache = llm.llm_engine.vllm_config.cache_config
    layers = info["layers"].values()
    per_token = sum(layer.get("bytes_per_token", 0) for layer in layers)
    shared = sum(
        info["layers"][target].get("bytes_per_token", 0)
        for target in info["shared_layers"].values()
        if target in info["layers"]
    )
    return {
        **info,
        "bytes_per_token": per_token,
        "bytes_per_token_without_sharing": per_token + shared,
        # Linear-attention layers: one state per sequence, whatever its length.
        "state_bytes_per_sequence": sum(
            layer.get("state_bytes", 0) for layer in layers
        ),
        "num_blocks": cache.num_gpu_blocks,
        "block_size": cache.block_size,
        "mamba_block_size": getattr(cache, "mamba_block_size", None),
        "mamba_cache_mode": getattr(cache, "mamba_cache_mode", None),
        "enable_prefix_caching": getattr(cache, "enable_prefix_caching", None),
    }


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[1]).read_text())
    replies = _Replies(int(argv[2]))
    t0 = time.perf_counter()
    try:
        import vllm  # noqa: F401  (timed separately: most of the start-up)

        import_s = time.perf_counter() - t0
        llm = _build_llm(config)
    except Exception as exc:
        failure = _load_failed(config, exc, time.perf_counter() - t0)
        traceback.print_exception(exc)  # into the engine log, beside vLLM's lines
        replies.send(failure)
        return 0
    start_s = time.perf_counter() - t0
    replies.send(
        {
            "event": "ready",
            "start_s": start_s,
            "import_s": import_s,
            "model_class": llm.apply_model(model_class_name)[0],
            "kv_cache": _kv_cache(llm),
        }
    )
    for line in sys.stdin:
        request = json.loads(line)
        op = request.get("op")
        try:
            if op == "shutdown":
                replies.send({"ok": True})
                break
            if op == "generate":
                replies.send({"ok": True, **_generate(llm, request)})
            elif op == "metrics":
                replies.send({"ok": True, **_metrics(llm)})
            elif op == "rpc":
                replies.send({"ok": True, "result": _rpc(llm, request)})
            else:
                replies.send({"ok": False, "error": f"unknown op {op!r}"})
        except Exception as exc:
            replies.send({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    llm.llm_engine.engine_core.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
