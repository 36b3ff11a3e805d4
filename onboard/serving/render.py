"""The deployment as text: every number with the arithmetic that produced it."""

from __future__ import annotations

import shlex
from collections import Counter
from typing import TYPE_CHECKING

from onboard.serving.disagg import PROXY_URL, proxy_command
from onboard.serving.layout import ACTIVATION_BUFFERS, LOGIT_BYTES, GiB
from onboard.serving.serve import shell
from onboard.serving.weights import SHARD_EXPERTS, SHARD_KV, SHARD_TP
from onboard.templating import index_ranges

if TYPE_CHECKING:
    from onboard.serving.types import Deployment


def gib(n: float) -> str:
    return f"{n / GiB:,.2f} GiB"


def render_deployment(deployment: Deployment) -> str:
    sections = [
        _header(deployment),
        _weights(deployment),
        _kv_cache(deployment),
        _memory(deployment),
    ]
    if deployment.chosen is not None:
        sections += [
            _capacity(deployment),
            _parallelism(deployment),
            _serve(deployment),
        ]
    if deployment.quantize_time is not None:
        sections.append(
            ["8. Quantizing the checkpoint", *deployment.quantize_time.lines()]
        )
    return "\n\n".join("\n".join(lines) for lines in sections)


def _header(deployment: Deployment) -> list[str]:
    """The target, scheme and load."""
    spec, t, kv = deployment.spec, deployment.target, deployment.kv
    note = f": {deployment.support.note}" if deployment.support.note else ""
    return [
        f"onboard deployment: {spec.name} on {t.name} ({t.description})",
        f"scheme {deployment.scheme} ({deployment.support.support} on {t.name}{note}), "
        f"dtype {deployment.dtype}, KV cache {kv.dtype}",
        f"load: {deployment.concurrency} request(s) of {deployment.context:,} tokens "
        f"({deployment.output_len:,} of them output)",
    ]


def _weights(deployment: Deployment) -> list[str]:
    """1. Weights per group."""
    w = deployment.weights
    out: list[str] = []
    add = out.append
    add(f"1. Weights ({deployment.scheme}; unquantized tensors in {w.dtype})")
    add(_weight_rule(deployment.scheme))
    add(f"   {'group':<40} {'params':>17} {'bytes':>19}  split over")
    for g in w.groups.values():
        add(
            f"   {g.name:<40} {g.params:>17,} {g.bytes:>19,}  {_shard_text(g.shard)}"
            + (" (quantized)" if g.quantized_params == g.params and g.params else "")
        )
    add(
        f"   {'total':<40} {w.total_params:>17,} {w.total_bytes:>19,}  "
        f"= {gib(w.total_bytes)}"
    )
    if w.mtp.tensors:
        add(
            f"   MTP heads (not loaded without MTP speculation): {w.mtp.params:,} "
            f"params, {w.mtp.bytes:,} B"
        )
    return out


def _kv_cache(deployment: Deployment) -> list[str]:
    """2. KV cache per token and per request."""
    kv = deployment.kv
    out: list[str] = []
    add = out.append
    add(f"2. KV cache per token ({kv.dtype}, {kv.dtype_bytes} B per value)")
    add(f"   per layer: {kv.formula}")
    kinds: dict[str, list[int]] = {}
    for layer in kv.layers:
        key = "shared" if layer.shares is not None else layer.kind
        kinds.setdefault(key, []).append(layer.index)
    for key, idx in kinds.items():
        add(f"   {key:<8} layers ({len(idx)}): {index_ranges(idx)}")
    owning = kv.owning_layers
    per_layer = owning[0].bytes_per_token if owning else 0
    sizes = Counter(layer.bytes_per_token for layer in owning)
    terms = " + ".join(f"{n} x {size:,} B" for size, n in sizes.items())
    add(
        f"   layers that own a cache: {terms} = {kv.bytes_per_token:,} B per token"
        + (
            f" ({kv.bytes_per_token_without_sharing:,} B without KV sharing)"
            if kv.bytes_per_token != kv.bytes_per_token_without_sharing
            else ""
        )
    )
    if kv.states:
        return out + _states(deployment)
    windowed = [x for x in owning if x.window]
    if windowed:
        full = [x for x in owning if not x.window]
        win = windowed[0].window
        add(
            f"   one request of {deployment.context:,} tokens: {len(full)} x "
            f"{per_layer:,} x "
            f"{deployment.context:,} + {len(windowed)} x {per_layer:,} x min("
            f"{deployment.context:,}, window {win:,}) = "
            f"{kv.bytes_per_request(deployment.context):,} B"
        )
    else:
        add(
            f"   one request of {deployment.context:,} tokens: "
            f"{kv.bytes_per_token:,} x "
            f"{deployment.context:,} = {kv.bytes_per_request(deployment.context):,} "
            "B = "
            f"{gib(kv.bytes_per_request(deployment.context))}"
        )
    return out


