"""`onboard plan`: the arithmetic by hand from the spec's numbers, the weight bytes
against what `onboard quantize` writes, and (engine tests) the KV-cache bytes per
token against vLLM's own accounting on the cpu target."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from onboard.serving import make_deployment
from onboard.serving.kv import kv_report
from onboard.serving.render import render_deployment
from onboard.serving.weights import LINEAR_ROLES, quantized_bytes, weight_report
from onboard.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "model_specs"
ONBOARD = Path(sys.executable).with_name("onboard")
GiB = 1 << 30

# ---- DeepSeek-V3-style at its real dimensions, by hand -----------------------------
#
# From model_specs/deepseek-v3-style.yaml:
H = 7168  # hidden_size
V = 129280  # vocab_size
L = 61  # num_hidden_layers
DENSE = 3  # mlp.moe.first_k_dense: layers 0-2 dense, 3-60 MoE
MOE = L - DENSE  # 58
HEADS = 128
Q_LORA, KV_LORA, NOPE, ROPE, V_DIM = 1536, 512, 128, 64, 128
INTER = 18432  # dense MLP width
E, E_INTER, SHARED_INTER = 256, 2048, 2048  # experts, expert width, 1 shared expert

# Weight shapes (rows = out features, cols = in features), per layer.
Q_A = (Q_LORA, H)
KV_A = (KV_LORA + ROPE, H)
Q_B = (HEADS * (NOPE + ROPE), Q_LORA)
KV_B = (HEADS * (NOPE + V_DIM), KV_LORA)
O_PROJ = (H, HEADS * V_DIM)
GATE_UP, DOWN = (INTER, H), (H, INTER)
E_GATE_UP, E_DOWN = (E_INTER, H), (H, E_INTER)
S_GATE_UP, S_DOWN = (SHARED_INTER, H), (H, SHARED_INTER)


def fp8_block(rows, cols):  # FP8 bytes + one bf16 scale per 128 x 128 block
    return rows * cols + math.ceil(rows / 128) * math.ceil(cols / 128) * 2


def nvfp4(rows, cols):  # FP4 (half a byte) + one FP8 scale per 16 + two FP32 scales
    return rows * cols // 2 + rows * cols // 16 + 8


def mxfp4(rows, cols):  # FP4 + one E8M0 (1 byte) scale per 32
    return rows * cols // 2 + rows * cols // 32


def bf16(rows, cols=1):
    return rows * cols * 2


def hand_groups(q) -> dict[str, int]:
    """Bytes of each weight group with linear projections quantized by ``q``;
    embeddings, output head, norms and routers stay bf16."""
    return {
        "embedding": bf16(V, H),
        "output head": bf16(V, H),
        # per layer: input + post-attention norms, q_a and kv_a norms; final norm
        "norms": bf16(L * (H + H + Q_LORA + KV_LORA) + H),
        "attention, replicated (MLA q_a/kv_a)": L * (q(*Q_A) + q(*KV_A)),
        "attention": L * (q(*Q_B) + q(*KV_B) + q(*O_PROJ)),
        "dense MLP": DENSE * (2 * q(*GATE_UP) + q(*DOWN)),
        # router weight (E x H) and its e_score_correction_bias (E)
        "routers": MOE * bf16(E * H + E),
        "routed experts": MOE * E * (2 * q(*E_GATE_UP) + q(*E_DOWN)),
        "shared experts": MOE * (2 * q(*S_GATE_UP) + q(*S_DOWN)),
    }


def hand_per_device(groups: dict[str, int], tp: int, ep: int) -> int:
    """TP splits embedding, head, attention (q_b/kv_b/o), dense MLP and shared
    experts; q_a/kv_a (a ReplicatedLinear in vLLM), norms and routers are whole on
    every rank; EP gives each rank E / ep whole experts."""
    split = (
        groups["embedding"]
        + groups["output head"]
        + groups["attention"]
        + groups["dense MLP"]
        + groups["shared experts"]
    )
    whole = (
        groups["norms"]
        + groups["attention, replicated (MLA q_a/kv_a)"]
        + groups["routers"]
    )
    experts = groups["routed experts"] * (E // ep) // E
    return math.ceil(split / tp) + whole + experts


# KV cache: MLA keeps (kv_lora_rank + qk_rope_head_dim) bf16 values per token/layer.
KV_PER_TOKEN = L * (KV_LORA + ROPE) * 2
CONTEXT, CONCURRENCY = 163840, 16  # the spec's full context, 16 requests
KV_PER_REQUEST = KV_PER_TOKEN * CONTEXT
# Reserve per device on Blackwell / MI355X: 4 GiB non-torch + 16 bf16 activation
# buffers of 16,384 batched tokens x hidden + float32 logits of 16 sequences.
RESERVE = 4 * GiB + 16 * 16384 * H * 2 + CONCURRENCY * V * 4


@pytest.fixture(scope="module")
def deepseek():
    return load_spec(SPECS / "deepseek-v3-style.yaml")


def test_deepseek_weights_by_hand(deepseek):
    params = (
        2 * V * H
        + L * (H + H + Q_LORA + KV_LORA)
        + H
        + L * sum(r * c for r, c in (Q_A, KV_A, Q_B, KV_B, O_PROJ))
        + DENSE * 3 * INTER * H
        + MOE * (E * H + E)
        + MOE * E * 3 * E_INTER * H
        + MOE * 3 * SHARED_INTER * H
    )
    assert params == 671_026_419_200  # DeepSeek-V3's 671B
    for scheme, q in (
        ("bf16", bf16),
        ("fp8-block", fp8_block),
        ("nvfp4", nvfp4),
        ("mxfp4", mxfp4),
    ):
        report = weight_report(deepseek, scheme)
        assert report.total_params == params
        got = {name: g.bytes for name, g in report.groups.items()}
        assert got == hand_groups(q), scheme
    assert weight_report(deepseek, "fp8-block").total_bytes == 673_068_905_648


def test_deepseek_kv_cache_by_hand(deepseek):
    kv = kv_report(deepseek)
    assert KV_PER_TOKEN == 70_272
    assert kv.bytes_per_token == KV_PER_TOKEN
    assert kv.bytes_per_request(CONTEXT) == KV_PER_REQUEST == 11_513_364_480
    assert all(layer.kind == "mla" for layer in kv.layers)


def test_deepseek_b200_fp8_block_by_hand(deepseek):
    """8 x B200: TP8 x EP8 with DCP8. Four devices cannot hold the weights; TP8
    alone holds 8 copies of the latent cache, too many for 16 full contexts."""
    plan = make_deployment(
        deepseek, "b200", "fp8-block", context=CONTEXT, concurrency=CONCURRENCY
    )
    groups = hand_groups(fp8_block)
    usable = int(180e9 * 0.92)  # 180 GB x gpu_memory_utilization
    assert plan.usable == usable == 165_600_000_000
    assert plan.reserve == RESERVE == 8_061_337_600

    # Four devices: weights alone exceed what is usable after the reserve.
    tp4 = hand_per_device(groups, tp=4, ep=4)
    assert tp4 + RESERVE > usable
    # DP attention on four devices replicates attention, embeddings, dense MLP.
    dp4 = hand_per_device(groups, tp=1, ep=4)
    assert dp4 > tp4

    weights = hand_per_device(groups, tp=8, ep=8)
    assert weights == 85_129_789_968
    budget = usable - weights - RESERVE
    assert budget == 72_408_872_432
    # Without DCP every one of the 8 TP ranks holds each request's whole latent.
    assert CONCURRENCY * KV_PER_REQUEST > budget
    kv_per_rank = CONCURRENCY * KV_PER_REQUEST // 8  # DCP 8 shards the tokens
    assert kv_per_rank == 23_026_728_960 <= budget

    layout = plan.layout
    assert (layout.tp, layout.dp, layout.pp, layout.ep, layout.dcp) == (
        8,
        1,
        1,
        True,
        8,
    )
    assert plan.chosen.weights == weights
    assert plan.chosen.kv_budget == budget
    assert plan.chosen.kv_needed == kv_per_rank
    assert plan.max_concurrency == budget // (KV_PER_REQUEST // 8) == 50
    assert plan.max_context == CONTEXT  # 16 x 163,840 fit with room to spare
    assert [c.layout.devices for c in plan.candidates if c.fits] == [8]
    # 16 requests decode while each 162,816-token prompt takes 10 prefill steps.
    assert plan.dcp.pays and plan.pd.pays and len(plan.pd_commands) == 2
    assert plan.env == {}
    assert plan.argv == [
        "vllm", "serve", "./checkpoints/fp8-block",
        "--tensor-parallel-size", "8",
        "--enable-expert-parallel",
        "--decode-context-parallel-size", "8",
        "--max-model-len", "163840",
        "--max-num-seqs", "16",
        "--max-num-batched-tokens", "16384",
        "--gpu-memory-utilization", "0.92",
    ]  # fmt: skip
    text = render_deployment(plan)
    for number in (
        "70,272 B per token",
        "11,513,364,480",
        "85,129,789,968",
        "72,408,872,432",
        "8,061,337,600",
        "FLASHINFER_MLA",
    ):
        assert number in text, number


def test_deepseek_b200_nvfp4_by_hand(deepseek):
    """NVFP4 halves the bytes again: four B200s, TP4 x EP4 with DCP4."""
    plan = make_deployment(
        deepseek, "b200", "nvfp4", context=CONTEXT, concurrency=CONCURRENCY
    )
    groups = hand_groups(nvfp4)
    usable = 165_600_000_000
    assert hand_per_device(groups, tp=2, ep=2) + RESERVE > usable
    weights = hand_per_device(groups, tp=4, ep=4)
    assert weights == 95_618_612_908
    budget = usable - weights - RESERVE
    assert CONCURRENCY * KV_PER_REQUEST > budget  # four copies without DCP
    assert CONCURRENCY * KV_PER_REQUEST // 4 <= budget
    lay = plan.layout
    assert (lay.tp, lay.dp, lay.ep, lay.dcp, lay.devices) == (4, 1, True, 4, 4)
    assert plan.chosen.weights == weights and plan.chosen.kv_budget == budget
    assert plan.max_concurrency == budget // (KV_PER_REQUEST // 4) == 21
    assert plan.support.support == "native"
    assert "FlashInferCuteDslNvFp4LinearKernel" in render_deployment(plan)


def test_deepseek_mi355x_mxfp4_by_hand(deepseek):
    """288 GB MI355X: two devices hold the MXFP4 weights but not 16 full contexts
    (even with DCP2 or DP attention); four do, TP4 x EP4 with DCP4."""
    plan = make_deployment(
        deepseek, "mi355x", "mxfp4", context=CONTEXT, concurrency=CONCURRENCY
    )
    groups = hand_groups(mxfp4)
    usable = int(288e9 * 0.92)
    assert plan.usable == usable == 264_960_000_000
    assert plan.reserve == RESERVE  # same batch size and overhead as B200

    tp2 = hand_per_device(groups, tp=2, ep=2)
    assert tp2 == 180_034_110_464
    assert CONCURRENCY * KV_PER_REQUEST // 2 > usable - tp2 - RESERVE  # DCP2 short
    dp2 = hand_per_device(groups, tp=1, ep=2)  # DP attention: 8 requests per rank
    assert CONCURRENCY // 2 * KV_PER_REQUEST > usable - dp2 - RESERVE

    weights = hand_per_device(groups, tp=4, ep=4)
    assert weights == 90_369_803_264
    budget = usable - weights - RESERVE
    assert budget == 166_528_859_136
    assert CONCURRENCY * KV_PER_REQUEST > budget
    assert CONCURRENCY * KV_PER_REQUEST // 4 <= budget
    lay = plan.layout
    assert (lay.tp, lay.dp, lay.ep, lay.dcp, lay.devices) == (4, 1, True, 4, 4)
    assert plan.chosen.weights == weights and plan.chosen.kv_budget == budget
    assert plan.max_concurrency == budget // (KV_PER_REQUEST // 4) == 57
    tried = [(c.layout.name, c.fits) for c in plan.candidates]
    assert ("TP2 x EP2 x DCP2", False) in tried and ("TP1 x DP2 x EP2", False) in tried
    assert plan.env == {"VLLM_ROCM_USE_AITER": "1"}
    assert plan.support.support == "native"
    text = render_deployment(plan)
    assert "export VLLM_ROCM_USE_AITER=1" in text
    assert "ROCM_AITER_MLA" in text and "AiterMxfp4LinearKernel" in text
    assert "wheels.vllm.ai/rocm/0.32.0" in text


def test_deepseek_mi355x_fp8_block_by_hand(deepseek):
    """The same FP8-block checkpoint as on 8 x B200 fits four 288 GB MI355X:
    TP4 x EP4 holds the weights; 16 full contexts need DCP4 (four latent copies
    otherwise)."""
    plan = make_deployment(
        deepseek, "mi355x", "fp8-block", context=CONTEXT, concurrency=CONCURRENCY
    )
    groups = hand_groups(fp8_block)
    usable = 264_960_000_000
    weights = hand_per_device(groups, tp=4, ep=4)
    assert weights == 169_121_092_208  # the B200 table's TP4 row, too big there
    assert hand_per_device(groups, tp=2, ep=2) + RESERVE > usable
    budget = usable - weights - RESERVE
    assert budget == 87_777_570_192
    assert CONCURRENCY * KV_PER_REQUEST > budget  # TP4 alone: "no (KV)"
    kv_per_rank = CONCURRENCY * KV_PER_REQUEST // 4
    assert kv_per_rank == 46_053_457_920 <= budget
    lay = plan.layout
    assert (lay.tp, lay.dp, lay.ep, lay.dcp, lay.devices) == (4, 1, True, 4, 4)
    assert plan.chosen.weights == weights and plan.chosen.kv_budget == budget
    assert plan.chosen.kv_needed == kv_per_rank
    assert plan.max_concurrency == budget // (KV_PER_REQUEST // 4) == 30
    assert plan.env == {"VLLM_ROCM_USE_AITER": "1"}
    text = render_deployment(plan)
    for number in ("169,121,092,208", "87,777,570,192", "46,053,457,920", "30 request"):
        assert number in text, number


# ---- GQA, sliding windows, KV sharing, by hand --------------------------------------


def test_dense_gqa_on_h100_by_hand():
    """Llama-3-8B shape, bf16, one full 131,072-token request: one H100."""
    spec = load_spec(SPECS / "dense-gqa.yaml")
    h, v, n, kv_heads, hd, inter = 4096, 128256, 32, 8, 128, 14336
    params = (
        2 * v * h  # embedding + untied head
        + n * (h * h + 2 * kv_heads * hd * h + h * h)  # q, k, v, o
        + n * 3 * inter * h
        + n * 2 * h
        + h  # norms
    )
    assert params == 8_030_261_248
    plan = make_deployment(spec, "h100", context=131072, concurrency=1)
    assert plan.weights.total_bytes == 2 * params
    per_token = n * 2 * kv_heads * hd * 2  # 2 (K and V) x heads x dim x bf16
    assert plan.kv.bytes_per_token == per_token == 131_072
    reserve = 4 * GiB + 16 * 8192 * h * 2 + 1 * v * 4  # H100: 8,192 batched tokens
    budget = int(80e9 * 0.92) - 2 * params - reserve
    assert plan.reserve == reserve and plan.chosen.kv_budget == budget
    assert per_token * 131072 <= budget
    assert plan.layout.devices == 1 and plan.layout.dcp == 1
    assert plan.max_concurrency == budget // (per_token * 131072) == 3
    assert not plan.dcp.pays  # one rank: no copies of the cache to shard


def test_novel_launch_kv_by_hand():
    """48 layers, every 4th full (3, 7, ..., 47), window 4096; layers 40-47 read
    the caches of 36-39."""
    spec = load_spec(SPECS / "novel-launch.yaml")
    kv = kv_report(spec)
    per_layer = 2 * 8 * 128 * 2  # 4,096 B
    owning = 40
    full_owning = len(range(3, 40, 4))  # 10
    assert kv.bytes_per_token == owning * per_layer == 163_840
    assert kv.bytes_per_token_without_sharing == 48 * per_layer
    n = 262144
    assert kv.bytes_per_request(n) == (
        full_owning * per_layer * n + (owning - full_owning) * per_layer * 4096
    )
    assert kv.bytes_per_request(1000) == owning * per_layer * 1000
    # vLLM's groups: 10 full layers, 30 sliding in three groups of 10.
    groups = kv.cache_groups()
    assert [len(g) for g in groups] == [10, 10, 10, 10]
    assert kv.bytes_per_block(16) == 16 * 10 * per_layer


def test_dcp_rule():
    """DCP shards the copies TP makes of the KV cache: none with GQA while TP <=
    num_kv_heads; refused with sliding windows (vLLM asserts); long or
    non-fitting contexts otherwise."""
    from onboard.arch import build_plan
    from onboard.serving import dcp_decision
    from onboard.serving.layout import Layout
    from onboard.targets import get_target

    b200 = get_target("b200")
    novel = load_spec(SPECS / "novel-launch.yaml")
    kv = kv_report(novel)
    no_copies = dcp_decision(build_plan(novel), kv, b200, Layout(tp=8), False, 262144)
    assert not no_copies.pays and "different share" in no_copies.reason
    mqa = novel.model_copy(
        update={"attention": novel.attention.model_copy(update={"num_kv_heads": 2})}
    )
    sliding = dcp_decision(
        build_plan(mqa), kv_report(mqa), b200, Layout(tp=8), False, 262144
    )
    assert not sliding.pays and "sliding" in sliding.reason
    dense = load_spec(SPECS / "dense-gqa.yaml")
    gqa2 = dense.model_copy(
        update={"attention": dense.attention.model_copy(update={"num_kv_heads": 2})}
    )
    kv2, arch2 = kv_report(gqa2), build_plan(gqa2)
    assert Layout(tp=8).kv_replicas(arch2) == 4
    assert dcp_decision(arch2, kv2, b200, Layout(tp=8), True, 131072).pays
    assert not dcp_decision(arch2, kv2, b200, Layout(tp=8), True, 8192).pays
    assert dcp_decision(arch2, kv2, b200, Layout(tp=8), False, 8192).pays
    rocm = dcp_decision(arch2, kv2, get_target("mi355x"), Layout(tp=8), False, 8192)
    assert not rocm.pays and "LSE" in rocm.reason
    plan = make_deployment(novel, "b200", "fp8-dynamic", context=262144, concurrency=8)
    assert plan.layout is not None and plan.layout.dcp == 1


def test_pd_disaggregation_rule():
    spec = load_spec(SPECS / "deepseek-v3-style.yaml")
    long = make_deployment(spec, "b200", "nvfp4", context=131072, concurrency=8)
    # 131,072 - 1,024 = 130,048 prompt tokens: 8 prefill steps of 16,384.
    assert long.pd.pays and "8 prefill step(s)" in long.pd.reason
    assert [role for role, _ in long.pd_commands] == [
        "prefill instance",
        "decode instance",
    ]
    for _, argv in long.pd_commands:
        config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert config == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    short = make_deployment(spec, "b200", "nvfp4", context=8192, concurrency=64)
    assert not short.pd.pays and not short.pd_commands


def test_multi_node_layouts():
    spec = load_spec(SPECS / "deepseek-v3-style.yaml")
    plan = make_deployment(spec, "h100", context=4096, concurrency=1)  # bf16, 1.34 TB
    lay = plan.layout
    assert lay.tp == 8 and lay.ep and lay.devices > 8 and plan.nodes == lay.devices // 8
    assert "--data-parallel-size" in plan.argv
    assert any("--headless" in note for note in plan.notes)
    dense = load_spec(SPECS / "dense-gqa.yaml")
    big = dense.model_copy(update={"num_hidden_layers": 1400})  # ~300 B params
    plan = make_deployment(big, "h100", context=8192)
    assert plan.layout.pp > 1 and plan.layout.tp == 8
    assert "--pipeline-parallel-size" in plan.argv


def test_nodes_gives_the_ray_multi_node_commands():
    """--nodes N: exactly N nodes' devices, served as vLLM's multi-node docs do it,
    through a Ray cluster (ray start on every node, one command on the head)."""
    spec = load_spec(SPECS / "deepseek-v3-style.yaml")
    plan = make_deployment(spec, "b300", "nvfp4", context=8192, nodes=2)
    lay = plan.layout
    assert lay.devices == 16 and plan.nodes == 2 and lay.ep and lay.dp > 1
    argv = plan.argv
    assert argv[argv.index("--data-parallel-backend") + 1] == "ray"
    local = int(argv[argv.index("--data-parallel-size-local") + 1])
    assert local * lay.tp == 8  # vLLM's strict packing: whole nodes of DP ranks
    assert "--distributed-executor-backend" not in argv
    assert [cmd for _, cmd in plan.ray_commands] == [
        ["ray", "start", "--head", "--port=6379"],
        ["ray", "start", "--address=<head node IP>:6379"],
    ]
    assert not any("--headless" in note for note in plan.notes)
    text = render_deployment(plan)
    assert "ray start --head --port=6379" in text
    assert "--data-parallel-backend ray" in text
    assert plan.to_dict()["nodes_requested"] == 2

    # A dense model over 3 nodes: TP8 x PP3 through the Ray executor.
    dense = load_spec(SPECS / "dense-gqa.yaml")
    big = dense.model_copy(update={"num_hidden_layers": 1400})
    plan = make_deployment(big, "b300", context=8192, nodes=3)
    assert (plan.layout.tp, plan.layout.pp, plan.nodes) == (8, 3, 3)
    argv = plan.argv
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "3"
    # One node: no cluster to start.
    one = make_deployment(spec, "b300", "nvfp4", context=8192, nodes=1)
    assert one.layout.devices == 8 and not one.ray_commands
    assert "ray" not in one.argv


def test_nodes_refusals():
    from onboard.errors import InputError

    spec = load_spec(SPECS / "dense-gqa.yaml")
    with pytest.raises(InputError, match="serves from one node"):
        make_deployment(spec, "cpu", nodes=2)
    with pytest.raises(InputError, match="--nodes must be at least 1"):
        make_deployment(spec, "b300", nodes=0)
    # Too few nodes for the model: no layout, exit 1 from the CLI.
    ds = str(SPECS / "deepseek-v3-style.yaml")
    res = _plan_cli(ds, "--target", "h100", "--context", "4096", "--nodes", "1")
    assert res.returncode == 1 and "no layout fits" in res.stdout, res.stderr


# ---- weight bytes are what `onboard quantize` writes --------------------------------


def test_linear_roles_and_scheme_bytes_match_onboard_quantize():
    from onboard.quantize import selection as qselection
    from onboard.quantize.kernels import output_tensors
    from onboard.quantize.schemes import SCHEMES

    assert LINEAR_ROLES == qselection.LINEAR_ROLES
    size = {"U8": 1, "F8_E4M3": 1, "I8": 1, "BF16": 2, "F32": 4, "I32": 4, "I64": 8}
    for name, scheme in SCHEMES.items():
        for shape in ((2048, 7168), (576, 7168), (7168, 2048), (130, 96), (1, 32)):
            written = sum(
                math.prod(s) * size[d]
                for _, d, s in output_tensors(scheme, "m", shape, "BF16")
            )
            assert quantized_bytes(name, *shape) == written, (name, shape)


def _tensor_bytes(directory: Path) -> int:
    total = 0
    for shard in directory.glob("*.safetensors"):
        with open(shard, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        header.pop("__metadata__", None)
        total += sum(b - a for a, b in (t["data_offsets"] for t in header.values()))
    return total


@pytest.mark.parametrize("name", ["deepseek-v3-style", "novel-launch"])
def test_weight_bytes_equal_the_quantized_checkpoints(tmp_path, name):
    """Every scheme: the plan's bytes (main model + MTP heads) equal the tensor
    bytes of the checkpoint `onboard quantize` writes from a tiny bf16 one."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.quantize import quantize_checkpoint

    src = write_tiny_checkpoint(load_spec(SPECS / f"{name}.yaml"), tmp_path / "bf16")
    tiny = load_spec(src / "spec.yaml")
    report = weight_report(tiny, "bf16")
    assert _tensor_bytes(src) == report.total_bytes + report.mtp.bytes
    # nvfp4 calibrates through a transformers model, which novel_launch has not.
    # (w4a16: the tiny experts' 64 inputs are less than one group of 128)
    schemes = ["fp8-dynamic", "fp8-block", "nvfp4a16", "mxfp4", "w8a8-int8"]
    schemes += ["nvfp4"] if name == "deepseek-v3-style" else []
    for scheme in schemes:
        out = quantize_checkpoint(src, scheme, tmp_path / scheme, workers=1)
        report = weight_report(tiny, scheme)
        assert report.quantized_params > 0
        assert _tensor_bytes(out) == report.total_bytes + report.mtp.bytes, scheme


