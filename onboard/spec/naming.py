"""Names the generated plugin goes by, derived from the spec: the generator, the
PR tree and validation all need them and must agree."""

from __future__ import annotations

from onboard.spec.model import ModelSpec


def dist_name(spec: ModelSpec) -> str:
    return f"onboard-plugin-{spec.name}"


def package_name(spec: ModelSpec) -> str:
    return f"onboard_plugin_{spec.module_name}"


def model_class_path(spec: ModelSpec) -> str:
    """What the plugin registers: ``package.module:Class``."""
    return f"{package_name(spec)}.{spec.module_name}:{spec.architecture}"


# The environment variable that lets an installed generated plugin replace an
# architecture vLLM already serves (comma-separated architectures, or "all"):
# without it the plugin leaves vLLM's class in place.
OVERRIDE_ENV = "ONBOARD_OVERRIDE_ARCHITECTURES"
