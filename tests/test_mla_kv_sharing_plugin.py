"""The plugin's runtime patch for MLA cross-layer KV sharing (mla_kv_sharing.py).

Fast: no engine. The plugin generated for tests/fixtures/mla_share/spec.yaml is
imported by a fresh interpreter (the patch changes vLLM's classes for the whole
process): another vLLM version is refused; on the installed 0.32 the patch makes
lets two MLA layers share one latent cache (and register() makes the model
type MLA), as the core
change in the PR tree does (tests/test_pr_mla_kv_sharing.py). The engine run is
tests/test_mla_kv_sharing_engine.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "tests" / "fixtures" / "mla_share" / "spec.yaml"

PROBE = """
import tempfile
from types import SimpleNamespace

import torch

import vllm
import onboard_plugin_mla_share
from onboard_plugin_mla_share import mla_kv_sharing

# Another vLLM is refused before anything is patched.
released = vllm.__version__
vllm.__version__ = "0.33.0"
try:
    mla_kv_sharing.patch()
except RuntimeError as exc:
    print("other version:", exc)
vllm.__version__ = released

from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.layers.attention import MLAAttention
from vllm.transformers_utils import model_arch_config_convertor as convertors
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

def is_mla(model_type):
    cls = convertors.MODEL_ARCH_CONFIG_CONVERTORS.get(
        model_type, convertors.ModelArchConfigConvertorBase
    )
    convertor = object.__new__(cls)
    convertor.hf_text_config = SimpleNamespace(model_type=model_type)
    return convertor.is_deepseek_mla()

print("mla before:", is_mla("mla_share"))
onboard_plugin_mla_share.register()  # the convertor, then the patch
mla_kv_sharing.patch()  # a second call changes nothing
print("mla after:", is_mla("mla_share"), is_mla("llama"))

config = VllmConfig()
torch.set_default_dtype(torch.bfloat16)
with set_current_vllm_config(config):
    init_distributed_environment(
        world_size=1, rank=0, local_rank=0,
        distributed_init_method=f"file://{tempfile.mkstemp()[1]}", backend="gloo",
    )
    initialize_model_parallel(1, 1)

    def layer(i, target=None, rank=512):
        return MLAAttention(
            num_heads=4, scale=0.1, qk_nope_head_dim=32, qk_rope_head_dim=64,
            v_head_dim=32, q_lora_rank=None, kv_lora_rank=rank,
            kv_b_proj=torch.nn.Linear(rank, 4 * 64, bias=False),
            prefix=f"model.layers.{i}.self_attn.attn",
            kv_sharing_target_layer_name=target,
        )

    own = layer(0)
    shared = layer(1, "model.layers.0.self_attn.attn")
    print(
        "target:", own.kv_sharing_target_layer_name,
        shared.kv_sharing_target_layer_name,
    )
    for i, bad, rank in (
        (2, "model.layers.5.self_attn.attn", 512),
        (3, "model.layers.2.mlp", 512),
        (4, "model.layers.0.self_attn.attn", 256),
    ):
        try:
            layer(i, bad, rank)
        except ValueError as exc:
            print("refused:", exc)
        else:
            raise SystemExit(f"target {bad} accepted")
    # The sharing layer writes nothing: its cache stays as it was.
    cache = torch.zeros(2, 16, 576)
    shared.update_kv_cache(
        torch.ones(3, 512), torch.ones(3, 1, 64), cache, torch.arange(3),
        None, "auto", torch.tensor(1.0),
    )
    print("sharing layer wrote:", bool(cache.any()))
    own.update_kv_cache(
        torch.ones(3, 512), torch.ones(3, 1, 64), cache, torch.arange(3),
        None, "auto", torch.tensor(1.0),
    )
    print("owning layer wrote:", bool(cache.any()))
    runner = SimpleNamespace(vllm_config=config, shared_kv_cache_layers={})
    specs = GPUModelRunner.get_kv_cache_spec(runner)
    print("caches:", sorted(specs))
    print("shared:", runner.shared_kv_cache_layers)
    spec = specs["model.layers.0.self_attn.attn"]
    print("bytes per token:", spec.page_size_bytes // spec.block_size)
"""


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    from onboard.generate import generate_files
    from onboard.spec import load_spec

    out = tmp_path_factory.mktemp("mla-share-plugin")
    for rel, text in generate_files(load_spec(SPEC)).items():
        if rel.startswith("plugin/"):
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return out / "plugin"


def test_plugin_carries_the_patch_and_register_applies_it(plugin):
    package = plugin / "onboard_plugin_mla_share"
    init = (package / "__init__.py").read_text()
    assert "from onboard_plugin_mla_share.mla_kv_sharing import patch" in init
    assert init.index("patch()") < init.index("ModelRegistry.register_model")
    assert "_register_mla_cache()" in init  # the model type is MLA
    patch = (package / "mla_kv_sharing.py").read_text()
    assert 'VLLM_SERIES = "0.32"' in patch


def test_the_patch_lets_two_mla_layers_share_one_cache(plugin, tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{plugin}{os.pathsep}{env.get('PYTHONPATH', '')}"
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "other version: MlaShareForCausalLM shares MLA caches" in out
    assert "this plugin patches vLLM 0.32 only" in out
    assert "mla before: False" in out
    assert "mla after: True False" in out
    assert "target: None model.layers.0.self_attn.attn" in out
    assert out.count("refused:") == 3
    assert "is not an earlier MLA attention layer" in out
    assert "caches 576 values per token" in out
    assert "sharing layer wrote: False" in out
    assert "owning layer wrote: True" in out
    assert "caches: ['model.layers.0.self_attn.attn']" in out
    assert (
        "shared: {'model.layers.1.self_attn.attn': 'model.layers.0.self_attn.attn'}"
        in out
    )
    # One cache of the latent (512) and the rope key (64) in bfloat16.
    assert "bytes per token: 1152" in out


# What vLLM's MLA layers do with a sharing target, observed the same way on the
# released vLLM with the plugin's runtime patch and on a vLLM tree with the PR's
# core change (onboard/pr/mla_kv_sharing.py): the two forms of one change.
BEHAVIOUR = PROBE[PROBE.index("config = VllmConfig()") :]
RUNTIME_PREAMBLE = """
import tempfile
from types import SimpleNamespace

import torch

from onboard_plugin_mla_share import mla_kv_sharing

mla_kv_sharing.patch()
"""
TREE_PREAMBLE = """
import tempfile
from types import SimpleNamespace

import torch
"""
IMPORTS = """
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.layers.attention import MLAAttention
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
"""


def _behaviour(preamble: str, path: Path, tmp: Path) -> list[str]:
    script = tmp / "behaviour.py"
    script.write_text(preamble + IMPORTS + BEHAVIOUR)
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_the_runtime_patch_behaves_as_the_pr_core_change(plugin, tmp_path):
    """The plugin's runtime patch on the released vLLM and the PR tree's core
    change give vLLM's MLA layers the same behaviour, line for line: which
    targets they take or refuse (and why), what a sharing layer writes to the
    cache, and the KV-cache spec the model runner builds."""
    from test_pr_mla_kv_sharing import _patched_tree

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    runtime = _behaviour(RUNTIME_PREAMBLE, plugin, tmp_path / "a")
    tree = _behaviour(TREE_PREAMBLE, _patched_tree(tmp_path / "tree"), tmp_path / "b")
    assert any(line.startswith("refused:") for line in runtime)
    assert "bytes per token: 1152" in runtime
    assert runtime == tree
