"""Fuzz `spec check`, `generate` and `checkpoint tiny` in-process with hostile specs.

Specs start as valid ones (tests/test_spec_properties.py's strategy) and take up to
three mutations: hostile values at any path (huge, negative, non-finite, long or
escape-laden strings, deep structures), hostile keys, reserved architecture names,
random tensor-name templates and keep_unquantized regexes, extreme but legal
sizes, and YAML-level damage (alias bombs, recursion, tags, duplicates, cuts).

The contract, for every spec: no traceback; every `spec check` message located
(FILE:LINE:COL: path: message) and printable; every call under 5 s and 500 MB of
new peak memory; and whatever check accepts, generate handles (writes its files)
and tiny handles (writes its checkpoint, or refuses a copy beyond its size cap with
exit 2). A fixed seed keeps `make test` reproducible; `make test-all` runs a larger
budget. Each run prints its figures (specs tried, tracebacks, unlocated messages,
hangs).
"""

from __future__ import annotations

import collections
import re
import resource
import signal
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from test_spec_properties import to_yaml, valid_spec_data

from onboard.errors import InputError
from onboard.spec import SpecError, parse_spec_text
from onboard.spec.rules import GENERATED_NAMES

LOCATED = re.compile(r"^[^\n]+?:\d+:\d+: \S+: .+$")
SECONDS = 5
MEMORY_MB = 500

HOSTILE_VALUES = [
    0, -1, 2**31, 2**63, 10**30, 1e400, -1e400, float("nan"), 1e-400, 0.5,
    "", "x" * 5000, "\x1b]0;pwn\x07", "a\nb", "{layer:0>99999}", "{layer!r}",
    "re:(", "re:(a+)+$", "../../etc/passwd", "/dev/zero", "Attention",
    "VllmConfig", "training", "class", [], {}, [[[[]]]], {"a": {"b": {"c": 1}}},
    None, True, [1] * 2000,
]  # fmt: skip
HOSTILE_KEYS = ["foo[0]", "a.b", "\x1b[2J", "new\nline", "{layer}", "x" * 300, "0"]
ROLES = ["q_proj", "k_proj", "o_proj", "gate_proj", "router", "lm_head", "embed",
         "expert_up_proj", "mtp_head", "training", "q_proj["]  # fmt: skip
TEMPLATE_PARTS = ["model", "layers", "{layer}", "{expert}", "{layer:09}", "{0}",
                  "{layer!s}", "self_attn", "q_proj", "k_proj", "training", "class",
                  "_x", "9", "", "forward", "mlp", "experts", "{", "}"]  # fmt: skip
ARCHITECTURES = sorted(GENERATED_NAMES)[:20] + ["FooModel", "VllmForCausalLM",
                                                "AttentionForCausalLM"]  # fmt: skip
FIGURES: collections.Counter = collections.Counter()


def _paths(data, prefix=()):
    yield prefix
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _paths(v, prefix + (i,))


def _put(data, path, value):
    for part in path[:-1]:
        data = data[part]
    data[path[-1]] = value


@st.composite
def hostile_spec_text(draw) -> str:
    data = draw(valid_spec_data())
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from([
            "value", "value", "key", "architecture", "template", "keep", "extreme",
        ]))  # fmt: skip
        if kind == "value":
            path = draw(st.sampled_from([p for p in _paths(data) if p]))
            _put(data, path, draw(st.sampled_from(HOSTILE_VALUES)))
        elif kind == "key":
            sections = [p for p in _paths(data) if isinstance(_get(data, p), dict)]
            section = _get(data, draw(st.sampled_from(sections)))
            section[draw(st.sampled_from(HOSTILE_KEYS))] = 1
        elif kind == "architecture":
            data["architecture"] = draw(st.sampled_from(ARCHITECTURES))
        elif kind == "template":
            parts = draw(st.lists(st.sampled_from(TEMPLATE_PARTS), max_size=6))
            checkpoint = data.setdefault("checkpoint", {})
            if isinstance(checkpoint, dict):  # a hostile value may have replaced it
                names = checkpoint.setdefault("tensor_names", {})
                if isinstance(names, dict):
                    names[draw(st.sampled_from(ROLES))] = ".".join(parts)
        elif kind == "keep":
            data["keep_unquantized"] = draw(st.lists(st.sampled_from(
                ["re:(", "re:.*o_proj", "o_proj", "o_prj", "model.norm", "re:[", "x"]
            ), max_size=3))  # fmt: skip
        else:  # legal extremes: the largest sizes the schema accepts
            att = data["attention"]
            field, value = draw(st.sampled_from([
                ("num_hidden_layers", 1024), ("hidden_size", 65536),
                ("vocab_size", 2**31 - 1), ("max_position_embeddings", 2**31 - 1),
            ]))  # fmt: skip
            data[field] = value
            if field == "num_hidden_layers":
                for key in ("layer_types", "kv_sharing"):
                    att.pop(key, None)
                moe = data["mlp"].get("moe") if isinstance(data["mlp"], dict) else None
                if isinstance(moe, dict):  # a hostile value may have replaced it
                    moe["dense_layers"] = []
    text = to_yaml(data)
    damage = draw(st.sampled_from(["none"] * 6 + [
        "cut", "bomb", "recursion", "tag", "duplicate", "deep", "tab",
    ]))  # fmt: skip
    if damage == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    elif damage == "bomb":
        text += "x_bomb: &b0 [a, a, a, a, a, a, a, a]\n" + "".join(
            f"x_b{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * 8) + "]\n"
            for i in range(1, 8)
        )
    elif damage == "recursion":
        text += "x_self: &s [*s]\n"
    elif damage == "tag":
        text = text.replace("vocab_size:", "vocab_size: !!int", 1)
    elif damage == "duplicate":
        text += text.splitlines()[0] + "\n"
    elif damage == "deep":
        text += "x_deep: " + "[" * 200 + "]" * 200 + "\n"
    elif damage == "tab":
        text = text.replace("  ", "\t", 1)
    return text


