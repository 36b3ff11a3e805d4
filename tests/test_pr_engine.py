"""The in-tree path: the PR applied to a copy of the installed vLLM serves the
model with no plugin and passes the same accuracy validation.

Per spec: generate, tiny checkpoint, `onboard pr apply` to a hard-link farm of the
installed vLLM (onboard.pr.farm), `import vllm.model_executor.models.<name>` from
it, then `onboard validate --reference-vllm-in-tree` with the farm first on
PYTHONPATH (the engine's processes inherit it). dense-gqa runs in `make test`
(about 2 min), the other bundled specs in `make test-all`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.pipeline.generate import generate_all
from onboard.pr import apply as pr
from onboard.pr.farm import vllm_farm
from onboard.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
ONBOARD = str(Path(sys.executable).with_name("onboard"))


def _in_tree_run(tmp: Path, name: str) -> None:
    spec_path = ROOT / "model_specs" / f"{name}.yaml"
    spec = load_spec(spec_path)
    gen, ckpt, out = tmp / "gen", tmp / "ckpt", tmp / "out"
    generate_all(spec, gen)
    # Accuracy does not read the MTP heads: no training step (a minute of CPU).
    write_tiny_checkpoint(spec, ckpt)
    patch = (gen / "vllm-pr" / "changes.patch").read_text()
    touched = [
        line.split(" b/", 1)[1]
        for line in patch.splitlines()
        if line.startswith("diff --git ")
    ]
    farm = vllm_farm(tmp / "vllm-src", touched)
    plan = pr.apply(gen, farm)
    assert plan.kind == "installed package"
    # The copy goes first on the path (before site-packages) for every process.
    path = os.pathsep.join(filter(None, [str(farm), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    module = f"vllm.model_executor.models.{spec.module_name}"
    probe = subprocess.run(
        [sys.executable, "-c", f"import {module} as m; print(m.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip().splitlines()[-1].startswith(str(farm))
    t0 = time.perf_counter()
    run = subprocess.run(
        [
            ONBOARD,
            "validate",
            str(ckpt),
            "--spec",
            str(ckpt / "spec.yaml"),  # the shrunk spec the checkpoint was made from
            "--generated",
            str(gen),
            "--reference-vllm-in-tree",
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    print(f"\n{name}: in-tree validate {time.perf_counter() - t0:.1f} s")
    assert (out / "validation.json").is_file(), run.stdout + run.stderr
    result = json.loads((out / "validation.json").read_text())
    accuracy = next(c for c in result["checks"] if c["name"] == "accuracy")
    print(
        json.dumps({k: v for k, v in accuracy["metrics"].items() if k != "per_prompt"})
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert accuracy["status"] == "passed", accuracy["details"]
    # vLLM's own registry, patched, chose the generated module: no plugin.
    assert result["vllm_model_class"] == f"{module}.{spec.architecture}"


@pytest.mark.engine
def test_dense_gqa_in_tree(tmp_path):
    _in_tree_run(tmp_path, "dense-gqa")


@pytest.mark.engine
@pytest.mark.acceptance
@pytest.mark.parametrize("name", ["deepseek-v3-style", "novel-launch"])
def test_in_tree_acceptance(tmp_path, name):
    _in_tree_run(tmp_path, name)
