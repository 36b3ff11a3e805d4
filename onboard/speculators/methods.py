"""vLLM ``--speculative-config`` JSON per method, and the refusals.

Every JSON written here is accepted by the pinned vLLM's own ``SpeculativeConfig``
(tests/test_speculators.py constructs it from each file). What vLLM 0.32 would
reject — or would only fail on deep inside an engine — is refused here with the
reason, before anything starts: a method it does not know, MTP without MTP heads, a
draft whose hidden size or vocabulary does not fit the verifier.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from onboard.errors import InputError
from onboard.spec.model import ModelSpec, Speculator
from onboard.speculators.heads import HEAD_METHODS, SPECULATORS_TYPE, speculators_type

# n-gram lookup window: vLLM's documented example (its built-in default is 5/5,
# marked "TODO: tune"); `onboard speculators tune` is where this gets measured.
PROMPT_LOOKUP_MIN = 2
PROMPT_LOOKUP_MAX = 4
# The methods that need a draft checkpoint of their own.
DRAFT_METHODS = ("draft_model", *HEAD_METHODS)
# onboard's names for heads vLLM 0.32 serves under another method: a P-EAGLE head
# is an EAGLE-3 head drafting its k tokens in one pass (`parallel_drafting`; vLLM
# reads a speculators "peagle" config as `eagle3` + `parallel_drafting`,
# transformers_utils/configs/speculators/base.py:133-134), a DFlash2 head runs as
# `dflash` (base.py:135-136) with its own architecture (DFlash2DraftModel).
VLLM_METHOD = {"p_eagle": "eagle3", "dflash2": "dflash"}
# The methods whose config sets vLLM's enable_adaptive_verification (the
# verifier checks, per step, only the drafts worth their cost: v1/worker/gpu/
# spec_decode/adaptive_verification.py:282-350). vLLM 0.32 documents it for
# dspark (vllm/config/speculative.py:551-553), and its V2 runner implements it
# for every model draft (an acceptance estimator on the draft logits,
# v1/worker/gpu/spec_decode/speculator.py:170-176 and 250-261; DFlash2's
# candidate scores, dflash2/speculator.py:246-250). Set for the two V2-only
# methods, whose configs run nowhere else: the launches shipped DFlash2 with it;
# for eagle3, mtp and dflash it would keep the config off the V1 runner, which
# refuses it (vllm/config/vllm.py:2980-2981): the CPU engine's, and P-EAGLE's
# (parallel drafting for EAGLE is V1-only, vllm/config/vllm.py:2936-2943).
ADAPTIVE_METHODS = ("dspark", "dflash2")


def vllm_method(method: str) -> str:
    """The ``method`` vLLM's speculative config names for a spec's method."""
    return VLLM_METHOD.get(method, method)


def vllm_methods() -> set[str] | None:
    """The method names the installed vLLM accepts (None: vLLM is not installed).

    Read from vLLM's own ``SpeculativeMethod`` type, never copied."""
    try:
        from typing import get_args

        from vllm.config.speculative import SpeculativeMethod
    except ImportError:
        return None

    names: set[str] = set()

    def walk(tp: Any) -> None:
        args = get_args(tp)
        if not args:
            names.add(tp)
        for arg in args:
            if isinstance(arg, str):
                names.add(arg)
            else:
                walk(arg)

    walk(SpeculativeMethod)
    return names


def where(index: int, field: str | None = None) -> str:
    return f"speculators[{index}]" + (f".{field}" if field else "")


def refusals(spec: ModelSpec, source: str = "spec") -> list[str]:
    """Why the pinned vLLM would reject each listed method (empty: none would)."""
    problems: list[str] = []
    known = vllm_methods()
    for i, entry in enumerate(spec.speculators):
        at = f"{source}: {where(i, 'method')}"
        if known is not None and vllm_method(entry.method) not in known:
            problems.append(
                f"{at}: vLLM does not know the method {entry.method!r} "
                f"(it accepts: {', '.join(sorted(known))})"
            )
            continue
        if entry.method == "mtp":
            problems += _mtp_refusals(spec, entry, at)
        if entry.method == "draft_model" and entry.model is None:
            problems.append(
                f"{source}: {where(i, 'model')}: draft_model needs `model:` (a smaller "
                "checkpoint with the same tokenizer)"
            )
        if entry.method in DRAFT_METHODS and entry.model is not None:
            problems += _draft_refusals(spec, entry, f"{source}: {where(i, 'model')}")
    return problems


def entry_for(spec: ModelSpec, method: str) -> Speculator:
    """The spec's entry for ``method`` (k=3 and no draft when it lists none)."""
    for entry in spec.speculators:
        if entry.method == method:
            return entry
    return Speculator(method=method)


def find_draft(spec: ModelSpec, entry: Speculator, speculators_dir: Path | None):
    """(draft directory or Hub id, None) or (None, why there is none) for methods
    that need a draft checkpoint. A trained head is searched in the speculators
    stage output (DIR/speculators/tiny/<method>, DIR/speculators/<method>) and
    must fit this verifier (the refusal rules of `onboard speculators`)."""
    if entry.model is not None:
        return entry.model, None
    if entry.method not in HEAD_METHODS:
        return None, f"{entry.method} needs a draft checkpoint (`model:` in the spec)"
    if speculators_dir is None:
        return None, (
            f"no trained {entry.method} draft: no speculators directory was given "
            "(`onboard new-model` passes DIR/speculators, written by its "
            "speculators stage)"
        )
    tried = []
    for head in (
        Path(speculators_dir) / "tiny" / entry.method,
        Path(speculators_dir) / entry.method,
    ):
        tried.append(str(head))
        if not any(head.glob("*.safetensors")):
            continue
        candidate = Speculator(
            method=entry.method,
            num_speculative_tokens=entry.num_speculative_tokens,
            model=str(head),
        )
        probe = spec.model_copy(update={"speculators": [candidate]})
        if not refusals(probe):
            return str(head), None
    return None, (
        f"no trained {entry.method} draft that fits this verifier in "
        f"{' or '.join(tried)} (a config without weights cannot be served; the "
        "speculators stage trains one for the tiny checkpoint)"
    )


