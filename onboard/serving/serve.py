"""The `vllm serve` command line and environment of a deployment."""

from __future__ import annotations

import importlib.util
import json
import shlex
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onboard.serving.types import Deployment

NIXL_CONFIG = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
RAY_PORT = 6379  # `ray start --head`'s default GCS port


def fill_commands(deployment: Deployment, model: str | None) -> None:
    """Set deployment.model, deployment.env, deployment.argv (and the P/D pair
    when it pays)."""
    spec, target = deployment.spec, deployment.target
    if model is None:
        if deployment.scheme == "bf16":
            model = spec.base_checkpoint or "./checkpoints/bf16"
        else:
            # Where `onboard new-model` writes the quantized checkpoint.
            model = f"./checkpoints/{deployment.scheme}"
            deployment.notes.append(
                f"{model} is the {deployment.scheme} checkpoint `onboard quantize` / "
                "`onboard new-model` writes; point MODEL at its Hub copy if uploaded"
            )
    deployment.model = model
    env = {k: v for k, v in target.env.items() if not v.startswith("<")}
    if deployment.cpu_kv_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(deployment.cpu_kv_space_gib)
    deployment.env = env

    layout = deployment.layout
    argv = ["vllm", "serve", model]
    if layout is not None:
        argv += ["--tensor-parallel-size", str(layout.tp)]
        if layout.pp > 1:
            argv += ["--pipeline-parallel-size", str(layout.pp)]
        if layout.dp > 1:
            argv += ["--data-parallel-size", str(layout.dp)]
            local = max(1, target.devices_per_node // layout.tp)
            if layout.dp > local:
                argv += ["--data-parallel-size-local", str(local)]
        if layout.ep:
            argv += ["--enable-expert-parallel"]
        if layout.dcp > 1:
            argv += ["--decode-context-parallel-size", str(layout.dcp)]
    argv += [
        "--max-model-len",
        str(deployment.context),
        "--max-num-seqs",
        str(deployment.concurrency),
        "--max-num-batched-tokens",
        str(target.max_num_batched_tokens),
    ]
    if target.is_gpu:
        argv += ["--gpu-memory-utilization", f"{target.memory_utilization:g}"]
    if deployment.dtype != "bfloat16":
        argv += ["--dtype", deployment.dtype]
    if deployment.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", deployment.kv_cache_dtype]
    if deployment.kv.state_dtype is not None:
        # The linear-attention layers' recurrent state: the spec's dtype (vLLM's
        # default follows the model's dtype).
        argv += ["--mamba-ssm-cache-dtype", deployment.kv.state_dtype]
    mla = deployment.arch.attention.kind == "mla"
    if not target.is_gpu and mla and deployment.dtype != "bfloat16":
        # The AMX MLA backend, preferred on AMX CPUs, only takes bf16.
        argv += ["--attention-backend", "CPU_MLA"]
    deployment.argv = argv

    if (
        deployment.nodes_requested is not None
        and layout is not None
        and deployment.nodes > 1
    ):
        _ray_cluster(deployment)
    elif layout is not None and layout.devices > target.devices_per_node:
        deployment.notes.append(
            f"{layout.devices} devices over {deployment.nodes} nodes: run the "
            "command on every node; on the others add --headless "
            "--data-parallel-start-rank <first local DP rank> "
            "--data-parallel-address <head node IP>"
            if layout.dp > 1
            else f"{layout.devices} devices over {deployment.nodes} nodes: run the "
            f"command on every node with --nnodes {deployment.nodes} "
            "--node-rank <rank> --master-addr <head node IP> (and --headless on "
            "all but the head)"
        )
    if deployment.pd.pays and layout is not None:
        config = json.dumps(NIXL_CONFIG, separators=(",", ":"))
        deployment.pd_commands = [
            (role, argv + ["--kv-transfer-config", config])
            for role in ("prefill instance", "decode instance")
        ]
        deployment.notes.append(
            f"P/D: each instance on its own {layout.devices} device(s) (or its own "
            "--port); both need NIXL (pip install nixl) and a proxy in front "
            "that sends each prompt to the prefill instance, then to the decode "
            "instance (vLLM's examples/online_serving/disaggregated_serving)"
        )
    if spec.mtp is not None:
        deployment.notes.append(
            f"MTP heads ({_gib(deployment.weights.mtp.bytes)}) are not loaded: add "
            '--speculative-config \'{"method": "mtp", "num_speculative_tokens": '
            f"{spec.mtp.num_heads}}}' to serve them as drafts (more weights and KV)"
            + (
                "; on the cpu target with linear-attention layers also "
                "--no-enable-prefix-caching (vLLM 0.32's CPU build cannot run the "
                "prefix-caching state copy for draft tokens)"
                if deployment.kv.states and not target.is_gpu
                else ""
            )
        )
    if not vllm_knows(spec.architecture):
        deployment.notes.append(
            f"vLLM 0.32 has no {spec.architecture}: install the generated plugin "
            "first (onboard generate SPEC --out GEN; pip install GEN/plugin)"
        )


def _ray_cluster(deployment: Deployment) -> None:
    """Serve across ``deployment.nodes`` nodes the way vLLM's multi-node docs do it: a
    Ray cluster of the nodes, then one command on the head node, from which vLLM
    places every rank. TP x PP spans nodes through the Ray executor
    (``--distributed-executor-backend ray``); DP replicas (with EP for MoE) are
    placed as Ray actors (``--data-parallel-backend ray``), each node holding
    ``--data-parallel-size-local`` of them (vLLM's default strict packing)."""
    layout = deployment.layout
    assert layout is not None
    head = f"<head node IP>:{RAY_PORT}"
    deployment.ray_commands = [
        ("on the head node", ["ray", "start", "--head", f"--port={RAY_PORT}"]),
        (
            f"on each of the other {deployment.nodes - 1} node(s)",
            ["ray", "start", f"--address={head}"],
        ),
    ]
    backend = (
        "--data-parallel-backend"
        if layout.dp > 1
        else ("--distributed-executor-backend")
    )
    deployment.argv += [backend, "ray"]
    per_node = deployment.target.devices_per_node
    deployment.notes.append(
        f"{layout.devices} devices over {deployment.nodes} nodes through Ray: start "
        "Ray on "
        f"every node (above), check that `ray status` lists {deployment.nodes} nodes "
        "of "
        f"{per_node} GPUs, then run the command on the head node only; every node "
        "needs the same vLLM and the model at the same path (or its Hub id). Set "
        "VLLM_HOST_IP to each node's own address if it has several"
    )


def shell(env: dict[str, str], argv: list[str]) -> str:
    """The command as a copy-pasteable shell snippet, one flag per line."""
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    words = [shlex.quote(w) for w in argv]
    parts: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if (
            word.startswith("--")
            and i + 1 < len(words)
            and not words[i + 1].startswith("--")
        ):
            parts.append(f"{word} {words[i + 1]}")
            i += 2
        else:
            parts.append(word)
            i += 1
    head = " ".join(parts[:3])
    lines.append(" \\\n    ".join([head, *parts[3:]]))
    return "\n".join(lines)


@cache
def vllm_knows(architecture: str) -> bool:
    """Whether the installed vLLM's model registry names the architecture (read
    from its source, so planning does not import vLLM). True when vLLM is not
    installed here: nothing to say then."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return True
    registry = Path(spec.origin).parent / "model_executor" / "models" / "registry.py"
    try:
        return f'"{architecture}"' in registry.read_text(encoding="utf-8")
    except OSError:
        return True


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.1f} GiB"
