"""Drive the real vLLM engine in a worker subprocess.

The engine runs in :mod:`onboard.runtime.engine_worker` (one ``vllm.LLM`` per run,
shared by every check), so that vLLM's imports, threads and child processes never
touch this process, and so that the generated plugin can be made visible to vLLM
with nothing installed: the worker's ``PYTHONPATH`` carries the plugin's package
and a synthesized ``.dist-info`` whose ``entry_points.txt`` declares the plugin in
the ``vllm.general_plugins`` group. The worker runs vLLM's engine core in its own
process (tensor parallelism adds one process per rank); every vLLM process
inherits that environment, finds the entry point through
``importlib.metadata`` and calls the plugin's ``register()``, exactly as it would
after ``pip install DIR/plugin``.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onboard.errors import InputError
from onboard.runtime.compare import TOP_K
from onboard.spec.model import ModelSpec
from onboard.spec.naming import OVERRIDE_ENV

PLUGIN_GROUP = "vllm.general_plugins"
START_TIMEOUT_S = 1800.0
REQUEST_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Plugin:
    """A generated out-of-tree plugin, as its pyproject declares it."""

    root: Path  # the directory to put on PYTHONPATH
    package: str  # top-level import name, e.g. onboard_plugin_tiny_llama
    dist_name: str
    version: str
    entry_point: str  # name in the vllm.general_plugins group
    target: str  # "module:function"
    # True: pip-installed where the engine's Python finds it; nothing is added to
    # the engine's path, so vLLM loads exactly what pip installed.
    installed: bool = False


def read_plugin(plugin_dir: Path) -> Plugin:
    """Read DIR/plugin/pyproject.toml; the plugin must declare one general plugin."""
    pyproject = plugin_dir / "pyproject.toml"
    if not pyproject.is_file():
        raise InputError(f"{plugin_dir}: no pyproject.toml (not a generated plugin)")
    try:
        data = tomllib.loads(pyproject.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{pyproject}: invalid TOML: {exc}") from None
    project = data.get("project", {})
    entries = project.get("entry-points", {}).get(PLUGIN_GROUP, {})
    if len(entries) != 1:
        raise InputError(
            f"{pyproject}: expected one entry point in group {PLUGIN_GROUP!r}, "
            f"found {len(entries)}"
        )
    ((name, target),) = entries.items()
    package = target.split(":")[0].split(".")[0]
    for root in (plugin_dir, plugin_dir / "src"):
        if (root / package / "__init__.py").is_file() or (
            root / f"{package}.py"
        ).is_file():
            break
    else:
        raise InputError(f"{plugin_dir}: package {package!r} of {target!r} not found")
    return Plugin(
        root=root.resolve(),
        package=package,
        dist_name=project.get("name", package),
        version=str(project.get("version", "0")),
        entry_point=name,
        target=target,
    )


def installed_plugin(dist_name: str) -> Plugin:
    """The plugin ``dist_name`` as pip installed it into this environment."""
    from importlib import metadata

    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise InputError(
            f"--installed-plugin: {dist_name} is not installed in this Python "
            f"environment ({sys.executable}); run `pip install GEN_DIR/plugin`"
        ) from None
    entries = [ep for ep in dist.entry_points if ep.group == PLUGIN_GROUP]
    if len(entries) != 1:
        raise InputError(
            f"--installed-plugin: {dist_name} declares {len(entries)} entry points "
            f"in group {PLUGIN_GROUP!r}, expected one"
        )
    (entry,) = entries
    return Plugin(
        root=Path(str(dist.locate_file(""))).resolve(),
        package=entry.value.split(":")[0].split(".")[0],
        dist_name=dist.metadata["Name"],
        version=dist.version,
        entry_point=entry.name,
        target=entry.value,
        installed=True,
    )


def compat_plugin() -> Plugin:
    """onboard's CPU shims (:mod:`onboard.runtime.compat`) as a general plugin of
    their own, beside the generated one."""
    from onboard.runtime import compat

    return Plugin(
        root=Path(__file__).resolve().parents[2],
        package="onboard",
        dist_name="onboard-cpu-compat",
        version="0",  # the metadata vLLM's plugin lookup needs, nothing more
        entry_point=compat.ENTRY_POINT,
        target=compat.TARGET,
    )


def plugin_site(plugin: Plugin, site_dir: Path) -> Path:
    """Write the plugin's ``.dist-info`` (METADATA + entry_points.txt) in site_dir."""
    dist = plugin.dist_name.replace("-", "_")
    info = site_dir / f"{dist}-{plugin.version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {plugin.dist_name}\nVersion: {plugin.version}\n"
    )
    (info / "entry_points.txt").write_text(
        f"[{PLUGIN_GROUP}]\n{plugin.entry_point} = {plugin.target}\n"
    )
    return site_dir


