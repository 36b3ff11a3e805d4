"""Jinja rendering, import collection and ruff formatting of generated Python."""

from __future__ import annotations

import ast
import builtins
import itertools
import math
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

import onboard
from onboard.errors import InputError

TEMPLATES = Path(onboard.__file__).resolve().parents[1] / "templates"

# vLLM's own ruff settings (line length 88, vLLM's import order), so generated code
# reads like vLLM's and can be copied into a vLLM pull request as it is.
RUFF_SETTINGS = (
    "line-length = 88",
    'target-version = "py310"',
    'lint.select = ["E", "F", "I", "UP", "B", "SIM"]',
    'lint.isort.known-first-party = ["vllm", "onboard_plugin_*"]',
)

# Where each name a generated file may use comes from. Only these modules may be
# imported: vLLM's layers, distributed, config, attention and model-interface /
# utility modules, torch, and transformers' base config class (never a model).
IMPORTS: dict[str, tuple[str, str | None]] = {
    # name: (module, imported name or None for `import module`)
    "math": ("math", None),
    "re": ("re", None),
    "Iterable": ("collections.abc", "Iterable"),
    "islice": ("itertools", "islice"),
    "torch": ("torch", None),
    "nn": ("torch", "nn"),
    "PreTrainedConfig": ("transformers", "PreTrainedConfig"),
    "support_torch_compile": ("vllm.compilation.decorators", "support_torch_compile"),
    "CacheConfig": ("vllm.config", "CacheConfig"),
    "VllmConfig": ("vllm.config", "VllmConfig"),
    "get_ep_group": ("vllm.distributed", "get_ep_group"),
    "get_pp_group": ("vllm.distributed", "get_pp_group"),
    "get_tensor_model_parallel_rank": (
        "vllm.distributed",
        "get_tensor_model_parallel_rank",
    ),
    "get_tensor_model_parallel_world_size": (
        "vllm.distributed",
        "get_tensor_model_parallel_world_size",
    ),
    "tensor_model_parallel_all_gather": (
        "vllm.distributed",
        "tensor_model_parallel_all_gather",
    ),
    "tensor_model_parallel_all_reduce": (
        "vllm.distributed",
        "tensor_model_parallel_all_reduce",
    ),
    "split_tensor_along_last_dim": (
        "vllm.distributed.utils",
        "split_tensor_along_last_dim",
    ),
    "GeluAndMul": ("vllm.model_executor.layers.activation", "GeluAndMul"),
    "SiluAndMul": ("vllm.model_executor.layers.activation", "SiluAndMul"),
    "Attention": ("vllm.model_executor.layers.attention", "Attention"),
    "FusedMoEFactory": ("vllm.model_executor.layers.fused_moe", "FusedMoEFactory"),
    "GateLinear": ("vllm.model_executor.layers.fused_moe", "GateLinear"),
    "GemmaRMSNorm": ("vllm.model_executor.layers.layernorm", "GemmaRMSNorm"),
    "LayerNorm": ("vllm.model_executor.layers.layernorm", "LayerNorm"),
    "set_weight_attrs": ("vllm.model_executor.utils", "set_weight_attrs"),
    "RMSNorm": ("vllm.model_executor.layers.layernorm", "RMSNorm"),
    "ColumnParallelLinear": (
        "vllm.model_executor.layers.linear",
        "ColumnParallelLinear",
    ),
    "MergedColumnParallelLinear": (
        "vllm.model_executor.layers.linear",
        "MergedColumnParallelLinear",
    ),
    "QKVParallelLinear": ("vllm.model_executor.layers.linear", "QKVParallelLinear"),
    "ReplicatedLinear": ("vllm.model_executor.layers.linear", "ReplicatedLinear"),
    "RowParallelLinear": ("vllm.model_executor.layers.linear", "RowParallelLinear"),
    "LogitsProcessor": (
        "vllm.model_executor.layers.logits_processor",
        "LogitsProcessor",
    ),
    "KimiGatedDeltaNetAttention": (
        "vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn",
        "KimiGatedDeltaNetAttention",
    ),
    "QwenGatedDeltaNetAttention": (
        "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
        "QwenGatedDeltaNetAttention",
    ),
    **{
        name: ("vllm.model_executor.layers.mamba.mamba_utils", name)
        for name in (
            "MambaStateCopyFunc",
            "MambaStateCopyFuncCalculator",
            "MambaStateDtypeCalculator",
            "MambaStateShapeCalculator",
        )
    },
    "MLAAttention": ("vllm.model_executor.layers.attention", "MLAAttention"),
    "ChunkedLocalAttention": (
        "vllm.model_executor.layers.attention",
        "ChunkedLocalAttention",
    ),
    "MLAModules": ("vllm.model_executor.layers.mla", "MLAModules"),
    "MultiHeadLatentAttentionWrapper": (
        "vllm.model_executor.layers.mla",
        "MultiHeadLatentAttentionWrapper",
    ),
    "QuantizationConfig": (
        "vllm.model_executor.layers.quantization",
        "QuantizationConfig",
    ),
    "get_rope": ("vllm.model_executor.layers.rotary_embedding", "get_rope"),
    "ParallelLMHead": (
        "vllm.model_executor.layers.vocab_parallel_embedding",
        "ParallelLMHead",
    ),
    "VocabParallelEmbedding": (
        "vllm.model_executor.layers.vocab_parallel_embedding",
        "VocabParallelEmbedding",
    ),
    **{
        name: ("vllm.model_executor.models.interfaces", name)
        for name in (
            "EagleModelMixin",
            "HasInnerState",
            "IsHybrid",
            "MixtureOfExperts",
            "SupportsEagle3",
            "SupportsLoRA",
            "SupportsPP",
            "SupportsQuant",
        )
    },
    **{
        name: ("vllm.model_executor.models.utils", name)
        for name in (
            "AutoWeightsLoader",
            "PPMissingLayer",
            "WeightsMapper",
            "extract_layer_index",
            "make_empty_intermediate_tensors_factory",
            "make_layers",
            "maybe_prefix",
            "spec_decode_needs_target_embed",
        )
    },
    "default_weight_loader": (
        "vllm.model_executor.model_loader.weight_utils",
        "default_weight_loader",
    ),
    "sharded_weight_loader": (
        "vllm.model_executor.model_loader.weight_utils",
        "sharded_weight_loader",
    ),
    "IntermediateTensors": ("vllm.sequence", "IntermediateTensors"),
    # Sparse MLA's lightning indexer: vLLM's indexer op, its key cache layer, the
    # FP8 quantization of its queries.
    "SparseAttnIndexer": (
        "vllm.model_executor.layers.sparse_attn_indexer",
        "SparseAttnIndexer",
    ),
    "DeepseekV32IndexerCache": (
        "vllm.model_executor.models.deepseek_v2",
        "DeepseekV32IndexerCache",
    ),
    "per_token_group_quant_fp8": (
        "vllm.model_executor.layers.quantization.utils.fp8_utils",
        "per_token_group_quant_fp8",
    ),
    "get_max_prefill_buffer_size": (
        "vllm.v1.attention.backends.mla.indexer",
        "get_max_prefill_buffer_size",
    ),
    "get_current_vllm_config": ("vllm.config", "get_current_vllm_config"),
}


