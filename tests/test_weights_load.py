"""Quantized weights load into the generated models (onboard.runtime.weights_probe).

Where vLLM's CPU build cannot run a format, the probe builds the generated model
with the checkpoint's quantization config on CPU and checks that every tensor is
consumed into a parameter of the stored shape and dtype. Here: gpt-oss's own
MXFP4 experts format (its checkpoints ship it), a quantized dense and MoE model,
the faults the probe must find, and (``make test-all``) every bundled spec with
every scheme onboard writes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.errors import InputError
from onboard.generate import write_model_code
from onboard.quantize import quantize_checkpoint
from onboard.runtime.engine import EngineOptions, engine_state_options, read_plugin
from onboard.runtime.weights_probe import probe_weights
from onboard.spec import load_spec
from onboard.spec.model import ModelSpec

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
SCHEMES = ("fp8-dynamic", "fp8-block", "nvfp4", "nvfp4a16", "mxfp4", "w4a16",
           "w4a16-asym", "w8a8-int8")  # fmt: skip
# vLLM's refusal of fp8-block partitions that are not whole 128-row blocks.
NARROW_FP8_BLOCK = "is not divisible by weight quantization block_n = 128"
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def tiny(
    name: str, out: Path, moe: dict | None = None, **changes
) -> tuple[ModelSpec, Path, Path]:
    """A bundled spec's tiny checkpoint and its generated plugin (``moe``: changes
    to its mlp.moe section)."""
    data = load_spec(ROOT / "model_specs" / f"{name}.yaml").model_dump(mode="json")
    data.update(changes)
    data["mlp"]["moe"] = data["mlp"]["moe"] and {**data["mlp"]["moe"], **(moe or {})}
    write_tiny_checkpoint(ModelSpec.model_validate(data), out / "ckpt", seed=0)
    spec = load_spec(out / "ckpt" / "spec.yaml")
    write_model_code(spec, out / "gen")
    return spec, out / "ckpt", out / "gen" / "plugin"


def probe(spec, plugin: Path, dirs: list[Path], work: Path):
    """As the quant check probes: the engine's options for the spec (dtype,
    CPU shims, sparse MLA run densely where the CPU has no sparse backend)."""
    # onboard.validate.harness.dense_equivalent: the config's index_topk 0.
    dense = {"hf_overrides": {"index_topk": 0}} if spec.attention.indexer else {}
    options = EngineOptions(
        model_dir=dirs[0],
        plugin=read_plugin(plugin),
        extra=dense,
        **engine_state_options(spec),
    )
    return probe_weights(dirs, work, options, spec)


def mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., out, in] -> OpenAI's MXFP4: blocks [..., out, in / 32, 16] (E2M1
    codes, low nibble first) and scales [..., out, in / 32] (E8M0)."""
    *lead, rows, cols = weight.shape
    groups = weight.float().reshape(*lead, rows, cols // 32, 32)
    amax = groups.abs().amax(-1, keepdim=True).clamp_min(2.0**-126)
    exponent = torch.floor(torch.log2(amax)) - 2  # 6.0 = 1.5 x 2^2
    scaled = groups / torch.exp2(exponent)
    magnitude = (scaled.abs().unsqueeze(-1) - E2M1).abs().argmin(-1)
    code = (magnitude | ((scaled < 0) & (magnitude > 0)).long() << 3).to(torch.uint8)
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    scales = (exponent.squeeze(-1) + 127).clamp(0, 255).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


def openai_mxfp4(src: Path, out: Path) -> Path:
    """gpt-oss's checkpoint format: the experts in MXFP4 (output dim first),
    everything else 16-bit, ``quant_method: mxfp4``."""
    out.mkdir(parents=True)
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(src.glob("*.safetensors")):
        for name, tensor in load_file(path).items():
            if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
                # stored input dim first: [experts, in, out] -> [experts, out, in]
                blocks, scales = mxfp4(tensor.transpose(1, 2))
                tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
            else:
                tensors[name] = tensor
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("spec.yaml", "generation_config.json", "tokenizer.json"):
        shutil.copy(src / name, out / name)
    return out


def test_gpt_oss_loads_its_own_mxfp4_experts(tmp_path):
    """gpt-oss's checkpoints store the experts in MXFP4 (``*_blocks`` /
    ``*_scales``): the generated model loads them into vLLM's MXFP4 MoE
    parameters; without its MXFP4 path (a spec that ships no mxfp4) it cannot."""
    spec, ckpt, plugin = tiny("gpt-oss-style", tmp_path)
    checkpoint = openai_mxfp4(ckpt, tmp_path / "mxfp4")
    # The same model generated without the MXFP4 path.
    bare = spec.model_copy(update={"quantization": []})
    write_model_code(bare, tmp_path / "bare")
    (ok,) = probe(spec, plugin, [checkpoint], tmp_path / "probe")
    (bad,) = probe(bare, tmp_path / "bare" / "plugin", [checkpoint], tmp_path / "bad")
    assert ok.passed, ok.summary()
    assert ok.consumed == ok.tensors
    assert any("Mxfp4" in m for m in ok.quant_methods), ok.quant_methods
    assert not bad.passed and "_blocks" in bad.error, bad.summary()


def test_fp8_block_experts_load_where_the_spec_has_whole_blocks(tmp_path):
    """vLLM builds fp8-block layers only from whole 128-row blocks per partition.
    A spec whose experts are whole blocks gets a tiny checkpoint whose experts are
    too (128 wide), and it loads; one whose experts are not (192) keeps 64-wide
    tiny experts, and the probe reports vLLM's refusal, as vLLM would refuse the
    full-size checkpoint."""
    spec, ckpt, plugin = tiny("qwen3-next-style", tmp_path / "whole")
    odd, odd_ckpt, _ = tiny(
        "qwen3-next-style",
        tmp_path / "odd",
        moe={"expert_intermediate_size": 192, "shared_expert_intermediate_size": 192},
    )
    assert spec.mlp.moe.expert_intermediate_size == 128
    assert odd.mlp.moe.expert_intermediate_size == 64
    dirs = [
        quantize_checkpoint(ckpt, "fp8-block", tmp_path / "q-whole", spec=spec),
        quantize_checkpoint(odd_ckpt, "fp8-block", tmp_path / "q-odd", spec=odd),
    ]
    ok, refused = probe(spec, plugin, dirs, tmp_path / "probe")
    assert ok.passed, ok.summary()
    assert ok.consumed == ok.tensors - ok.skipped
    assert not refused.passed
    assert NARROW_FP8_BLOCK in refused.error, refused.summary()


def test_int4_and_int8_moe_experts_load_where_the_cpu_has_no_amx(tmp_path):
    """INT4 (w4a16, w4a16-asym) and INT8 (w8a8-int8) DeepSeek-V3-style
    checkpoints, experts included, load into the generated model. vLLM's CPU
    INT4 / INT8 experts need AMX tiles (CPUExpertsInt4 / CPUExpertsInt8); the
    probe builds them without that check where the CPU lacks AMX. The experts
    are 128 wide (one INT4 group; the tiny checkpoint keeps whole groups and
    blocks where the spec ships INT4 or fp8-block, as this one does)."""
    spec, ckpt, plugin = tiny("deepseek-v3-style", tmp_path)
    assert spec.mlp.moe.expert_intermediate_size == 128
    schemes = ("w4a16", "w4a16-asym", "w8a8-int8")
    written = [quantize_checkpoint(ckpt, s, tmp_path / s, spec=spec) for s in schemes]
    results = probe(spec, plugin, written, tmp_path / "probe")
    for scheme, result in zip(schemes, results, strict=True):
        assert result.passed, (scheme, result.summary())
        assert result.consumed == result.tensors - result.skipped > 0
        experts = "Int8" if scheme == "w8a8-int8" else "WNA16"
        assert any(experts in m for m in result.quant_methods), result.quant_methods
        if not torch.cpu._is_amx_tile_supported():
            assert any("MoE: CPUExperts" in f for f in result.fallbacks), scheme


@pytest.fixture(scope="module")
def dense_nvfp4(tmp_path_factory):
    work = tmp_path_factory.mktemp("dense")
    spec, ckpt, plugin = tiny("dense-gqa", work)
    return spec, plugin, quantize_checkpoint(ckpt, "nvfp4", work / "nvfp4", spec=spec)


def _edited(src: Path, out: Path, edit) -> Path:
    shutil.copytree(src, out)
    for path in sorted(out.glob("*.safetensors")):
        tensors = load_file(path)
        edit(tensors)
        save_file(tensors, str(path), metadata={"format": "pt"})
    return out


def test_the_probe_finds_a_missing_and_a_reinterpreted_tensor(dense_nvfp4, tmp_path):
    """The faults a loader makes: a scale no tensor fills, packed FP4 bytes read
    as numbers. The intact checkpoint passes in the same run."""
    spec, plugin, nvfp4 = dense_nvfp4
    scale = "model.layers.0.mlp.down_proj.weight_scale"
    packed = "model.layers.1.self_attn.o_proj.weight_packed"

    def drop(tensors):
        tensors.pop(scale, None)

    def as_float(tensors):
        if packed in tensors:
            tensors[packed] = tensors[packed].to(torch.bfloat16)

    missing = _edited(nvfp4, tmp_path / "missing", drop)
    floated = _edited(nvfp4, tmp_path / "floated", as_float)
    intact, no_scale, cast = probe(
        spec, plugin, [nvfp4, missing, floated], tmp_path / "probe"
    )
    assert intact.passed, intact.summary()
    assert not no_scale.passed
    assert any(
        "not (fully) written" in p and "mlp.down_proj.weight_scale" in p
        for p in no_scale.problems
    ), no_scale.problems
    assert not cast.passed
    assert any("reinterpreted" in p and "o_proj" in p for p in cast.problems), (
        cast.problems
    )


# ---- every bundled spec, every scheme (make test-all) ------------------------------


@pytest.mark.acceptance
@pytest.mark.parametrize(
    "name", sorted(p.stem for p in (ROOT / "model_specs").glob("*.yaml"))
)
def test_every_scheme_loads_into_the_generated_model(name, tmp_path):
    # Every scheme listed, so the tiny copy keeps its widths in each scheme's
    # whole blocks where the full-size spec has them (glm-5-style lists only
    # nvfp4: its tiny experts were 64 rows, which fp8-block cannot load).
    spec, ckpt, plugin = tiny(name, tmp_path, quantization=list(SCHEMES))
    written, refused = [], {}
    for scheme in SCHEMES:
        try:
            written.append(
                quantize_checkpoint(ckpt, scheme, tmp_path / scheme, spec=spec)
            )
        except InputError as exc:  # onboard refuses it for this model: say why
            refused[scheme] = str(exc)
    results = probe(spec, plugin, written, tmp_path / "probe")
    report = {Path(r.model_dir).name: r.summary() for r in results}
    for result in results:
        assert result.passed, (Path(result.model_dir).name, report)
        assert result.consumed == result.tensors - result.skipped
    print(json.dumps({"loaded": report, "refused by onboard": refused}, indent=1))
