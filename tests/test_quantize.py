"""onboard quantize: the kernels against compressed-tensors, whole checkpoints of the
DeepSeek-V3-style tiny model (MLA + MoE + MTP) for every scheme, and the CLI's errors.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from onboard.errors import InputError
from onboard.quantize import SCHEMES, kernels, quantize_checkpoint
from onboard.quantize.st_io import file_sha256

sys.path.insert(0, str(Path(__file__).parent))
from quantize_helpers import (  # noqa: E402
    write_bundled_dsv3_checkpoint,
    write_dsv3_checkpoint,
    write_llama_checkpoint,
)

ONBOARD = str(Path(sys.executable).parent / "onboard")
ALL = list(SCHEMES)


def load_all(d: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(f, "pt") as h:
            for k in h.keys():
                out[k] = h.get_tensor(k)
    return out


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(
            a.contiguous().view(-1).view(torch.uint8),
            b.contiguous().view(-1).view(torch.uint8),
        )
    )


# ---- kernels -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp4_rounding_and_packing_match_library_at_every_boundary(dtype):
    from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8
    from compressed_tensors.quantization.quant_args import FP4_E2M1_DATA

    grid = torch.tensor(
        [
            0.0,
            0.5,
            1.0,
            1.5,
            2.0,
            3.0,
            4.0,
            6.0,
            0.25,
            0.75,
            1.25,
            1.75,
            2.5,
            3.5,
            5.0,
            7.0,
            1e-30,
        ],
        dtype=dtype,
    )
    near = torch.cat(
        [grid, torch.nextafter(grid, grid + 1), torch.nextafter(grid, grid - 1)]
    )
    values = torch.cat([near, -near, torch.tensor([-0.0], dtype=dtype)])
    values = torch.cat([values, values[: (-len(values)) % 16]]).reshape(1, -1)
    with torch.compiler.set_stance("force_eager"):
        ref = pack_fp4_to_uint8(
            FP4_E2M1_DATA.cast_to_fp4(values.clamp(-6, 6)).to(dtype)
        )
    codes = kernels.fp4_codes(values)
    mine = codes[:, 0::2] | (codes[:, 1::2] << 4)
    assert torch.equal(mine, ref)


@pytest.mark.parametrize(
    ("scheme", "limit"), [("w4a16", 8.0), ("w4a16-asym", 8.0), ("w8a8-int8", 128.0)]
)
def test_integer_rounding_and_packing_match_library_on_every_bfloat16_value(
    scheme, limit
):
    """Every bfloat16 value on a grid of scale 1 (each row's absmax, or for the
    asymmetric scheme its min and max, pins the scale to 1.0 and the zero point
    to 0): the quotients are the values themselves, so the ties of
    round-half-to-even, the clamp (-limit + 0.5 rounds to -limit, limit - 0.5 to
    limit, clamped), and the nibble order of the INT4 packing are all met, and
    compared byte for byte with the library."""
    sch = SCHEMES[scheme]
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    values = every.view(torch.bfloat16)
    anchors = [limit - 0.5] if sch.symmetric else [-limit, limit - 1]
    low, high = (-anchors[0], anchors[0]) if sch.symmetric else anchors
    values = values[(values >= low) & (values <= high)]
    cols = 128
    per_row = cols - len(anchors)
    rows = -(-values.numel() // per_row)
    rows = -(-rows // 8) * 8  # (whole int32s of packed zero points)
    body = torch.zeros(rows * per_row, dtype=torch.bfloat16)
    body[: values.numel()] = values
    anchor = torch.tensor(anchors, dtype=torch.bfloat16).expand(rows, -1)
    w = torch.cat([anchor, body.view(rows, per_row)], dim=1).contiguous()
    out = kernels.quantize_weight(w, sch, "m", check=False)
    ref = kernels.library_compress(w, sch, None)
    assert torch.all(ref["weight_scale"] == 1.0)
    for local, value in ref.items():
        assert same_bytes(out[f"m.{local}"], value), local


def test_fp4_codes_match_library_on_every_bfloat16_value_and_near_midpoints():
    from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8
    from compressed_tensors.quantization.quant_args import FP4_E2M1_DATA

    every_bf16 = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    every_bf16 = every_bf16.view(torch.bfloat16).float()
    points = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5, 2.0])
    near = [points]
    up, down = points, points
    for _ in range(4):  # a few float32 steps either side of each decision point
        up, down = torch.nextafter(up, up + 1), torch.nextafter(down, down - 1)
        near += [up, down]
    g = torch.Generator().manual_seed(0)
    values = torch.cat(
        [every_bf16, *near, *(-v for v in near), torch.rand(4096, generator=g) * 16 - 8]
    )
    values = values[torch.isfinite(values)]
    values = torch.cat([values, values[: (-len(values)) % 16]]).reshape(-1, 16)
    with torch.compiler.set_stance("force_eager"):
        ref = pack_fp4_to_uint8(FP4_E2M1_DATA.cast_to_fp4(values.clamp(-6, 6)))
    codes = kernels.fp4_codes(values)
    assert torch.equal(codes[:, 0::2] | (codes[:, 1::2] << 4), ref)


def _weights(shape, seed):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(shape, generator=g) * 0.02).to(torch.bfloat16)
    w[0, :4] = torch.tensor([0.0, -0.0, 1e-8, -1e-8])
    w[1] = 0.0  # an all-zero row: scales fall back to the library's eps
    w[2, :16] = w[2, :16].abs().max()  # a group of identical values
    return w


@pytest.mark.parametrize(
    ("scheme", "shape"),
    [
        (scheme, shape)
        for scheme in ALL
        for shape in [(576, 256), (100, 64), (300, 160), (300, 384)]
        # (an input width the scheme's groups do not divide is refused: the
        # error test)
        if shape[1] % SCHEMES[scheme].input_multiple == 0
    ],
)
def test_quantize_weight_is_byte_identical_to_compressed_tensors(scheme, shape):
    sch = SCHEMES[scheme]
    w = _weights(shape, seed=shape[0])
    g = (
        kernels.global_scale([kernels.absmax(kernels.observe(w, sch))])
        if sch.global_scale
        else None
    )
    ig = kernels.input_global_scale(3.5) if sch.calibrated else None
    out = kernels.quantize_weight(w, sch, "m", g, ig, check=False)
    ref = kernels.library_compress(w, sch, g)
    for local, value in ref.items():
        assert same_bytes(out[f"m.{local}"], value), local
    planned = kernels.output_tensors(sch, "m", shape, "BF16")
    assert [(n, d, s) for n, d, s in planned] == [
        (n, kernels.ST_DTYPES[out[n].dtype], tuple(out[n].shape)) for n, _, _ in planned
    ]
    assert set(out) == {n for n, _, _ in planned}


@pytest.mark.parametrize("scheme", ALL)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_scale_table_is_the_library_on_every_16_bit_absmax(scheme, dtype):
    # scales() looks up the library's calculate_qparams result by the absmax's bits:
    # against the library itself, on every finite non-negative value, in the
    # [rows, groups] shape the observer gives.
    from compressed_tensors.quantization.utils import calculate_qparams

    sch = SCHEMES[scheme]
    a = torch.arange(2**15, dtype=torch.int16).view(dtype)
    a = a[torch.isfinite(a)]
    a = torch.cat([a, a[: (-len(a)) % 64]]).reshape(-1, 64)
    g = kernels.global_scale([a.max()]) if sch.global_scale else None
    stats = kernels._AbsMax((-a, a))
    mine = kernels.scales(stats, sch, g)
    ref, _ = calculate_qparams(-a, a, sch.ct_scheme.weights, global_scale=g)
    assert same_bytes(mine, ref)


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp4_code_table_matches_the_loop_and_the_library(scheme, dtype, monkeypatch):
    # The FP4 table path (codes looked up by group scale and bits) against the
    # plain loop and the library, on a weight holding every finite 16-bit value
    # (shuffled: groups of many magnitudes, so many distinct scales), and on
    # ordinary weights.
    sch = SCHEMES[scheme]
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    every = every.view(dtype)
    every = every[torch.isfinite(every)]
    g = torch.Generator().manual_seed(1)
    every = every[torch.randperm(len(every), generator=g)]
    every = torch.cat([every, every[: (-len(every)) % 256]]).reshape(-1, 256)
    for w in (every, _weights((512, 1024), seed=3).to(dtype)):
        stats = kernels.observe(w, sch)
        gs = kernels.global_scale([kernels.absmax(stats)]) if sch.global_scale else None
        ig = kernels.input_global_scale(3.5) if sch.calibrated else None
        monkeypatch.setattr(kernels, "TABLE_MIN_RATIO", 0)  # always the table
        assert kernels._fp4_table_keys(stats, sch, gs, w.numel()) is not None
        table = kernels.quantize_weight(w, sch, "m", gs, ig, check=False)
        monkeypatch.setattr(kernels, "TABLE_MIN_RATIO", 1 << 40)  # never
        loop = kernels.quantize_weight(w, sch, "m", gs, ig, check=False)
        assert table.keys() == loop.keys()
        for name in table:
            assert same_bytes(table[name], loop[name]), name
        ref = kernels.library_compress(w, sch, gs)
        assert same_bytes(table["m.weight_packed"], ref["weight_packed"])


@pytest.mark.parametrize(
    "scheme", ["fp8-dynamic", "fp8-block", "nvfp4a16", "w4a16-asym", "w8a8-int8"]
)
def test_quantize_weight_float16_and_block_sink_match_library(scheme):
    # float16 weights (the FP8 table of float16), and the sink path the workers
    # use (blocks handed over as made) gives the same bytes as the whole tensor.
    sch = SCHEMES[scheme]
    w = _weights((300, 2048), seed=5).to(torch.float16)
    g = (
        kernels.global_scale([kernels.absmax(kernels.observe(w, sch))])
        if sch.global_scale
        else None
    )
    whole = kernels.quantize_weight(w, sch, "m", g, check=False)
    ref = kernels.library_compress(w, sch, g)
    for local, value in ref.items():
        assert same_bytes(whole[f"m.{local}"], value), local
    big = "m.weight_packed" if sch.packed else "m.weight"
    got = torch.zeros_like(whole[big])
    rows_seen = []

    def sink(name, row, block):
        assert name == big
        got[row : row + block.shape[0]] = block
        rows_seen.append((row, block.shape[0]))

    small = kernels.quantize_weight(w, sch, "m", g, sink=sink)
    assert big not in small and len(rows_seen) > 1
    assert sum(n for _, n in rows_seen) == w.shape[0]
    assert same_bytes(got, whole[big])
    for name, value in small.items():
        assert same_bytes(value, whole[name]), name


@pytest.mark.parametrize(
    "scheme,limit",
    [("fp8-dynamic", 0.04), ("fp8-block", 0.04), ("nvfp4a16", 0.13), ("mxfp4", 0.16),
     ("w4a16", 0.13), ("w4a16-asym", 0.11), ("w8a8-int8", 0.01)],
)  # fmt: skip
def test_dequantized_weights_are_close(scheme, limit):
    sch = SCHEMES[scheme]
    w = (torch.randn(256, 512, generator=torch.Generator().manual_seed(3)) * 0.02).to(
        torch.bfloat16
    )
    g = (
        kernels.global_scale([kernels.absmax(kernels.observe(w, sch))])
        if sch.global_scale
        else None
    )
    out = kernels.quantize_weight(w, sch, "m", g)
    dq = kernels.dequantize(out, sch, "m").float()
    rel = ((dq - w.float()).norm() / w.float().norm()).item()
    assert 0 < rel < limit


@pytest.mark.parametrize("scheme", ["w4a16", "w4a16-asym"])
def test_int4_packing_is_the_layout_vllm_unpacks(scheme):
    # Written out by hand: value j of a row, offset to unsigned (+8), sits in
    # bits 4 (j % 8) of int32 j // 8 (vLLM's pack_factor 8, GPTQ order); the
    # asymmetric zero points are packed the same way down the rows.
    sch = SCHEMES[scheme]
    levels = torch.arange(-8, 8).repeat(16)  # 256 inputs, two groups
    w = torch.stack([levels * 0.5, -levels * 0.25] * 5).to(torch.bfloat16)
    out = kernels.quantize_weight(w, sch, "m")
    scale = out["m.weight_scale"].float().repeat_interleave(128, dim=1)
    zp = torch.zeros_like(scale)
    if not sch.symmetric:
        packed_zp = out["m.weight_zero_point"]
        assert tuple(packed_zp.shape) == (2, 2)  # ceil(10 rows / 8), groups
        bits = (packed_zp.unsqueeze(1) >> (4 * torch.arange(8)).view(1, 8, 1)) & 15
        zp = (bits.reshape(16, 2)[:10] - 8).float().repeat_interleave(128, dim=1)
    q = torch.round(w.float() / scale + zp).clamp(-8, 7).to(torch.int64) + 8
    words = (q.view(10, 32, 8) << (4 * torch.arange(8))).sum(-1)
    assert torch.equal(out["m.weight_packed"], words.to(torch.int32))
    assert out["m.weight_shape"].tolist() == [10, 256]
    deq = kernels.dequantize(out, sch, "m").float()
    assert torch.equal(deq, ((q - 8 - zp) * scale).to(torch.bfloat16).float())


def test_int8_weights_are_per_channel():
    sch = SCHEMES["w8a8-int8"]
    w = (torch.arange(-127, 128).float() / 127).repeat(4, 1) * torch.tensor(
        [[1.0], [2.0], [0.5], [0.0]]
    )
    w = w.to(torch.bfloat16)
    out = kernels.quantize_weight(w, sch, "m")
    q, scale = out["m.weight"], out["m.weight_scale"]
    assert q.dtype == torch.int8 and scale.dtype == torch.bfloat16
    # One scale per row, absmax / 127.5 (compressed-tensors' symmetric range);
    # the all-zero row gets the library's eps and quantizes to zeros.
    assert torch.equal(scale[:3, 0], (w[:3].abs().amax(1) / 127.5))
    assert scale[3, 0] > 0 and not q[3].any()
    assert q[:3, -1].tolist() == [127] * 3 and q[:3, 0].tolist() == [-127] * 3
    err = (q.float() * scale.float() - w.float()).abs()
    assert (err <= scale.float() * 0.5 + 1e-3).all()


# ---- whole checkpoints ---------------------------------------------------------


@pytest.fixture(scope="session")
def dsv3(tmp_path_factory) -> Path:
    return write_bundled_dsv3_checkpoint(tmp_path_factory.mktemp("dsv3") / "bf16")


@pytest.fixture(scope="session")
def dsv3_wide(tmp_path_factory) -> Path:
    """The same model with 128-wide experts: INT4's groups of 128 inputs fit the
    experts' down_proj (the bundled tiny checkpoint's are 64 wide)."""
    out = write_dsv3_checkpoint(tmp_path_factory.mktemp("wide") / "bf16", 0, "1MB", 128)
    # Read without a spec, as saved by transformers (its MTP layer has an
    # embed_tokens copy the helper's spec does not list).
    (out / "spec.yaml").unlink()
    return out


def source(scheme: str, dsv3: Path, dsv3_wide: Path) -> Path:
    """The DeepSeek-V3-style checkpoint a scheme is tested on."""
    return dsv3_wide if SCHEMES[scheme].input_multiple > 64 else dsv3


@pytest.fixture(scope="session")
def quantized(dsv3, dsv3_wide, tmp_path_factory):
    root = tmp_path_factory.mktemp("dsv3-q")
    cache: dict[str, Path] = {}

    def get(scheme: str) -> Path:
        if scheme not in cache:
            src = source(scheme, dsv3, dsv3_wide)
            cache[scheme] = quantize_checkpoint(src, scheme, root / scheme, workers=2)
        return cache[scheme]

    return get


LINEARS = (
    "self_attn.q_a_proj",
    "self_attn.q_b_proj",
    "self_attn.kv_a_proj_with_mqa",
    "self_attn.kv_b_proj",
    "self_attn.o_proj",
)


@pytest.mark.parametrize("scheme", ALL)
def test_scheme_on_deepseek_v3_style_checkpoint(scheme, dsv3, dsv3_wide, quantized):
    from compressed_tensors.quantization import QuantizationConfig

    sch = SCHEMES[scheme]
    out = quantized(scheme)
    dsv3 = source(scheme, dsv3, dsv3_wide)
    src, dst = load_all(dsv3), load_all(out)
    config = json.loads((out / "config.json").read_text())
    qc = config["quantization_config"]
    parsed = QuantizationConfig.model_validate(qc)
    assert parsed.format == sch.format and qc["quant_method"] == "compressed-tensors"
    assert parsed.quantization_status == "compressed"
    assert parsed.config_groups["group_0"].weights.model_dump(
        mode="json"
    ) == sch.ct_scheme.weights.model_dump(mode="json")

    # Untouched: embeddings, lm_head, norms, routers and their bias, the MTP layer.
    untouched = [
        k
        for k in src
        if "embed_tokens" in k
        or k.startswith("lm_head")
        or "norm" in k
        or k.endswith("mlp.gate.weight")
        or "e_score_correction_bias" in k
        or k.startswith("model.layers.2.")
    ]
    assert len(untouched) > 40
    for k in untouched:
        assert same_bytes(src[k], dst[k]), k
    ignore = set(qc["ignore"])
    assert {"lm_head", "model.layers.1.mlp.gate", "model.layers.2.eh_proj"} <= ignore
    assert "model.layers.2.self_attn.q_a_proj" in ignore
    assert not any(
        i.startswith(("model.layers.0.", "model.layers.1.self")) for i in ignore
    )

    # Every decoder projection (layers 0 and 1) is quantized and dequantizes close.
    modules = [f"model.layers.{i}.{m}" for i in (0, 1) for m in LINEARS]
    modules += [
        f"model.layers.0.mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")
    ]
    modules += [
        f"model.layers.1.mlp.experts.{e}.{p}"
        for e in range(8)
        for p in ("gate_proj", "up_proj", "down_proj")
    ]
    modules += [
        f"model.layers.1.mlp.shared_experts.{p}" for p in ("gate_proj", "up_proj")
    ]
    for m in modules:
        assert f"{m}.weight_scale" in dst and m not in ignore, m
        w = src[f"{m}.weight"].float()
        dq = kernels.dequantize(dst, sch, m).float()
        assert ((dq - w).norm() / w.norm()).item() < 0.2, m

    if scheme == "fp8-block":
        # MLA's 576-row projection: a ceil-divided 5 x 2 grid of 128 x 128 blocks.
        s = dst["model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale"]
        assert tuple(s.shape) == (5, 2)
    if sch.global_scale:
        # Fused in vLLM -> one global scale.
        for a, b in [
            (
                "model.layers.0.self_attn.q_a_proj",
                "model.layers.0.self_attn.kv_a_proj_with_mqa",
            ),
            ("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"),
            (
                "model.layers.1.mlp.shared_experts.gate_proj",
                "model.layers.1.mlp.shared_experts.up_proj",
            ),
            *[
                (
                    f"model.layers.1.mlp.experts.{e}.gate_proj",
                    f"model.layers.1.mlp.experts.{e}.up_proj",
                )
                for e in range(8)
            ],
        ]:
            assert torch.equal(
                dst[f"{a}.weight_global_scale"], dst[f"{b}.weight_global_scale"]
            )
        assert not torch.equal(
            dst["model.layers.0.self_attn.o_proj.weight_global_scale"],
            dst["model.layers.0.self_attn.q_b_proj.weight_global_scale"],
        )
    if sch.calibrated:
        for m in modules:
            assert dst[f"{m}.input_global_scale"].item() > 0, m

    # Index, manifest checksums, copied side files.
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(dst)
    manifest = json.loads((out / "onboard-quantize.json").read_text())
    for name, rec in manifest["shards"].items():
        assert file_sha256(out / name) == rec["sha256"]
    assert (out / "tokenizer.json").read_bytes() == (
        dsv3 / "tokenizer.json"
    ).read_bytes()
    assert not list(out.parent.glob(".*partial"))


def test_include_mtp_quantizes_the_mtp_layer(dsv3, tmp_path):
    out = quantize_checkpoint(dsv3, "fp8-dynamic", tmp_path / "q", include_mtp=True)
    dst = load_all(out)
    assert dst["model.layers.2.self_attn.q_a_proj.weight"].dtype == torch.float8_e4m3fn
    # The MTP head's own projection and output head stay in 16 bits.
    assert dst["model.layers.2.eh_proj.weight"].dtype == torch.bfloat16


def test_spec_keep_unquantized_is_honoured(dsv3, tmp_path):
    from onboard.spec import load_spec

    spec = load_spec(dsv3 / "spec.yaml").model_copy(
        update={"keep_unquantized": ["o_proj", "re:layers\\.1\\.mlp\\.experts\\.3\\."]}
    )
    out = quantize_checkpoint(dsv3, "fp8-dynamic", tmp_path / "q", spec=spec)
    dst = load_all(out)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    for m in (
        "model.layers.0.self_attn.o_proj",
        "model.layers.1.mlp.experts.3.up_proj",
    ):
        assert dst[f"{m}.weight"].dtype == torch.bfloat16 and m in qc["ignore"]
    assert (
        dst["model.layers.1.mlp.experts.2.up_proj.weight"].dtype == torch.float8_e4m3fn
    )


# ---- errors ---------------------------------------------------------------------


def run_cli(*args):
    return subprocess.run(
        [ONBOARD, "quantize", *map(str, args)], capture_output=True, text=True
    )


@pytest.fixture(scope="session")
def small(tmp_path_factory) -> Path:
    return write_llama_checkpoint(
        tmp_path_factory.mktemp("small") / "bf16",
        hidden=128,
        intermediate=256,
        layers=2,
        vocab=256,
        heads=4,
        kv=2,
        shards=2,
    )


def test_non_empty_output_directory_is_refused_untouched(small, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = run_cli(small, "--scheme", "fp8-dynamic", "--out", out)
    assert r.returncode == 2, r.stderr
    assert "not empty" in r.stderr and "Traceback" not in r.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("damage", ["truncate", "header"])
def test_corrupt_or_truncated_shard_is_refused(small, tmp_path, damage):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(small, bad)
    shard = bad / "model-00002-of-00002.safetensors"
    data = shard.read_bytes()
    if damage == "truncate":
        shard.write_bytes(data[: len(data) - 1000])
    else:
        shard.write_bytes(data[:8] + b"{not json" + data[17:])
    r = run_cli(bad, "--scheme", "fp8-dynamic", "--out", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert (
        "model-00002-of-00002.safetensors" in r.stderr and "Traceback" not in r.stderr
    )
    assert ("truncated" if damage == "truncate" else "corrupt") in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "scheme,multiple", [("nvfp4a16", 16), ("mxfp4", 32), ("w4a16", 128)]
)
def test_input_dimension_the_scheme_cannot_take(tmp_path, scheme, multiple):
    ckpt = write_llama_checkpoint(
        tmp_path / "bf16",
        hidden=128,
        intermediate=200,
        layers=1,
        vocab=256,
        heads=4,
        kv=2,
    )
    r = run_cli(ckpt, "--scheme", scheme, "--out", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert "model.layers.0.mlp.down_proj.weight" in r.stderr
    assert f"groups of {multiple}" in r.stderr and "200" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def test_bad_inputs_raise_input_error(small, tmp_path, quantized):
    with pytest.raises(InputError, match="unknown scheme"):
        quantize_checkpoint(small, "int3", tmp_path / "a")
    with pytest.raises(InputError, match="already quantized"):
        quantize_checkpoint(quantized("fp8-dynamic"), "fp8-dynamic", tmp_path / "b")
    with pytest.raises(InputError, match="not a directory"):
        quantize_checkpoint(tmp_path / "nothing", "fp8-dynamic", tmp_path / "c")
    with pytest.raises(InputError, match="workers"):
        quantize_checkpoint(small, "fp8-dynamic", tmp_path / "d", workers=0)


def test_spec_is_inferred_from_config_json_without_spec_yaml(dsv3, quantized, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(dsv3, bare)
    (bare / "spec.yaml").unlink()
    out = quantize_checkpoint(bare, "fp8-dynamic", tmp_path / "q")
    with_spec = quantized("fp8-dynamic")
    for f in ("config.json", *(p.name for p in with_spec.glob("*.safetensors"))):
        assert (out / f).read_bytes() == (with_spec / f).read_bytes(), f


def test_non_finite_weights_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    ckpt = write_llama_checkpoint(
        tmp_path / "bf16",
        hidden=128,
        intermediate=256,
        layers=1,
        vocab=256,
        heads=4,
        kv=2,
    )
    shard = next(iter(sorted(ckpt.glob("*.safetensors"))))
    tensors = load_file(shard)
    name = next(k for k in tensors if k.endswith("q_proj.weight"))
    tensors[name][3, 5] = float("nan")
    save_file(tensors, shard, metadata={"format": "pt"})
    r = run_cli(ckpt, "--scheme", "fp8-dynamic", "--out", tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert name in r.stderr and "NaN" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_lean_import_of_compressed_tensors(tmp_path):
    # `onboard quantize` imports compressed-tensors without transformers or torch's
    # compiler (docs/benchmarks.md: 8.3 s of a 17 s run), its run-time byte check
    # against the library still passes, and a later `import transformers` is real.
    ckpt = write_llama_checkpoint(
        tmp_path / "bf16", hidden=64, intermediate=128, layers=1, vocab=128,
        heads=2, kv=1,
    )  # fmt: skip
    code = (
        "import sys\n"
        "from onboard.quantize import quantize_checkpoint\n"
        f"quantize_checkpoint({str(ckpt)!r}, 'nvfp4a16', {str(tmp_path / 'q')!r})\n"
        "print(sorted(m for m in ('transformers', 'torch._dynamo', 'sklearn')"
        " if m in sys.modules))\n"
        "import transformers\n"
        "print(transformers.PreTrainedModel.__module__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["[]", "transformers.modeling_utils"]


def test_pipeline_quantize_stage_writes_and_reuses(tmp_path):
    from rich.console import Console

    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.pipeline import stage_quantize
    from onboard.pipeline.runner import Context
    from onboard.spec import load_spec

    spec = load_spec(Path(__file__).parents[1] / "model_specs" / "dense-gqa.yaml")
    spec = spec.model_copy(update={"quantization": ["fp8-dynamic", "mxfp4"]})
    ctx = Context(spec=spec, out=tmp_path, full=False, console=Console(quiet=True))
    bf16 = write_tiny_checkpoint(spec, ctx.checkpoints / "bf16", seed=0)
    stage_quantize.run(ctx)
    made = {}
    for scheme in ("fp8-dynamic", "mxfp4"):
        record = json.loads(
            (ctx.checkpoints / scheme / "onboard-quantize.json").read_text()
        )
        assert record["scheme"] == scheme
        made[scheme] = (ctx.checkpoints / scheme / "config.json").stat().st_mtime_ns
    stage_quantize.run(ctx)  # same bf16 files: reused, not rewritten
    for scheme, mtime in made.items():
        assert (ctx.checkpoints / scheme / "config.json").stat().st_mtime_ns == mtime
    # New bf16 weights: the quantized checkpoints are stale and redone.
    write_tiny_checkpoint(spec, tmp_path / "other", seed=1)
    for shard in (tmp_path / "other").glob("*.safetensors"):
        shard.replace(bf16 / shard.name)
    stage_quantize.run(ctx)
    fp8 = ctx.checkpoints / "fp8-dynamic"
    assert (fp8 / "config.json").stat().st_mtime_ns != made["fp8-dynamic"]
    record = json.loads((fp8 / "onboard-quantize.json").read_text())
    for name, entry in record["shards"].items():
        assert file_sha256(fp8 / name) == entry["sha256"]
    # An output made by other quantizer code (another onboard) is redone too.
    stamp_file = tmp_path / ".onboard" / "quantize-fp8-dynamic.json"
    stamp = json.loads(stamp_file.read_text())
    stamp_file.write_text(json.dumps(dict(stamp, quantizer="an older onboard")))
    before = (fp8 / "config.json").stat().st_mtime_ns
    stage_quantize.run(ctx)
    assert (fp8 / "config.json").stat().st_mtime_ns != before
    assert json.loads(stamp_file.read_text()) == stamp


def test_nvfp4_calibrates_a_model_type_transformers_does_not_know(tmp_path):
    """novel-launch: calibration runs onboard's generated reference; every routed
    expert gets an activation scale; the KV-sharing layers' own K/V stay 16-bit."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.spec import load_spec
    from onboard.spec.hf import transformers_knows

    root = Path(__file__).resolve().parents[1]
    spec = load_spec(root / "model_specs" / "novel-launch.yaml")
    assert not transformers_knows(spec.model_type)
    bf16 = write_tiny_checkpoint(spec, tmp_path / "bf16", seed=0)
    tiny = load_spec(bf16 / "spec.yaml")
    out = quantize_checkpoint(bf16, "nvfp4", tmp_path / "nvfp4", workers=1)
    tensors = load_all(out)
    moe_layer = next(i for i in range(tiny.num_hidden_layers) if tiny.is_moe_layer(i))
    experts = tiny.mlp.moe.num_experts
    for e in range(experts):
        name = f"model.layers.{moe_layer}.mlp.experts.{e}.down_proj.input_global_scale"
        assert torch.isfinite(tensors[name]).all() and float(tensors[name]) > 0
    ignore = json.loads((out / "config.json").read_text())["quantization_config"][
        "ignore"
    ]
    for layer in tiny.attention.kv_sharing:
        for proj in ("k_proj", "v_proj"):
            module = f"model.layers.{layer}.self_attn.{proj}"
            assert module in ignore
            assert tensors[f"{module}.weight"].dtype == torch.bfloat16
        q = f"model.layers.{layer}.self_attn.q_proj.weight_packed"
        assert tensors[q].dtype == torch.uint8


