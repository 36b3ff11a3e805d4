"""`onboard plan` at scale: the quantize-time prediction (--node-gbps) and the
prefill/decode layout (--disaggregate P:D), their arithmetic by hand, and the
refusals of bad flags (exit 2, the flag named)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from onboard.errors import InputError
from onboard.serving import make_deployment
from onboard.serving.disagg import (
    DECODE_PORT,
    PREFILL_PORT,
    Figures,
    active_params,
    parse_ratio,
)
from onboard.serving.quantize_time import RAY_FIT, SHARD_BYTES, quantize_time
from onboard.serving.render import render_deployment
from onboard.serving.weights import weight_report
from onboard.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "model_specs"
DSV3 = SPECS / "deepseek-v3-style.yaml"
ONBOARD = Path(sys.executable).with_name("onboard")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ONBOARD), "plan", *args], capture_output=True, text=True, timeout=120
    )


# ---- quantize time -------------------------------------------------------------


def test_quantize_time_arithmetic():
    spec = load_spec(DSV3)
    q = quantize_time(spec, "fp8-dynamic", 4, 2.5)
    bf16 = weight_report(spec, "bf16")
    # The whole 16-bit checkpoint, MTP head included: 671 B params + 11.7 B MTP.
    assert q.source_bytes == bf16.total_bytes + bf16.mtp.bytes
    assert 1.36e12 < q.source_bytes < 1.37e12
    assert q.shards == math.ceil(q.source_bytes / SHARD_BYTES)
    start, task = RAY_FIT["fp8-dynamic"]
    assert (q.start_s, q.task_s) == (start, task)
    assert q.bytes_s == pytest.approx(q.source_bytes / 1e9 / (4 * 2.5))
    assert q.tasks_s == pytest.approx(q.tasks * task / 4)
    assert q.total_s == pytest.approx(start + q.bytes_s + q.tasks_s)
    # Twice the nodes: both node terms halve, the start stays.
    q8 = quantize_time(spec, "fp8-dynamic", 8, 2.5)
    assert q8.total_s - start == pytest.approx((q.total_s - start) / 2)
    # A scheme the benchmark did not run uses the larger fitted per-task cost.
    qb = quantize_time(spec, "fp8-block", 4, 2.5)
    assert qb.task_s == max(t for _, t in RAY_FIT.values())
    assert qb.fit_scheme != "fp8-block"


def test_quantize_task_count_matches_the_worker(tmp_path):
    """own_tasks counts the tasks onboard.quantize.worker.make_tasks makes of a
    tiny checkpoint: one per quantized weight (fp8-dynamic fuses nothing), the
    kept tensors batched per shard."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.quantize.schemes import get_scheme
    from onboard.quantize.selection import make_selection as quant_plan
    from onboard.quantize.worker import make_tasks

    spec = load_spec(SPECS / "dense-gqa.yaml")
    ckpt = write_tiny_checkpoint(spec, tmp_path / "ckpt")
    tiny = load_spec(ckpt / "spec.yaml")
    plan = quant_plan(ckpt, tiny, get_scheme("fp8-dynamic"))
    tasks = make_tasks(plan, [s.name for s in plan.shards])
    report = weight_report(tiny, "fp8-dynamic")
    quantized = [t for t in tasks if t.quantize]
    # A tiny checkpoint keeps no tensor of 1 MiB: its tasks of their own are the
    # quantized weights, plus one batch of small kept tensors (norms) per shard,
    # which the prediction counts as the shards.
    assert report.own_tasks == len(quantized) > 0
    assert len(tasks) == report.own_tasks + len(plan.shards)


def test_quantize_time_cli_and_refusals():
    res = _cli(
        str(DSV3),
        "--target",
        "b300",
        "--scheme",
        "fp8-block",
        "--nodes",
        "2",
        "--context",
        "8192",
        "--node-gbps",
        "2",
        "--json",
    )
    assert res.returncode == 0, res.stderr
    q = json.loads(res.stdout)["quantize_time"]
    assert q["nodes"] == 2 and q["node_gbps"] == 2
    assert q["total_s"] == pytest.approx(q["start_s"] + q["bytes_s"] + q["tasks_s"])
    res = _cli(
        str(DSV3),
        "--target",
        "b300",
        "--scheme",
        "fp8-block",
        "--context",
        "8192",
        "--node-gbps",
        "2",
    )
    assert "8. Quantizing the checkpoint" in res.stdout
    assert "/ (1 x 2 GB/s)" in res.stdout, res.stdout
    for flags, message in (
        (["--scheme", "fp8-block", "--node-gbps", "0"], "--node-gbps must be"),
        (["--node-gbps", "2"], "needs a quantized --scheme"),
    ):
        res = _cli(str(DSV3), "--target", "b300", "--context", "8192", *flags)
        assert res.returncode == 2, (flags, res.stdout, res.stderr)
        assert message in res.stderr + res.stdout
        assert "Traceback" not in res.stderr


