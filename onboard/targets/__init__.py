"""Hardware target profiles: one data file (profiles.yaml), typed by pydantic.

``load_profiles()`` returns every target by name; ``get_target(name)`` one of them
(an unknown name is an :class:`~onboard.errors.InputError`). What each field means
and where each fact comes from is in docs/targets.md.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from onboard.errors import InputError
from onboard.spec.model import QUANT_SCHEMES, TARGETS

PROFILES_FILE = Path(__file__).with_name("profiles.yaml")
# bf16 (the unquantized checkpoint) and every quantization scheme of the spec.
SCHEMES = ("bf16", *QUANT_SCHEMES)

Support = Literal["native", "emulated", "unsupported"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SchemeSupport(_Strict):
    """How vLLM 0.32 runs one checkpoint scheme on a target."""

    support: Support
    linear: str | None = None  # linear kernel vLLM selects first
    moe: str | None = None  # MoE backend vLLM selects first
    # MoE experts' support where it differs from the linear layers' (e.g. the
    # CPU FP8 MoE kernels take block FP8 only).
    moe_support: Support | None = None
    note: str = ""

    def level(self, moe: bool) -> Support:
        """Support for a model with (``moe``) or without MoE layers."""
        if moe and self.moe_support is not None:
            return self.moe_support
        return self.support


class Backends(_Strict):
    """Attention, MLA and unquantized-MoE backends vLLM picks on the target."""

    attention: str
    mla: str
    moe: str

    @property
    def attention_name(self) -> str:
        """The AttentionBackendEnum member name (first word of ``attention``)."""
        return self.attention.split()[0]

    @property
    def mla_name(self) -> str:
        return self.mla.split()[0]


class VllmPackage(_Strict):
    package: str
    install: str


class TargetProfile(_Strict):
    """One hardware target."""

    name: str
    description: str
    vendor: str
    platform: Literal["cpu", "cuda", "rocm"]
    arch: str
    memory_gb: float | None = Field(
        description="Vendor per-device memory, decimal GB; null: the host's memory."
    )
    devices_per_node: int = Field(gt=0)
    scale_up_devices: int = Field(
        gt=0, description="Devices in one NVLink/xGMI domain."
    )
    interconnect: str
    fp8_dtype: Literal["float8_e4m3fn", "float8_e4m3fnuz"]
    memory_utilization: float = Field(gt=0, le=1)
    overhead_gib: float = Field(ge=0, description="Non-torch memory per device.")
    max_num_batched_tokens: int = Field(gt=0)
    kv_block_size: dict[Literal["attention", "mla"], int] | None = None
    vllm: VllmPackage
    env: dict[str, str]
    backends: Backends
    schemes: dict[str, SchemeSupport]
    sources: list[str]

    @model_validator(mode="after")
    def _every_scheme(self) -> TargetProfile:
        missing = set(SCHEMES) - set(self.schemes)
        extra = set(self.schemes) - set(SCHEMES)
        if missing or extra:
            raise ValueError(
                f"schemes must name exactly {', '.join(SCHEMES)} "
                f"(missing {sorted(missing)}, unknown {sorted(extra)})"
            )
        return self

    @property
    def is_gpu(self) -> bool:
        return self.platform != "cpu"

    def scheme(self, name: str) -> SchemeSupport:
        try:
            return self.schemes[name]
        except KeyError:
            raise InputError(
                f"--scheme: unknown scheme {name!r}; choose one of {', '.join(SCHEMES)}"
            ) from None


def load_profiles(path: Path = PROFILES_FILE) -> dict[str, TargetProfile]:
    """Every target profile in ``path``, by name (validated)."""
    return dict(_load(path))


@cache
def _load(path: Path) -> tuple[tuple[str, TargetProfile], ...]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"{path}: cannot read target profiles: {exc}") from None
    targets = (data or {}).get("targets")
    if not isinstance(targets, dict):
        raise InputError(f"{path}: expected a `targets:` mapping")
    out = []
    for name, body in targets.items():
        try:
            out.append((name, TargetProfile.model_validate({"name": name, **body})))
        except ValidationError as exc:
            raise InputError(
                "\n".join(
                    f"{path}: targets.{'.'.join(map(str, (name, *e['loc'])))}: "
                    f"{e['msg']}"
                    for e in exc.errors()
                )
            ) from None
    return tuple(out)


def get_target(name: str) -> TargetProfile:
    profiles = load_profiles()
    if name not in profiles:
        raise InputError(
            f"--target: unknown target {name!r} (known: {', '.join(profiles)})"
        )
    return profiles[name]


__all__ = [
    "SCHEMES",
    "TARGETS",
    "Backends",
    "SchemeSupport",
    "TargetProfile",
    "get_target",
    "load_profiles",
]
