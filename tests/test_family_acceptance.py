"""Acceptance: HF config -> spec -> tiny checkpoint -> transformers and vLLM.

For each family a config written by transformers' own config class goes through
``spec_from_hf_config_file`` and ``write_tiny_checkpoint``; the checkpoint must load
in transformers' own model class with no missing or unexpected keys, and in vLLM
(CPU, its in-tree model class, float32) and generate.

All the vLLM loads run in ONE subprocess (this file run as a script), so vLLM's
import cost is paid once; the engine runs in-process there
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so one model is freed before the next.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROMPTS = ["The capital of France is", "Hello, my name is"]
MAX_TOKENS = 8
LONG_TEXT = (
    "Every morning the harbour town wakes slowly. The fishing boats come back "
    "before the sun is high, the market opens, and the bakers carry warm bread."
)

# The common small dimensions, then what each family needs to show its features.
_SMALL = dict(
    vocab_size=1000,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
)
_MLA = dict(
    _SMALL,
    num_key_value_heads=4,
    kv_lora_rank=512,  # the CPU MLA decode kernel needs a 576-wide latent
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    n_routed_experts=8,
    n_shared_experts=2,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    first_k_dense_replace=1,
)
FAMILIES: dict[str, tuple[str, str, dict]] = {
    # family: (config class, architecture, config kwargs)
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        _SMALL, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        })),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(
        _SMALL, head_dim=64, sliding_window=1024)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(_SMALL)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        _SMALL, head_dim=128, tie_word_embeddings=True)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        _SMALL, num_experts=16, num_experts_per_tok=4,
        moe_intermediate_size=128, norm_topk_prob=True, mlp_only_layers=[0])),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(
        _SMALL, num_local_experts=8, num_experts_per_tok=2)),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", dict(
        _SMALL, head_dim=64, sliding_window=None,
        layer_types=["full_attention"] * 4)),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", dict(
        _MLA, q_lora_rank=None, topk_method="greedy", routed_scaling_factor=1.0)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        _MLA, q_lora_rank=128, n_group=4, topk_group=2, routed_scaling_factor=2.5,
        num_nextn_predict_layers=1, rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
            "original_max_position_embeddings": 1024, "beta_fast": 32.0,
            "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        })),
    # Families `spec from-hf` proves (not verified): fused q/k/v and gate/up
    # tensors; a parallel block with weight-only LayerNorms and scaled logits.
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(
        _SMALL, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "cohere": ("CohereConfig", "CohereForCausalLM", dict(
        _SMALL, logit_scale=0.5, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
}  # fmt: skip

# vLLM's in-tree module for each family (not the Transformers modeling backend).
VLLM_MODULES = {
    "llama": "vllm.model_executor.models.llama",
    "mistral": "vllm.model_executor.models.mistral",
    "qwen2": "vllm.model_executor.models.qwen2",
    "qwen3": "vllm.model_executor.models.qwen3",
    "qwen3_moe": "vllm.model_executor.models.qwen3_moe",
    "mixtral": "vllm.model_executor.models.mixtral",
    "exaone4": "vllm.model_executor.models.exaone4",
    "deepseek_v2": "vllm.model_executor.models.deepseek_v2",
    "deepseek_v3": "vllm.model_executor.models.deepseek_v2",
    "phi3": "vllm.model_executor.models.phi3",
    "cohere": "vllm.model_executor.models.commandr",
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """family -> tiny checkpoint made from a config transformers wrote."""
    import transformers

    from onboard.checkpoint import write_tiny_checkpoint
    from onboard.reference.infer import infer_spec
    from onboard.spec.hf import FAMILIES as VERIFIED
    from onboard.spec.hf import spec_from_hf_config_file

    root = tmp_path_factory.mktemp("families")
    out = {}
    for family, (cls_name, arch, kwargs) in FAMILIES.items():
        config = getattr(transformers, cls_name)(architectures=[arch], **kwargs)
        config.save_pretrained(root / f"{family}-config")
        path = root / f"{family}-config" / "config.json"
        if family in VERIFIED:
            spec = spec_from_hf_config_file(path)
        else:  # what `spec from-hf` writes: inferred and proven
            spec, _ = infer_spec(json.loads(path.read_text()))
        assert spec.model_type == family and spec.architecture == arch
        out[family] = write_tiny_checkpoint(spec, root / family, seed=0)
    return out


def _mtp_layer_prefixes(ckpt: Path) -> set[str]:
    from onboard.spec import load_spec

    spec = load_spec(ckpt / "spec.yaml")
    heads = spec.mtp.num_heads if spec.mtp else 0
    n = spec.num_hidden_layers
    return {f"model.layers.{i}." for i in range(n, n + heads)}


def _layer_prefix(key: str) -> str:
    parts = key.split(".")
    return ".".join(parts[:3]) + "." if parts[:2] == ["model", "layers"] else key


@pytest.mark.parametrize("family", list(FAMILIES))
def test_loads_in_transformers_without_missing_or_unexpected_keys(
    checkpoints: dict[str, Path], family: str
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt = checkpoints[family]
    model, info = AutoModelForCausalLM.from_pretrained(
        ckpt, dtype=torch.float32, output_loading_info=True
    )
    assert type(model).__name__ == FAMILIES[family][1]
    assert info["missing_keys"] == set()
    assert info["mismatched_keys"] == set()
    assert info["error_msgs"] == []
    # transformers has no MTP modules: its DeepSeek-V3 class ignores only
    # r"model\.layers\.61.*" (the full model's MTP layer), so a tiny model's MTP
    # layer (model.layers.{num_hidden_layers}) is reported unexpected. vLLM loads
    # it (DeepSeekMTP) and its main-model loader skips it.
    # (It reports them after its own renaming, e.g. fused experts.gate_up_proj.)
    mtp = _mtp_layer_prefixes(ckpt)
    if family == "deepseek_v3":
        assert mtp  # the spec has an MTP head, so the checkpoint has one
    assert {_layer_prefix(k) for k in info["unexpected_keys"]} == mtp

    tok = AutoTokenizer.from_pretrained(ckpt)
    batch = tok(LONG_TEXT, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits[0]
    assert torch.isfinite(logits).all()
    top2 = logits.topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).median().item() > 1.0  # decisive, not flat


# Families whose tiny checkpoint is checked in transformers only here (the vLLM
# loads above run in `make test`; these run on the engine in tests/test_generate.py
# and tests/test_hf_families_acceptance.py).
_GRANITE = dict(
    _SMALL,
    embedding_multiplier=12.0,
    residual_multiplier=0.22,
    logits_scaling=16.0,
    attention_multiplier=1 / 64,
)
MORE_FAMILIES: dict[str, tuple[str, str, dict]] = {
    "granite": ("GraniteConfig", "GraniteForCausalLM", _GRANITE),
    # Experts saved stacked under the pre-transformers-5 names, which transformers
    # renames when it loads them.
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", dict(
        _GRANITE, num_local_experts=8, num_experts_per_tok=2)),
    "granitemoeshared": ("GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM",
                         dict(_GRANITE, num_local_experts=8, num_experts_per_tok=2,
                              shared_intermediate_size=128)),
}  # fmt: skip


@pytest.mark.parametrize("family", list(MORE_FAMILIES))
def test_more_families_load_in_transformers_without_missing_or_unexpected_keys(
    tmp_path: Path, family: str
) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from onboard.checkpoint import write_tiny_checkpoint
    from onboard.spec.hf import spec_from_hf_config_file

    cls_name, arch, kwargs = MORE_FAMILIES[family]
    getattr(transformers, cls_name)(architectures=[arch], **kwargs).save_pretrained(
        tmp_path / "config"
    )
    spec = spec_from_hf_config_file(tmp_path / "config" / "config.json")
    ckpt = write_tiny_checkpoint(spec, tmp_path / "ckpt", seed=0)
    model, info = AutoModelForCausalLM.from_pretrained(
        ckpt, dtype=torch.float32, output_loading_info=True
    )
    assert type(model).__name__ == arch
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert info["mismatched_keys"] == set() and info["error_msgs"] == []
    ids = torch.arange(24)[None]
    with torch.no_grad():
        logits = model(ids).logits[0]
    top2 = logits.topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).median().item() > 1.0  # decisive, not flat


@pytest.fixture(scope="module")
def vllm_results(checkpoints: dict[str, Path], tmp_path_factory) -> dict[str, dict]:
    """Load and run every family in one vLLM subprocess; family -> result."""
    work = tmp_path_factory.mktemp("vllm")
    job = work / "job.json"
    result = work / "result.json"
    job.write_text(json.dumps({f: str(p) for f, p in checkpoints.items()}))
    env = dict(
        os.environ,
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        # Lets the script ask the engine which model class it built.
        VLLM_ALLOW_INSECURE_SERIALIZATION="1",
    )
    proc = subprocess.run(
        [sys.executable, __file__, str(job), str(result)],
        env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    if not result.exists():
        raise AssertionError(
            f"vLLM worker exited {proc.returncode} without results:\n"
            f"{proc.stderr[-6000:]}"
        )
    return json.loads(result.read_text())


@pytest.mark.engine
@pytest.mark.parametrize("family", list(FAMILIES))
def test_loads_in_vllm_in_tree_and_generates(
    vllm_results: dict[str, dict], checkpoints: dict[str, Path], family: str
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    res = vllm_results[family]
    assert res["ok"], res["error"]
    module, _, cls = res["model_class"].rpartition(".")
    assert module == VLLM_MODULES[family]
    assert cls == FAMILIES[family][1]
    for tokens in res["token_ids"]:
        assert len(tokens) == MAX_TOKENS

    # The first greedy token comes from the prefill alone: float32 vLLM and
    # transformers must agree on it when the logits are decisive.
    ckpt = checkpoints[family]
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(ckpt)
    for prompt, tokens in zip(PROMPTS, res["token_ids"], strict=True):
        with torch.no_grad():
            logits = model(**tok(prompt, return_tensors="pt")).logits[0, -1]
        assert tokens[0] == int(logits.argmax()), prompt


# ---- acceptance: from-hf -> generate -> pip install -> validate -----------

ONBOARD = str(Path(sys.executable).with_name("onboard"))
ROOT = Path(__file__).resolve().parents[1]
SWEEP = ("llama", "qwen3", "exaone4", "qwen3_moe", "mixtral", "deepseek_v3")


def _run(*args: str, env: dict | None = None, timeout: int = 1800):
    proc = subprocess.run(
        list(args), capture_output=True, text=True, env=env, timeout=timeout
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr[-4000:]
    return proc


def _with_site(site: Path) -> str:
    """PYTHONPATH with pip's --target directory in front (kept: the caller's)."""
    return os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))


def _pip_install_target(plugin_dir: Path, site: Path, tmp: Path) -> None:
    import shutil

    src = tmp / "plugin-src"
    shutil.copytree(plugin_dir, src)  # setuptools builds in the source tree
    _run(
        sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
        "--no-index", "-q", "--target", str(site), str(src),
    )  # fmt: skip
    shutil.rmtree(src)


@pytest.mark.acceptance  # ~30 s of pip builds; make test's budget is spent
def test_installed_plugin_is_what_the_engine_is_given(tmp_path: Path):
    """`validate --installed-plugin` reads the plugin from pip's .dist-info and puts
    nothing of its own on the engine's path (no engine here)."""
    from onboard.pipeline.generate import generate_all
    from onboard.spec import load_spec

    spec = load_spec(ROOT / "model_specs" / "dense-gqa.yaml")
    generate_all(spec, tmp_path / "gen")
    site = tmp_path / "site"
    _pip_install_target(tmp_path / "gen" / "plugin", site, tmp_path)
    probe = (
        "import json, pathlib\n"
        "from onboard.runtime.engine import Engine, EngineOptions, installed_plugin\n"
        "p = installed_plugin('onboard-plugin-dense-gqa')\n"
        "e = Engine(EngineOptions(model_dir=pathlib.Path('.'), plugin=p),"
        " pathlib.Path('w'), pathlib.Path('w.log'))\n"
        "env = e.environment()\n"
        "print(json.dumps([str(p.root), p.package, p.target, p.installed,"
        " env['VLLM_PLUGINS'], env['PYTHONPATH']]))\n"
    )
    env = {**os.environ, "PYTHONPATH": _with_site(site)}
    out = _run(sys.executable, "-c", probe, env=env)
    root, package, target, installed, plugins, path = json.loads(out.stdout)
    assert (root, package, installed) == (str(site), "onboard_plugin_dense_gqa", True)
    assert target == "onboard_plugin_dense_gqa:register"
    assert plugins == "onboard_plugin_dense_gqa"  # only this plugin is loaded
    # Only onboard's own root is added in front of the user's PYTHONPATH.
    assert path.split(os.pathsep) == [str(ROOT), *_with_site(site).split(os.pathsep)]
    missing = _run(
        sys.executable, "-c",
        "from onboard.runtime.engine import installed_plugin\n"
        "installed_plugin('onboard-plugin-dense-gqa')",
    )  # fmt: skip
    assert missing.returncode == 1 and "is not installed" in missing.stderr