# ---- the command line ----------------------------------------------------------


def _plan_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ONBOARD), "plan", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_plan_explains_and_exit_codes(tmp_path):
    spec = str(SPECS / "deepseek-v3-style.yaml")
    res = _plan_cli(spec, "--target", "b200", "--scheme", "nvfp4", "--context", "32768")
    assert res.returncode == 0, res.stderr
    for section in (
        "1. Weights",
        "2. KV cache",
        "3. Memory",
        "4. Capacity",
        "7. Serve",
    ):
        assert section in res.stdout
    assert re.search(r"^vllm serve \./checkpoints/nvfp4 \\$", res.stdout, re.M)
    js = _plan_cli(spec, "--target", "mi355x", "--scheme", "mxfp4", "--json")
    data = json.loads(js.stdout)
    assert data["kv_cache"]["bytes_per_token"] == KV_PER_TOKEN
    assert data["layout"]["devices"] >= 2 and data["env"] == {
        "VLLM_ROCM_USE_AITER": "1"
    }

    bad = _plan_cli(spec, "--target", "cpu", "--scheme", "nvfp4")
    assert bad.returncode == 2 and "cpu cannot run nvfp4" in bad.stderr
    assert "Traceback" not in bad.stderr
    unknown = _plan_cli(spec, "--target", "tpu")
    assert unknown.returncode == 2 and "unknown target 'tpu'" in unknown.stderr
    ctx = _plan_cli(spec, "--target", "b200", "--context", "999999")
    assert ctx.returncode == 2 and "--context must be in 1..163840" in ctx.stderr
    # The full model does not fit in this machine's memory: exit 1, explained.
    cpu = _plan_cli(spec, "--target", "cpu", "--context", "4096")
    assert cpu.returncode == 1 and "no layout fits" in cpu.stdout
    assert "failed: no layout" in cpu.stderr