def test_fused_projections_quantize_as_one_linear(tmp_path):
    # Phi-3 stores q/k/v and gate/up each as one tensor (checkpoint.fused), which
    # vLLM loads as one Linear: each is quantized as one, NVFP4's global scale
    # taken over the whole tensor, with the spec and without (the layout from the
    # names; calibration's spec inferred and proven from config.json).
    import transformers

    from onboard.reference.infer import infer_spec

    config = transformers.Phi3Config(
        vocab_size=256, hidden_size=128, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    ckpt = tmp_path / "phi3"
    transformers.Phi3ForCausalLM(config).save_pretrained(ckpt)
    spec, _ = infer_spec(config.to_dict())
    assert spec.checkpoint.fused == ["qkv_proj", "gate_up_proj"]
    out = quantize_checkpoint(ckpt, "nvfp4", tmp_path / "spec", spec=spec)
    bare = quantize_checkpoint(ckpt, "nvfp4", tmp_path / "bare")
    for f in ("config.json", *(p.name for p in out.glob("*.safetensors"))):
        assert (bare / f).read_bytes() == (out / f).read_bytes(), f

    sch = SCHEMES["nvfp4"]
    src, dst = load_all(ckpt), load_all(out)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    for m in ("self_attn.qkv_proj", "mlp.gate_up_proj"):
        name = f"model.layers.1.{m}"
        assert name not in qc["ignore"]
        w = src[f"{name}.weight"]
        assert tuple(dst[f"{name}.weight_packed"].shape) == (
            w.shape[0],
            w.shape[1] // 2,
        )
        want = kernels.global_scale([kernels.absmax(kernels.observe(w, sch))])
        assert torch.equal(dst[f"{name}.weight_global_scale"], want), m
        assert dst[f"{name}.input_global_scale"].item() > 0, m
        dq = kernels.dequantize(dst, sch, name).float()
        assert ((dq - w.float()).norm() / w.float().norm()).item() < 0.2, m
    assert not any(".q_proj" in k or ".gate_proj" in k for k in dst)
