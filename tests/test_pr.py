"""The PR-ready vLLM tree (onboard/pr): edits, patch building, check/apply.

Fast: no engine. Trees are the installed vLLM (a hard-link farm) and the fixture
files of tests/fixtures/vllm-pr in vLLM's format for tests/ and docs/.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from onboard.errors import InputError
from onboard.pipeline.generate import generate_all
from onboard.pr import apply as pr
from onboard.pr.build import installed_vllm_root, tree_version
from onboard.pr.edits import Edit, EditError, apply_edit
from onboard.pr.farm import vllm_farm
from onboard.pr.versions import API_CHANGES, PINNED_VLLM, api_changes_markdown
from onboard.safetensors_header import read_header
from onboard.spec import load_spec
from onboard.spec.hf import transformers_knows
from onboard.spec.module_tree import used_roles
from onboard.templating import RUFF_SETTINGS

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "vllm-pr" / "checkout"
SPECS = ["dense-gqa", "deepseek-v3-style", "novel-launch"]


# -- edits on text -------------------------------------------------------------

TABLE = """\
X = 1
_MODELS = {
    # [Decoder-only]
    "AlphaForCausalLM": ("alpha", "AlphaForCausalLM"),
    "GammaForCausalLM": (
        "gamma",
        "GammaForCausalLM",
    ),
    # Zeta is special
    "ZetaForCausalLM": ("zeta", "ZetaForCausalLM"),
}
"""


def test_entry_goes_after_the_greatest_smaller_key():
    edit = Edit(
        "f.py", "entry", "_MODELS", "BetaForCausalLM", '    "BetaForCausalLM": 1,'
    )
    lines = apply_edit(TABLE, edit).splitlines()
    assert lines[4] == '    "BetaForCausalLM": 1,'
    # After a multi-line entry, before the comment that introduces the next one.
    edit = Edit("f.py", "entry", "_MODELS", "OmegaForCausalLM", '    "Omega": 2,')
    lines = apply_edit(TABLE, edit).splitlines()
    assert lines[8:10] == ['    "Omega": 2,', "    # Zeta is special"]
    # Before every entry: above the section comment.
    edit = Edit("f.py", "entry", "_MODELS", "Aardvark", '    "Aardvark": 0,')
    assert apply_edit(TABLE, edit).splitlines()[2] == '    "Aardvark": 0,'


def test_entry_keep_and_replace_an_existing_key():
    keep = Edit(
        "f.py", "entry", "_MODELS", "GammaForCausalLM", '    "GammaForCausalLM": 9,'
    )
    assert apply_edit(TABLE, keep) == TABLE
    replace = Edit(
        "f.py", "entry", "_MODELS", "GammaForCausalLM",
        '    "GammaForCausalLM": ("mine", "GammaForCausalLM"),', mode="replace",
    )  # fmt: skip
    text = apply_edit(TABLE, replace)
    assert '"gamma",' not in text
    assert '    "GammaForCausalLM": ("mine", "GammaForCausalLM"),\n    # Zeta' in text
    assert apply_edit(text, replace) == text


def test_append_before_and_md_row():
    source = 'def f(x):\n    if x in (\n        "a",\n    ):\n        return 1\n'
    edit = Edit("f.py", "append", r"in \($", "b", '        "b",', within=r"def f\(")
    once = apply_edit(source, edit)
    assert '        "a",\n        "b",\n    ):' in once
    assert apply_edit(once, edit) == once
    before = Edit("f.py", "before", r"^        return 1$", "# b", "        # b")
    assert "        # b\n        return 1" in apply_edit(source, before)
    table = (
        "# T\n\n## Text Generation\n\n| A | B |\n|---|---|\n| `Aa` | 1 |\n"
        "| `Cc` | 3 |\n"
    )
    row = Edit("d.md", "md_row", r"^#+ Text Generation", "Bb", "| `Bb` | 2 |")
    assert "| `Aa` | 1 |\n| `Bb` | 2 |\n| `Cc` | 3 |" in apply_edit(table, row)
    same = Edit("d.md", "md_row", r"^#+ Text Generation", "Cc", "| `Cc` | x |")
    assert apply_edit(table, same) == table


def test_missing_anchor_is_located():
    edit = Edit("vllm/x.py", "entry", "_NOPE", "K", '    "K": 1,')
    with pytest.raises(EditError, match=r"vllm/x.py: no line matching .*_NOPE"):
        apply_edit(TABLE, edit)


# -- versions -------------------------------------------------------------------


def test_pinned_version_is_the_installed_one():
    assert tree_version(installed_vllm_root()) == PINNED_VLLM


def test_api_change_table_names_what_the_installed_vllm_exports():
    # The "after" side of the MoE rows is what the generated models import.
    # (read from the source: importing vLLM costs half a minute here)
    init = installed_vllm_root() / "vllm/model_executor/layers/fused_moe/__init__.py"
    tree = ast.parse(init.read_text())
    exported = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and node.targets[0].id == "__all__"
    )
    assert {"FusedMoEFactory", "GateLinear", "MoERunner"} <= set(exported)
    assert "FusedMoE" not in exported  # the 2026 move: no longer exported
    assert any(c.area == "fused MoE layer" for c in API_CHANGES)
    table = api_changes_markdown()
    assert table.count("\n") == len(API_CHANGES) + 2
    for change in API_CHANGES:
        assert (ROOT / change.used_by.split(" ")[0]).exists(), change.used_by


# -- the generated tree ---------------------------------------------------------


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name in SPECS:
        gen = tmp_path_factory.mktemp(f"gen-{name}")
        generate_all(load_spec(ROOT / "model_specs" / f"{name}.yaml"), gen)
        out[name] = gen
    return out


def _ruff(*args: str) -> subprocess.CompletedProcess:
    """ruff with vLLM's settings (line length 88, vllm first-party), as the
    generator itself uses them."""
    config = [item for setting in RUFF_SETTINGS for item in ("--config", setting)]
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--isolated", *config],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("name", SPECS)
def test_tree_layout_and_python_files_are_ruff_clean(generated, name):
    spec = load_spec(ROOT / "model_specs" / f"{name}.yaml")
    tree = generated[name] / "vllm-pr"
    module = spec.module_name
    model = tree / "vllm/model_executor/models" / f"{module}.py"
    plugin_model = (
        generated[name] / "plugin" / f"onboard_plugin_{module}" / f"{module}.py"
    )
    assert model.read_text().startswith(
        "# SPDX-License-Identifier: Apache-2.0\n"
        "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
    )
    # The model is the plugin's file (only the header differs): not re-rendered.
    body = plugin_model.read_text().split('"""', 1)[1]
    assert model.read_text().split('"""', 1)[1] == body
    registry = (tree / "vllm/model_executor/models/registry.py").read_text()
    assert (
        f'    "{spec.architecture}": ("{module}", "{spec.architecture}"),' in registry
    )
    assert (tree / f"tests/models/language/generation/test_{module}.py").is_file()
    for part in ("changes.patch", "edits.json", "PR.md"):
        assert (tree / part).is_file()
    python = sorted(tree.rglob("*.py"))
    fmt = _ruff("format", "--check", *map(str, python))
    assert fmt.returncode == 0, fmt.stdout
    base = installed_vllm_root()
    for path in python:
        original = base / path.relative_to(tree)
        if not original.exists():  # a new file: lint-clean
            lint = _ruff("check", str(path))
            assert lint.returncode == 0, lint.stdout
        else:  # an edited vLLM file: no diagnostic that vLLM's own file lacks
            count = [
                _ruff("check", "--statistics", str(p)).stdout for p in (original, path)
            ]
            assert count[0] == count[1], (path, count)
    config = tree / f"vllm/transformers_utils/configs/{module}.py"
    assert config.is_file() == (name == "novel-launch")