# ---- cpu target: the plan's KV cache against vLLM's own accounting ------------------

# novel-launch (full and sliding GQA layers, KV sharing) and deepseek-v3-style
# (MLA) in `make test`; dense-gqa's full layers, which novel-launch also has, in
# `make test-all`.
TINY = [
    pytest.param("dense-gqa", marks=pytest.mark.acceptance),
    "deepseek-v3-style",
    "novel-launch",
]
ENGINE_KV_TYPES = {
    "full": "FullAttentionSpec",
    "sliding": "SlidingWindowSpec",
    "mla": "MLAAttentionSpec",
}


@pytest.fixture(scope="module", params=TINY)
def engine_and_plan(request):
    """ONE vLLM CPU engine per tiny checkpoint, built as the cpu plan says: float32,
    the plan's context, concurrency, batch size and VLLM_CPU_KVCACHE_SPACE."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.runtime.engine import Engine, EngineOptions, read_plugin
    from onboard.serving.serve import vllm_knows

    name = request.param
    # Its own directory: pytest prunes old base temp dirs when other sessions of
    # the same user start, which can pull a minutes-long engine's files away.
    tmp = tempfile.TemporaryDirectory(prefix=f"onboard-plan-{name}-")
    request.addfinalizer(tmp.cleanup)
    work = Path(tmp.name)
    ckpt = write_tiny_checkpoint(
        load_spec(SPECS / f"{name}.yaml"), work / "ckpt", dtype="float32"
    )
    spec = load_spec(ckpt / "spec.yaml")
    plan = make_deployment(
        spec, "cpu", context=256, concurrency=2, dtype="float32", model=str(ckpt)
    )
    plugin = None
    if not vllm_knows(spec.architecture):  # novel_launch: the generated plugin
        from onboard.pipeline.generate import generate_all

        generate_all(spec, work / "generated")
        plugin = read_plugin(work / "generated" / "plugin")
    options = EngineOptions(
        model_dir=ckpt,
        plugin=plugin,
        max_model_len=plan.context,
        uses_mla=spec.attention.type == "mla",
        extra={
            "max_num_seqs": plan.concurrency,
            "max_num_batched_tokens": plan.target.max_num_batched_tokens,
        },
    )
    old = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = plan.env["VLLM_CPU_KVCACHE_SPACE"]
    try:
        with Engine(options, work / "engine", work / "engine.log") as engine:
            engine.start()
            info = engine.wait_ready()
            yield spec, plan, info["kv_cache"]
    finally:
        if old is None:
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        else:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = old


def _layer(name: str) -> int:
    return int(re.search(r"layers\.(\d+)\.", name).group(1))


@pytest.mark.engine
def test_cpu_plan_kv_cache_equals_vllm_accounting(engine_and_plan):
    """Per layer and in total, the bytes per token the plan computes from the
    spec are the engine's (page size / block size of each layer's KV-cache spec),
    KV-shared layers own nothing, and the engine made the plan's block count."""
    spec, plan, engine = engine_and_plan
    assert "error" not in engine, engine
    layers = engine["layers"]
    got = {_layer(n): layer["bytes_per_token"] for n, layer in layers.items()}
    want = {x.index: x.bytes_per_token for x in plan.kv.owning_layers}
    assert got == want
    for n, layer in layers.items():
        mine = plan.kv.layers[_layer(n)]
        assert layer["type"] == ENGINE_KV_TYPES[mine.kind], n
        assert layer["block_size"] == plan.kv_block_size
        assert layer["page_size_bytes"] == plan.kv_block_size * mine.bytes_per_token
    assert engine["bytes_per_token"] == plan.kv.bytes_per_token
    assert engine["bytes_per_token_without_sharing"] == (
        plan.kv.bytes_per_token_without_sharing
    )
    shared = {_layer(a): _layer(b) for a, b in engine["shared_layers"].items()}
    assert shared == {x.index: x.shares for x in plan.kv.layers if x.shares is not None}
    assert shared == dict(spec.attention.kv_sharing)
    assert engine["block_size"] == plan.kv_block_size
    assert engine["num_blocks"] == plan.num_blocks
    assert plan.num_blocks == (
        plan.cpu_kv_space_gib * GiB // plan.kv.bytes_per_block(plan.kv_block_size)
    )


