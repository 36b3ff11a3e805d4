"""What the vLLM pull request for a spec contains: new files and edits.

``pr_changes(spec, plugin_files)`` takes the rendered plugin (the model file is
consumed as generated, never re-rendered here) and returns the new files and the
declarative edits of vLLM's files (:mod:`onboard.pr.edits`). The edits of
``vllm/`` files are applied to the installed vLLM (the pinned version) at
generation time; those of ``tests/`` and ``docs/`` files, which an installed
package does not have, are applied to a checkout's own files by ``onboard pr``.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from onboard.errors import InputError
from onboard.pr.edits import Edit, EditError, apply_edits
from onboard.pr.versions import PINNED_VLLM
from onboard.spec.shrink import shrink_spec, tiny_config_overrides

if TYPE_CHECKING:
    from onboard.spec.model import ModelSpec

COPYRIGHT = "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project"
MODELS = "vllm/model_executor/models"
REGISTRY = f"{MODELS}/registry.py"
CONFIGS = "vllm/transformers_utils/configs"
CONFIG_PY = "vllm/transformers_utils/config.py"
CONVERTOR = "vllm/transformers_utils/model_arch_config_convertor.py"
SPECULATIVE = "vllm/config/speculative.py"
TEST_REGISTRY = "tests/models/registry.py"
SUPPORTED_MODELS = "docs/models/supported_models.md"
LINE_LENGTH = 88


@dataclass(frozen=True)
class PrChanges:
    new_files: dict[str, str]  # repository path -> text
    edits: list[Edit]
    notes: list[str]  # what a reviewer must know (shown in PR.md)
    mtp_architecture: str | None


@dataclass(frozen=True)
class FileChange:
    path: str
    old: str | None  # None: a new file
    new: str


def vllm_source(text: str) -> str:
    """A generated module as vLLM carries it: vLLM's SPDX header in place of
    onboard's provenance comment."""
    lines = text.split("\n")
    if not lines[0].startswith("# SPDX-License-Identifier"):
        raise InputError("generated module has no SPDX header")
    body = 1
    while body < len(lines) and lines[body].startswith("#"):
        body += 1
    return "\n".join([lines[0], COPYRIGHT, *lines[body:]])


def _dict_entry(key: str, value: str, indent: int = 4) -> str:
    """``"key": value,`` in ruff's style, wrapped like ruff wraps a tuple."""
    pad = " " * indent
    line = f'{pad}"{key}": {value},'
    if len(line) <= LINE_LENGTH or not value.startswith("("):
        return line
    items = [item.strip() for item in value.strip("()").split(",") if item.strip()]
    inner = "\n".join(f"{pad}    {item}," for item in items)
    return f'{pad}"{key}": (\n{inner}\n{pad}),'


def _call_entry(key: str, call: str, args: list[str]) -> str:
    one_line = f'    "{key}": {call}({", ".join(args)}),'
    if len(one_line) <= LINE_LENGTH:
        return one_line
    inner = "\n".join(f"        {arg}," for arg in args)
    return f'    "{key}": {call}(\n{inner}\n    ),'


def _mtp_layers_key(spec: ModelSpec) -> str:
    from onboard.spec.hf import hf_config_from_spec

    config = hf_config_from_spec(spec)
    for key in ("num_nextn_predict_layers", "num_mtp_layers"):
        if key in config:
            return key
    return "num_nextn_predict_layers"


