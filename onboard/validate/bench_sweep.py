"""vLLM's own serving benchmark (`vllm bench serve`) over a concurrency sweep, in
one process.

``python -m onboard.validate.bench_sweep --base-url URL --concurrency 1,2,4
--result-dir DIR [--prompts-per-slot 2 --min-prompts 4] -- <vllm bench serve
arguments>`` parses the arguments with
`vllm bench serve`'s own parser (``vllm.benchmarks.serve.add_cli_args``) and calls
its ``main`` once per concurrency, adding ``--max-concurrency C --save-result
--result-dir DIR --result-filename bench-cC.json``: the same code and the same
result JSON as the CLI, with vLLM imported once instead of once per concurrency
(tens of seconds each on two cores). It waits for the server's /health first, so
it can import vLLM while the server boots. After each level it saves the
server's /metrics as ``metrics-cC.prom`` (the engine's own token timings).

The client runs at a raised priority (``--nice``, default -10) where the OS
allows it: it is the stopwatch. On two shared cores the server's engine-core
process spins on ``sched_yield`` while its worker computes (vLLM's shared-memory
queue busy-loops for a second after each read), and a client at equal priority
then waits tens to hundreds of milliseconds for a core while streamed tokens
pile up in its socket: vLLM's benchmark timestamps them all at once (TTFT close
to the request's whole latency, inter-token gaps of microseconds, a median TPOT
of ~0.005 ms). See docs/validation.md ("Speed").
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request


def wait_health(base_url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    raise SystemExit(f"{base_url}/health did not answer in {timeout:.0f} s")


def raise_priority(nice: int) -> int:
    """Set this process's nice value (lower = sooner on a core); the value in
    effect after trying (unchanged where the OS does not permit it)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError as exc:
        print(f"bench_sweep: cannot set nice {nice} ({exc}); timings may lag")
    return os.getpriority(os.PRIO_PROCESS, 0)


def scrape(base_url: str, path: str) -> None:
    with urllib.request.urlopen(base_url + "/metrics", timeout=60) as r:
        text = r.read()
    with open(path, "wb") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, bench_args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :])
        if "--" in argv
        else (argv, [])
    )
    parser = argparse.ArgumentParser(prog="onboard.validate.bench_sweep")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--concurrency", required=True)
    parser.add_argument("--result-dir", required=True)
    parser.add_argument("--wait", type=float, default=900.0)
    # Requests per level: max(min, per_slot x concurrency), unless the benchmark
    # arguments fix --num-prompts.
    parser.add_argument("--prompts-per-slot", type=int, default=2)
    parser.add_argument("--min-prompts", type=int, default=4)
    parser.add_argument("--nice", type=int, default=-10)
    args = parser.parse_args(own)

    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    wait_health(args.base_url, args.wait)
    # After the import and the server's start, which it should not slow down.
    print(f"bench_sweep: client nice {raise_priority(args.nice)}", flush=True)
    for c in [int(x) for x in args.concurrency.split(",")]:
        bench_parser = FlexibleArgumentParser()
        add_cli_args(bench_parser)
        bench = bench_parser.parse_args(
            [
                *bench_args,
                *(
                    []
                    if "--num-prompts" in bench_args
                    else [
                        "--num-prompts",
                        str(max(args.min_prompts, args.prompts_per_slot * c)),
                    ]
                ),
                "--base-url",
                args.base_url,
                "--max-concurrency",
                str(c),
                "--save-result",
                "--result-dir",
                args.result_dir,
                "--result-filename",
                f"bench-c{c}.json",
            ]
        )
        bench_main(bench)
        scrape(args.base_url, os.path.join(args.result_dir, f"metrics-c{c}.prom"))


if __name__ == "__main__":
    main()
