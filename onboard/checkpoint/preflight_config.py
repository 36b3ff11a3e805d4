"""Preflight of ``config.json``: read it, then compare it key by key with the spec's.

The spec's side is :func:`onboard.spec.hf.hf_config_from_spec`; the checkpoint's
side is read through transformers' config class where it ships one, as vLLM reads
it. vLLM's known traps (``topk_method`` for the router's bias correction,
``n_group: null``, another spelling of a key) get their own explanation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from onboard.checkpoint.preflight_report import PreflightRun
from onboard.checkpoint.preflight_spec import config_spec_fields
from onboard.config_json import non_finite_keys
from onboard.errors import InputError

CONFIG_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


def read_config(run: PreflightRun) -> None:
    """config.json into ``run.config``, with its float dtype and quant method."""
    path = run.root / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        run.add(
            "error",
            "config",
            "config.json",
            "missing: vLLM and transformers read the architecture and every "
            "size from it",
            "add the checkpoint's config.json (`onboard checkpoint tiny` shows "
            "the one onboard writes for this spec)",
        )
        return
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        run.add(
            "error",
            "config",
            "config.json",
            f"cannot read: {exc}",
            "re-download or fix the file",
        )
        return
    if not isinstance(config, dict):
        run.add(
            "error",
            "config",
            "config.json",
            "not a JSON object",
            "re-download or fix the file",
        )
        return
    for key in non_finite_keys(config)[:5]:
        run.add(
            "error",
            "config",
            key,
            "is NaN or infinite; no model config means that",
            "fix the value (a corrupt or hand-edited config.json?)",
            config_keys=[key],
        )
    run.config = config
    dtype = config.get("dtype", config.get("torch_dtype"))
    run.dtype = CONFIG_DTYPES.get(str(dtype))
    qc = config.get("quantization_config")
    if isinstance(qc, dict):
        run.report.quantization = str(qc.get("quant_method"))


def check_config(run: PreflightRun, keys: bool = True) -> None:
    spec, raw = run.spec, run.config
    assert raw is not None
    if raw.get("model_type") != spec.model_type:
        run.add(
            "error",
            "config",
            "model_type",
            f"config.json says {raw.get('model_type')!r}, the spec {spec.model_type!r}",
            f'set "model_type": "{spec.model_type}" '
            "(vLLM picks the config class by it), or use the spec of this "
            "checkpoint",
            spec_fields=["model_type"],
            config_keys=["model_type"],
        )
    if raw.get("architectures") != [spec.architecture]:
        run.add(
            "error",
            "config",
            "architectures",
            f"config.json says {raw.get('architectures')!r}, the spec "
            f"[{spec.architecture!r}]",
            f'set "architectures": ["{spec.architecture}"] (vLLM picks the '
            "model class by it)",
            spec_fields=["architecture"],
            config_keys=["architectures"],
        )
    if keys:
        from onboard.arch.config_keys import unset_keys

        run.unset_ok = frozenset() if run.in_tree else unset_keys(spec)
        _check_config_keys(run)


def _check_config_keys(run: PreflightRun) -> None:
    from onboard.spec import hf

    spec, raw = run.spec, run.config
    try:
        expected = hf.hf_config_from_spec(spec)
    except InputError as exc:
        run.add(
            "error",
            "config",
            "config.json",
            f"the spec has no config.json form to compare with: {exc}",
            "fix the spec first (`onboard spec check`)",
        )
        return
    known = config_class(spec.model_type)
    skip = hf.IGNORED | {"architectures", "model_type", "dtype"}
    if spec.checkpoint.language_model_prefix is not None:
        # A multimodal wrapper: the language model's config is text_config (the
        # wrapper's other keys configure what the generated model does not
        # build); tie_word_embeddings is the wrapper's own.
        tie = raw.get("tie_word_embeddings", False)
        if tie != spec.tie_word_embeddings:
            run.add(
                "error",
                "config",
                "tie_word_embeddings",
                f"config.json says {tie!r}, the spec {spec.tie_word_embeddings!r}",
                f"set tie_word_embeddings to {json.dumps(spec.tie_word_embeddings)}",
                spec_fields=["tie_word_embeddings"],
                config_keys=["tie_word_embeddings"],
            )
        text_type = hf.text_model_type(spec.model_type)
        known = config_class(text_type) if text_type else None
        expected, raw = hf.hf_text_config(expected), hf.hf_text_config(raw)
        skip |= {"tie_word_embeddings"}
    actual = raw
    if known is not None:
        # What vLLM sees: transformers' config class fills defaults and maps
        # aliases and legacy keys (rope_scaling) before anyone reads the config.
        try:
            actual = normalised(known, raw)
        except Exception as exc:  # the class's own validation, e.g. a wrong type
            run.add(
                "error",
                "config",
                "config.json",
                f"transformers' {known.__name__} rejects it: "
                + " ".join(str(exc).split()),
                "fix the config so transformers (and vLLM) can load it",
            )
    if "sliding_attention" not in spec.layer_attention_types():
        # Which layers slide means nothing when none does (a published Qwen2.5
        # config keeps max_window_layers beside use_sliding_window: false; dots1's
        # layer_types are all full_attention beside a sliding_window).
        skip |= WINDOW_ONLY
    compared: set[str] = set()
    for key, want in expected.items():
        if key in skip:
            continue
        compared.add(key)
        _compare_key(run, key, want, actual, raw, known)
    aliases = {a for names in hf.ALIASES.values() for a in names}
    # Other spellings of compared keys are reported with them.
    spelled = {
        a for names in hf.ALIASES.values() if compared & set(names) for a in names
    }
    for key in sorted(set(raw) - set(expected) - skip - {"quantization_config"}):
        if key.startswith("_") or key in ("rope_scaling", "rope_theta"):
            continue  # legacy rope keys: compared through rope_parameters
        if key in spelled:
            continue
        run.add(
            "note",
            "config-extra",
            key,
            f"config.json sets {key} = {_short(raw[key])}, which the spec's "
            "config does not have"
            + ("" if key in aliases else "; the generated model does not read it"),
            "if it changes the forward pass, the spec cannot express it",
            config_keys=[key],
        )


def _compare_key(
    run: PreflightRun, key: str, want: Any, actual: dict, raw: dict, known: Any
) -> None:
    from onboard.spec import hf

    got = actual.get(key, _MISSING)
    if _same(want, got):
        return
    derive = DERIVED.get(key)
    if got in (_MISSING, None) and derive is not None and _same(want, derive(actual)):
        return  # absent or null: transformers and vLLM both derive this value
    if got in (_MISSING, None) and key in run.unset_ok:
        _unset_for_generated(run, key, want, got, known)
        return
    if got is _MISSING and want is None:
        # Absent means null to the code that reads it with getattr (OLMoE's
        # attention reads sliding_window so); a null spec field is never read by
        # the generated model (it has no branch for a feature the spec lacks).
        return
    if isinstance(want, dict) and isinstance(got, dict):
        kinds = set(run.spec.layer_attention_types())
        for sub in sorted(set(want) | set(got)):
            if key == "rope_parameters" and sub in hf.LAYER_KINDS and sub not in kinds:
                continue  # the rope of a layer kind the model lacks is never read
            w, g = want.get(sub, _MISSING), got.get(sub, _MISSING)
            # Mistral-4 repeats the context length there, and the rope type
            # under its legacy name.
            same = {
                "max_position_embeddings": raw.get("max_position_embeddings"),
                "type": want.get("rope_type"),
            }
            if (
                key == "rope_parameters"
                and sub in same
                and w is _MISSING
                and _same(g, same[sub])
            ):
                continue
            if not _same(w, g):
                _config_problem(run, f"{key}.{sub}", key, w, g, raw, known)
        return
    # Another spelling of the same concept (the generated model reads `key`).
    concept = next((c for c, names in hf.ALIASES.items() if key in names), None)
    if got is _MISSING and concept is not None:
        for alias in hf.ALIASES[concept]:
            if alias != key and alias in raw and _same(want, raw[alias]):
                run.add(
                    "error",
                    "config",
                    key,
                    f"config.json spells it {alias!r}; the generated model and "
                    f"vLLM read {key!r}",
                    f'rename "{alias}" to "{key}" in config.json',
                    config_keys=[key, alias],
                )
                return
    _config_problem(run, key, key, want, got, raw, known)


def _unset_for_generated(
    run: PreflightRun, key: str, want: Any, got: Any, known: Any
) -> None:
    """A key transformers' class for the family does without, left out (or null)
    by the checkpoint: the generated model serves it as transformers computes
    it; vLLM's in-tree model of the family would read the key."""
    said = f"has no {key}" if got is _MISSING else f"has {key}: null"
    cls = f"transformers' {known.__name__}" if known is not None else "transformers"
    run.add(
        "note",
        "config",
        key,
        f"config.json {said}, as {cls} writes it; the generated model serves "
        "the checkpoint as the spec says without it, but vLLM's in-tree model of "
        f"the family reads the key (the spec's value: {_short(want)})",
        f'to serve the checkpoint with vLLM\'s in-tree model, set "{key}": '
        f"{json.dumps(want)} in config.json",
        config_keys=[key],
    )


