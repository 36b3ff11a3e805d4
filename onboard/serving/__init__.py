"""`onboard deployment`: how to serve a spec on a hardware target, with the arithmetic.

``make_deployment`` computes, from the spec and the target profile: weight bytes for the
scheme (:mod:`onboard.serving.weights`), KV-cache bytes per token
(:mod:`onboard.serving.kv`), the smallest layout whose devices hold weights, reserve
and the KV cache of ``concurrency`` requests of ``context`` tokens
(:mod:`onboard.serving.layout`), the maximum context at that concurrency, whether
decode context parallelism or prefill/decode disaggregation pays, and the
``vllm serve`` command with its environment (:mod:`onboard.serving.serve`).
``render_deployment`` writes it all out so that a reader can redo it by hand.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from onboard.arch import ArchPlan, build_plan
from onboard.errors import InputError
from onboard.serving.disagg import (
    Figures,
    PDLayout,
    PDRole,
    add_nixl,
    estimate,
    parse_ratio,
)
from onboard.serving.kv import KV_DTYPE_BYTES, KVReport, kv_report
from onboard.serving.layout import (
    DeviceMemory,
    GiB,
    Layout,
    candidate_layouts,
    device_memory,
    max_concurrency,
    max_context,
    reserve_bytes,
)
from onboard.serving.serve import NIXL_CONFIG, fill_commands
from onboard.serving.types import Decision, Deployment
from onboard.serving.weights import DTYPE_BYTES, weight_report
from onboard.spec.model import ModelSpec
from onboard.targets import SCHEMES, TargetProfile, get_target

# Decode context parallelism pays from this context on (tokens), see dcp_decision.
DCP_LONG_CONTEXT = 32768
# P/D disaggregation pays when a prompt spans at least this many chunked-prefill
# steps and at least PD_MIN_CONCURRENCY requests decode meanwhile.
PD_PROMPT_CHUNKS = 4
PD_MIN_CONCURRENCY = 8
MAX_GPU_DEVICES = 64
DEFAULT_OUTPUT_LEN = 1024


def make_deployment(
    spec: ModelSpec,
    target: str | TargetProfile,
    scheme: str = "bf16",
    *,
    context: int | None = None,
    concurrency: int = 1,
    dtype: str = "bfloat16",
    kv_cache_dtype: str = "auto",
    output_len: int | None = None,
    model: str | None = None,
    host_memory_bytes: int | None = None,
    nodes: int | None = None,
    disaggregate: str | None = None,
    figures: Figures | None = None,
) -> Deployment:
    """Plan serving ``spec`` on ``target`` (see the module docstring).

    ``nodes``: use exactly that many nodes' devices (the first layout of that
    size that fits), served through a Ray cluster (serve.py).
    ``disaggregate``: "P:D", P prefill and D decode nodes (onboard.serving.disagg);
    the deployment returned is the decode deployment's, with ``pd_layout`` set."""

    profile = target if isinstance(target, TargetProfile) else get_target(target)
    # The load and how it is served: the same for one deployment and for each
    # role of a disaggregated one.
    load = dict(
        scheme=scheme,
        context=context,
        concurrency=concurrency,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        output_len=output_len,
        model=model,
    )
    if disaggregate is not None:
        return _disaggregated(
            spec, profile, disaggregate, nodes, figures or Figures(), **load
        )
    if figures is not None and figures != Figures():
        raise InputError(
            "--link-gbps, --device-tflops and --hbm-tbps size a prefill/decode "
            "split: give them with --disaggregate P:D"
        )
    return _single(
        spec, profile, host_memory_bytes=host_memory_bytes, nodes=nodes, **load
    )