def test_novel_model_type_gets_its_config_registration(generated):
    tree = generated["novel-launch"] / "vllm-pr"
    configs = (tree / "vllm/transformers_utils/configs/__init__.py").read_text()
    assert (
        '    "NovelLaunchConfig": "vllm.transformers_utils.configs.novel_launch",'
        in configs
    )
    assert '    "NovelLaunchConfig",\n' in configs.split("__all__ = [")[1]
    config_py = (tree / "vllm/transformers_utils/config.py").read_text()
    assert '    novel_launch="NovelLaunchConfig",' in config_py


def test_pr_md_follows_the_vllm_template(generated, tmp_path):
    text = (generated["dense-gqa"] / "vllm-pr" / "PR.md").read_text()
    for heading in ("## Purpose", "## Test Plan", "## Test Result"):
        assert heading in text
    assert "Not measured" in text  # no validation.json next to it
    # ... so it does not claim the model was validated, it says how to.
    assert "was also validated" not in text and "To validate" in text
    assert "already serves `LlamaForCausalLM`" in text


def test_pr_md_quotes_the_latest_validation(generated, tmp_path):
    import json

    from onboard.pipeline.generate import write_pr_md

    gen = tmp_path / "run" / "generated"
    shutil.copytree(generated["dense-gqa"], gen)
    validation = tmp_path / "run" / "validation" / "validation.json"
    validation.parent.mkdir()
    checks = [
        {
            "name": "accuracy",
            "status": "passed",
            "passed": True,
            "metrics": {"greedy_identical_sequences": 4, "num_prompts": 4},
            "details": "",
        },
        {
            "name": "spec-decode:ngram",
            "status": "passed",
            "passed": True,
            "metrics": {"mean_acceptance_length": 1.75, "speedup": 0.85},
            "details": "",
        },
        {"name": "speed", "status": "not-run", "passed": False, "metrics": {},
         "details": "no hardware"},
    ]  # fmt: skip
    validation.write_text(
        json.dumps(
            {
                "passed": True,
                "target": "cpu",
                "vllm_model_class": "m.C",
                "checks": checks,
            }
        )
    )
    path = write_pr_md(ROOT / "model_specs" / "dense-gqa.yaml", gen, None)
    text = path.read_text()
    assert "greedy_identical_sequences=4, num_prompts=4" in text
    assert "mean_acceptance_length=1.75, speedup=0.85" in text
    assert "| speed | not-run | not measured: no hardware |" in text
    assert "| quant:fp8-dynamic | not measured | |" in text
    assert "was also validated with `onboard`" in text