def _states(deployment: Deployment) -> list[str]:
    """The linear-attention layers' states, and one request's total."""
    kv = deployment.kv
    idx = [s.index for s in kv.states]
    state = kv.state_bytes_per_sequence
    request = kv.bytes_per_request(deployment.context)
    return [
        f"   linear-attention layers ({len(idx)}): {index_ranges(idx)}, no KV cache: "
        f"one state per sequence ({kv.state_dtype} recurrent state)",
        f"   per layer: {kv.state_formula}",
        f"   one request of {deployment.context:,} tokens: KV {kv.bytes_per_token:,} x "
        f"{deployment.context:,} + states {len(idx)} x {kv.states[0].bytes:,} = "
        f"{kv.kv_bytes_per_request(deployment.context):,} + {state:,} = {request:,} "
        "B = "
        f"{gib(request)}",
    ]


def _memory(deployment: Deployment) -> list[str]:
    """3. Memory per device and the layouts tried."""
    spec, t, kv = deployment.spec, deployment.target, deployment.kv
    out: list[str] = []
    add = out.append
    add("3. Memory per device")
    mem_src = f"{t.memory_gb:g} GB" if t.memory_gb is not None else "host memory"
    add(
        f"   usable = {mem_src} ({deployment.memory_per_device:,} B) x "
        f"{t.memory_utilization:g} = {deployment.usable:,} B = {gib(deployment.usable)}"
    )
    act = deployment.reserve_items
    add(
        f"   reserve = {act['non-torch overhead']:,} "
        f"(non-torch, {t.overhead_gib:g} GiB)"
        f" + {act['activations']:,} (activations: {ACTIVATION_BUFFERS} x "
        f"{t.max_num_batched_tokens:,} tokens x hidden {spec.hidden_size:,} x "
        f"{2 if deployment.dtype != 'float32' else 4} B)"
        f" + {act['logits']:,} (logits: {deployment.concurrency} seqs x vocab "
        f"{spec.vocab_size:,} x {LOGIT_BYTES} B) = {deployment.reserve:,} B"
    )
    add(
        "   layouts tried (weights per device from section 1; KV = requests per "
        "rank x one request's KV / split):"
    )
    add(
        f"   {'devices':>7}  {'layout':<24} {'weights/dev':>17} {'KV needed/dev':>17}"
        f" {'KV budget/dev':>18}  fits"
    )
    for c in deployment.candidates:
        status = (
            f"no: {c.problem}"
            if c.problem
            else (
                "yes" if c.fits else "no (weights)" if c.kv_budget <= 0 else "no (KV)"
            )
        )
        add(
            f"   {c.layout.devices:>7}  {c.layout.name:<24} {c.weights:>17,} "
            f"{c.kv_needed:>17,} {c.kv_budget:>18,}  {status}"
        )
    if deployment.chosen is None:
        add("   no layout fits: the deployment stops here")
        return out
    c = deployment.chosen
    lay = c.layout
    add(
        f"   chosen: {lay.name} on {lay.devices} device(s) ({deployment.nodes} "
        "node(s) of "
        f"{t.devices_per_node}) - the first that fits, fewest devices first"
    )
    add(
        f"   per device: weights {gib(c.weights)} + reserve "
        f"{gib(deployment.reserve)} + KV "
        f"{gib(c.kv_needed)} = {gib(c.weights + deployment.reserve + c.kv_needed)} of "
        f"{gib(deployment.usable)} usable"
    )
    split = lay.tp / lay.kv_replicas(deployment.arch)
    states = (
        f" + states {kv.state_bytes_per_sequence:,} / (TP {lay.tp} x PP {lay.pp})"
        if kv.states
        else ""
    )
    add(
        "   KV per request per rank = "
        f"{kv.kv_bytes_per_request(deployment.context):,} / "
        f"(TP split {split:g} x DCP {lay.dcp} x PP {lay.pp}){states} = "
        f"{lay.kv_bytes_per_request(deployment.arch, kv, deployment.context):,.0f} B; "
        f"requests per rank = ceil({deployment.concurrency} / DP {lay.dp}) = "
        f"{lay.requests_per_rank(deployment.concurrency)}"
    )
    return out


