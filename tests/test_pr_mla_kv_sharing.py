"""The vLLM core change for MLA cross-layer KV sharing (onboard/pr/mla_kv_sharing).

Fast: no engine. The change is applied to a copy of the installed vLLM (a
hard-link farm with the edited files real), and the copy builds two MLA layers,
the second reading the first's cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from onboard.pr.build import installed_vllm_root
from onboard.pr.edits import Edit, EditError, apply_edits
from onboard.pr.farm import vllm_farm
from onboard.pr.mla_kv_sharing import CPU_MLA, MLA_ATTENTION, mla_kv_sharing_edits

REFUSAL = "KV sharing is not supported for MLA"

# Two MLA layers in the patched tree (CPU MLA dims: latent 512 + rope key 64);
# the second shares the first's cache; bad targets are refused; the model
# runner's KV-cache spec allocates one cache and records the sharing pair.
PROBE = """
import tempfile
from types import SimpleNamespace

import torch

import vllm
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.layers.attention import MLAAttention
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

print("vllm:", vllm.__file__)
config = VllmConfig()
torch.set_default_dtype(torch.bfloat16)
with set_current_vllm_config(config):
    init_distributed_environment(
        world_size=1, rank=0, local_rank=0,
        distributed_init_method=f"file://{tempfile.mkstemp()[1]}", backend="gloo",
    )
    initialize_model_parallel(1, 1)

    def layer(i, target=None):
        return MLAAttention(
            num_heads=4, scale=0.1, qk_nope_head_dim=32, qk_rope_head_dim=64,
            v_head_dim=32, q_lora_rank=None, kv_lora_rank=512,
            kv_b_proj=torch.nn.Linear(512, 4 * 64, bias=False),
            prefix=f"model.layers.{i}.self_attn.attn",
            kv_sharing_target_layer_name=target,
        )

    own = layer(0)
    shared = layer(1, "model.layers.0.self_attn.attn")
    for bad in ("model.layers.5.self_attn.attn", "model.layers.2.mlp"):
        try:
            layer(2, bad)
        except ValueError as exc:
            print("refused:", exc)
        else:
            raise SystemExit(f"target {bad} accepted")
    runner = SimpleNamespace(vllm_config=config, shared_kv_cache_layers={})
    specs = GPUModelRunner.get_kv_cache_spec(runner)
    print("caches:", sorted(specs))
    print("shared:", runner.shared_kv_cache_layers)
    spec = specs["model.layers.0.self_attn.attn"]
    print("bytes per token:", spec.page_size_bytes // spec.block_size)
"""


def _by_path(edits: list[Edit]) -> dict[str, list[Edit]]:
    out: dict[str, list[Edit]] = {}
    for edit in edits:
        out.setdefault(edit.path, []).append(edit)
    return out


def test_edits_apply_once_to_the_pinned_release_and_lift_the_refusals():
    root = installed_vllm_root()
    for path, edits in _by_path(mla_kv_sharing_edits()).items():
        old = (root / path).read_text(encoding="utf-8")
        new = apply_edits(old, edits)
        assert new != old, path
        assert apply_edits(new, edits) == new, f"{path}: not idempotent"
        compile(new, path, "exec")
        if path in (MLA_ATTENTION, CPU_MLA):
            assert REFUSAL in old
            assert REFUSAL not in new


def test_a_moved_anchor_is_an_error_naming_the_file():
    edit = mla_kv_sharing_edits()[0]
    with pytest.raises(EditError, match="mla_attention.py.*occurs 0 times"):
        apply_edits("nothing here\n", [edit])


def _patched_tree(tmp: Path) -> Path:
    edits = _by_path(mla_kv_sharing_edits())
    root = vllm_farm(tmp, edits)
    for path, file_edits in edits.items():
        target = root / path
        target.write_text(apply_edits(target.read_text(), file_edits))
    return root


def _probe(tree: Path, tmp: Path) -> subprocess.CompletedProcess:
    script = tmp / "probe.py"
    script.write_text(PROBE)
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{tree}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_patched_tree_shares_one_mla_cache_between_two_layers(tmp_path):
    root = _patched_tree(tmp_path / "tree")
    done = _probe(root, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert f"vllm: {root}" in out
    assert out.count("refused:") == 2
    assert "is not an earlier MLA attention layer" in out
    assert "caches: ['model.layers.0.self_attn.attn']" in out
    assert (
        "shared: {'model.layers.1.self_attn.attn': 'model.layers.0.self_attn.attn'}"
        in out
    )
    # One cache of the latent (512) and the rope key (64) in bfloat16.
    assert "bytes per token: 1152" in out


def _mla_sharing_text() -> str:
    root = Path(__file__).resolve().parents[1]
    text = (root / "model_specs" / "deepseek-v3-style.yaml").read_text()
    text = text.replace("  type: mla\n", "  type: mla\n  kv_sharing: {4: 3}\n")
    text = text.replace("model_type: deepseek_v3", "model_type: mla_share")
    return text.replace("DeepseekV3ForCausalLM", "MlaShareForCausalLM")


def _mla_sharing_spec(tmp: Path):
    """DeepSeek-V3-style with a sharing layer, in the generated form: no rope
    scaling, no MTP heads."""
    import yaml

    from onboard.spec import load_spec

    data = yaml.safe_load(_mla_sharing_text())
    data["rope"].pop("scaling")
    data.pop("mtp")
    data["speculators"] = []
    path = tmp / "mla-share.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(path)


def test_the_forms_not_validated_on_the_engine_are_refused_at_check():
    # DeepSeek-V3's YaRN rope and MTP heads beside sharing layers are not
    # generated; its MLA projections are (tests/test_mla_kv_sharing_*). A spec
    # rule, located at the field, so generate never sees them.
    from onboard.spec import SpecError, parse_spec_text

    with pytest.raises(SpecError) as info:
        parse_spec_text(_mla_sharing_text(), "mla-share.yaml")
    assert "rope.scaling: MLA layers that share" in str(info.value)
    assert "mtp: MLA layers that share" in str(info.value)


def test_pr_plan_of_an_mla_sharing_spec_carries_the_core_change(tmp_path):
    from onboard.pr.build import pr_changes
    from onboard.spec.naming import package_name

    spec = _mla_sharing_spec(tmp_path)
    model = "# SPDX-License-Identifier: Apache-2.0\n# generated\nX = 1\n"
    files = {
        f"{package_name(spec)}/{spec.module_name}.py": model,
        f"{package_name(spec)}/config.py": model,
    }
    plan = pr_changes(spec, files)
    assert [e for e in plan.edits if e.op == "replace"] == mla_kv_sharing_edits()
    assert any("MLA layer's latent cache" in note for note in plan.notes)