# -- check / apply --------------------------------------------------------------


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def _touched(gen: Path) -> list[str]:
    patch = (gen / "vllm-pr" / "changes.patch").read_text()
    return [line.split(" b/", 1)[1] for line in patch.splitlines()
            if line.startswith("diff --git ")]  # fmt: skip


def _checkout(tmp: Path, gen: Path) -> Path:
    """A fake vLLM checkout: fixture tests/ and docs/, the installed vllm/."""
    root = vllm_farm(tmp / "checkout", _touched(gen))
    shutil.copytree(FIXTURE, root, dirs_exist_ok=True)
    return root


def _small_digest(root: Path, gen: Path) -> str:
    """Digest of every file the PR touches (hashing 6000 files is slow)."""
    paths = _touched(gen) + [
        "tests/models/registry.py",
        "docs/models/supported_models.md",
    ]
    h = hashlib.sha256()
    for rel in paths:
        path = root / rel
        h.update(rel.encode() + (path.read_bytes() if path.exists() else b"-"))
    return h.hexdigest()


@pytest.mark.parametrize("name", SPECS)
def test_checkout_check_apply_then_refuse_twice(generated, tmp_path, name):
    gen = generated[name]
    root = _checkout(tmp_path, gen)
    registry_fixture = (root / "tests/models/registry.py").read_text()
    plan = pr.check(gen, root)
    assert plan.kind == "checkout"
    assert not plan.skipped
    spec = load_spec(ROOT / "model_specs" / f"{name}.yaml")
    if name == "novel-launch":  # new to the fixture: entry and row added
        assert "tests/models/registry.py" in plan.files
        assert "docs/models/supported_models.md" in plan.files
    else:  # already in the fixture's tables: kept as they are
        assert "tests/models/registry.py" not in plan.files
    pr.apply(gen, root)
    registry = (root / "tests/models/registry.py").read_text()
    docs = (root / "docs/models/supported_models.md").read_text()
    assert f'"{spec.architecture}": _HfExamplesInfo(' in registry
    assert f"| `{spec.architecture}` |" in docs
    if name == "novel-launch":
        assert registry != registry_fixture
        # Sorted position: after Mixtral, before Qwen3.
        assert registry.index("NovelLaunch") < registry.index('"Qwen3ForCausalLM"')
        assert registry.index("NovelLaunch") > registry.index('"MixtralForCausalLM"')
        entry = registry.split('"NovelLaunchForCausalLM"')[1][:200]
        assert "trust_remote_code=True" in entry
        compile(registry, "registry.py", "exec")
    assert (
        root / f"tests/models/language/generation/test_{spec.module_name}.py"
    ).is_file()
    installed = installed_vllm_root() / "vllm/model_executor/models/registry.py"
    assert f'("{spec.module_name}",' not in installed.read_text()  # not written through
    before = _small_digest(root, gen)
    with pytest.raises(InputError, match="already applied"):
        pr.apply(gen, root)
    with pytest.raises(InputError, match="already applied"):
        pr.check(gen, root)
    assert _small_digest(root, gen) == before


