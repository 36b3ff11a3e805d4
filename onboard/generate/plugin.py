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
        mla_kv_sharing.py     # only for MLA layers sharing a cache: the runtime
                              # patch of the released vLLM (docs/generate.md)
"""

from __future__ import annotations

from onboard import VLLM_VERSION
from onboard.arch import build_plan
from onboard.reference.context import config_class_context
from onboard.spec.hf import find_base
from onboard.spec.model import ModelSpec, class_prefix
from onboard.spec.mtp import mtp_draft, mtp_module_name
from onboard.spec.naming import OVERRIDE_ENV, dist_name, package_name
from onboard.templating import render_python, render_template

PLUGIN_VERSION = "0.1.0"

# The model types vLLM 0.32 caches as MLA (its config convertor's
# is_deepseek_mla list; tests/test_plugin.py checks it against the installed
# vLLM). Any other MLA model type needs the plugin to say it is MLA.
VLLM_MLA_MODEL_TYPES = frozenset(
    """
    axk1 deepseek_v2 deepseek_v3 deepseek_v32 deepseek_v4 deepseek_v41 dots3_note
    deepseek_mtp k3_dspark glm5_next glm5_next_text glm_moe_dsa glm4_moe_lite
    glm4_moe_lite_mtp kimi_k2 kimi_linear longcat_flash pangu_ultra_moe
    pangu_ultra_moe_mtp bailing_hybrid bailing_hybrid_mtp bailing_hybrid_v3_mtp
    hy_v4 hy_v4_mtp
    """.split()
)


def transformers_knows(model_type: str) -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


def plugin_files(
    spec: ModelSpec,
    model_source: str,
    mtp_source: str | None = None,
    standalone: bool = False,
) -> dict[str, str]:
    """Relative path -> text of every file of the plugin directory
    (``standalone``: as :func:`onboard.generate.render_model`)."""
    package = package_name(spec)
    new_model_type = not transformers_knows(spec.model_type)
    base = None if standalone else find_base(spec)
    context = {
        "spec": spec,
        "package": package,
        "module_name": spec.module_name,
        "dist_name": dist_name(spec),
        "version": PLUGIN_VERSION,
        "new_model_type": new_model_type,
        # A model type vLLM does not list as MLA caches MLA's latent only when
        # the plugin says it is MLA.
        "mla_cache": spec.attention.type == "mla"
        and spec.model_type not in VLLM_MLA_MODEL_TYPES,
        "config_class": f"{class_prefix(spec.architecture)}Config",
        "mtp": mtp_draft(spec, standalone) if spec.mtp is not None else None,
        "mtp_module": mtp_module_name(spec),
        "num_mtp_field": _num_mtp_field(spec) if spec.mtp is not None else None,
        "mla_kv_sharing": needs_mla_kv_sharing_patch(spec),
        "override_env": OVERRIDE_ENV,
        "base": base.base if base is not None else None,
        "renames": bool(base.renames) if base is not None else False,
        "deltas": [
            d.description.format(family=f"`{base.base.architecture}`")
            for d in base.deltas
        ]
        if base is not None
        else [],
        "vllm_series": vllm_series(),
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
    if context["mla_kv_sharing"]:
        files[f"{package}/mla_kv_sharing.py"] = render_python(
            "plugin/mla_kv_sharing.py.j2", context, f"{package}/mla_kv_sharing.py"
        )
    if new_model_type:
        # Without it vLLM cannot even read config.json of a new model type.
        files[f"{package}/config.py"] = (
            render_python(
                "modular/config.py.j2",
                context,
                f"{package}/config.py",
            )
            if base is not None
            else render_python(
                "plugin/config.py.j2",
                {**context, **config_class_context(spec)},
                f"{package}/config.py",
            )
        )
    return files


def needs_mla_kv_sharing_patch(spec: ModelSpec) -> bool:
    """MLA layers that read an earlier layer's cache: released vLLM refuses them
    until the plugin's runtime patch (mla_kv_sharing.py) is applied."""
    return spec.attention.type == "mla" and bool(spec.attention.kv_sharing)


def vllm_series() -> str:
    """The vLLM minor series the generated code is written against ("0.32")."""
    return ".".join(VLLM_VERSION.split(".")[:2])


def _num_mtp_field(spec: ModelSpec) -> str:
    """The config attribute holding the number of MTP heads."""
    assert spec.mtp is not None
    return build_plan(spec).config.need("num_nextn_predict_layers", spec.mtp.num_heads)