def _head_dim(config: dict) -> Any:
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return _MISSING


# Keys that only say which layers slide.
WINDOW_ONLY = frozenset({"max_window_layers"})

# Keys whose absence (or null) means a value derived from others, as both
# transformers' modeling code and vLLM read them.
DERIVED: dict[str, Callable[[dict], Any]] = {"head_dim": _head_dim}


def _config_problem(
    run: PreflightRun, path: str, key: str, want: Any, got: Any, raw: dict, known: Any
) -> None:
    spec = run.spec
    fields = config_spec_fields().get(key, ())
    if got is _MISSING:
        said = f"config.json has no {path}"
    elif key not in raw and known is not None:
        said = (
            f"config.json does not set {path}, so transformers' "
            f"{known.__name__} uses its default {_short(got)}"
        )
    else:
        said = f"config.json has {path} = {_short(got)}"
    if want is _MISSING:  # a key inside a mapping the spec does not write
        message = f"{said}; the spec has no such key"
        fix = f"remove {path} from config.json" + (
            f", or, if the checkpoint is right, {', '.join(fields)} in the spec"
            if fields
            else ""
        )
    else:
        message = f"{said}; the spec needs {_short(want)}"
        fix = f"set {path} to {json.dumps(want)} in config.json" + (
            f", or, if the checkpoint is right, {', '.join(fields)} in the spec"
            if fields
            else ""
        )
    moe = spec.mlp.moe
    if key == "topk_method" and moe is not None and moe.router.bias_correction:
        message += (
            ". The spec routes with a bias correction (router.bias_correction: "
            "true); vLLM builds the router's e_score_correction_bias only when "
            "topk_method is noaux_tc, so without it the in-tree model has no "
            "bias parameter and loading fails with KeyError "
            "'...mlp.gate.e_score_correction_bias'"
        )
        fix = (
            'add "topk_method": "noaux_tc" to config.json; if the checkpoint '
            "has no e_score_correction_bias, set mlp.moe.router.bias_correction: "
            "false in the spec instead"
        )
    elif key in ("n_group", "topk_group") and got is None:
        message += (
            f". {key}: null breaks vLLM's grouped routing: its DeepSeek-style "
            "MoE reads getattr(config, 'n_group', 1), gets None, and the router "
            "fails (`assert topk_group is not None` on CPU)"
        )
        fix = (
            f'set "{key}": {json.dumps(want)} in config.json (1 and 1 mean '
            "ungrouped top-k)"
        )
    run.add(
        "error",
        "config",
        path,
        message,
        fix,
        spec_fields=fields,
        config_keys=[key],
    )


def config_class(model_type: str) -> type | None:
    """transformers' config class for a model type it ships, else None."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else None


def normalised(cls: type, config: dict) -> dict:
    """The config as transformers' class reads it (defaults filled, aliases mapped)."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()  # rope-validation warnings: we report problems
    try:
        return cls.from_dict(dict(config)).to_dict()
    finally:
        logging.set_verbosity(level)


# A key the config does not set (None is a value there: n_group: null).
_MISSING = object()


def _same(a: Any, b: Any) -> bool:
    if a is _MISSING or b is _MISSING:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (a == b and type(a) is type(b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _short(value: Any, limit: int = 80) -> str:
    if value is _MISSING:
        return "(not set)"
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