# ---- prefill/decode layout -----------------------------------------------------


def test_disaggregated_layout_and_commands():
    spec = load_spec(DSV3)
    plan = make_deployment(
        spec, "b300", "nvfp4", context=8192, concurrency=64, disaggregate="1:3"
    )
    pd = plan.pd_layout
    assert list(pd.prefill.nodes) == [0] and list(pd.decode.nodes) == [1, 2, 3]
    assert pd.prefill.deployment.layout.devices == 8
    assert pd.decode.deployment.layout.devices == 24 and pd.decode.deployment.layout.ep
    assert plan is pd.decode.deployment  # the decode side holds the requested load
    nixl = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
    for role, port in ((pd.prefill, PREFILL_PORT), (pd.decode, DECODE_PORT)):
        argv = role.deployment.argv
        assert argv[argv.index("--kv-transfer-config") + 1] == nixl
        assert argv[argv.index("--port") + 1] == str(port)
        commands = role.commands()
        env = commands[-1][1]
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == f"<node {role.first_node} IP>"
    # The decode side spans 3 nodes: its own Ray cluster, head on node 1.
    where = [w for w, _, _ in pd.decode.commands()]
    assert where == [
        "decode: on node 1 (its Ray head)",
        "decode: on nodes 2-3",
        "decode: on node 1",
    ]
    assert pd.decode.commands()[1][2] == ["ray", "start", "--address=<node 1 IP>:6379"]
    assert pd.prefill.commands()[0][0] == "prefill: on node 0"  # one node, no Ray
    text = render_deployment(plan)
    assert "prefill: node 0 (8 devices)" in text
    assert "--prefiller-hosts '<node 0 IP>' --prefiller-ports 8100" in text
    assert "--decoder-hosts '<node 1 IP>' --decoder-ports 8200" in text
    d = plan.to_dict()["pd_layout"]
    assert d["prefill"]["nodes"] == [0] and d["decode"]["ep"] == 24


def test_disaggregated_estimates_by_hand():
    spec = load_spec(DSV3)
    figures = Figures(link_gbps=50, device_tflops=2000, hbm_tbps=8)
    plan = make_deployment(
        spec,
        "b300",
        "nvfp4",
        context=8192,
        concurrency=64,
        output_len=1024,
        nodes=4,
        disaggregate="1:3",
        figures=figures,
    )
    est = plan.pd_layout.estimate
    prompt = 8192 - 1024
    # MLA: (kv_lora_rank 512 + rope 64) x 2 bytes x 61 layers per token.
    assert est.kv_bytes_per_token == (512 + 64) * 2 * 61
    assert est.kv_bytes_per_request == est.kv_bytes_per_token * prompt
    assert est.link_s_per_request == pytest.approx(est.kv_bytes_per_request / 50e9)
    assert est.link_requests_per_s == pytest.approx(1 / est.link_s_per_request)
    # Active parameters: all but 248 of every 256 routed experts.
    w = weight_report(spec, "nvfp4")
    routed = w.groups["routed experts"].params
    assert active_params(plan) == w.total_params - routed + routed * 8 // 256
    assert 36e9 < active_params(plan) < 39e9
    assert est.prefill_tokens_per_s == pytest.approx(
        8 * 2000e12 / (2 * active_params(plan))
    )
    mem = plan.chosen
    step = (mem.weights + mem.kv_needed) / 8e12
    assert est.decode_tokens_per_s == pytest.approx(64 / step)
    prefill_rps = est.prefill_tokens_per_s / prompt / 1
    decode_rps = est.decode_tokens_per_s / 1024 / 3
    assert est.balanced_ratio == pytest.approx(decode_rps / prefill_rps)
    text = render_deployment(plan)
    assert "balanced: P/D = " in text and "--link-gbps 50 GB/s" in text