@dataclass
class EngineOptions:
    model_dir: Path
    # None: vLLM's own in-tree classes (baselines); else the generated plugin.
    plugin: Plugin | None
    max_model_len: int = 256
    seed: int = 0
    uses_mla: bool = False
    # float32, as the reference: vLLM's CPU kernels for linear attention take
    # bfloat16 only, and the CPU shims (onboard.runtime.compat: gdn_float32,
    # kda_torch) run both kinds in float32. A quantization scheme whose CPU
    # kernel takes 16-bit activations only sets bfloat16 (check_quant).
    dtype: str = "float32"
    # The linear-attention layers' recurrent-state dtype (None: no such layers).
    mamba_ssm_cache_dtype: str | None = None
    # Further vllm.LLM keyword arguments (e.g. speculative_config for later checks).
    extra: dict[str, Any] = field(default_factory=dict)
    # Environment for the engine's processes (e.g. VLLM_CPU_OMP_THREADS_BIND).
    env: dict[str, str] = field(default_factory=dict)
    # The CPU shims the model needs (onboard.runtime.compat.shims_for): what
    # vLLM's CPU build lacks, installed into the engine's processes only.
    compat: tuple[str, ...] = ()

    def engine_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "dtype": self.dtype,
            "enforce_eager": True,  # skips torch.compile: minutes on 2 cores
            "max_model_len": self.max_model_len,
            "max_num_seqs": 16,
            "seed": self.seed,
            "gpu_memory_utilization": 0.3,  # on CPU: share of host memory
            "skip_tokenizer_init": True,  # prompts arrive as token ids
            "disable_log_stats": False,  # counters for speculative decoding
        }
        if self.uses_mla:
            # The AMX MLA backend, preferred when the CPU has AMX, only takes bf16
            # weights; the reference CPU MLA backend runs float32.
            kwargs["attention_config"] = {"backend": "CPU_MLA"}
        if self.mamba_ssm_cache_dtype is not None:
            kwargs["mamba_ssm_cache_dtype"] = self.mamba_ssm_cache_dtype
            if self.uses_mla or self.extra.get("speculative_config"):
                # vLLM's CPU platform turns prefix caching off for MLA models
                # after the hybrid config has sized the states' blocks for it
                # ('--mamba-block-size can only be set with
                # --enable-prefix-caching'): off from the start instead.
                # With speculation, prefix caching puts a hybrid model's states
                # in vLLM's "align" mode, whose state copy for draft tokens is a
                # Triton kernel that the CPU build cannot launch ('function'
                # object is not subscriptable, vllm/v1/worker/mamba_utils.py
                # run_fused_precopy); without it speculation keeps one state per
                # draft position.
                kwargs["enable_prefix_caching"] = False
        return {**kwargs, **self.extra}


def engine_state_options(spec: ModelSpec) -> dict[str, Any]:
    """EngineOptions fields a spec's layers need: MLA's backend, with
    linear-attention layers their recurrent state's dtype, and the CPU shims
    vLLM's CPU build needs for them."""
    from onboard.runtime.compat import shims_for

    lin = spec.linear_attention
    return {
        "uses_mla": spec.attention.type == "mla",
        "mamba_ssm_cache_dtype": None if lin is None else lin.state_dtype,
        "compat": shims_for(spec),
    }


def vllm_environment(options: EngineOptions, work_dir: Path) -> dict[str, str]:
    """The environment of a process that runs vLLM with ``options``' plugin and
    CPU shims only (the engine's, and the weights probe's)."""
    env = dict(os.environ)
    paths = []
    # Only ours: another installed plugin must not register over them (none:
    # vLLM's own classes, even where a plugin is installed).
    plugins = []
    if options.plugin is not None:
        plugin = options.plugin
        if not plugin.installed:
            paths += [
                str(plugin.root),
                str(plugin_site(plugin, work_dir / "site")),
            ]
        plugins.append(plugin.entry_point)
        # The engine runs the generated class, also for an architecture
        # vLLM serves in-tree (its plugin's register() logs the switch).
        env[OVERRIDE_ENV] = "all"
    if options.compat:
        from onboard.runtime import compat

        site = plugin_site(compat_plugin(), work_dir / "site")
        if str(site) not in paths:
            paths.append(str(site))
        plugins.append(compat.ENTRY_POINT)
        env[compat.ENV] = ",".join(options.compat)
    env["VLLM_PLUGINS"] = ",".join(plugins)
    # The helper functions the worker ships into vLLM's processes live in
    # onboard; make sure those processes can import it.
    paths.append(str(Path(__file__).resolve().parents[2]))
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # apply_model/collective_rpc ship a function to the engine processes, which
    # vLLM only allows with pickle enabled; set for this worker tree only.
    env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env.update(options.env)
    return env


class EngineLoadError(Exception):
    """vLLM could not build the model; ``failure`` is the worker's report."""

    def __init__(self, failure: dict[str, Any]):
        self.failure = failure
        super().__init__(failure.get("error", "engine failed to start"))


class EngineRequestError(RuntimeError):
    """The engine raised ``error`` under a request (with the engine core in the
    worker's process, the exception itself: vLLM logs nothing of it)."""

    def __init__(self, op: str, error: str):
        self.error = error
        super().__init__(f"engine request {op!r} failed: {error}")