def pr_changes(spec: ModelSpec, plugin_files: dict[str, str]) -> PrChanges:
    """New files and edits of the vLLM pull request for ``spec``."""
    # (imported here: `onboard pr check|apply` needs none of the generator)
    from onboard.spec.hf import transformers_knows
    from onboard.spec.model import class_prefix
    from onboard.spec.naming import package_name
    from onboard.templating import render_python

    module = spec.module_name
    package = package_name(spec)
    arch = spec.architecture
    new_model_type = not transformers_knows(spec.model_type)
    notes: list[str] = []
    files = {
        f"{MODELS}/{module}.py": vllm_source(plugin_files[f"{package}/{module}.py"])
    }
    edits = [
        Edit(
            REGISTRY,
            "entry",
            "_TEXT_GENERATION_MODELS",
            arch,
            _dict_entry(arch, f'("{module}", "{arch}")'),
            mode="replace",
        )
    ]
    mtp_arch, new_mtp_type = _mtp_changes(spec, plugin_files, files, edits, notes)
    if new_model_type:
        config_class = f"{class_prefix(arch)}Config"
        files[f"{CONFIGS}/{module}.py"] = vllm_source(
            plugin_files[f"{package}/config.py"]
        )
        edits += [
            Edit(
                f"{CONFIGS}/__init__.py",
                "entry",
                "_CLASS_TO_MODULE",
                config_class,
                _dict_entry(
                    config_class, f'"vllm.transformers_utils.configs.{module}"'
                ),
            ),
            Edit(
                f"{CONFIGS}/__init__.py",
                "entry",
                "__all__",
                config_class,
                f'    "{config_class}",',
            ),
            Edit(
                CONFIG_PY,
                "entry",
                "_CONFIG_REGISTRY",
                spec.model_type,
                f'    {spec.model_type}="{config_class}",',
            ),
        ]
    if spec.attention.type == "mla":
        # vLLM decides MLA (KV-cache layout, backend) from a list of model types.
        for model_type in [spec.model_type] + (
            [f"{spec.model_type}_mtp"] if new_mtp_type else []
        ):
            edits.append(
                Edit(
                    CONVERTOR,
                    "append",
                    r"model_type in \($",
                    model_type,
                    f'            "{model_type}",',
                    within=r"def is_deepseek_mla\(",
                )
            )
    edits += _core_changes(spec, notes)
    edits += _tests_and_docs(spec, mtp_arch, new_model_type)
    files[f"tests/models/language/generation/test_{module}.py"] = render_python(
        "vllm-pr/test_model.py.j2",
        {
            "spec": spec,
            "module": module,
            "trust_remote_code": new_model_type,
            "tiny_config": tiny_config_overrides(spec),
            "tiny_layers": shrink_spec(spec).num_hidden_layers,
        },
        f"test_{module}.py",
    )
    notes += linear_attention_notes(spec)
    return PrChanges(dict(sorted(files.items())), edits, notes, mtp_arch)


def _mtp_changes(
    spec: ModelSpec,
    plugin_files: dict[str, str],
    files: dict[str, str],
    edits: list[Edit],
    notes: list[str],
) -> tuple[str | None, bool]:
    """Add the MTP draft's file and edits; return its architecture (None: no
    draft) and whether its model type is new to vLLM."""
    from onboard.spec.naming import package_name

    module = spec.module_name
    package = package_name(spec)
    mtp_source = plugin_files.get(f"{package}/{module}_mtp.py")
    mtp_arch = None
    new_mtp_type = False  # the draft gets a model type vLLM does not know
    draft = None
    if spec.mtp is not None:
        # The draft's registry name and class, as the generator decided them:
        # vLLM's own name for a model type vLLM maps to an MTP draft, vLLM's own
        # class for a renamed family (no MTP file then).
        from onboard.spec.mtp import mtp_draft

        draft = mtp_draft(spec, standalone=mtp_source is not None)
        if draft.class_name is not None and mtp_source is None:
            notes.append(
                f"The spec has {spec.mtp.num_heads} MTP head(s) but the generator "
                f"wrote no `{module}_mtp.py` yet: this tree has no MTP draft model."
            )
            draft = None
    if draft is not None:
        mtp_arch, mtp_class = draft.architecture, draft.class_name
        if mtp_source is not None:
            files[f"{MODELS}/{module}_mtp.py"] = vllm_source(mtp_source)
        new_mtp_type = draft.override
        if draft.override:
            mtp_type = f"{spec.model_type}_mtp"
            layers_key = _mtp_layers_key(spec)
            edits += [
                Edit(
                    SPECULATIVE,
                    "append",
                    r"^MTPModelTypes = Literal\[$",
                    mtp_type,
                    f'    "{mtp_type}",',
                ),
                Edit(
                    SPECULATIVE,
                    "before",
                    r"^        return hf_config$",
                    f'hf_config.model_type = "{mtp_type}"',
                    "\n".join(
                        [
                            f'        if hf_config.model_type == "{spec.model_type}":',
                            f'            hf_config.model_type = "{mtp_type}"',
                            "            n_predict = getattr(hf_config, "
                            f'"{layers_key}", None)',
                            "            hf_config.update(",
                            f'                {{"n_predict": n_predict, '
                            f'"architectures": ["{mtp_arch}"]}}',
                            "            )",
                            "",
                        ]
                    ),
                    within=r"def hf_config_override\(",
                ),
            ]
        if mtp_class is not None:
            edits.append(
                Edit(
                    REGISTRY,
                    "entry",
                    "_SPECULATIVE_DECODING_MODELS",
                    mtp_arch,
                    _dict_entry(mtp_arch, f'("{module}_mtp", "{mtp_class}")'),
                    mode="replace",
                )
            )
    return mtp_arch, new_mtp_type


