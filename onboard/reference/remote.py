"""A family's own code shipped beside its config (``auto_map``), to prove against.

A config.json whose model type transformers does not ship but whose ``auto_map``
names modeling code (Kimi-K2, and most launches before transformers has a class)
computes what that code computes, which the config alone does not state (Kimi-K2's
code interleaves rope without a key saying so). When that code is in the
checkpoint directory, `onboard spec from-hf --trust-remote-code` builds the tiny
model of the family with it and proves the inferred spec against it, as it does
against transformers' own classes. Loading it runs it, as transformers'
``trust_remote_code`` does: hence the flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onboard.errors import InputError, printable

# The auto classes the proof builds the family's model with.
AUTO_CLASSES = ("AutoConfig", "AutoModelForCausalLM")


@dataclass(frozen=True)
class RemoteCode:
    """The family's config and causal-LM classes, loaded from its directory."""

    directory: Path
    config_class: type
    model_class: type

    @property
    def description(self) -> str:
        return f"{self.model_class.__name__} from {self.directory}"


def _module_file(ref: Any) -> str | None:
    """``modeling_x.XForCausalLM`` -> ``modeling_x.py``; None for an entry in
    another repository (``org/repo--modeling_x.X``) or of another form."""
    if not isinstance(ref, str) or "--" in ref or "." not in ref:
        return None
    module = ref.rsplit(".", 1)[0]
    return module + ".py" if module.isidentifier() else None


def missing_remote_code(config: dict, directory: Path) -> list[str]:
    """What of the code ``config["auto_map"]`` names is not in ``directory``, one
    phrase each; empty when it all is."""
    auto_map = config.get("auto_map")
    auto_map = auto_map if isinstance(auto_map, dict) else {}
    missing = []
    for auto in AUTO_CLASSES:
        ref = auto_map.get(auto)
        file = _module_file(ref)
        if ref is None:
            missing.append(f"auto_map.{auto} is not set")
        elif file is None:
            shown = printable(repr(ref), 80)
            missing.append(f"auto_map.{auto} = {shown} names no file in {directory}")
        elif not (directory / file).is_file():
            missing.append(f"{file} (auto_map.{auto}) is not in {directory}")
    return missing


def load_remote_code(config: dict, directory: Path, source: str) -> RemoteCode:
    """Import the family's classes from ``directory`` (this runs its code)."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    from onboard.spec.hf import quiet_transformers

    auto_map = config["auto_map"]
    classes = []
    for auto in AUTO_CLASSES:
        try:
            with quiet_transformers():
                cls = get_class_from_dynamic_module(
                    auto_map[auto], str(directory), local_files_only=True
                )
        except Exception as exc:  # the code's own import errors
            detail = printable(" ".join(f"{type(exc).__name__}: {exc}".split()), 300)
            raise InputError(
                f"{source}: auto_map.{auto} ({auto_map[auto]}) cannot be loaded "
                f"from {directory}: {detail}"
            ) from None
        classes.append(cls)
    config_class, model_class = classes
    declared = getattr(config_class, "model_type", None)
    if declared != config.get("model_type"):
        raise InputError(
            f"{source}: auto_map.AutoConfig is {config_class.__name__}, whose "
            f"model_type is {declared!r}, not the config's "
            f"{config.get('model_type')!r}"
        )
    return RemoteCode(directory, config_class, model_class)