def _capacity(deployment: Deployment) -> list[str]:
    """4. Capacity of the chosen layout."""
    spec, kv = deployment.spec, deployment.kv
    c = deployment.chosen
    assert c is not None
    owning = kv.owning_layers
    out: list[str] = []
    add = out.append
    add("4. Capacity")
    if deployment.cpu_kv_space_gib is not None:
        add(
            f"   VLLM_CPU_KVCACHE_SPACE = ceil({deployment.concurrency} x "
            f"{kv.bytes_per_request(deployment.context):,} B / 1 GiB) = "
            f"{deployment.cpu_kv_space_gib} GiB (at least 1)"
        )
        groups = kv.cache_groups()
        add(
            f"   KV-cache groups (vLLM): {len(groups)} of {len(groups[0])} layer(s): "
            + "; ".join(",".join(map(str, g)) for g in groups)
        )
        page = (
            f"{kv.state_page_bytes(deployment.kv_block_size):,} B page"
            if kv.states
            else f"{deployment.kv_block_size} tokens x {owning[0].bytes_per_token:,} B"
        )
        if kv.states:
            add(
                f"   hybrid block size: the smallest multiple of the kernel's block "
                f"whose attention page holds a state: {deployment.kv_block_size} "
                "tokens; "
                "each state is padded to that page"
            )
        add(
            f"   KV blocks = {deployment.cpu_kv_space_gib} GiB // ({len(groups[0])} "
            f"layer(s) x {page}) = {deployment.num_blocks:,} blocks of "
            f"{deployment.kv_block_size} tokens, shared by the groups"
        )
        budget = deployment.cpu_kv_space_gib * GiB
    else:
        budget = c.kv_budget
        add(
            f"   KV budget per device = usable - weights - reserve = {budget:,} B "
            f"= {gib(budget)}"
        )
    add(
        f"   max context at {deployment.concurrency} concurrent request(s): "
        f"{deployment.max_context:,} tokens"
        + (
            " (the spec's maximum)"
            if deployment.max_context == spec.max_position_embeddings
            else ""
        )
    )
    add(
        f"   max concurrency at {deployment.context:,} tokens: "
        f"{deployment.max_concurrency:,} "
        "request(s)"
    )
    return out


def _parallelism(deployment: Deployment) -> list[str]:
    """5-6. DCP and prefill/decode disaggregation."""
    kv = deployment.kv
    out: list[str] = []
    add = out.append
    add("5. Decode context parallelism (DCP)")
    add(
        f"   {'pays' if deployment.dcp.pays else 'does not pay'}: "
        f"{deployment.dcp.reason}"
    )
    add("6. Prefill/decode disaggregation (NIXL connector)")
    add(
        f"   {'pays' if deployment.pd.pays else 'does not pay'}: {deployment.pd.reason}"
    )
    if deployment.pd.pays:
        prompt = deployment.context - deployment.output_len
        add(
            f"   KV sent per request: {kv.bytes_per_token:,} B x {prompt:,} prompt "
            f"tokens = {gib(kv.bytes_per_request(prompt))}"
        )
    if deployment.pd_layout is not None:
        out += _pd_layout(deployment.pd_layout)
    return out


