"""Every generated file imports vLLM's layers, distributed, config, attention and
model-interface/utility modules (and torch, transformers' base config class), never
another model's module (sparse MLA takes one layer from vLLM's DeepSeek-V2 module, its
index-key cache), and subclasses no model class. The one exception is the
MTP draft, which imports its blocks from its own model file (``from .<module>
import ...``, as vLLM's deepseek_mtp imports deepseek_v2)."""

from __future__ import annotations

import ast

import pytest
from generate_variants import ALL, any_spec

from onboard.generate import generate_files

# Module prefixes a generated file may import from.
ALLOWED_PREFIXES = (
    "collections.abc",
    "contextlib",
    "itertools",
    "math",
    "re",
    "typing",
    "torch",
    "vllm.compilation",
    "vllm.config",
    "vllm.distributed",
    "vllm.sequence",
    "vllm.model_executor.layers",
    "vllm.model_executor.models.interfaces",
    "vllm.model_executor.models.utils",
)
# Other vLLM entry points allowed by name (the plugin's lazy registration).
ALLOWED_EXACT = {
    "vllm": {"ModelRegistry"},
    "transformers": {"AutoConfig", "PreTrainedConfig"},
    # A parameter's own weight loader (Cohere's per-head q/k norm rows).
    "vllm.model_executor.utils": {"set_weight_attrs"},
    # The loader of a parameter split along dim 0 over the tensor-parallel ranks
    # (attention sinks, one per head).
    # (and the plain loader, for the KDA layer's gated-norm weight).
    "vllm.model_executor.model_loader.weight_utils": {
        "sharded_weight_loader",
        "default_weight_loader",
    },
    # Sparse MLA's index-key cache layer (a layer, not a model: vLLM's own
    # DeepSeek-V3.2 indexer's) and the indexer's prefill buffer size.
    "vllm.model_executor.models.deepseek_v2": {"DeepseekV32IndexerCache"},
    "vllm.v1.attention.backends.mla.indexer": {"get_max_prefill_buffer_size"},
    # The config convertor registry (an MLA model type vLLM does not list).
    "vllm.transformers_utils": {"model_arch_config_convertor"},
    # The typed config class, as transformers' own configs declare theirs.
    "huggingface_hub.dataclasses": {"strict"},
}
# What the plugin's register() may import besides: the environment variable that
# lets it replace an architecture vLLM serves, and vLLM's logger that says so.
INIT_IMPORTS = {"os": None, "vllm.logger": {"init_logger"}}
# The plugin's runtime patch of the released vLLM (MLA layers sharing a latent
# cache, docs/generate.md) imports what it patches; no other file may.
PATCH_FILE = "mla_kv_sharing.py"
PATCH_IMPORTS = {
    "functools",
    "inspect",
    "vllm",
    "vllm.transformers_utils.model_arch_config_convertor",
    "vllm.v1.worker.gpu_model_runner",
}
# Bases a generated class may have besides classes of the same file.
ALLOWED_BASES = {
    "PreTrainedConfig",
    "nn.Module",
    "EagleModelMixin",
    # A model with linear-attention layers: vLLM's hybrid-cache interfaces.
    "HasInnerState",
    # vLLM's own KDA layer (a layer, not a model), given the checkpoint's names.
    "KimiGatedDeltaNetAttention",
    "IsHybrid",
    # The plugin's convertor for an MLA model type vLLM does not list.
    "convertors.ModelArchConfigConvertorBase",
    "MixtureOfExperts",
    "SupportsEagle3",
    "SupportsLoRA",
    "SupportsPP",
    "SupportsQuant",
}


def _allowed_module(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in ALLOWED_PREFIXES)