def _mtp_refusals(spec: ModelSpec, entry: Speculator, at: str) -> list[str]:
    if spec.mtp is None:
        return [
            f"{at}: mtp needs MTP heads, and the model has none (no `mtp:` section)"
        ]
    return []


def _read_draft_config(model: str, at: str) -> dict[str, Any] | None:
    """The draft's config.json where it is a local directory (a Hub id is read by
    vLLM at serve time; nothing can be fetched here)."""
    path = Path(model)
    if not path.exists():
        return None
    config_path = path / "config.json" if path.is_dir() else path
    if config_path.exists() and not config_path.is_file():
        # /dev/zero or a FIFO would be read forever.
        raise InputError(f"{at}: {config_path}: not a regular file")
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise InputError(f"{at}: {path} has no config.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{at}: {config_path}: invalid JSON: {exc}") from None
    except OSError as exc:
        raise InputError(f"{at}: {config_path}: cannot read: {exc}") from None
    if not isinstance(config, dict):
        raise InputError(f"{at}: {config_path}: not a JSON object")
    return config


def _draft_refusals(spec: ModelSpec, entry: Speculator, at: str) -> list[str]:
    assert entry.model is not None
    config = _read_draft_config(entry.model, at)
    if config is None:
        return []
    problems = []
    if entry.method == "draft_model":
        vocab = config.get("vocab_size")
        if vocab is not None and vocab != spec.vocab_size:
            problems.append(
                f"{at}: the draft model's vocab_size is {vocab} but the verifier's is "
                f"{spec.vocab_size}; vLLM requires the same vocabulary"
            )
        mtp = _vllm_mtp_rewrite(entry.model)
        if mtp is not None:
            problems.append(
                f"{at}: vLLM rewrites a {config.get('model_type')!r} draft into its "
                f"MTP draft {mtp} and runs method mtp instead; use a draft of "
                "another family"
            )
        return problems
    kind = config.get("speculators_model_type")
    if kind is None:
        problems.append(
            f"{at}: {entry.model} is not a speculators-format head "
            "(no speculators_model_type in its config.json)"
        )
        return problems
    wanted = speculators_type(entry.method)
    if kind != wanted:
        # A dflash2 head listed as dflash would draft as plain DFlash on vLLM's
        # V1 runner, which refuses it (vllm/config/vllm.py:2987-2991).
        named = {v: k for k, v in SPECULATORS_TYPE.items()}.get(kind, kind)
        problems.append(
            f"{at}: {entry.model} is a {kind!r} head, not {wanted!r} (list it as "
            f"method {named})"
        )
    layer = config.get("transformer_layer_config") or {}
    expects = config.get("target_hidden_size") or layer.get("hidden_size")
    if expects != spec.hidden_size:
        problems.append(
            f"{at}: the draft reads verifier hidden states of size {expects} but the "
            f"verifier's hidden_size is {spec.hidden_size}"
        )
    vocab = layer.get("vocab_size")
    if vocab is not None and vocab != spec.vocab_size:
        problems.append(
            f"{at}: the draft's vocab_size is {vocab} but the verifier's is "
            f"{spec.vocab_size}"
        )
    return problems


def _vllm_mtp_rewrite(model: str) -> str | None:
    """The MTP architecture vLLM's own draft-config override turns this draft
    checkpoint into (vLLM 0.32 does it for every draft, e.g. DeepSeek-V3 ->
    DeepSeekMTPModel), or None."""
    try:
        from typing import get_args

        from transformers import AutoConfig
        from vllm.config.speculative import MTPModelTypes, SpeculativeConfig
    except ImportError:
        return None
    try:
        hf = SpeculativeConfig.hf_config_override(AutoConfig.from_pretrained(model))
    except Exception:  # a config transformers cannot read: vLLM's own error later
        return None
    if hf.model_type in get_args(MTPModelTypes):
        return (hf.architectures or [hf.model_type])[0]
    return None


def speculative_config(entry: Speculator, draft: str | None) -> dict[str, Any]:
    """The ``--speculative-config`` for one spec entry; ``draft`` is the draft
    checkpoint (the entry's own ``model`` or the head directory onboard wrote)."""
    cfg: dict[str, Any] = {
        "method": vllm_method(entry.method),
        "num_speculative_tokens": entry.num_speculative_tokens,
    }
    if entry.method == "p_eagle":
        cfg["parallel_drafting"] = True
    if entry.method in ADAPTIVE_METHODS:
        cfg["enable_adaptive_verification"] = True
    if entry.method == "ngram":
        cfg["prompt_lookup_min"] = PROMPT_LOOKUP_MIN
        cfg["prompt_lookup_max"] = PROMPT_LOOKUP_MAX
    if entry.method in DRAFT_METHODS:
        assert draft is not None
        cfg["model"] = draft
    return cfg
