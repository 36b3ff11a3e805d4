"""The installable vLLM plugin package around the generated model file.

Layout (other stages rely on these exact names)::

    plugin/
      pyproject.toml          # distribution onboard-plugin-<name>
      README.md
      onboard_plugin_<module_name>/
        __init__.py           # register(): ModelRegistry.register_model(...)
        <module_name>.py      # the model; class named spec.architecture
"""

from __future__ import annotations

from onboard.generate.render import render_python, render_template
from onboard.spec.model import ModelSpec

PLUGIN_VERSION = "0.1.0"


def dist_name(spec: ModelSpec) -> str:
    return f"onboard-plugin-{spec.name}"


def package_name(spec: ModelSpec) -> str:
    return f"onboard_plugin_{spec.module_name}"


def model_class_path(spec: ModelSpec) -> str:
    """What the plugin registers: ``package.module:Class``."""
    return f"{package_name(spec)}.{spec.module_name}:{spec.architecture}"


def plugin_files(spec: ModelSpec, model_source: str) -> dict[str, str]:
    """Relative path -> text of every file of the plugin directory."""
    package = package_name(spec)
    context = {
        "spec": spec,
        "package": package,
        "module_name": spec.module_name,
        "dist_name": dist_name(spec),
        "version": PLUGIN_VERSION,
    }
    return {
        "pyproject.toml": render_template("plugin/pyproject.toml.j2", context),
        "README.md": render_template("plugin/README.md.j2", context),
        f"{package}/__init__.py": render_python(
            "plugin/__init__.py.j2", context, f"{package}/__init__.py"
        ),
        f"{package}/{spec.module_name}.py": model_source,
    }