@pytest.mark.acceptance
@pytest.mark.engine
@pytest.mark.parametrize("family", SWEEP)
def test_sweep_from_hf_generate_pip_install_validate(family: str, tmp_path: Path):
    """A checkpoint transformers wrote -> `onboard spec from-hf` -> `onboard
    generate` -> pip installs DIR/plugin -> `onboard validate --target cpu
    --installed-plugin` passes with the generated class instantiated.

    pip builds and installs the plugin (wheel, .dist-info with its entry point)
    into a site directory on PYTHONPATH (``pip install --target``: the venv stays
    untouched, so vLLM's own classes remain its baselines). The generated sources
    are then deleted, so the only copy of the package is pip's, and validate adds
    nothing to the engine's path: vLLM finds the plugin through its
    ``vllm.general_plugins`` entry point as after a user's ``pip install``."""
    import shutil
    import time

    from hf_tiny import write_hf_checkpoint

    t0 = time.perf_counter()
    ckpt = write_hf_checkpoint(family, tmp_path / "ckpt")
    spec, gen = tmp_path / "spec.yaml", tmp_path / "gen"
    name = f"tiny-{family.replace('_', '-')}"
    _run(ONBOARD, "spec", "from-hf", str(ckpt), "-o", str(spec), "--name", name)
    _run(ONBOARD, "generate", str(spec), "--out", str(gen))
    site = tmp_path / "site"
    _pip_install_target(gen / "plugin", site, tmp_path)
    shutil.rmtree(gen / "plugin")
    package = f"onboard_plugin_{name.replace('-', '_')}"
    env = {**os.environ, "PYTHONPATH": _with_site(site)}
    where = _run(
        sys.executable, "-c",
        f"import importlib.util as u; print(u.find_spec({package!r}).origin)",
        env=env,
    )  # fmt: skip
    assert where.stdout.strip() == str(site / package / "__init__.py")

    out = tmp_path / "out"
    proc = _run(
        ONBOARD, "validate", str(ckpt), "--spec", str(spec), "--target", "cpu",
        "--out", str(out), "--installed-plugin", env=env,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    result = json.loads((out / "validation.json").read_text())
    accuracy = next(c for c in result["checks"] if c["name"] == "accuracy")
    m = accuracy["metrics"]
    print(
        f"\n{family}: {seconds:.0f} s end to end; {result['vllm_model_class']}; "
        f"{accuracy['details'].splitlines()[0]}; timings {m.get('timings')}"
    )
    assert proc.returncode == 0, accuracy["details"] + proc.stdout[-3000:]
    assert result["passed"] is True and accuracy["status"] == "passed"
    assert f"loading the installed plugin onboard-plugin-{name}" in proc.stderr
    arch = FAMILIES[family][1]
    assert result["vllm_model_class"] == f"{package}.{name.replace('-', '_')}.{arch}"
    assert m["generated_class_instantiated"] is True
    assert result["reference"].startswith("transformers ")
    assert m["num_prompts"] >= 8 and m["max_new_tokens"] == 32
    assert m["greedy_failed_sequences"] == 0
    assert m["prompt_logprob_max_abs_diff"] <= m["prompt_logprob_atol"]
    assert m["top1_top2_margin_median"] > 0.1  # decisive logits


# ---- the worker (run as a script by the vllm_results fixture) ----------------------


def _model_class(model) -> str:
    return f"{type(model).__module__}.{type(model).__qualname__}"


def _run_one(family: str, path: str) -> dict:
    from vllm import LLM, SamplingParams

    spec_text = Path(path, "spec.yaml").read_text()
    kwargs = {}
    if "type: mla" in spec_text:
        # vLLM 0.32 picks AMX_MLA on any AMX host, whatever the dtype, and that
        # backend only takes bf16 weights ("expect weight to be bfloat16, ...").
        kwargs["attention_backend"] = "CPU_MLA"
    llm = LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=256,
              seed=0, **kwargs)  # fmt: skip
    try:
        outs = llm.generate(
            PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                    ignore_eos=True)
        )  # fmt: skip
        return {
            "ok": True,
            "model_class": llm.apply_model(_model_class)[0],
            "token_ids": [list(o.outputs[0].token_ids) for o in outs],
            "text": [o.outputs[0].text for o in outs],
        }
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm


def main(job: Path, result: Path) -> None:
    import gc
    import traceback

    from onboard.runtime.engine_worker import inspect_classes_here

    inspect_classes_here()  # as onboard's engine worker does
    results = {}
    for family, path in json.loads(job.read_text()).items():
        try:
            results[family] = _run_one(family, path)
        except Exception:  # record and go on: one family's failure is its own
            results[family] = {"ok": False, "error": traceback.format_exc()[-4000:]}
        gc.collect()
        print(family, "ok" if results[family]["ok"] else "FAILED", flush=True)
    result.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
