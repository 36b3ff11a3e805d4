"""The installable vLLM plugin package around the generated model file.

Layout (other stages rely on these exact names)::

    plugin/
      pyproject.toml          # distribution onboard-plugin-<name>
      README.md
      onboard_plugin_<module_name>/
        __init__.py           # register(): ModelRegistry.register_model(...)
        <module_name>.py      # the model; class named spec.architecture
        <module_name>_mtp.py  # only with MTP heads: the MTP draft model
        config.py             # only for a model type transformers does not know
"""

from __future__ import annotations

from onboard.arch import build_plan
from onboard.reference.context import config_class_context
from onboard.spec.model import ModelSpec, class_prefix
from onboard.spec.mtp import mtp_draft, mtp_module_name
from onboard.spec.naming import dist_name, package_name
from onboard.templating import render_python, render_template

PLUGIN_VERSION = "0.1.0"


def transformers_knows(model_type: str) -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


def plugin_files(
    spec: ModelSpec, model_source: str, mtp_source: str | None = None
) -> dict[str, str]:
    """Relative path -> text of every file of the plugin directory."""
    package = package_name(spec)
    new_model_type = not transformers_knows(spec.model_type)
    context = {
        "spec": spec,
        "package": package,
        "module_name": spec.module_name,
        "dist_name": dist_name(spec),
        "version": PLUGIN_VERSION,
        "new_model_type": new_model_type,
        "config_class": f"{class_prefix(spec.architecture)}Config",
        "mtp": mtp_draft(spec) if mtp_source is not None else None,
        "mtp_module": mtp_module_name(spec),
        "num_mtp_field": _num_mtp_field(spec) if mtp_source is not None else None,
    }
    files = {
        "pyproject.toml": render_template("plugin/pyproject.toml.j2", context),
        "README.md": render_template("plugin/README.md.j2", context),
        f"{package}/__init__.py": render_python(
            "plugin/__init__.py.j2", context, f"{package}/__init__.py"
        ),
        f"{package}/{spec.module_name}.py": model_source,
    }
    if mtp_source is not None:
        files[f"{package}/{mtp_module_name(spec)}.py"] = mtp_source
    if new_model_type:
        # Without it vLLM cannot even read config.json of a new model type.
        files[f"{package}/config.py"] = render_python(
            "plugin/config.py.j2",
            {**context, **config_class_context(spec)},
            f"{package}/config.py",
        )
    return files


def _num_mtp_field(spec: ModelSpec) -> str:
    """The config attribute holding the number of MTP heads."""
    assert spec.mtp is not None
    return build_plan(spec).config.need("num_mtp_layers", spec.mtp.num_heads)
