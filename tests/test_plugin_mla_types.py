"""The plugin's list of the model types vLLM caches as MLA, against the installed
vLLM: a model type off that list gets a config convertor from the plugin (or vLLM
sizes its cache by head_dim and refuses the MLA layer), one on it gets none."""

from __future__ import annotations

import ast
import inspect

from onboard.generate import generate_files
from onboard.generate.plugin import VLLM_MLA_MODEL_TYPES
from onboard.spec import load_spec


def _vllm_mla_model_types() -> set[str]:
    import vllm.config  # noqa: F401  (the convertor module imports through it)
    from vllm.transformers_utils.model_arch_config_convertor import (
        ModelArchConfigConvertorBase,
    )

    source = inspect.getsource(ModelArchConfigConvertorBase.is_deepseek_mla)
    tree = ast.parse(inspect.cleandoc("\n" + source))
    # The first `model_type in (...)` test is vLLM's list.
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In):
            return {elt.value for elt in node.comparators[0].elts}
    raise AssertionError("no model type list in is_deepseek_mla")


def test_the_list_is_vllms():
    assert set(VLLM_MLA_MODEL_TYPES) == _vllm_mla_model_types()


def _init(spec_path: str) -> str:
    files = generate_files(load_spec(spec_path))
    return next(text for rel, text in files.items() if rel.endswith("/__init__.py"))


def test_only_an_unlisted_mla_model_type_gets_the_convertor():
    # deepseek_v3 is on vLLM's list; glm5_style is not.
    assert "_register_mla_cache" not in _init("model_specs/deepseek-v3-style.yaml")
    assert "_register_mla_cache()" in _init("model_specs/glm-5-style.yaml")
    assert "_register_mla_cache" not in _init("model_specs/dense-gqa.yaml")