def check_file(path: str, source: str, module_name: str = "") -> list[str]:
    """Problems with one generated Python file (empty when it is fine)."""
    own_package = f"onboard_plugin_{module_name}"
    patch_imports = PATCH_IMPORTS if path.endswith(f"/{PATCH_FILE}") else set()
    problems = []
    tree = ast.parse(source, filename=path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if path.endswith("__init__.py") and alias.name in INIT_IMPORTS:
                    continue
                if not (_allowed_module(alias.name) or alias.name in patch_imports):
                    problems.append(f"{path}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                # Only the MTP draft, from its own model file.
                sibling = node.level == 1 and module == module_name
                if not (sibling and path.endswith(f"/{module_name}_mtp.py")):
                    problems.append(f"{path}:{node.lineno}: relative import .{module}")
            elif path.endswith("__init__.py") and INIT_IMPORTS.get(module):
                bad = {a.name for a in node.names} - INIT_IMPORTS[module]
                if bad:
                    problems.append(f"{path}:{node.lineno}: from {module} import ...")
            elif module in ALLOWED_EXACT:
                bad = {a.name for a in node.names} - ALLOWED_EXACT[module]
                if bad:
                    problems.append(
                        f"{path}:{node.lineno}: from {module} import "
                        f"{', '.join(sorted(bad))}"
                    )
            elif module in (
                f"{own_package}.config",
                f"{own_package}.mla_kv_sharing",
            ) and path.endswith("__init__.py"):
                pass  # the plugin's config class and patch, imported by register()
            elif module in patch_imports:
                pass
            elif not _allowed_module(module):
                problems.append(f"{path}:{node.lineno}: from {module} import ...")
            if module.startswith(("vllm.model_executor.models.", "transformers.")) and (
                module not in ALLOWED_EXACT
            ):
                if module.rsplit(".", 1)[-1] not in ("interfaces", "utils"):
                    problems.append(f"{path}:{node.lineno}: model module {module}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and (node.func.id in ("__import__", "exec", "eval"))
        ):
            problems.append(f"{path}:{node.lineno}: dynamic {node.func.id}()")
    local_classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = ast.unparse(base)
                if name not in local_classes and name not in ALLOWED_BASES:
                    problems.append(
                        f"{path}:{node.lineno}: class {node.name} subclasses {name}"
                    )
    return problems


@pytest.mark.parametrize("name", ALL)
def test_generated_files_import_no_model_module(name):
    # Standalone: a modular file imports its family's module by design
    # (tests/test_modular.py).
    files = generate_files(any_spec(name), standalone=True)
    # The HF reference (hf/) has its own AST test in test_reference_ast.py.
    py = {
        p: s for p, s in files.items() if p.startswith("plugin/") and p.endswith(".py")
    }
    spec = any_spec(name)
    package = f"plugin/onboard_plugin_{spec.module_name}"
    expected = {f"{package}/__init__.py", f"{package}/{spec.module_name}.py"}
    if spec.mtp is not None:
        expected.add(f"{package}/{spec.module_name}_mtp.py")  # the MTP draft
    if spec.attention.type == "mla" and spec.attention.kv_sharing:
        expected.add(f"{package}/{PATCH_FILE}")  # the runtime patch
    # + config.py for a model type transformers lacks
    assert set(py) - expected in (set(), {f"{package}/config.py"})
    assert expected <= set(py)
    problems = [
        p for path, src in py.items() for p in check_file(path, src, spec.module_name)
    ]
    assert not problems, "\n".join(problems)
    if spec.mtp is not None:
        # What the draft imports from its model file is defined there.
        model = ast.parse(py[f"{package}/{spec.module_name}.py"])
        defined = {n.name for n in model.body if isinstance(n, ast.ClassDef)}
        mtp = ast.parse(py[f"{package}/{spec.module_name}_mtp.py"])
        imported = {
            alias.name
            for node in mtp.body
            if isinstance(node, ast.ImportFrom) and node.level
            for alias in node.names
        }
        assert imported and imported <= defined, (imported, defined)


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from vllm.model_executor.models.llama import LlamaMLP\n", "model module"),
        ("import transformers.models.llama.modeling_llama\n", "import transformers"),
        ("from transformers import LlamaForCausalLM\n", "from transformers import"),
        ("from .llama import X\n", "relative import"),
        (
            "from vllm.model_executor.models.interfaces import SupportsPP\n"
            "class A(SupportsPP, LlamaForCausalLM):\n    pass\n",
            "subclasses",
        ),
        ("import os\n", "import os"),
    ],
)
def test_the_checker_catches_model_imports(source, expected):
    # The rule above must be able to fail.
    problems = check_file("x.py", source)
    assert any(expected in p for p in problems), problems


def test_only_the_mtp_draft_imports_only_its_own_model_file():
    sibling = "from .m import MDecoderLayer\n"
    assert check_file("p/m_mtp.py", sibling, "m") == []
    assert check_file("p/m.py", sibling, "m")  # not the MTP file
    assert check_file("p/m_mtp.py", "from .llama import X\n", "m")
    assert check_file("p/m_mtp.py", "from ..m import X\n", "m")


# ---- PR model files hold only what vLLM would merge ------------------------------

PLATFORM_CHECKS = {"is_cpu", "is_cuda", "is_rocm", "is_xpu", "is_tpu", "is_cuda_alike"}


def model_file_problems(path: str, source: str) -> list[str]:
    """What a generated model file may not hold: a platform branch
    (``current_platform``, ``is_cpu()``) or a monkeypatch (an assignment to, or a
    ``setattr`` on, something the file imported). What vLLM's CPU build needs for
    validation is onboard.runtime.compat's, installed into the engine only."""
    tree = ast.parse(source, filename=path)
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
    problems = []

    def root(node: ast.AST) -> str | None:
        while isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    for node in ast.walk(tree):
        where = f"{path}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Name) and node.id == "current_platform":
            problems.append(f"{where}: current_platform")
        elif isinstance(node, ast.Attribute) and node.attr in PLATFORM_CHECKS:
            problems.append(f"{where}: .{node.attr}")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and root(target) in imported:
                    problems.append(f"{where}: patches {ast.unparse(target)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and node.args
            and root(node.args[0]) in imported
        ):
            problems.append(f"{where}: setattr on {ast.unparse(node.args[0])}")
    return problems


@pytest.mark.parametrize("name", ALL)
def test_pr_model_files_have_no_platform_branch_or_patch(name):
    """The model files of the PR tree (the plugin's, with vLLM's header) branch
    on no platform and patch nothing of vLLM's."""
    spec = any_spec(name)
    files = generate_files(spec)
    package = f"plugin/onboard_plugin_{spec.module_name}"
    models = [f"{package}/{spec.module_name}.py"]
    if spec.mtp is not None:
        models.append(f"{package}/{spec.module_name}_mtp.py")
    problems = [p for path in models for p in model_file_problems(path, files[path])]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "source, expected",
    [
        (
            "from vllm.platforms import current_platform\n"
            "if current_platform.is_cpu():\n    pass\n",
            "current_platform",
        ),
        ("def f(p):\n    return p.is_cpu()\n", ".is_cpu"),
        (
            "from vllm.x import Backend\nBackend.supports = classmethod(f)\n",
            "patches Backend.supports",
        ),
        ("import vllm\nsetattr(vllm.x, 'y', 1)\n", "setattr on vllm.x"),
    ],
)
def test_the_model_file_checker_can_fail(source, expected):
    problems = model_file_problems("m.py", source)
    assert any(expected in p for p in problems), problems
    # An attribute of the module's own objects is no patch.
    assert not model_file_problems(
        "m.py", "class A:\n    def f(self):\n        self.x = 1\n"
    )