def _single(
    spec: ModelSpec,
    profile: TargetProfile,
    scheme: str,
    *,
    context: int | None,
    concurrency: int,
    dtype: str,
    kv_cache_dtype: str,
    output_len: int | None,
    model: str | None,
    host_memory_bytes: int | None,
    nodes: int | None,
) -> Deployment:
    """One deployment's deployment (make_deployment without --disaggregate)."""
    if scheme not in SCHEMES:
        raise InputError(
            f"--scheme: unknown scheme {scheme!r}; choose one of {', '.join(SCHEMES)}"
        )
    if dtype not in DTYPE_BYTES:
        raise InputError(f"--dtype: choose one of {', '.join(DTYPE_BYTES)}")
    if kv_cache_dtype not in ("auto", "fp8"):
        raise InputError("--kv-cache-dtype: choose auto or fp8")
    support = profile.scheme(scheme)
    arch = build_plan(spec)
    if support.level(arch.has_moe) == "unsupported":
        raise InputError(
            f"{profile.name} cannot run {scheme} in vLLM 0.32: {support.note}"
        )
    context = spec.max_position_embeddings if context is None else context
    if not 0 < context <= spec.max_position_embeddings:
        raise InputError(
            f"--context must be in 1..{spec.max_position_embeddings} "
            f"(the spec's max_position_embeddings), got {context}"
        )
    if concurrency < 1:
        raise InputError(f"--concurrency must be at least 1, got {concurrency}")
    if output_len is None:
        output_len = min(DEFAULT_OUTPUT_LEN, context // 2)

    weights = weight_report(spec, scheme, dtype)
    kv = kv_report(
        spec, dtype if kv_cache_dtype == "auto" else kv_cache_dtype, model_dtype=dtype
    )
    memory = _device_memory_bytes(profile, host_memory_bytes)
    usable = int(memory * profile.memory_utilization)
    reserve, items = reserve_bytes(
        spec,
        profile.max_num_batched_tokens,
        concurrency,
        profile.overhead_gib,
        DTYPE_BYTES[dtype],
    )
    max_devices = MAX_GPU_DEVICES if profile.is_gpu else profile.devices_per_node
    only = None
    if nodes is not None:
        if nodes < 1:
            raise InputError(f"--nodes must be at least 1, got {nodes}")
        if not profile.is_gpu and nodes > 1:
            raise InputError(
                f"--nodes {nodes}: the {profile.name} target serves from one node "
                "(vLLM's CPU build has no multi-node executor)"
            )
        only = nodes * profile.devices_per_node
        max_devices = max(max_devices, only)

    def memory_of(layout: Layout) -> DeviceMemory:
        return device_memory(
            arch,
            weights,
            kv,
            layout,
            usable=usable,
            reserve=reserve,
            context=context,
            concurrency=concurrency,
        )

    candidates: list[DeviceMemory] = []
    chosen = None
    dcp = Decision(False, "no layout fits")
    for layout in candidate_layouts(arch, profile.scale_up_devices, max_devices, only):
        mem = memory_of(layout)
        candidates.append(mem)
        if not mem.weights_fit:
            continue
        dcp = dcp_decision(arch, kv, profile, layout, mem.fits, context)
        if dcp.pays:
            with_dcp = memory_of(layout.with_dcp(layout.kv_replicas(arch)))
            candidates.append(with_dcp)
            if with_dcp.fits:
                chosen = with_dcp
                break
        elif mem.fits:
            chosen = mem
            break

    if chosen is None:
        dcp = Decision(False, "no layout fits")
    pd = pd_decision(profile, context, concurrency, output_len, chosen is not None)
    if pd.pays and chosen is not None and chosen.layout.dcp > 1:
        if arch.attention.kind != "mla":
            # VllmConfig: "PD with decode_context_parallel_size > 1 is only
            # supported for MLA models".
            pd = Decision(
                False,
                f"{pd.reason}, but vLLM 0.32 runs NIXL P/D with DCP for MLA models "
                "only, and this deployment needs DCP",
            )
    deployment = Deployment(
        spec=spec,
        arch=arch,
        target=profile,
        scheme=scheme,
        support=support,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        context=context,
        concurrency=concurrency,
        output_len=output_len,
        weights=weights,
        kv=kv,
        memory_per_device=memory,
        usable=usable,
        reserve=reserve,
        reserve_items=items,
        candidates=candidates,
        chosen=chosen,
        dcp=dcp,
        pd=pd,
        nodes_requested=nodes,
    )
    if chosen is not None:
        if not profile.is_gpu:
            _cpu_kv_cache(deployment)
        else:
            deployment.max_context = max_context(arch, kv, chosen, concurrency)
            deployment.max_concurrency = max_concurrency(arch, kv, chosen, context)
    fill_commands(deployment, model)
    return deployment


def _disaggregated(
    spec: ModelSpec,
    profile: TargetProfile,
    ratio: str,
    nodes: int | None,
    figures: Figures,
    **load,
) -> Deployment:
    """The decode deployment's deployment with the P/D layout (onboard.serving.disagg):
    each role planned on exactly its nodes, for the same load (a prefill
    instance holds each prompt's KV cache until the decode instance pulls it)."""
    p, d = parse_ratio(ratio)
    if not profile.is_gpu:
        raise InputError(
            f"--disaggregate: the {profile.name} target has no NIXL transfer "
            "(it moves GPU memory); choose a GPU target"
        )
    if nodes is not None and nodes != p + d:
        raise InputError(
            f"--disaggregate {ratio}: {p} prefill + {d} decode nodes is {p + d}, "
            f"but --nodes is {nodes}"
        )
    figures.check()
    roles = {}
    for role, count in (("prefill", p), ("decode", d)):
        side = make_deployment(spec, profile, nodes=count, **load)
        if side.chosen is None:
            devices = count * profile.devices_per_node
            raise InputError(
                f"--disaggregate {ratio}: no layout of the {role} side's {count} "
                f"node(s) ({devices} {profile.name} devices) holds {spec.name} and "
                "the requested KV cache; give that side more nodes (see `onboard "
                f"deployment --nodes {count}`)"
            )
        if side.layout.dcp > 1 and side.arch.attention.kind != "mla":
            # VllmConfig: "PD with decode_context_parallel_size > 1 is only
            # supported for MLA models".
            raise InputError(
                f"--disaggregate {ratio}: the {role} side's layout "
                f"({side.layout.name}) needs DCP, and vLLM 0.32 runs NIXL P/D "
                "with DCP for MLA models only; give that side more nodes or a "
                "shorter --context"
            )
        roles[role] = side
    prefill = PDRole("prefill", 0, roles["prefill"])
    decode = PDRole("decode", p, roles["decode"])
    if prefill.deployment.nodes != p or decode.deployment.nodes != d:
        raise InputError(
            f"--disaggregate {ratio}: the layouts span {prefill.deployment.nodes} and "
            f"{decode.deployment.nodes} node(s)"
        )
    config = json.dumps(NIXL_CONFIG, separators=(",", ":"))
    for role in (prefill, decode):
        add_nixl(role, config)
    deployment = decode.deployment
    deployment.pd_layout = PDLayout(
        prefill,
        decode,
        estimate(prefill.deployment, deployment, p, d, figures),
        figures,
    )
    deployment.pd_commands = []
    deployment.notes = [n for n in deployment.notes if not n.startswith("P/D:")]
    deployment.nodes_requested = p + d
    return deployment


def dcp_decision(
    arch: ArchPlan,
    kv: KVReport,
    profile: TargetProfile,
    layout: Layout,
    fits_without: bool,
    context: int,
) -> Decision:
    """Decode context parallelism shards each request's KV cache over the r TP
    ranks that would otherwise hold r copies of it (MLA: r = TP; GQA: r = TP /
    num_kv_heads when TP exceeds the KV heads). Rule: it pays when r > 1, the
    backend supports it, and either the requested load does not fit without it
    or the context is long (>= DCP_LONG_CONTEXT tokens), where decode reads each
    request's whole cache every step and DCP splits that read r ways, for one
    all-gather and one reduce-scatter per layer."""
    r = layout.kv_replicas(arch)
    if not profile.is_gpu:
        return Decision(False, "not on the cpu target (no DCP in vLLM's CPU build)")
    if r == 1:
        return Decision(
            False,
            f"{layout.name}: "
            + (
                "one rank per replica holds the KV cache, nothing to shard"
                if layout.tp == 1
                else "each TP rank holds a different share of the KV cache (its KV "
                "heads), no copies to shard"
            ),
        )
    if kv.sliding:
        return Decision(
            False,
            "the model has sliding-window layers and vLLM 0.32 refuses DCP with "
            "them (SlidingWindowSpec: 'DCP not support sliding window')",
        )
    if arch.attention.kind == "gqa" and profile.platform == "rocm":
        return Decision(
            False,
            "ROCm's MHA backends cannot return the softmax LSE that DCP merges "
            "(can_return_lse_for_decode)",
        )
    if not fits_without:
        return Decision(
            True,
            f"{layout.name} holds {r} copies of every request's KV cache and the "
            f"requested load only fits when DCP {r} shards them",
        )
    if context >= DCP_LONG_CONTEXT:
        return Decision(
            True,
            f"context {context:,} >= {DCP_LONG_CONTEXT:,}: {layout.name} holds {r} "
            f"copies of the KV cache; DCP {r} stores and reads 1/{r} of each "
            f"request per rank ({r}x the KV capacity, {r}x less KV read per "
            "decode step)",
        )
    return Decision(
        False,
        f"context {context:,} < {DCP_LONG_CONTEXT:,} and the load fits: the KV "
        "read per decode step is small, DCP's per-layer communication would cost "
        "more than it saves",
    )


def pd_decision(
    profile: TargetProfile, context: int, concurrency: int, output_len: int, fits: bool
) -> Decision:
    """Prefill/decode disaggregation (NIXL connector) moves prefills to their
    own instance, so that long prompts stop stalling decodes. Rule: it pays when
    a prompt (context - output) spans at least PD_PROMPT_CHUNKS chunked-prefill
    steps of max_num_batched_tokens, each of which delays every running decode,
    and at least PD_MIN_CONCURRENCY requests decode at once; it costs a second
    instance of the layout and one KV transfer per request."""
    prompt = context - output_len
    chunks = math.ceil(prompt / profile.max_num_batched_tokens) if prompt > 0 else 0
    if not profile.is_gpu:
        return Decision(False, "not on the cpu target (NIXL moves GPU memory)")
    if not fits:
        return Decision(False, "no layout fits")
    facts = (
        f"a {prompt:,}-token prompt takes {chunks} prefill step(s) of "
        f"{profile.max_num_batched_tokens:,} tokens; {concurrency} request(s) decode "
        "at once"
    )
    if chunks >= PD_PROMPT_CHUNKS and concurrency >= PD_MIN_CONCURRENCY:
        return Decision(True, f"{facts}: every prefill would stall the decodes")
    return Decision(
        False,
        f"{facts} (pays from {PD_PROMPT_CHUNKS} steps and {PD_MIN_CONCURRENCY} "
        "concurrent requests)",
    )


def _device_memory_bytes(profile: TargetProfile, host: int | None) -> int:
    if profile.memory_gb is not None:
        return int(profile.memory_gb * 1e9)
    if host is not None:
        return host
    return _host_memory()


def _host_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    raise InputError("cannot read the host's memory (/proc/meminfo) for the cpu target")


def _cpu_kv_cache(deployment: Deployment) -> None:
    """The CPU engine gets exactly VLLM_CPU_KVCACHE_SPACE GiB of KV cache: the
    smallest whole GiB that holds the requested load (at least 1). vLLM then makes
    floor(space / bytes per block) blocks (see KVReport.bytes_per_block)."""
    arch, kv = deployment.arch, deployment.kv
    need = deployment.concurrency * kv.bytes_per_request(deployment.context)
    deployment.cpu_kv_space_gib = max(1, math.ceil(need / GiB))
    space = deployment.cpu_kv_space_gib * GiB
    assert deployment.target.kv_block_size is not None
    kind = "mla" if arch.attention.kind == "mla" else "attention"
    deployment.kv_block_size = deployment.target.kv_block_size[kind]
    if kv.states:
        # A hybrid model's attention page must hold a whole state: vLLM raises
        # the block size to the smallest multiple that does.
        deployment.kv_block_size = kv.hybrid_block_size(deployment.kv_block_size)
    deployment.num_blocks = space // kv.bytes_per_block(deployment.kv_block_size)
    # The chosen rank's KV budget on cpu is the space, not the leftover memory.
    chosen = deployment.chosen
    assert chosen is not None
    budget_mem = DeviceMemory(
        chosen.layout,
        space + chosen.weights + chosen.reserve,
        chosen.weights,
        chosen.reserve,
        chosen.kv_needed,
    )
    deployment.max_context = max_context(arch, kv, budget_mem, deployment.concurrency)
    deployment.max_concurrency = max_concurrency(
        arch, kv, budget_mem, deployment.context
    )


__all__ = [
    "KV_DTYPE_BYTES",
    "Decision",
    "Deployment",
    "dcp_decision",
    "make_deployment",
    "pd_decision",
]
