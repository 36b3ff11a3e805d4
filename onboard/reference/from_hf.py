"""`onboard spec from-hf`: a published config.json (and what lies beside it) to a
proven spec and the header comment that says what was proven.

Beside the inference and proof (onboard.reference.infer), a config as the Hub
publishes it carries what is not architecture: the checkpoint's own
quantization (config.json's ``quantization_config``, or NVIDIA ModelOpt's
``hf_quant_config.json`` beside it), recorded as the spec's
``checkpoint.source_quantization``; keys that do not change the forward pass
(onboard.spec.hf.ACCEPTED and DUPLICATES), named in the header; and, for a
model type whose remote code is not beside the config, an ``architectures``
entry naming a class transformers ships (Kimi-K2's DeepseekV3ForCausalLM).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from onboard.errors import InputError, printable
from onboard.spec.model import ModelSpec

HF_QUANT_CONFIG = "hf_quant_config.json"


def infer_from_hf(
    config: Any,
    source: str,
    *,
    name: str | None = None,
    verify: bool = True,
    trust_remote_code: bool = False,
    log: Callable[[str], None] = lambda msg: None,
) -> tuple[str, ModelSpec]:
    """(the spec file's header, the spec): the spec inferred from ``config`` (read
    from ``source``) and, unless ``verify`` is off, proven against transformers'
    class for its family, or the family's own code (``auto_map``) beside it."""
    from onboard.spec.hf import (
        accepted_keys,
        model_type_of,
        source_quantization,
        source_quantization_note,
        spec_from_hf_config,
        transformers_knows,
    )

    model_type = model_type_of(config, source)
    directory = Path(source).parent
    hf_quant = (
        _hf_quant_config(directory) if Path(source).name == "config.json" else None
    )
    quant = source_quantization(config, hf_quant, source)
    notes = []
    shipped = _shipped_model_type(config, model_type, directory)
    if shipped is not None:
        arch = config["architectures"][0]
        notes.append(
            f"the config's model_type {model_type!r} names remote code (auto_map) "
            f"that is not beside the config; its architectures names {arch}, "
            f"transformers' class for {shipped!r}: read as {shipped!r}"
        )
        name = name or model_type.replace("_", "-")  # the model's own name
        config, model_type = {**config, "model_type": shipped}, shipped
    remote = None
    if verify and config.get("auto_map") and not transformers_knows(model_type):
        remote = _remote_code(config, model_type, directory, source, trust_remote_code)
    if not verify or (remote is None and not transformers_knows(model_type)):
        spec = spec_from_hf_config(config, name=name, source=source)
        why = (
            "not proven (--no-verify)"
            if not verify
            else f"not proven: transformers has no class for model_type "
            f"{model_type!r}; onboard's generated reference is its reference"
        )
    else:
        from onboard.reference.infer import infer_spec

        against = remote.description if remote else f"transformers' {model_type}"
        log(f"proving the spec against {against} ...")
        spec, proof = infer_spec(config, name=name, source=source, remote=remote)
        why = proof.header()
    if quant is not None:
        data = spec.model_dump(mode="json")
        data["checkpoint"]["source_quantization"] = quant
        spec = ModelSpec.model_validate(data)
        notes.append(source_quantization_note(quant))
    accepted = accepted_keys(config)
    if accepted:
        notes.append(
            "accepted, as they do not change the forward pass: " + "; ".join(accepted)
        )
    text = f"Inferred by `onboard spec from-hf`; {why}."
    lines = textwrap.wrap(text, 86, break_on_hyphens=False)
    for note in notes:
        lines += textwrap.wrap(
            note[:1].upper() + note[1:] + ".", 86, break_on_hyphens=False
        )
    lines += [
        "config.json states no licence: set `license:` to the weights' own before",
        "publishing.",
    ]
    return "".join(f"# {line}\n" for line in lines), spec


def _hf_quant_config(directory: Path) -> Any:
    """NVIDIA ModelOpt's hf_quant_config.json in ``directory``, parsed (None
    where there is none)."""
    path = directory / HF_QUANT_CONFIG
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}"
        ) from None


def _shipped_model_type(config: dict, model_type: str, directory: Path) -> str | None:
    """For a model type transformers does not ship whose remote code is not
    beside the config: the model type whose causal-LM class transformers ships
    under the config's ``architectures`` name (Kimi-K2's DeepseekV3ForCausalLM),
    where onboard knows that family's facts; else None."""
    from onboard.reference.remote import missing_remote_code
    from onboard.spec.hf import FAMILIES, transformers_knows

    architectures = config.get("architectures")
    if transformers_knows(model_type) or not isinstance(architectures, list):
        return None
    if len(architectures) != 1 or not config.get("auto_map"):
        return None
    if not missing_remote_code(config, directory):
        return None  # its own code is there: prove against it
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    )

    found = [
        mt
        for mt, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()
        if cls == architectures[0] and mt in FAMILIES
    ]
    return found[0] if len(found) == 1 else None


def _remote_code(
    config: dict, model_type: str, directory: Path, source: str, trusted: bool
):
    """The family's own code that ``config``'s auto_map names, loaded from
    ``directory`` to prove against; InputError naming what is missing or the flag
    that loading it needs."""
    from onboard.reference.remote import load_remote_code, missing_remote_code

    remote = printable(json.dumps(config["auto_map"]), 160)
    what = (
        f"{source}: model_type {model_type!r} is remote code (auto_map: {remote}), "
        "which transformers does not ship, and the config alone does not say what "
        "that code hard-codes (rope interleaving, norm placement, fused tensors)"
    )
    missing = missing_remote_code(config, directory)
    if missing:
        raise InputError(
            f"{what}. Its code is not beside the config ({'; '.join(missing)}), so "
            "from-hf cannot prove a spec against it: put the model's code files "
            "there, write the spec by hand, or pass --no-verify to write the "
            "inferred spec unproven"
        )
    if not trusted:
        raise InputError(
            f"{what}. Its code is in {directory}: pass --trust-remote-code to prove "
            "the spec against it (this runs that code), or --no-verify to write "
            "the inferred spec unproven"
        )
    return load_remote_code(config, directory, source)