def _get(data, path):
    for part in path:
        data = data[part]
    return data


class Guard:
    """Fails a call that runs past SECONDS or raises peak memory by MEMORY_MB."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self):
        def expired(signum, frame):
            FIGURES["hangs"] += 1
            raise TimeoutError(f"{self.what}: still running after {SECONDS} s")

        self.previous = signal.signal(signal.SIGALRM, expired)
        signal.alarm(SECONDS)
        self.peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return self

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self.peak
        if grown > MEMORY_MB * 1024:
            raise AssertionError(f"{self.what}: peak memory grew by {grown // 1024} MB")
        return False


def drive(text: str, stages: bool, tmp: Path) -> None:
    """Run check, then (with ``stages``) generate and tiny on what check accepts."""
    FIGURES["tried"] += 1
    try:
        with Guard("spec check"):
            spec = parse_spec_text(text, "fuzz.yaml")
    except SpecError as exc:
        FIGURES["refused"] += 1
        lines = str(exc).split("\n")
        bad = [
            line
            for line in lines
            if not (line.isprintable() and LOCATED.match(line))
            and not line.startswith("... and ")
        ]
        FIGURES["unlocated"] += len(bad)
        assert not bad, bad
        return
    except BaseException:
        FIGURES["tracebacks"] += 1
        raise
    FIGURES["accepted"] += 1
    if not stages:
        return
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.generate import generate_files

    try:
        with Guard("generate"):
            files = generate_files(spec)
        assert any(path.endswith(".py") for path in files)
        with Guard("checkpoint tiny"):
            try:
                write_tiny_checkpoint(spec, tmp / f"tiny-{FIGURES['tried']}")
                FIGURES["tiny written"] += 1
            except InputError as exc:
                # The one refusal allowed after check: the size cap, with its count.
                assert "parameters" in str(exc), exc
                FIGURES["tiny over its size cap"] += 1
    except (AssertionError, TimeoutError):
        raise
    except BaseException:
        FIGURES["tracebacks"] += 1
        raise


def _report(name: str, started: float) -> None:
    figures = ", ".join(f"{k} {v}" for k, v in sorted(FIGURES.items()))
    print(f"\n{name}: {figures} ({time.monotonic() - started:.0f} s)")


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=False,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


def _run(name: str, check_examples: int, stage_examples: int) -> None:
    from onboard.generate import generate_files
    from onboard.spec import load_spec

    # The first render loads jinja, the templates and ruff: not the spec's cost.
    generate_files(load_spec(Path(__file__).parents[1] / "model_specs/dense-gqa.yaml"))
    FIGURES.clear()
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="onboard-fuzz-"))

    @seed(20261201)
    @_settings(check_examples)
    @given(hostile_spec_text())
    def check_only(text):
        drive(text, False, tmp)

    @seed(20261202)
    @_settings(stage_examples)
    @given(st.one_of(hostile_spec_text(), valid_spec_data().map(to_yaml)))
    def with_stages(text):
        drive(text, True, tmp)

    try:
        check_only()
        with_stages()
    finally:
        _report(name, started)
    assert FIGURES["tracebacks"] == FIGURES["unlocated"] == FIGURES["hangs"] == 0
    assert FIGURES["accepted"] and FIGURES["refused"], "the fuzz lost its spread"


def test_fuzz_check_generate_tiny():
    _run("fuzz", check_examples=400, stage_examples=24)


@pytest.mark.acceptance
def test_fuzz_check_generate_tiny_large():
    _run("fuzz (large)", check_examples=4000, stage_examples=300)


def test_hostile_text_strategy_yields_parseable_and_broken_yaml():
    """The fuzz reaches both sides of the loader: what the YAML parser accepts and
    what it refuses (a strategy that only produced broken YAML would test little)."""
    parsed = broken = 0

    @seed(1)
    @_settings(60)
    @given(hostile_spec_text())
    def sample(text):
        nonlocal parsed, broken
        try:
            yaml.safe_load(text)
            parsed += 1
        except (yaml.YAMLError, RecursionError, ValueError):
            broken += 1

    sample()
    assert parsed > 20 and broken > 0