def test_installed_package_gets_the_vllm_part_only(generated, tmp_path):
    gen = generated["novel-launch"]
    root = vllm_farm(tmp_path / "site", _touched(gen))
    plan = pr.apply(gen, root)
    assert plan.kind == "installed package"
    assert all(path.startswith("vllm/") for path in plan.files)
    assert "tests/models/registry.py" in plan.skipped
    assert "docs/models/supported_models.md" in plan.skipped
    assert "skipped" in plan.summary("changed")
    assert (root / "vllm/model_executor/models/novel_launch.py").is_file()
    assert not (root / "tests").exists()


def test_other_version_and_broken_trees_are_refused_unchanged(generated, tmp_path):
    gen = generated["dense-gqa"]
    root = _checkout(tmp_path, gen)
    version_py = root / "vllm/_version.py"
    text = version_py.read_text()
    version_py.unlink()  # a hard link: replace, do not write through
    version_py.write_text(text.replace("0.32.0", "0.31.1").replace("32, 0", "31, 1"))
    before = _small_digest(root, gen)
    with pytest.raises(
        InputError, match=r"vLLM 0\.31\.1, but the PR targets vLLM 0\.32"
    ):
        pr.apply(gen, root)
    assert _small_digest(root, gen) == before
    version_py.unlink()
    version_py.write_text(text)
    # A registry that changed under the patch: nothing applies, nothing changes.
    registry = root / "vllm/model_executor/models/registry.py"
    registry.write_text(
        registry.read_text().replace('("llama", "LlamaForCausalLM")', "x")
    )
    before = _small_digest(root, gen)
    with pytest.raises(InputError, match="does not apply"):
        pr.apply(gen, root)
    assert _small_digest(root, gen) == before
    assert not (root / "vllm/model_executor/models/dense_gqa.py").exists()


def test_bad_inputs_are_clear(generated, tmp_path):
    with pytest.raises(InputError, match="no vllm/ directory"):
        pr.check(generated["dense-gqa"], tmp_path)
    root = vllm_farm(tmp_path / "site")
    with pytest.raises(InputError, match="changes.patch: missing"):
        pr.check(tmp_path / "nothing", root)


def test_git_apply_accepts_and_reverses_the_patch(generated, tmp_path):
    """The patch is plain `git apply` input: both directions, as a maintainer
    would use it."""
    gen = generated["novel-launch"]
    root = vllm_farm(tmp_path / "site", _touched(gen))
    patch = gen / "vllm-pr" / "changes.patch"
    vllm_only = ["--include=vllm/*"]
    env = {"GIT_CEILING_DIRECTORIES": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["git", "apply", *vllm_only, *args, str(patch)],
            cwd=root,
            capture_output=True,
            text=True,
            env=env,
        )

    assert run("--check").returncode == 0
    assert run().returncode == 0
    assert run("--check").returncode != 0
    assert run("--reverse").returncode == 0
    assert not (root / "vllm/model_executor/models/novel_launch.py").exists()
    original = installed_vllm_root() / "vllm/model_executor/models/registry.py"
    assert (root / "vllm/model_executor/models/registry.py").read_text() == (
        original.read_text()
    )


