"""Fuzz `spec check`, `generate` and `checkpoint tiny` in-process with hostile specs.

Specs start as valid ones (tests/test_spec_properties.py's strategy) and take up to
three mutations: hostile values at any path (huge, negative, non-finite, long or
escape-laden strings, deep structures), hostile keys, reserved architecture names,
random tensor-name templates and keep_unquantized regexes, extreme but legal
sizes, and YAML-level damage (alias bombs, recursion, tags, duplicates, cuts).

The contract, for every spec: no traceback; every `spec check` message located
(FILE:LINE:COL: path: message) and printable; every call under 5 s of CPU and 500 MB of
new peak memory; and whatever check accepts, generate handles (writes its files)
and tiny handles (writes its checkpoint, or refuses a copy beyond its size cap with
exit 2). A fixed seed keeps `make test` reproducible; `make test-all` runs a larger
budget. Each run prints its figures (specs tried, tracebacks, unlocated messages,
hangs).

A second strategy aims at the newer features: bundled specs of each (Gated
DeltaNet and Kimi delta attention layers, sparse MLA's indexer and its shared
layers, attention sinks, MLA KV sharing, norm placements) cut to a few layers,
with their fields, per-layer lists and the tensor names of their roles drawn,
sometimes out of range. There an accepted spec must also give the reference
(never `hf/README.md` alone), shrink (the shrink rule is total over accepted
specs) and a tiny checkpoint, with no later-stage refusal at all.
"""

from __future__ import annotations

import collections
import copy
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

from onboard.components.indexer import COMPONENT as INDEXER
from onboard.components.linear_attention import KDA_ROLES as KIMI_DELTA_ROLES
from onboard.errors import InputError
from onboard.spec import SpecError, parse_spec_text
from onboard.spec.layouts import LAYOUT_PRESETS
from onboard.spec.rules import GENERATED_NAMES
from onboard.threads import one_thread

SPECS = Path(__file__).resolve().parents[1] / "model_specs"

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
            # (a copy: the same list put twice could end up inside itself)
            _put(data, path, copy.deepcopy(draw(st.sampled_from(HOSTILE_VALUES))))
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


# ---- the newer features -----------------------------------------------------------

FEATURE_BASES = [
    "qwen3-next-style", "kimi-k3-style", "glm-5-style", "gpt-oss-style",
    "deepseek-v3-style", "dense-gqa", "mistral-large-4-style",
]  # fmt: skip
LINEAR_ROLES = [
    "linear_attn", "linear_in_proj_qkvz", "linear_in_proj_ba", "linear_in_proj_qkv",
    "linear_in_proj_z", "linear_in_proj_b", "linear_in_proj_a", "linear_conv1d",
    "linear_norm", "linear_out_proj",
]  # fmt: skip
NEW_ROLES = [*INDEXER.roles, *LINEAR_ROLES, *KIMI_DELTA_ROLES, "sinks", "q_norm",
             "mla_gate_proj", "attention_output_norm", "mlp_output_norm",
             "mlp_input_norm", "router"]  # fmt: skip
NEW_PARTS = ["model", "layers", "{layer}", "self_attn", "linear_attn", "indexer",
             "mixer", "A_log", "dt_bias", "conv1d", "wk", "k_norm", "sinks", "attn",
             "norm", "mlp", "out_proj", "{expert}", "topk", "weight"]  # fmt: skip


def _bundled(name: str) -> dict:
    return yaml.safe_load((SPECS / f"{name}.yaml").read_text())