class EngineDied(Exception):
    """The worker exited without answering."""


class Engine:
    """One vLLM engine in a worker process: start, ask, close.

    ``start()`` returns at once so that the caller can run the reference while
    the engine boots; ``wait_ready()`` then returns what the engine reported."""

    def __init__(self, options: EngineOptions, work_dir: Path, log_path: Path):
        self.options = options
        self.work_dir = work_dir
        self.log_path = log_path
        self.info: dict[str, Any] | None = None
        self._proc: subprocess.Popen | None = None
        self._fd: int | None = None
        self._buffer = b""
        self._started_at = 0.0

    # -- lifecycle ------------------------------------------------------------

    def environment(self) -> dict[str, str]:
        return vllm_environment(self.options, self.work_dir)

    def _worker_environment(self) -> dict[str, str]:
        env = self.environment()
        # The engine core in the worker's own process (vLLM's V1 multiprocessing
        # off; tensor parallelism still starts one process per rank): two fewer
        # processes to spawn and import vLLM into, about 25 s less per engine
        # start on 2 cores. `vllm serve` (the speed check) keeps vLLM's default.
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        return env

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Absolute paths: the worker runs in work_dir.
        config = {
            "model": str(Path(self.options.model_dir).resolve()),
            "engine_kwargs": self.options.engine_kwargs(),
            "log_path": str(self.log_path.resolve()),
        }
        config_path = self.work_dir / "engine-config.json"
        config_path.write_text(json.dumps(config, indent=2))
        read_fd, write_fd = os.pipe()
        log = open(self.log_path, "wb")  # noqa: SIM115 (closed after Popen)
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "onboard.runtime.engine_worker",
                    str(config_path),
                    str(write_fd),
                ],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                env=self._worker_environment(),
                cwd=self.work_dir,
            )
        finally:
            log.close()
            os.close(write_fd)
        self._fd = read_fd
        self._started_at = time.perf_counter()

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> dict[str, Any]:
        message = self._read(timeout)
        if message.get("event") == "load_failed":
            self.close()
            raise EngineLoadError(message)
        self.info = message
        return message

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                self._send({"op": "shutdown"}, proc)
                self._read(60, proc)
            except (EngineDied, TimeoutError, OSError):
                pass
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()  # only our own worker, by its handle
                proc.wait()
        if proc.stdin:
            proc.stdin.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- requests -------------------------------------------------------------

    def generate(self, prompts: list[list[int]], **sampling: Any) -> dict[str, Any]:
        """Run prompts (token ids) with SamplingParams(**sampling); outputs with
        logprob dicts keyed by int token id."""
        reply = self.request(
            {"op": "generate", "prompts": prompts, "sampling": sampling}
        )
        for out in reply["outputs"]:
            for key in ("logprobs", "prompt_logprobs"):
                if out[key] is not None:
                    out[key] = [
                        None if step is None else {int(t): v for t, v in step.items()}
                        for step in out[key]
                    ]
        return reply

    def greedy(
        self, prompts: list[list[int]], max_tokens: int, prompt_logprobs: bool = False
    ) -> dict[str, Any]:
        """Greedy continuations of ``max_tokens`` tokens each (EOS ignored, so
        every run decodes alike) with the top logprobs of each token, and of each
        prompt token where asked: what a comparison with the reference reads."""
        sampling: dict[str, Any] = dict(
            temperature=0.0, max_tokens=max_tokens, logprobs=TOP_K, ignore_eos=True
        )
        if prompt_logprobs:
            sampling["prompt_logprobs"] = TOP_K
        return self.generate(prompts, **sampling)

    def metrics(self) -> dict[str, Any]:
        return self.request({"op": "metrics"})["metrics"]

    def rpc(self, function: str, *args: Any) -> Any:
        """Call ``function`` ("module:name", importable in vLLM's processes) in the
        model workers through collective_rpc; the first worker's result."""
        reply = self.request({"op": "rpc", "function": function, "args": list(args)})
        return reply["result"][0]

    def request(self, message: dict[str, Any], timeout: float = REQUEST_TIMEOUT_S):
        self._send(message)
        reply = self._read(timeout)
        if not reply.get("ok"):
            raise EngineRequestError(message["op"], reply["error"])
        return reply

    # -- plumbing -------------------------------------------------------------

    def _send(self, message: dict[str, Any], proc: subprocess.Popen | None = None):
        proc = proc or self._proc
        if proc is None or proc.stdin is None:
            raise EngineDied("engine worker is not running")
        proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()

    def _read(self, timeout: float, proc: subprocess.Popen | None = None) -> dict:
        proc = proc or self._proc
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"engine worker did not answer in {timeout:.0f} s")
            ready, _, _ = select.select([self._fd], [], [], min(remaining, 5.0))
            if not ready:
                continue
            chunk = os.read(self._fd, 1 << 20)
            if not chunk:
                code = proc.wait() if proc is not None else None
                raise EngineDied(
                    f"engine worker exited (code {code}) without answering; "
                    f"see {self.log_path}:\n{self.log_tail()}"
                )
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ("" when it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