def _pd_layout(pd) -> list[str]:
    """The --disaggregate split and the numbers that size it."""
    est, fig = pd.estimate, pd.figures
    out = [
        f"   layout (--disaggregate {len(pd.prefill.nodes)}:{len(pd.decode.nodes)}),"
        " each side planned on exactly its nodes for the same load:"
    ]
    out += [f"   {role.describe()}" for role in (pd.prefill, pd.decode)]
    out.append(
        f"   KV over the link per request: {est.kv_bytes_per_token:,} B/token x "
        f"{est.prompt:,} prompt tokens = {gib(est.kv_bytes_per_request)}"
    )
    if est.link_s_per_request is not None:
        out.append(
            f"   link (--link-gbps {fig.link_gbps:g} GB/s per node): "
            f"{est.link_s_per_request * 1e3:,.1f} ms per request; the "
            f"{len(pd.prefill.nodes)} prefill node(s) send at most "
            f"{est.link_requests_per_s:,.1f} requests/s"
        )
    else:
        out.append("   link: give --link-gbps (GB/s per node) for the transfer time")
    if est.prefill_tokens_per_s is not None:
        out.append(
            f"   prefill at peak (--device-tflops {fig.device_tflops:g}): "
            f"{pd.prefill.deployment.layout.devices} devices x "
            f"{fig.device_tflops:g} TFLOPS / (2 x "
            f"{est.active_params / 1e9:,.1f} B active params) = "
            f"{est.prefill_tokens_per_s:,.0f} tokens/s (linear layers only)"
        )
    if est.decode_tokens_per_s is not None:
        out.append(
            f"   decode (--hbm-tbps {fig.hbm_tbps:g}): "
            f"{pd.decode.deployment.concurrency} tokens per step, each device "
            f"reading {gib(est.decode_step_bytes)} "
            f"(weights + full-context KV) = {est.decode_tokens_per_s:,.0f} tokens/s"
        )
    if est.balanced_ratio is not None:
        out.append(
            f"   balanced: P/D = {est.balanced_ratio:.2f} (equal requests/s of "
            f"{est.prompt:,} prompt and {est.output:,} output tokens per node "
            f"side); requested {len(pd.prefill.nodes)}/{len(pd.decode.nodes)} = "
            f"{len(pd.prefill.nodes) / len(pd.decode.nodes):.2f}"
        )
    elif est.prefill_tokens_per_s is None or est.decode_tokens_per_s is None:
        out.append(
            "   throughput: give --device-tflops and --hbm-tbps for the prefill and "
            "decode estimates and the balanced P:D"
        )
    return out


def _serve(deployment: Deployment) -> list[str]:
    """7. The serve command (one per role with prefill/decode disaggregation)."""
    out = [
        f"7. Serve ({deployment.target.vllm.install})",
        "   backends: " + _backends(deployment),
    ]
    for where, argv in [] if deployment.pd_layout else deployment.ray_commands:
        out += [f"# {where}", shlex.join(argv)]
    if deployment.ray_commands and deployment.pd_layout is None:
        out.append("# then on the head node")
    if deployment.pd_layout is not None:
        pd = deployment.pd_layout
        for role in (pd.prefill, pd.decode):
            for where, env, argv in role.commands():
                text = shell(env, argv) if argv[0] == "vllm" else shlex.join(argv)
                out += [f"# {where}", text]
        out += [
            f"# proxy, on any host that reaches both (vLLM's NIXL proxy: {PROXY_URL})",
            shlex.join(proxy_command(pd.prefill, pd.decode)),
        ]
    elif deployment.pd_commands:
        for role, argv in deployment.pd_commands:
            out += [f"# {role}", shell(deployment.env, argv)]
    else:
        out.append(shell(deployment.env, deployment.argv))
    return out + [f"# note: {note}" for note in deployment.notes]


def _weight_rule(scheme: str) -> str:
    if scheme == "bf16":
        return "   bytes = params x dtype bytes (nothing quantized)"
    rules = {
        "fp8-dynamic": "quantized: params x 1 B + rows x 2 B scales",
        "fp8-block": "quantized: params x 1 B + ceil(rows/128) x ceil(cols/128) x 2 B",
        "nvfp4": "quantized: params / 2 + params / 16 scales + 8 B global scales",
        "nvfp4a16": "quantized: params / 2 + params / 16 scales + 4 B global scale",
        "mxfp4": "quantized: params / 2 + params / 32 scales",
        "w4a16": "quantized: params / 2 + params / 128 x 2 B scales + 16 B shape",
        "w4a16-asym": "quantized: as w4a16 + params / 128 x 0.5 B zero points",
        "w8a8-int8": "quantized: params x 1 B + rows x 2 B scales",
    }
    return f"   bytes = {rules[scheme]}; others: params x dtype bytes"


def _shard_text(shard: str) -> str:
    return {
        SHARD_TP: "TP",
        SHARD_KV: "TP up to the KV heads",
        SHARD_EXPERTS: "EP (whole experts), else TP",
    }.get(shard, "replicated")


def _backends(deployment: Deployment) -> str:
    b = deployment.target.backends
    attention = b.mla if deployment.arch.attention.kind == "mla" else b.attention
    moe = deployment.support.moe or b.moe
    parts = [f"attention {attention}", f"linear {deployment.support.linear}"]
    if deployment.arch.has_moe:
        parts.append(f"MoE {moe}")
    return "; ".join(parts)