@st.composite
def feature_spec_data(draw) -> dict:
    """A bundled spec of the newer features, a few layers long, with those
    features' fields, per-layer lists and tensor names drawn: mostly within the
    rules (so the later stages run), one draw in a few out of them."""

    def rarely() -> bool:
        return draw(st.integers(0, 5)) == 5  # (not the simplest draw)

    base = draw(st.sampled_from(FEATURE_BASES))
    data = _bundled(base)
    # Short new names: a model type or architecture of a few dozen characters
    # overflows a hand-wrapped docstring line of the renamed-family templates
    # (RenderError, a known open finding), which this strategy does not aim at.
    i = FEATURE_BASES.index(base)
    data["model_type"] = f"onb_fz{i}"
    data["architecture"] = f"OnbFz{i}ForCausalLM"
    n = draw(st.integers(2, 9))
    data["num_hidden_layers"] = n
    att, mlp = data["attention"], data["mlp"]
    att.pop("kv_sharing", None)
    data["rope"].pop("nope_layers", None)
    mla = att.get("type") == "mla"
    # One past the end now and then.
    layer = st.integers(0, n) if rarely() else st.integers(0, n - 1)
    if "mtp" in data and draw(st.booleans()):
        data.pop("mtp")
        data["speculators"] = [s for s in data["speculators"] if s["method"] != "mtp"]
    moe = mlp.get("moe")
    if moe is not None:
        moe["first_k_dense"] = draw(st.integers(0, n - 1))
        moe["layer_frequency"] = draw(st.sampled_from([1, 1, 2, 3]))
        moe.pop("dense_layers", None)
    if "intermediate_size" not in mlp and not rarely():
        mlp["intermediate_size"] = 512
    # Linear attention: its layers, kind and dims.
    if "linear_attention" in data or (draw(st.integers(0, 3)) == 0 and not mla):
        lin = data.setdefault(
            "linear_attention",
            {"num_key_heads": 2, "num_value_heads": 4, "key_head_dim": 128,
             "value_head_dim": 128},
        )  # fmt: skip
        length = n + (draw(st.sampled_from([-1, 1])) if rarely() else 0)
        types = draw(
            st.lists(st.sampled_from(["linear_attention", "full_attention"]),
                     min_size=length, max_size=length)
        )  # fmt: skip
        if not rarely():  # at least one of each
            types[0], types[-1] = "linear_attention", "full_attention"
        att["layer_types"] = types
        att.pop("sliding_window_pattern", None)
        if draw(st.booleans()):
            lin["type"] = draw(st.sampled_from(["gated_deltanet", "kimi_delta"]))
        if draw(st.booleans()):
            heads = draw(st.sampled_from([1, 2, 4]))
            lin["num_key_heads"] = heads
            lin["num_value_heads"] = heads * draw(st.sampled_from([1, 2, 3]))
        if draw(st.booleans()):
            lin["key_head_dim"] = draw(st.sampled_from([32, 64, 96, 128]))
            lin["value_head_dim"] = draw(
                st.sampled_from([lin["key_head_dim"], 64, 128])
            )
        if lin.get("type") == "kimi_delta" and not rarely():
            lin["num_value_heads"] = lin["num_key_heads"]
            lin["value_head_dim"] = lin["key_head_dim"]
            lin.pop("projections", None)
        if draw(st.booleans()):
            lin["conv_kernel_size"] = draw(st.integers(2, 6))
        if draw(st.booleans()) and lin.get("type") != "kimi_delta":
            lin["projections"] = draw(st.sampled_from(["grouped", "split"]))
        if rarely():
            lin["state_dtype"] = draw(st.sampled_from(["float32", "bfloat16"]))
    elif "layer_types" in att:
        att["layer_types"] = att["layer_types"][:n]
    # Sparse MLA's indexer (not beside linear attention: the rules refuse it).
    if (
        mla
        and "linear_attention" not in data
        and ("indexer" in att or draw(st.booleans()))
    ):
        idx = att.setdefault("indexer", {"num_heads": 4, "head_dim": 128, "topk": 2048})
        att["mla"].setdefault("q_lora_rank", 1536)
        if att["mla"]["q_lora_rank"] is None and not rarely():
            att["mla"]["q_lora_rank"] = 1536
        if draw(st.booleans()):
            idx["num_heads"] = draw(st.sampled_from([1, 2, 4, 64]))
        if draw(st.booleans()):
            idx["head_dim"] = draw(
                st.sampled_from([32, 96] if rarely() else [64, 128, 256])
            )
        if draw(st.booleans()):
            idx["topk"] = draw(
                st.sampled_from([16385, True, 0] if rarely() else [1, 8, 2048, 16384])
            )
        idx["rope_interleave"] = draw(st.booleans())
        if draw(st.booleans()):
            shared = draw(st.lists(layer, max_size=3))
            idx["shared_layers"] = shared if rarely() else sorted(set(shared) - {0})
    # Attention sinks (GQA).
    if not mla and draw(st.booleans()):
        att["sinks"] = draw(st.booleans())
    # Cross-layer KV sharing: a pair or two, an earlier target mostly, and the
    # plain MLA block its generated form needs where drawn.
    if draw(st.booleans()):
        pairs = draw(st.lists(st.tuples(layer, layer), max_size=2))
        if not rarely():
            pairs = [(max(a, b), min(a, b)) for a, b in pairs if a != b]
        att["kv_sharing"] = dict(pairs)
        if mla and not rarely():
            data["rope"].pop("scaling", None)
            data["max_position_embeddings"] = 4096
            att.pop("llama_4_scaling", None)
            data.pop("mtp", None)
            data["speculators"] = []
            data["norm"]["placement"] = "pre"
    # Norm placement.
    if rarely():
        data["norm"]["placement"] = draw(
            st.sampled_from(["pre", "post", "parallel", "sandwich"])
        )
    # Tensor names of the new roles: a preset path with one part replaced, or
    # parts drawn.
    names = data.setdefault("checkpoint", {}).setdefault("tensor_names", {})
    for _ in range(draw(st.integers(0, 2))):
        role = draw(st.sampled_from(NEW_ROLES))
        path = LAYOUT_PRESETS["llama"][role].split(".")
        if draw(st.booleans()):
            path[draw(st.integers(0, len(path) - 1))] = draw(st.sampled_from(NEW_PARTS))
        elif rarely():
            path = draw(st.lists(st.sampled_from(NEW_PARTS), min_size=1, max_size=6))
        names[role] = ".".join(path)
    return data


