"""Prefill/decode disaggregation over N nodes: which nodes prefill, which decode.

``onboard deployment --nodes N --disaggregate P:D`` splits the N nodes into P prefill
and D decode nodes (P + D = N). Each role is one vLLM deployment planned as
``onboard deployment --nodes P`` (and ``--nodes D``) plans one: the first layout of
exactly that many nodes' devices that holds the weights and the requested KV
cache (TP inside a node, DP x EP or PP across nodes, through a Ray cluster of the
role's nodes when it spans several). Both serve with vLLM's NIXL connector
(``--kv-transfer-config {"kv_connector":"NixlConnector","kv_role":"kv_both"}``):
a proxy sends each prompt to a prefill instance with ``max_tokens`` 1, then the
request with the returned ``kv_transfer_params`` to a decode instance, which
pulls the prompt's KV cache from the prefill instance's GPUs over the link.

The numbers that size P:D, each from a stated input:

- KV bytes that cross the link per request: the KV report's bytes per token x
  the prompt tokens (context - output); with ``--link-gbps`` (GB/s of scale-out
  network per node) the transfer time per request and the request rate the P
  prefill nodes' links carry.
- With ``--device-tflops`` (dense TFLOPS of one device in the serving format) and
  ``--hbm-tbps`` (TB/s of one device's memory): prefill tokens/s of the prefill
  deployment at peak, 2 x active parameters FLOPs per token over its devices
  (linear layers only: attention's own FLOPs and every inefficiency make the
  real figure lower); decode tokens/s of the decode deployment, ``concurrency``
  tokens per step, one step reading each device's weights and its share of the
  full-context KV cache from memory. The balanced split gives each side the same
  request rate: P / D = (decode requests/s per node) / (prefill requests/s per
  node), a request being ``prompt`` prefill tokens and ``output`` decode tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onboard.errors import InputError

# vLLM's NIXL test proxy (vllm-project/vllm, tests/v1/kv_connector/
# nixl_integration/toy_proxy_server.py): not in the vllm wheel, fetched from
# the repository at the installed version's tag.
PROXY_URL = (
    "https://raw.githubusercontent.com/vllm-project/vllm/v0.32.0/tests/v1/"
    "kv_connector/nixl_integration/toy_proxy_server.py"
)
PREFILL_PORT = 8100
DECODE_PORT = 8200
PROXY_PORT = 8000


def parse_ratio(text: str) -> tuple[int, int]:
    """``P:D`` -> (P, D), both at least 1; InputError naming the flag otherwise."""
    parts = text.split(":")
    try:
        p, d = (int(x) for x in parts)
    except ValueError:
        p = d = 0
    if len(parts) != 2 or p < 1 or d < 1:
        raise InputError(
            f"--disaggregate: expected P:D, the prefill and decode node counts "
            f"(e.g. 1:3), got {text!r}"
        )
    return p, d


@dataclass(frozen=True)
class Figures:
    """The stated hardware figures (None: not given)."""

    link_gbps: float | None = None
    device_tflops: float | None = None
    hbm_tbps: float | None = None

    def check(self) -> None:
        for flag, value in (
            ("--link-gbps", self.link_gbps),
            ("--device-tflops", self.device_tflops),
            ("--hbm-tbps", self.hbm_tbps),
        ):
            if value is not None and not (0 < value < math.inf):
                raise InputError(f"{flag} must be a positive number, got {value}")


@dataclass
class PDEstimate:
    """The arithmetic behind the split; fields None where a figure is missing."""

    prompt: int
    output: int
    kv_bytes_per_token: int
    kv_bytes_per_request: int
    active_params: int
    link_s_per_request: float | None = None
    link_requests_per_s: float | None = None  # over the P prefill nodes' links
    prefill_tokens_per_s: float | None = None  # the prefill deployment
    decode_tokens_per_s: float | None = None  # the decode deployment
    decode_step_bytes: int | None = None  # read per device per step
    balanced_ratio: float | None = None  # P / D at equal request rates

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def active_params(deployment) -> int:
    """Parameters one token runs through: all but the routed experts it skips."""
    w = deployment.weights
    routed = w.groups.get("routed experts")
    if routed is None or not deployment.arch.moe:
        return w.total_params
    k, e = deployment.arch.moe.num_experts_per_tok, deployment.arch.moe.num_experts
    return w.total_params - routed.params + routed.params * k // e


def estimate(prefill, decode, p_nodes: int, d_nodes: int, figures: Figures):
    """PDEstimate of a prefill deployment on p_nodes and a decode deployment on
    d_nodes."""
    prompt = max(0, prefill.context - prefill.output_len)
    kv = prefill.kv
    est = PDEstimate(
        prompt=prompt,
        output=prefill.output_len,
        kv_bytes_per_token=kv.bytes_per_token,
        kv_bytes_per_request=kv.bytes_per_request(prompt),
        active_params=active_params(prefill),
    )
    if figures.link_gbps is not None:
        est.link_s_per_request = est.kv_bytes_per_request / (figures.link_gbps * 1e9)
        if est.kv_bytes_per_request:
            est.link_requests_per_s = (
                p_nodes * figures.link_gbps * 1e9 / est.kv_bytes_per_request
            )
    if figures.device_tflops is not None:
        flops = figures.device_tflops * 1e12 * prefill.layout.devices
        est.prefill_tokens_per_s = flops / (2 * est.active_params)
    if figures.hbm_tbps is not None:
        mem = decode.chosen
        est.decode_step_bytes = mem.weights + mem.kv_needed
        step_s = est.decode_step_bytes / (figures.hbm_tbps * 1e12)
        est.decode_tokens_per_s = decode.concurrency / step_s
    if (
        est.prefill_tokens_per_s
        and est.decode_tokens_per_s
        and prompt > 0
        and est.output > 0
    ):
        prefill_rps_node = est.prefill_tokens_per_s / prompt / p_nodes
        decode_rps_node = est.decode_tokens_per_s / est.output / d_nodes
        est.balanced_ratio = decode_rps_node / prefill_rps_node
    return est


@dataclass
class PDRole:
    role: str  # "prefill" | "decode"
    first_node: int
    deployment: object  # the role's Deployment (nodes_requested = its node count)

    @property
    def nodes(self) -> range:
        return range(self.first_node, self.first_node + self.deployment.nodes)

    @property
    def port(self) -> int:
        return PREFILL_PORT if self.role == "prefill" else DECODE_PORT

    def commands(self) -> list[tuple[str, dict[str, str], list[str]]]:
        """(where, env, argv) of this role, in order: its Ray cluster (when it
        spans several nodes), then vllm serve on its first node."""
        deployment = self.deployment
        head = f"node {self.first_node}"
        out: list[tuple[str, dict[str, str], list[str]]] = []
        for where, argv in deployment.ray_commands:
            if where == "on the head node":
                where = f"{self.role}: on {head} (its Ray head)"
            else:
                where = f"{self.role}: on {_nodes_text(self.nodes[1:])}"
                argv = [a.replace("<head node IP>", f"<{head} IP>") for a in argv]
            out.append((where, {}, argv))
        env = {**deployment.env, "VLLM_NIXL_SIDE_CHANNEL_HOST": f"<{head} IP>"}
        out.append((f"{self.role}: on {head}", env, list(deployment.argv)))
        return out

    def describe(self) -> str:
        layout = self.deployment.layout
        ep = (
            f"EP {layout.tp * layout.dp}"
            if layout.ep
            else "no EP (dense)"
            if not self.deployment.arch.moe
            else "experts split over TP"
        )
        return (
            f"{self.role}: {_nodes_text(self.nodes)} ({layout.devices} devices), "
            f"{layout.name}: TP {layout.tp}, DP {layout.dp}, PP {layout.pp}, {ep}"
        )


@dataclass
class PDLayout:
    prefill: PDRole
    decode: PDRole
    estimate: PDEstimate
    figures: Figures

    def to_dict(self) -> dict:
        roles = {}
        for r in (self.prefill, self.decode):
            layout = r.deployment.layout
            roles[r.role] = {
                "nodes": list(r.nodes),
                "layout": layout.name,
                "tp": layout.tp,
                "dp": layout.dp,
                "pp": layout.pp,
                "ep": layout.tp * layout.dp if layout.ep else None,
                "devices": layout.devices,
                "commands": [
                    {"where": w, "env": env, "command": argv}
                    for w, env, argv in r.commands()
                ],
            }
        return {
            **roles,
            "proxy": {
                "url": PROXY_URL,
                "command": proxy_command(self.prefill, self.decode),
            },
            "figures": dict(self.figures.__dict__),
            "estimate": self.estimate.to_dict(),
        }


def add_nixl(role: PDRole, nixl_config: str) -> None:
    """The role's serve command with the NIXL connector on its own port."""
    role.deployment.argv += [
        "--kv-transfer-config",
        nixl_config,
        "--port",
        str(role.port),
    ]


def proxy_command(prefill: PDRole, decode: PDRole) -> list[str]:
    return [
        "python",
        "toy_proxy_server.py",
        "--port",
        str(PROXY_PORT),
        "--prefiller-hosts",
        f"<node {prefill.first_node} IP>",
        "--prefiller-ports",
        str(PREFILL_PORT),
        "--decoder-hosts",
        f"<node {decode.first_node} IP>",
        "--decoder-ports",
        str(DECODE_PORT),
    ]


def _nodes_text(nodes: range) -> str:
    if len(nodes) == 1:
        return f"node {nodes[0]}"
    return f"nodes {nodes[0]}-{nodes[-1]}"