def test_mla_kv_sharing_by_hand(tmp_path):
    """DeepSeek-V3's 61 MLA layers, layers 4 and 5 reading layer 3's latent
    cache: 59 caches of (512 + 64) bf16 values per token."""
    import yaml

    data = yaml.safe_load((SPECS / "deepseek-v3-style.yaml").read_text())
    data["attention"]["kv_sharing"] = {4: 3, 5: 3}
    # Generated without rope scaling and MTP heads (spec rules).
    data["rope"].pop("scaling")
    data.pop("mtp")
    data["speculators"] = []
    path = tmp_path / "mla-share.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    kv = kv_report(load_spec(path))
    per_layer = (512 + 64) * 2
    assert kv.bytes_per_token == 59 * per_layer == 67_968
    assert kv.bytes_per_token_without_sharing == 61 * per_layer
    assert {x.index: x.shares for x in kv.layers if x.shares is not None} == {
        4: 3,
        5: 3,
    }
    # The sharing layers' own kv_a_proj_with_mqa (576 x 7168) is never run: it
    # stays bf16 when the rest is quantized.
    base = weight_report(load_spec(SPECS / "deepseek-v3-style.yaml"), "fp8-block")
    shared = weight_report(load_spec(path), "fp8-block")
    kept = 2 * (bf16(576, 7168) - fp8_block(576, 7168))
    assert shared.total_bytes - base.total_bytes == kept