def drive_features(text: str, tmp: Path) -> None:
    """Check; on what check accepts: generate (the reference included), shrink
    and tiny, with no refusal at all."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.generate import generate_files
    from onboard.spec.shrink import shrink_spec

    spec = _checked(text)
    if spec is None:
        return
    stage = "generate"
    try:
        with Guard("generate"):
            files = generate_files(spec)
        if "hf/README.md" in files:
            FIGURES["reference dropped"] += 1
            raise AssertionError(files["hf/README.md"])
        stage = "shrink"
        with Guard("shrink"):
            shrink_spec(spec)
        stage = "checkpoint tiny"
        with Guard("checkpoint tiny"):
            write_tiny_checkpoint(spec, tmp / f"tiny-{FIGURES['tried']}")
        FIGURES["tiny written"] += 1
    except InputError:
        FIGURES["later-stage refusals"] += 1
        raise
    except (AssertionError, TimeoutError):
        if stage == "shrink":
            FIGURES["tracebacks"] += 1
        raise
    except BaseException:
        FIGURES["tracebacks"] += 1
        raise


def _checked(text: str):
    """`spec check` on ``text``: the spec, or None where it refused it (every
    line of the refusal located); counted in FIGURES."""
    FIGURES["tried"] += 1
    try:
        with Guard("spec check"):
            spec = parse_spec_text(text, "fuzz.yaml")
    except SpecError as exc:
        FIGURES["refused"] += 1
        bad = [
            line
            for line in str(exc).split("\n")
            if not (line.isprintable() and LOCATED.match(line))
            and not line.startswith("... and ")
        ]
        FIGURES["unlocated"] += len(bad)
        assert not bad, bad
        return None
    except BaseException:
        FIGURES["tracebacks"] += 1
        raise
    FIGURES["accepted"] += 1
    return spec


def _get(data, path):
    for part in path:
        data = data[part]
    return data


class Guard:
    """Fails a call that runs past SECONDS of CPU time or raises peak memory by
    MEMORY_MB. CPU time, not wall-clock: a busy machine stretches a call's wall
    time (generate took over 5 s at load 8), while a loop that never ends still
    spends CPU."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self):
        def expired(signum, frame):
            FIGURES["hangs"] += 1
            raise TimeoutError(f"{self.what}: still running after {SECONDS} s of CPU")

        self.previous = signal.signal(signal.SIGPROF, expired)
        signal.setitimer(signal.ITIMER_PROF, SECONDS)
        self.peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return self

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, self.previous)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self.peak
        if grown > MEMORY_MB * 1024:
            raise AssertionError(f"{self.what}: peak memory grew by {grown // 1024} MB")
        return False


def drive(text: str, stages: bool, tmp: Path) -> None:
    """Run check, then (with ``stages``) generate and tiny on what check accepts."""
    spec = _checked(text)
    if spec is None or not stages:
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
        # One torch thread: the guards count CPU time, which torch's threads add up.
        with one_thread():
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


def _run_features(name: str, check_examples: int, stage_examples: int) -> None:
    from onboard.generate import generate_files
    from onboard.spec import load_spec

    # Warm: jinja, ruff and each feature's templates load once, not in a guard.
    for base in FEATURE_BASES:
        generate_files(load_spec(SPECS / f"{base}.yaml"))
    FIGURES.clear()
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="onboard-fuzz-features-"))

    @seed(20261203)
    @_settings(check_examples)
    @given(feature_spec_data().map(to_yaml))
    def check_only(text):
        drive(text, False, tmp)

    @seed(20261204)
    @_settings(stage_examples)
    @given(feature_spec_data().map(to_yaml))
    def with_stages(text):
        drive_features(text, tmp)

    try:
        # One torch thread: the guards count CPU time, which torch's threads add up.
        with one_thread():
            check_only()
            with_stages()
    finally:
        _report(name, started)
    assert FIGURES["tracebacks"] == FIGURES["unlocated"] == FIGURES["hangs"] == 0
    assert FIGURES["later-stage refusals"] == FIGURES["reference dropped"] == 0
    assert FIGURES["accepted"] and FIGURES["refused"], "the fuzz lost its spread"


def test_fuzz_new_features():
    _run_features("fuzz (new features)", check_examples=300, stage_examples=60)


@pytest.mark.acceptance
def test_fuzz_new_features_large():
    _run_features("fuzz (new features, large)", check_examples=3000, stage_examples=300)


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
