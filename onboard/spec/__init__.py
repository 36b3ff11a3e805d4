"""The declarative model spec: schema, YAML loading with located errors, HF mapping.

Names are imported on first use: a stage that needs only the tensor-name layouts
(``onboard.spec.layouts``, e.g. quantize on a checkpoint without a spec) does not
pay for pydantic and the schema.
"""

from importlib import import_module

_EXPORTS = {
    "Problem": "onboard.spec.loader",
    "SpecError": "onboard.spec.loader",
    "dump_spec": "onboard.spec.loader",
    "load_spec": "onboard.spec.loader",
    "parse_spec_text": "onboard.spec.loader",
    "ModelSpec": "onboard.spec.model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'onboard.spec' has no attribute {name!r}")