def _core_changes(spec: ModelSpec, notes: list[str]) -> list[Edit]:
    """Edits of vLLM's own layers that the spec needs (released vLLM refuses it),
    with a note for the reviewer."""
    if spec.attention.type == "mla" and spec.attention.kv_sharing:
        from onboard.pr.mla_kv_sharing import mla_kv_sharing_edits

        notes.append(
            "Layers of this model read an earlier MLA layer's latent cache: the tree "
            "carries the vLLM core change that lets `MLAAttention` share a cache "
            "(`onboard/pr/mla_kv_sharing.py`), which the released vLLM refuses."
        )
        return mla_kv_sharing_edits()
    return []


def linear_attention_notes(spec: ModelSpec) -> list[str]:
    """What a reviewer must know about a model with linear-attention layers: which
    vLLM layer runs them and how vLLM caches their state (vLLM's behaviour, not a
    measurement: the measured checks are in the Test Result section)."""
    lin = spec.linear_attention
    n = sum(spec.is_linear_layer(i) for i in range(spec.num_hidden_layers))
    if lin is None or not n:
        return []
    kind, layer = (
        ("Kimi delta attention", "KimiGatedDeltaNetAttention")
        if lin.type == "kimi_delta"
        else ("Gated DeltaNet linear attention", "QwenGatedDeltaNetAttention")
    )
    return [
        f"{n} of {spec.num_hidden_layers} layers are {kind}, built with vLLM's own "
        f"`{layer}` and its kernels; the model is `IsHybrid` / `HasInnerState`, so "
        "vLLM keeps a recurrent state per sequence beside the attention layers' KV "
        f"cache. Serve with `--mamba-ssm-cache-dtype {lin.state_dtype}` (the spec's "
        "state dtype).",
        PREFIX_CACHING_NOTE,
    ]


# How vLLM 0.32 caches prefixes of a hybrid model (its behaviour, not a
# measurement of this model).
PREFIX_CACHING_NOTE = (
    "Prefix caching: vLLM 0.32 caches a hybrid model's prefixes in `align` mode "
    "(`mamba_cache_mode`, set when prefix caching is on, the default): the "
    "linear-attention states are kept at the attention block boundaries, so a "
    "cached prefix is reused in whole blocks (vLLM sizes a block so that its "
    "attention page holds a state)."
)


