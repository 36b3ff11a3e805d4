"""`onboard new-model`: stage order, layout, skipping unchanged stages, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_report import assert_numbers_match

ROOT = Path(__file__).resolve().parents[1]
ONBOARD = str(Path(sys.executable).with_name("onboard"))


def new_model(spec: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [ONBOARD, "new-model", str(spec), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=1500,
    )


def test_stages_write_the_layout_and_skip_when_unchanged(tmp_path):
    spec = tmp_path / "spec.yaml"
    # Without its MTP head: the checkpoint stage would train it (a minute a run),
    # which tells nothing about the stage bookkeeping tested here.
    text = (ROOT / "model_specs" / "deepseek-v3-style.yaml").read_text()
    for mtp in (
        "mtp:\n  num_heads: 1\n  mlp: moe\n",
        "  - {method: mtp, num_speculative_tokens: 1}\n",
    ):
        assert mtp in text
        text = text.replace(mtp, "")
    spec.write_text(text)
    out = tmp_path / "out"

    first = new_model(spec, out, "--stages", "generate,checkpoint")
    assert first.returncode == 0, first.stderr
    assert "> generate" in first.stdout and "> checkpoint" in first.stdout
    # Stages that do not exist yet are named, not silently dropped.
    assert "not in this version yet" in first.stdout
    assert (out / "spec.yaml").read_text().startswith("spec_version: 1")
    plugin = out / "generated" / "plugin" / "onboard_plugin_deepseek_v3_style"
    assert (plugin / "deepseek_v3_style.py").is_file()
    config = json.loads((out / "checkpoints" / "bf16" / "config.json").read_text())
    assert config["model_type"] == "deepseek_v3"
    shards = sorted((out / "checkpoints" / "bf16").glob("*.safetensors"))
    stamp = {p: p.stat().st_mtime_ns for p in shards}

    again = new_model(spec, out, "--stages", "generate,checkpoint")
    assert again.returncode == 0, again.stderr
    assert "generate: unchanged, skipped" in again.stdout
    assert "checkpoint: unchanged, skipped" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in shards} == stamp

    # A changed input reruns the stages that read it.
    spec.write_text(
        spec.read_text().replace("num_experts_per_tok: 8", "num_experts_per_tok: 6")
    )
    changed = new_model(spec, out, "--stages", "generate,checkpoint")
    assert changed.returncode == 0, changed.stderr
    assert "> generate" in changed.stdout and "> checkpoint" in changed.stdout
    config = json.loads((out / "checkpoints" / "bf16" / "config.json").read_text())
    assert config["num_experts_per_tok"] == 2  # the tiny copy caps top-k at 2

    # --force reruns even when nothing changed.
    forced = new_model(spec, out, "--stages", "checkpoint", "--force")
    assert "> checkpoint" in forced.stdout


def test_bad_stage_and_bad_spec_exit_2(tmp_path):
    spec = ROOT / "model_specs" / "dense-gqa.yaml"
    res = new_model(spec, tmp_path / "o", "--stages", "generate,bogus")
    assert res.returncode == 2
    assert "unknown stage(s) bogus" in res.stderr and "Traceback" not in res.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(spec.read_text().replace("num_kv_heads: 8", "num_kv_heads: 5"))
    res = new_model(bad, tmp_path / "o2")
    assert res.returncode == 2
    assert f"{bad}:" in res.stderr and "num_kv_heads" in res.stderr
    assert not (tmp_path / "o2").exists()


@pytest.mark.engine
def test_quick_run_validates_on_the_engine(tmp_path):
    """generate -> checkpoint -> validate (accuracy, kv-cache) on a bundled spec ends
    with a passing validation.json that names the generated class the engine
    instantiated; an unchanged rerun skips every stage."""
    out = tmp_path / "out"
    args = ("--stages", "generate,checkpoint,validate", "--checks", "accuracy,kv-cache")
    res = new_model(ROOT / "model_specs" / "dense-gqa.yaml", out, *args)
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads((out / "validation" / "validation.json").read_text())
    assert result["passed"] is True
    assert result["vllm_model_class"] == (
        "onboard_plugin_dense_gqa.dense_gqa.LlamaForCausalLM"
    )
    assert [c["name"] for c in result["checks"]] == ["accuracy", "kv-cache"]
    accuracy, kv_cache = result["checks"]
    assert accuracy["status"] == "passed"
    assert accuracy["metrics"]["top1_top2_margin_median"] > 0.5
    assert kv_cache["status"] == "passed"
    assert (out / "validation" / "report.html").is_file()
    rerun = new_model(ROOT / "model_specs" / "dense-gqa.yaml", out, *args)
    assert "validate: unchanged, skipped" in rerun.stdout
    assert rerun.returncode == 0


def test_unknown_check_exits_2_before_any_stage(tmp_path):
    res = new_model(
        ROOT / "model_specs" / "dense-gqa.yaml", tmp_path / "o", "--checks", "bogus"
    )
    assert res.returncode == 2
    assert "unknown check 'bogus'" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "o").exists()


def test_last_line_is_the_verdict_with_what_was_not_covered(tmp_path):
    """A rerun whose validation is unchanged still ends with the verdict, read
    from validation.json: which checks did not run and which quant checks were
    scored on the dequantized reference."""
    from rich.console import Console
    from test_report import PARTLY_COVERED, partly_covered_result

    from onboard.pipeline.runner import STAGES, Context, _fingerprint
    from onboard.spec import load_spec

    spec_path = ROOT / "model_specs" / "dense-gqa.yaml"
    out = tmp_path / "out"
    (out / "validation").mkdir(parents=True)
    (out / ".onboard").mkdir()
    partly_covered_result().write(out / "validation")
    # The stamp of a validate stage that ran on these inputs and passed.
    ctx = Context(load_spec(spec_path), out, full=False, console=Console())
    stage = next(s for s in STAGES if s.name == "validate")
    stamp = {"fingerprint": _fingerprint(ctx, stage, {}), "ok": True}
    (out / ".onboard" / "validate.json").write_text(json.dumps(stamp))

    res = new_model(spec_path, out, "--stages", "validate")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "validate: unchanged, skipped" in res.stdout
    assert res.stdout.splitlines()[-1] == f"validation (cpu): {PARTLY_COVERED}"


@pytest.mark.engine
@pytest.mark.acceptance
@pytest.mark.parametrize(
    "name",
    [
        "dense-gqa",
        "deepseek-v3-style",
        "novel-launch",
        "gpt-oss-style",
        "qwen3-next-style",
        "kimi-k3-style",
        "glm-5-style",
        "mistral-large-4-style",
    ],
)
def test_full_run_of_every_stage_and_check(tmp_path, name):
    """The default `onboard new-model`: every stage, every check the spec calls for;
    no check fails, and a check that cannot run on cpu says why."""
    out = tmp_path / "out"
    res = new_model(ROOT / "model_specs" / f"{name}.yaml", out)
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads((out / "validation" / "validation.json").read_text())
    assert result["passed"] is True
    names = [c["name"] for c in result["checks"]]
    assert names[:2] == ["accuracy", "kv-cache"] and "speed" in names
    for check in result["checks"]:
        assert check["status"] != "failed", (check["name"], check["details"])
        if check["status"] == "not-run":
            assert check["details"], check["name"]
    assert (out / "validation" / "report.html").is_file()
    # The report agrees with validation.json: every number it shows is the file's
    # (as written and as data), and every check metric is shown.
    page = (out / "validation" / "report.html").read_text()
    assert assert_numbers_match(page, [result]) > 50
    speed = next(c for c in result["checks"] if c["name"] == "speed")
    for variant in speed["metrics"]["variants"].values():
        for level in variant["sweep"]:
            # Per-token figures (the speed check fails on tokens read in bursts).
            assert level["tpot_ms"] > 0.1 * level["engine_tpot_ms"], level
    print(
        f"\n{name}: "
        + "; ".join(f"{c['name']} {c['status']}" for c in result["checks"])
        + f"\nspeed: {speed['details']}"
    )