def test_disaggregate_refusals():
    spec = load_spec(DSV3)
    for ratio in ("0:3", "1-3", "a:b", "1:2:3"):
        with pytest.raises(InputError, match="--disaggregate: expected P:D"):
            parse_ratio(ratio)
    with pytest.raises(InputError, match="but --nodes is 3"):
        make_deployment(spec, "b300", context=8192, nodes=3, disaggregate="1:3")
    with pytest.raises(InputError, match="no NIXL transfer"):
        make_deployment(load_spec(SPECS / "dense-gqa.yaml"), "cpu", disaggregate="1:1")
    with pytest.raises(InputError, match="give them with --disaggregate"):
        make_deployment(spec, "b300", context=8192, figures=Figures(link_gbps=50))
    with pytest.raises(InputError, match="--hbm-tbps must be a positive"):
        make_deployment(
            spec, "b300", context=8192, disaggregate="1:1", figures=Figures(hbm_tbps=-1)
        )
    # bf16 DeepSeek-V3 (1.34 TB) does not fit one h100 node: that side is named.
    with pytest.raises(InputError, match="prefill side's 1 node"):
        make_deployment(spec, "h100", context=4096, disaggregate="1:2")
    res = _cli(str(DSV3), "--target", "b300", "--disaggregate", "3")
    assert res.returncode == 2 and "expected P:D" in res.stderr + res.stdout
    assert "Traceback" not in res.stderr


# ---- the emitted GPU run serves the same layout ----------------------------------

STUB = """#!/usr/bin/env bash
printf '%s\\n' "$VLLM_NIXL_SIDE_CHANNEL_HOST" "$@" >"$STUB_LOG/$(basename "$0")"
"""


def test_emitted_run_serves_the_pd_layout(tmp_path):
    from onboard.validate.emit import emit

    out = tmp_path / "run"
    spec = SPECS / "dense-gqa.yaml"
    manifest = emit("my-org/tiny-llama", spec, "b300", out, disaggregate="1:1")
    assert manifest["pd_layout"]["prefill"]["nodes"] == [0]
    assert manifest["pd_layout"]["decode"]["nodes"] == [1]
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log.mkdir()
    for tool in ("vllm", "python3", "curl"):
        (bin_dir / tool).write_text(STUB)
        (bin_dir / tool).chmod(0o755)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("BASE_URL", "ROLE", "NIXL_HOST", "PREFILL_HOST", "DECODE_HOST")
    }
    env.update(PATH=f"{bin_dir}:{env['PATH']}", STUB_LOG=str(log), PYTHON="python3")

    def run(*phases: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(out / "run.sh"), *phases],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )

    nixl = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
    for role, port in (("prefill", PREFILL_PORT), ("decode", DECODE_PORT)):
        res = run("serve", ROLE=role, NIXL_HOST="10.0.0.7")
        assert res.returncode == 0, res.stderr
        host, *argv = (log / "vllm").read_text().splitlines()
        assert host == "10.0.0.7"
        assert argv[:2] == ["serve", "my-org/tiny-llama"]
        assert argv[argv.index("--kv-transfer-config") + 1] == nixl
        assert argv[-2:] == ["--port", str(port)] and argv.count("--port") == 1
        assert "--worker-extension-cls" in argv
    res = run("serve")
    assert res.returncode == 2 and "set ROLE=prefill or ROLE=decode" in res.stderr
    res = run("serve", ROLE="decode")
    assert res.returncode == 2 and "set NIXL_HOST" in res.stderr
    res = run("proxy", PREFILL_HOST="10.0.0.1")
    assert res.returncode == 2 and "PREFILL_HOST and DECODE_HOST" in res.stderr
    proxy = tmp_path / "proxy.py"
    proxy.write_text("")
    res = run(
        "proxy",
        PREFILL_HOST="10.0.0.1",
        DECODE_HOST="10.0.0.2",
        PROXY_SCRIPT=str(proxy),
    )
    assert res.returncode == 0, res.stderr
    argv = (log / "python3").read_text().splitlines()[1:]
    assert argv[0] == str(proxy)
    assert argv[argv.index("--prefiller-hosts") + 1] == "10.0.0.1"
    assert argv[argv.index("--prefiller-ports") + 1] == str(PREFILL_PORT)
    assert argv[argv.index("--decoder-hosts") + 1] == "10.0.0.2"
    assert argv[argv.index("--decoder-ports") + 1] == str(DECODE_PORT)