def _tests_and_docs(
    spec: ModelSpec, mtp_arch: str | None, new_model_type: bool
) -> list[Edit]:
    from onboard.spec.model import class_prefix

    repo = f'"{spec.base_checkpoint}"' if spec.base_checkpoint else f'"{spec.name}"'
    args = [repo]
    if new_model_type:
        # No transformers class: the checkpoint ships its modeling code.
        args.append("trust_remote_code=True")
    else:
        import transformers

        args.append(f'min_transformers_version="{transformers.__version__}"')
    edits = [
        Edit(
            TEST_REGISTRY,
            "entry",
            "_TEXT_GENERATION_EXAMPLE_MODELS",
            spec.architecture,
            _call_entry(spec.architecture, "_HfExamplesInfo", args),
        )
    ]
    if mtp_arch is not None:
        edits.append(
            Edit(
                TEST_REGISTRY,
                "entry",
                "_SPECULATIVE_DECODING_EXAMPLE_MODELS",
                mtp_arch,
                _call_entry(
                    mtp_arch,
                    "_HfExamplesInfo",
                    [*args, f"speculative_model={repo}", 'speculative_method="mtp"'],
                ),
            )
        )
    family = class_prefix(spec.architecture)
    example = f"`{spec.base_checkpoint}`, etc." if spec.base_checkpoint else ""
    edits.append(
        Edit(
            SUPPORTED_MODELS,
            "md_row",
            r"^#+ Text Generation",
            spec.architecture,
            f"| `{spec.architecture}` | {family} | {example} | ✅︎ | ✅︎ |",
        )
    )
    return edits


# -- the installed vLLM (the base of the vllm/ part) ---------------------------


def installed_vllm_root() -> Path:
    """The directory that contains the installed ``vllm/`` package."""
    found = importlib.util.find_spec("vllm")
    if found is None or found.origin is None:
        raise InputError("vLLM is not installed: the vllm-pr tree needs its sources")
    return Path(found.origin).parent.parent


def tree_version(root: Path) -> str | None:
    """vLLM version of the tree at ``root`` (checkout or site-packages)."""
    version_py = root / "vllm" / "_version.py"
    if version_py.is_file():
        match = re.search(
            r"""^__version__\s*(?:=\s*version\s*)?=\s*['"]([^'"]+)['"]""",
            version_py.read_text(),
            re.MULTILINE,
        )
        if match:
            return match.group(1)
    for info in sorted(root.glob("vllm*.dist-info")):
        match = re.fullmatch(r"vllm(?:_cpu)?-(.+)\.dist-info", info.name)
        if match:
            return match.group(1)
    return None


def same_release(version: str, pinned: str = PINNED_VLLM) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).release == Version(pinned).release
    except InvalidVersion:
        return False


def apply_changes(
    plan: PrChanges, root: Path, parts: tuple[str, ...] = ("vllm", "tests", "docs")
) -> list[FileChange]:
    """The file changes of ``plan`` against the files under ``root`` (only the
    given top-level parts). A new file that exists, or an edit whose anchor is
    missing, raises InputError."""
    changes: list[FileChange] = []
    for path, text in plan.new_files.items():
        if path.split("/", 1)[0] in parts:
            changes.append(FileChange(path, None, text))
    by_path: dict[str, list[Edit]] = {}
    for edit in plan.edits:
        if edit.part in parts:
            by_path.setdefault(edit.path, []).append(edit)
    for path, edits in by_path.items():
        target = root / path
        if not target.is_file():
            raise InputError(f"{target}: missing (the PR edits it)")
        old = target.read_text(encoding="utf-8")
        try:
            new = apply_edits(old, edits)
        except EditError as exc:
            raise InputError(f"{root}: {exc}") from None
        if new != old:
            changes.append(FileChange(path, old, new))
    return sorted(changes, key=lambda c: c.path)


def unified_diff(changes: list[FileChange]) -> str:
    """One git-style unified diff (``git apply -p1``) of ``changes``."""
    out: list[str] = []
    for change in changes:
        a = f"a/{change.path}"
        b = f"b/{change.path}"
        out.append(f"diff --git {a} {b}\n")
        if change.old is None:
            out.append("new file mode 100644\n")
        old_lines = [] if change.old is None else change.old.splitlines(keepends=True)
        new_lines = change.new.splitlines(keepends=True)
        for lines in (old_lines, new_lines):
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n\\ No newline at end of file\n"
        out.extend(
            difflib.unified_diff(
                old_lines,
                new_lines,
                "/dev/null" if change.old is None else a,
                b,
                n=3,
            )
        )
    return "".join(out)