@pytest.mark.parametrize("path", sorted((ROOT / "model_specs").glob("*.yaml")))
def test_every_matrix_is_in_a_group_of_its_own_kind(path):
    """Only 1-D tensors (norms, A_log, dt_bias) fall to "norms": a projection or
    convolution there would be counted replicated on every rank."""
    from onboard.arch import build_plan
    from onboard.arch.tensors import plan_tensors

    spec = load_spec(path)
    decoder = len(build_plan(spec).layers)
    one_d = sum(
        math.prod(t.shape)
        for t in plan_tensors(spec)
        if len(t.shape) == 1 and (t.layer is None or t.layer < decoder)
    )
    norms = weight_report(spec, "bf16").groups["norms"]
    assert 0 < norms.params <= one_d, (norms.params, one_d)


def test_split_linear_attention_is_split_over_the_ranks():
    """Qwen3.5's split projections (in_proj_qkv, _z, _b, _a) and A_log/dt_bias
    are split over the tensor-parallel ranks, as vLLM's Gated DeltaNet layer
    splits them (the linear-attention component's roles say so): none is
    counted among the replicated norms."""
    from onboard.arch.tensors import plan_tensors
    from tests.generate_variants import variant

    spec = variant("var-hybrid-split")
    mixer = [
        math.prod(t.shape)
        for t in plan_tensors(spec)
        if ".linear_attn." in t.name and ".linear_attn.out_norm." not in t.name
    ]
    group = weight_report(spec, "bf16").groups["linear attention"]
    assert group.shard == "tp"
    assert group.params == sum(mixer) > 0