def test_cli_exit_codes(generated, tmp_path):
    gen = generated["dense-gqa"]
    root = _checkout(tmp_path, gen)
    cli = [sys.executable, "-c", "from onboard.cli import main; main()", "pr"]
    ok = subprocess.run([*cli, "check", str(gen), "--vllm-src", str(root)],
                        capture_output=True, text=True)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "would change" in ok.stdout and "(checkout)" in ok.stdout
    bad = subprocess.run([*cli, "apply", str(gen), "--vllm-src", str(tmp_path)],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2
    assert "no vllm/ directory" in bad.stderr and "Traceback" not in bad.stderr


# -- features the bundled specs do not switch on ---------------------------------


def test_mla_with_a_new_model_type_joins_vllms_mla_list(tmp_path):
    """vLLM decides MLA from a list of model types: a new MLA model type must be
    added there (an out-of-tree plugin cannot)."""
    import yaml

    from onboard.generate import generate_files
    from onboard.pr import pr_tree_files

    data = yaml.safe_load((ROOT / "model_specs" / "deepseek-v3-style.yaml").read_text())
    data.update(name="novel-mla", architecture="NovelMlaForCausalLM")
    data.update(model_type="novel_mla", speculators=[], mtp=None)
    path = tmp_path / "novel-mla.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in data.items() if v is not None}))
    spec = load_spec(path)
    files = pr_tree_files(spec, generate_files(spec))
    convertor = files["vllm-pr/vllm/transformers_utils/model_arch_config_convertor.py"]
    function = convertor.split("def is_deepseek_mla(")[1].split("\n    def ")[0]
    first_list = function.split("model_type in (")[1].split("):")[0]
    assert '            "novel_mla",\n' in first_list
    assert first_list.count('"novel_mla"') == 1
    assert function.count('"novel_mla"') == 1  # not in the EAGLE branch
    compile(convertor, "model_arch_config_convertor.py", "exec")
    assert "vllm-pr/vllm/transformers_utils/configs/novel_mla.py" in files


@pytest.mark.parametrize("name", ["deepseek-v3-style", "novel-launch"])
def test_mtp_draft_and_its_plumbing(generated, name):
    spec = load_spec(ROOT / "model_specs" / f"{name}.yaml")
    module = spec.module_name
    tree = generated[name] / "vllm-pr"
    plugin = generated[name] / "plugin" / f"onboard_plugin_{module}"
    draft = tree / "vllm/model_executor/models" / f"{module}_mtp.py"
    if not (plugin / f"{module}_mtp.py").exists():
        # The MTP generator did not write a draft module: said in PR.md.
        assert not draft.exists()
        assert "this tree has no MTP draft model" in (tree / "PR.md").read_text()
        return
    from onboard.spec.mtp import mtp_draft

    info = mtp_draft(spec)
    assert draft.is_file()
    registry = (tree / "vllm/model_executor/models/registry.py").read_text()
    speculative_table = registry.split("_SPECULATIVE_DECODING_MODELS = {")[1]
    entry = f'"{info.architecture}": ("{module}_mtp", "{info.class_name}"),'
    assert entry in speculative_table.split("\n}")[0]
    speculative = tree / "vllm/config/speculative.py"
    assert speculative.exists() == info.override
    if info.override:  # a model type vLLM does not map to an MTP draft
        text = speculative.read_text()
        literal = text.split("MTPModelTypes = Literal[")[1].split("]")[0]
        assert f'"{spec.model_type}_mtp",' in literal
        override = text.split("def hf_config_override(")[1].split("\n    @")[0]
        branch = override.split(f'if hf_config.model_type == "{spec.model_type}":')[1]
        assert f'hf_config.model_type = "{spec.model_type}_mtp"' in branch
        assert f'"architectures": ["{info.architecture}"]' in branch
        assert override.rstrip().endswith("return hf_config")
        compile(text, "speculative.py", "exec")


@pytest.mark.parametrize("name", SPECS)
def test_check_against_the_installed_vllm(generated, name):
    """The acceptance dry run on the real site-packages (which sits inside this
    project's git repository: git must not patch relative to the project)."""
    site = installed_vllm_root()
    plan = pr.check(generated[name], site)
    assert plan.kind == "installed package"
    spec = load_spec(ROOT / "model_specs" / f"{name}.yaml")
    assert f"vllm/model_executor/models/{spec.module_name}.py" in plan.files
    assert not (site / f"vllm/model_executor/models/{spec.module_name}.py").exists()


def _tiny_config(test_file: Path) -> dict:
    """TINY_CONFIG as the generated test states it (a literal, read without running
    the file)."""
    for node in ast.parse(test_file.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and ast.unparse(node.targets[0]) == "TINY_CONFIG"
        ):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{test_file}: no TINY_CONFIG")


@pytest.mark.parametrize("name", SPECS)
def test_generated_test_runs_the_tiny_model_of_the_spec(generated, name, tmp_path):
    """The PR's test sets TINY_CONFIG on the example model's full-size config and
    builds a random model from it: transformers must build the shrunk spec's model
    (every tensor, every shape, vocabulary aside), not the full-size one."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from onboard.checkpoint.tiny import plan_tensors
    from onboard.reference import install_reference
    from onboard.spec.hf import hf_config_from_spec
    from onboard.spec.shrink import shrink_spec

    spec = load_spec(ROOT / "model_specs" / f"{name}.yaml")
    test = (
        generated[name]
        / "vllm-pr/tests/models/language/generation"
        / f"test_{spec.module_name}.py"
    )
    tiny = _tiny_config(test)
    assert tiny and "vocab_size" not in tiny and "max_position_embeddings" not in tiny
    # The example model as the Hub would serve it: its full-size config.json (and,
    # for a new model type, the configuration and modeling code beside it).
    (tmp_path / "config.json").write_text(json.dumps(hf_config_from_spec(spec)))
    remote = not transformers_knows(spec.model_type)
    if remote:
        install_reference(spec, tmp_path)
    config = AutoConfig.from_pretrained(tmp_path, trust_remote_code=remote)
    config.update(tiny)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=remote)
    saved = tmp_path / "tiny"
    model.save_pretrained(saved)  # the checkpoint vLLM loads, as transformers names it
    got = {
        name: entry.shape
        for shard in saved.glob("*.safetensors")
        for name, entry in read_header(shard).by_name().items()
    }
    shrunk = shrink_spec(spec)
    want = {p.name: p.shape for p in plan_tensors(shrunk)}
    assert set(got) - set(want) == set(), "tensors the shrunk spec does not have"
    # transformers' own DeepSeek-V3 class has no MTP layers, and a KV-sharing
    # layer's reference has no K/V of its own; everything else is there.
    missing = {k for k in set(want) - set(got) if not _optional(shrunk, k)}
    assert not missing, sorted(missing)[:5]
    tiny_vocab = shrunk.vocab_size
    for key, shape in got.items():  # the vocabulary is the example model's
        unvocab = tuple(tiny_vocab if d == spec.vocab_size else d for d in shape)
        assert unvocab == want[key], (key, shape, want[key])
    # Seconds-sized but for the embedding and head (the example's vocabulary).
    blocks = sum(math.prod(s) for s in got.values() if spec.vocab_size not in s)
    assert blocks < 40_000_000, blocks


def _optional(spec, name: str) -> bool:
    """A tensor of ``spec``'s checkpoint that vLLM's model does not need: an MTP
    head's, or a KV-sharing layer's own keys and values."""
    if spec.mtp is not None and any(
        name.startswith(f"model.layers.{spec.num_hidden_layers + i}.")
        for i in range(spec.mtp.num_heads)
    ):
        return True
    own_kv = ("k_proj", "v_proj", "k_norm")
    return any(
        name.startswith(spec.tensor_path(role).format(layer=layer))
        for layer in spec.attention.kv_sharing
        for role in own_kv
        if role in used_roles(spec)
    )


def test_py_literal_refuses_what_is_not_plain_data():
    from onboard.templating import GenerationError, py_literal

    assert py_literal({"num_hidden_layers": 4, "layer_types": ["full_attention"]}) == (
        '{"num_hidden_layers": 4, "layer_types": ["full_attention"]}'
    )
    assert ast.literal_eval(py_literal([1.5, None, True, "silu"])) == [
        1.5,
        None,
        True,
        "silu",
    ]
    for bad in (float("nan"), float("inf"), 'x"); import os; ("', {"a b": 1}, object()):
        with pytest.raises(GenerationError):
            py_literal(bad)
