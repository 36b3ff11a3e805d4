"""The declarative model spec: schema, YAML loading with located errors, HF mapping."""

from onboard.spec.loader import (
    Problem,
    SpecError,
    dump_spec,
    load_spec,
    parse_spec_text,
)
from onboard.spec.model import LayerPlan, ModelSpec

__all__ = [
    "LayerPlan",
    "ModelSpec",
    "Problem",
    "SpecError",
    "dump_spec",
    "load_spec",
    "parse_spec_text",
]