class RenderError(RuntimeError):
    """Generated code that does not parse or is not lint-clean: a template bug."""


def docwrap(text: str, indent: int) -> str:
    """Wrap a docstring body to fit line length 88 at ``indent`` spaces."""
    width = 88 - indent - 3  # room for the closing quotes
    paragraphs = [p for p in text.split("\n\n")]
    lines: list[str] = []
    for i, para in enumerate(paragraphs):
        if i:
            lines.append("")
        lines += textwrap.wrap(" ".join(para.split()), width=width) or [""]
    if len(lines) == 1 and len(lines[0]) > width - 3:
        # One line holds the opening quotes as well as the closing ones.
        lines = textwrap.wrap(lines[0], width=width - 3)
    pad = " " * indent
    out = ("\n").join(
        pad + line if line and n else line for n, line in enumerate(lines)
    )
    return out + (f"\n{pad}" if len(lines) > 1 else "")


def commentwrap(text: str, indent: int) -> str:
    """Wrap a ``#`` comment's text to fit line length 88 at ``indent`` spaces (the
    template writes the first line's ``# ``)."""
    lines = textwrap.wrap(" ".join(text.split()), width=88 - indent - 2)
    return f"\n{' ' * indent}# ".join(lines)


def _prose_kind(line: str) -> str:
    """What :func:`fit` may reflow a line with: the licence line stays alone."""
    if line.startswith("# SPDX-License-Identifier"):
        return "keep"
    return "comment" if line.startswith("# ") else "text"


def fit(text: str) -> str:
    """Prose at the top of a file (the header comment, the module docstring)
    whose lines a long spec name pushed past line length 88: each run of comment
    lines or paragraph of text holding such a line is reflowed, the others kept
    as written."""

    def wrap(words: str, prefix: str) -> list[str]:
        return textwrap.wrap(
            " ".join(words.split()),
            88,
            initial_indent=prefix,
            subsequent_indent=prefix,
            break_long_words=False,
            break_on_hyphens=False,
        )

    out = []
    for para in text.split("\n\n"):
        lines: list[str] = []
        for kind, run in itertools.groupby(para.split("\n"), key=_prose_kind):
            run = list(run)
            is_comment = kind == "comment"
            if kind == "keep" or all(len(line) <= 88 for line in run):
                lines += run
            elif is_comment:
                lines += wrap(" ".join(line[2:] for line in run), "# ")
            else:
                lines += wrap(" ".join(run), "")
        out.append("\n".join(lines))
    return "\n\n".join(out)


class GenerationError(InputError):
    """The spec cannot be turned into a model file (reported with exit code 2)."""


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")


def py_str(value: str) -> str:
    """A Python string literal for a spec-derived name (identifiers and dots only)."""
    if not all(_IDENT.fullmatch(part) for part in value.split(".") if part):
        raise GenerationError(f"refusing to put {value!r} into generated code")
    return f'"{value}"'


def py_literal(value: Any) -> str:
    """A Python literal for spec-derived data: None, bools, numbers, names (as
    :func:`py_str` allows them), and lists and name-keyed dicts of those."""
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return py_str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(py_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{py_str(k)}: {py_literal(v)}" for k, v in value.items())
            + "}"
        )
    raise GenerationError(f"refusing to put {value!r} into generated code")


def config_or(key: str | None, value: bool | int | float | str) -> str:
    """``config.<key>`` where the config carries the setting, else the literal:
    a generated model reads what the config says, and bakes in only what it
    does not say."""
    if key is None:
        if not isinstance(value, (bool, int, float, str)):
            raise GenerationError(f"refusing to put {value!r} into generated code")
        return py_str(value) if isinstance(value, str) else repr(value)
    if not _IDENT.fullmatch(key):
        raise GenerationError(f"refusing to read config.{key!r} in generated code")
    return f"config.{key}"


def index_ranges(values: Iterable[int]) -> str:
    """Sorted indices as runs: ``0-3, 5, 7-8``."""
    runs: list[list[int]] = []
    for v in sorted(values):
        if runs and runs[-1][1] == v - 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def text_environment(folder: Path) -> jinja2.Environment:
    """Jinja for the templates in ``folder``: undefined names fail, block tags
    leave no blank lines, nothing is escaped (the output is code and Markdown)."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


@cache
def environment() -> jinja2.Environment:
    env = text_environment(TEMPLATES)
    env.filters["docwrap"] = docwrap
    env.filters["commentwrap"] = commentwrap
    env.filters["fit"] = fit
    env.filters["py_str"] = py_str
    env.filters["config_or"] = config_or
    env.filters["py_literal"] = py_literal
    return env


def render_template(name: str, context: dict) -> str:
    return environment().get_template(name).render(**context)


def _used_names(source: str, what: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise RenderError(f"generated {what} does not parse: {exc}\n{source}") from exc
    defined = {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef | ast.FunctionDef)
    }
    used = {
        node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }
    return used - defined - set(dir(builtins))


def import_block(body: str, what: str, local: dict[str, str] | None = None) -> str:
    """The import statements ``body`` needs (ruff then orders them like isort).
    ``local`` maps names to the sibling module (``.module``) they come from."""
    sources = {**IMPORTS, **{n: (m, n) for n, m in (local or {}).items()}}
    lines: list[str] = []
    for name in sorted(_used_names(body, what)):
        if name not in sources:
            continue  # a local variable; ruff reports real undefined names
        module, imported = sources[name]
        lines.append(
            f"import {module}"
            if imported is None
            else f"from {module} import {imported}"
        )
    return "\n".join(lines) + "\n"


def _ruff(args: list[str], source: str, filename: str) -> subprocess.CompletedProcess:
    config = [item for setting in RUFF_SETTINGS for item in ("--config", setting)]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            *args,
            "--isolated",
            *config,
            "--stdin-filename",
            filename,
            "-",
        ],
        input=source,
        capture_output=True,
        text=True,
        check=False,
    )


def ruff_clean(source: str, filename: str) -> str:
    """Sort imports, format, then lint; raise RenderError on any remaining problem."""
    sorted_imports = _ruff(["check", "--fix", "--select", "I"], source, filename)
    if sorted_imports.returncode not in (0, 1):
        raise RenderError(f"ruff failed on {filename}: {sorted_imports.stderr}")
    formatted = _ruff(["format"], sorted_imports.stdout, filename)
    if formatted.returncode != 0:
        raise RenderError(f"ruff format failed on {filename}:\n{formatted.stderr}")
    lint = _ruff(["check", "--output-format", "concise"], formatted.stdout, filename)
    if lint.returncode != 0:
        raise RenderError(
            f"generated {filename} is not lint-clean (a template bug):\n"
            f"{lint.stdout}{lint.stderr}"
        )
    return formatted.stdout


def render_python(
    template: str,
    context: dict,
    filename: str,
    body_template: str | None = None,
    local_imports: dict[str, str] | None = None,
) -> str:
    """Render a Python module and ruff it. With ``body_template``, the body is
    rendered first and the imports it needs (from ``IMPORTS``, or from a sibling
    module as ``local_imports`` maps them) are passed to ``template``."""
    if body_template is not None:
        body = render_template(body_template, context)
        imports = import_block(body, filename, local_imports)
        context = {**context, "imports": imports, "body": body}
    return ruff_clean(render_template(template, context), filename)
