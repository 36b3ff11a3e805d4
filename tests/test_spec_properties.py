"""Property tests: random valid specs round-trip, random invalid ones are located.

Valid specs are built to satisfy onboard/spec/rules.py (GQA and MLA, dense and MoE
with every router variant, sliding windows and patterns, KV sharing, MTP, rope
scalings). Invalid specs are valid ones with one mutation that must be refused:
a wrong type, an out-of-range value, a misspelt key, a broken cross-field rule, an
unsafe identifier, a missing field, broken YAML or a duplicate key.
"""

from __future__ import annotations

import contextlib
import io
import keyword
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onboard.errors import InputError
from onboard.spec import SpecError, dump_spec, parse_spec_text
from onboard.spec.hf import hf_config_from_spec, hf_fields, spec_from_hf_config
from onboard.spec.model import MLP, Attention, ModelSpec, Norm, Rope

ROOT = Path(__file__).resolve().parents[1]
ONBOARD = ROOT / ".venv" / "bin" / "onboard"
LOCATED = re.compile(
    r"^(?P<file>[^\n]+?):(?P<line>\d+):(?P<col>\d+): (?P<path>\S+): .+$"
)


def quick(examples: int) -> settings:
    # Examples vary a lot in size; wall-clock health checks would only add noise.
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )


# ---- valid specs ---------------------------------------------------------------------

floats = st.floats(min_value=0.05, max_value=1e6, allow_nan=False, allow_infinity=False)
# Name parts that are not Python keywords (`name: as` would make a keyword module).
ident_part = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True).filter(
    lambda part: not keyword.iskeyword(part)
)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def rope(draw, mla: bool) -> dict:
    kind = draw(st.sampled_from([None, "linear", "yarn", "llama3"]))
    out: dict = {"theta": draw(floats), "interleaved": draw(st.booleans()) or mla}
    if kind is None:
        return out
    scaling: dict = {"type": kind, "factor": draw(floats)}
    optional = {
        "linear": [],
        "yarn": ["beta_fast", "beta_slow", "mscale", "mscale_all_dim"],
        "llama3": [],
    }[kind]
    if kind == "llama3":  # the spec requires both frequency factors
        scaling["low_freq_factor"] = draw(floats)
        scaling["high_freq_factor"] = draw(floats)
    for key in optional:
        if draw(st.booleans()):
            scaling[key] = draw(floats)
    if kind == "yarn" and draw(st.booleans()):
        scaling["truncate"] = draw(st.booleans())
    if kind != "linear" and draw(st.booleans()):
        scaling["original_max_position_embeddings"] = draw(st.integers(1, 8192))
    out["scaling"] = scaling
    return out


@st.composite
def gqa_attention(draw, n_layers: int) -> tuple[dict, int]:
    heads = draw(st.sampled_from([1, 2, 4, 8, 16]))
    att: dict = {"type": "gqa", "num_heads": heads}
    if draw(st.booleans()):
        att["num_kv_heads"] = draw(st.sampled_from(_divisors(heads)))
    if draw(st.booleans()):
        head_dim = draw(st.sampled_from([8, 16, 24, 32, 64]))
        att["head_dim"] = head_dim
        hidden = draw(st.integers(1, 512))
    else:
        head_dim = draw(st.sampled_from([8, 16, 32]))
        hidden = heads * head_dim
    att["partial_rotary_factor"] = draw(st.sampled_from([1.0, 0.5, 0.25]))
    for flag in ("qk_norm", "sinks", "qkv_bias", "o_bias"):
        att[flag] = draw(st.booleans())
    window = draw(st.sampled_from(["none", "all", "pattern", "explicit"]))
    kinds = ["full_attention"] * n_layers
    if window != "none":
        att["sliding_window"] = draw(st.integers(1, 4096))
        kinds = ["sliding_attention"] * n_layers
    if window == "pattern":
        pattern = draw(st.integers(1, n_layers + 1))
        att["sliding_window_pattern"] = pattern
        kinds = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(n_layers)
        ]
    elif window == "explicit":
        kinds = draw(
            st.lists(
                st.sampled_from(["full_attention", "sliding_attention"]),
                min_size=n_layers,
                max_size=n_layers,
            )
        )
        att["layer_types"] = kinds
    # KV sharing: a later layer reads the cache of an earlier, non-sharing layer of
    # the same window type.
    sharing: dict[int, int] = {}
    for layer in range(1, n_layers):
        if draw(st.booleans()):
            targets = [
                t for t in range(layer) if t not in sharing and kinds[t] == kinds[layer]
            ]
            if targets:
                sharing[layer] = draw(st.sampled_from(targets))
    if sharing:
        att["kv_sharing"] = sharing
    return att, hidden


@st.composite
def mla_attention(draw) -> tuple[dict, int]:
    hidden = draw(st.integers(8, 512))
    mla = {
        "q_lora_rank": draw(st.one_of(st.none(), st.integers(1, hidden))),
        "kv_lora_rank": draw(st.sampled_from([16, 64, 512])),
        "qk_nope_head_dim": draw(st.integers(1, 128)),
        "qk_rope_head_dim": draw(st.sampled_from([2, 16, 64])),
        "v_head_dim": draw(st.integers(1, 128)),
    }
    return {"type": "mla", "num_heads": draw(st.integers(1, 16)), "mla": mla}, hidden


@st.composite
def moe_section(draw, n_layers: int) -> dict:
    experts = draw(st.integers(1, 16))
    moe: dict = {
        "num_experts": experts,
        "num_experts_per_tok": draw(st.integers(1, experts)),
        "expert_intermediate_size": draw(st.integers(1, 256)),
    }
    shared = draw(st.integers(0, 2))
    if shared:
        moe["num_shared_experts"] = shared
        moe["shared_expert_gate"] = draw(st.booleans())
        if draw(st.booleans()):
            moe["shared_expert_intermediate_size"] = draw(st.integers(1, 512))
    # Layer placement, keeping at least one MoE layer.
    moe_layer = draw(st.integers(0, n_layers - 1))
    moe["first_k_dense"] = draw(st.integers(0, moe_layer))
    moe["layer_frequency"] = draw(st.sampled_from(_divisors(moe_layer + 1)))
    others = [i for i in range(n_layers) if i != moe_layer]
    moe["dense_layers"] = (
        draw(st.lists(st.sampled_from(others), unique=True)) if (others) else []
    )
    router: dict = {
        "scoring": draw(st.sampled_from(["softmax", "sigmoid"])),
        "norm_topk_prob": draw(st.booleans()),
        "bias_correction": draw(st.booleans()),
        "routed_scaling_factor": draw(floats),
        "bias": draw(st.booleans()),
    }
    stacked = not shared and draw(st.booleans())
    if stacked:  # gpt-oss's experts (stacked), routed by plain top-k
        moe["expert_bias"] = draw(st.booleans())
        moe["swiglu_alpha"], moe["swiglu_limit"] = 1.702, 7.0
        router["bias_correction"] = False
    groups = draw(st.sampled_from(_divisors(experts)))
    if not stacked and groups > 1 and draw(st.booleans()):
        per_group = experts // groups
        need = -(-moe["num_experts_per_tok"] // per_group)  # keep top-k reachable
        router["num_groups"] = groups
        router["topk_groups"] = draw(st.integers(need, groups))
    moe["router"] = router
    return moe


@st.composite
def valid_spec_data(draw, model_type: str | None = None) -> dict:
    n_layers = draw(st.integers(1, 6))
    is_mla = draw(st.booleans())
    att, hidden = draw(mla_attention() if is_mla else gqa_attention(n_layers))
    parts = draw(st.lists(ident_part, min_size=1, max_size=3))
    name = "-".join(parts)
    model_type = model_type or "onb_" + "_".join(parts)
    data: dict = {
        "name": name,
        "architecture": "".join(p.capitalize() for p in parts) + "ForCausalLM",
        "model_type": model_type,
        "vocab_size": draw(st.integers(1, 200_000)),
        "hidden_size": hidden,
        "num_hidden_layers": n_layers,
        "max_position_embeddings": draw(st.integers(1, 1 << 20)),
        "tie_word_embeddings": draw(st.booleans()),
        "activation": draw(st.sampled_from(["silu", "gelu", "gelu_pytorch_tanh"])),
        "norm": {
            "type": draw(st.sampled_from(["rmsnorm", "layernorm"])),
            "eps": draw(st.floats(1e-8, 0.5)),
        },
        "attention": att,
        "rope": draw(rope(is_mla)),
    }
    moe = draw(st.one_of(st.none(), moe_section(n_layers)))
    mlp: dict = {"moe": moe} if moe else {}
    mtp = None
    stacked = bool(moe and "swiglu_limit" in moe)  # no MTP heads with them
    if not stacked and draw(st.booleans()):
        mtp = {
            "num_heads": draw(st.integers(1, 3)),
            "mlp": draw(st.sampled_from(["moe", "dense"])) if moe else "dense",
        }
        data["mtp"] = mtp
    if mtp is None and draw(st.booleans()):
        draw(gemma_parts(data, is_mla))
    needs_dense = (
        moe is None
        or (mtp and mtp["mlp"] == "dense")
        or any(not _is_moe(moe, i) for i in range(n_layers))
    )
    if needs_dense or draw(st.booleans()):
        mlp["intermediate_size"] = draw(st.integers(1, 4096))
    data["mlp"] = mlp
    if mtp is None and draw(st.booleans()):  # Granite's multipliers
        # Each but where Gemma's part sets the same thing (the rules refuse both).
        clashes = {
            "embedding_multiplier": data.get("scale_embedding", False),
            "residual_multiplier": data["norm"].get("placement", "pre") != "pre",
            "logits_scaling": "final_logit_softcap" in data,
        }
        for key, clash in clashes.items():
            if not clash:
                data[key] = draw(floats)
    if not is_mla and "query_pre_attn_scalar" not in att and draw(st.booleans()):
        att["softmax_scale"] = draw(floats)
    layouts = ["llama", "deepseek", "qwen", "mixtral"]
    if not (moe and moe.get("num_shared_experts") and needs_dense):
        layouts.append("granite")  # its shared expert sits beside an MoE block
    if stacked:  # gpt-oss's experts, stacked as gpt-oss stores them
        data["checkpoint"] = {
            "layout": "gpt_oss",
            "fused": ["experts"],
            "experts_format": "gpt_oss",
        }
    else:
        # (gpt-oss's layout puts both stacked roles in one module: not with
        # experts stacked the Granite way)
        data["checkpoint"] = {"layout": draw(st.sampled_from([*layouts, "gpt_oss"]))}
    if moe and not stacked and draw(st.booleans()):
        data["checkpoint"]["layout"] = draw(st.sampled_from(layouts))
        data["checkpoint"]["fused"] = ["experts"]
        if moe.get("num_shared_experts") and draw(st.booleans()):
            data["checkpoint"]["fused"].insert(0, "shared_gate_up_proj")
    data["quantization"] = draw(
        st.lists(st.sampled_from(["fp8-dynamic", "fp8-block", "nvfp4"]), unique=True)
    )
    methods = ["ngram", "eagle3"] + (["mtp"] if mtp else [])
    chosen = draw(st.lists(st.sampled_from(methods), unique=True))
    data["speculators"] = [
        {
            "method": m,
            "num_speculative_tokens": mtp["num_heads"] if m == "mtp" else 3,
        }
        for m in chosen
    ]
    data["targets"] = draw(
        st.lists(
            st.sampled_from(["cpu", "h100", "b200", "mi355x"]), min_size=1, unique=True
        )  # fmt: skip
    )
    return data


@st.composite
def gemma_parts(draw, data: dict, is_mla: bool) -> None:
    """Gemma's parts on ``data`` (no MTP heads: the rules refuse them together)."""
    data["scale_embedding"] = draw(st.booleans())
    if draw(st.booleans()):
        data["final_logit_softcap"] = draw(floats)
    norm = data["norm"]
    placements = ["pre", "post"] + (["sandwich"] if norm["type"] == "rmsnorm" else [])
    norm["placement"] = draw(st.sampled_from(placements))
    if norm["type"] == "rmsnorm" and not is_mla:
        norm["unit_offset"] = draw(st.booleans())
    if is_mla:
        return
    att = data["attention"]
    if draw(st.booleans()):
        att["query_pre_attn_scalar"] = draw(st.sampled_from([8, 144, 256.0, 0.5]))
    if not att.get("sinks") and draw(st.booleans()):  # (not beside sinks)
        att["logit_softcap"] = draw(floats)
    spec = ModelSpec.model_validate({**data, "mlp": {"intermediate_size": 8}})
    if "sliding_attention" in spec.layer_attention_types() and draw(st.booleans()):
        sliding = draw(rope(False))
        full = data["rope"].get("scaling")
        scaling = sliding.get("scaling")
        if scaling and (full is None or full["type"] == scaling["type"]):
            data["rope"]["sliding"] = {"theta": sliding["theta"], "scaling": scaling}
        else:
            data["rope"]["sliding"] = {"theta": sliding["theta"]}


def _is_moe(moe: dict, layer: int) -> bool:
    return (
        layer >= moe["first_k_dense"]
        and (layer + 1) % moe["layer_frequency"] == 0
        and layer not in moe["dense_layers"]
    )


def to_yaml(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


@quick(200)
@given(valid_spec_data())
def test_valid_specs_round_trip_through_yaml(data):
    spec = parse_spec_text(to_yaml(data), "gen.yaml")
    text = dump_spec(spec)
    again = parse_spec_text(text, "dumped.yaml")
    assert again == spec
    assert dump_spec(again) == text


@quick(200)
@given(valid_spec_data())
def test_valid_specs_round_trip_through_hf_config(data):
    spec = parse_spec_text(to_yaml(data), "gen.yaml")
    config = hf_config_from_spec(spec)
    back = spec_from_hf_config(config, name=spec.name)
    assert hf_fields(back) == hf_fields(spec)
    # The fields a config carries verbatim come back verbatim.
    for field in ("architecture", "model_type", "vocab_size", "hidden_size",
                  "num_hidden_layers", "max_position_embeddings", "activation",
                  "tie_word_embeddings", "norm", "mtp", "scale_embedding",
                  "final_logit_softcap"):  # fmt: skip
        assert getattr(back, field) == getattr(spec, field), field
    for field in ("embedding_multiplier", "residual_multiplier", "logits_scaling"):
        assert getattr(back, field) == getattr(spec, field), field
    assert (back.rope.theta, back.rope.interleaved) == (
        spec.rope.theta,
        spec.rope.interleaved,
    )
    assert back.attention.kv_sharing == spec.attention.kv_sharing
    assert back.attention.logit_softcap == spec.attention.logit_softcap
    assert back.attention.sliding_window == spec.attention.sliding_window
    assert (
        back.attention.sliding_window_pattern == spec.attention.sliding_window_pattern
    )
    if spec.mlp.moe is not None:
        assert back.mlp.moe.router == spec.mlp.moe.router
        assert back.mlp.moe.dense_layers == spec.mlp.moe.dense_layers


# Specs shaped like a transformers family: its config class must take them.
@st.composite
def family_shaped(draw) -> dict:
    family = draw(
        st.sampled_from(["llama", "qwen3_moe", "deepseek_v3", "granite", "granitemoe"])
    )
    data = draw(valid_spec_data(model_type=family))
    data["mtp"] = None
    data["speculators"] = []
    data["norm"] = {"type": "rmsnorm", "eps": data["norm"]["eps"]}
    for key in ("scale_embedding", "final_logit_softcap"):  # Gemma's, not theirs
        data.pop(key, None)
    data["rope"].pop("sliding", None)
    for key in ("query_pre_attn_scalar", "logit_softcap"):
        data["attention"].pop(key, None)
    data["checkpoint"] = {}
    if family not in ("granite", "granitemoe"):
        for key in ("embedding_multiplier", "residual_multiplier", "logits_scaling"):
            data.pop(key, None)
        data["attention"].pop("softmax_scale", None)
    scaling = data["rope"].get("scaling")
    if scaling and scaling["type"] == "llama3":  # transformers requires both
        scaling.setdefault("low_freq_factor", 1.0)
        scaling.setdefault("high_freq_factor", 4.0)
    att, mlp = data["attention"], data["mlp"]
    if family in ("llama", "qwen3_moe", "granite", "granitemoe"):
        if att["type"] == "mla":
            data["attention"] = att = {"type": "gqa", "num_heads": att["num_heads"]}
        # transformers checks hidden_size % heads even with an explicit head_dim.
        data["hidden_size"] = att["num_heads"] * draw(st.integers(1, 16))
        att.setdefault("head_dim", 16)
        for key in ("sliding_window", "sliding_window_pattern", "layer_types",
                    "kv_sharing", "partial_rotary_factor"):  # fmt: skip
            att.pop(key, None)
        att["qk_norm"] = family == "qwen3_moe"
        att["o_bias"] = att["qkv_bias"] = att.get("qkv_bias", False)
        data["rope"]["interleaved"] = False
    if family in ("llama", "granite"):
        mlp.pop("moe", None)
        mlp.setdefault("intermediate_size", 64)
    elif family == "granitemoe":
        # Every layer MoE, the experts' width as intermediate_size, Mixtral's
        # router: softmax, top-k renormalised.
        moe = mlp.get("moe") or draw(moe_section(data["num_hidden_layers"]))
        moe.update(num_shared_experts=0, first_k_dense=0, layer_frequency=1,
                   dense_layers=[])  # fmt: skip
        moe.pop("shared_expert_gate", None)
        moe.pop("shared_expert_intermediate_size", None)
        moe["router"] = {"scoring": "softmax", "norm_topk_prob": True}
        data["mlp"] = {"moe": moe}
        data["checkpoint"] = {"layout": "granite", "fused": ["experts"]}
    else:
        moe = mlp.get("moe") or draw(moe_section(data["num_hidden_layers"]))
        mlp["moe"] = moe
        moe["num_shared_experts"] = (
            0 if family == "qwen3_moe" else draw(st.integers(0, 2))
        )
        moe.pop("shared_expert_gate", None)
        moe.pop("shared_expert_intermediate_size", None)
        mlp.setdefault("intermediate_size", 64)
        router = moe["router"]
        if family == "qwen3_moe":
            router.update(scoring="softmax", bias_correction=False,
                          routed_scaling_factor=1.0, num_groups=None,
                          topk_groups=None)  # fmt: skip
        else:
            moe["layer_frequency"], moe["dense_layers"] = 1, []
            moe["first_k_dense"] = min(
                moe["first_k_dense"], data["num_hidden_layers"] - 1
            )
            router.update(scoring="sigmoid", bias_correction=True)
            data["rope"]["interleaved"] = draw(st.booleans())
            if att["type"] != "mla":
                data["attention"], data["hidden_size"] = draw(mla_attention())
            heads = draw(st.integers(0, 2))
            data["mtp"] = {"num_heads": heads} if heads else None
    # gpt-oss's parts are its family's (tests/test_spec_hf.py), not these.
    data["attention"].pop("sinks", None)
    data["checkpoint"].pop("experts_format", None)
    if data["mlp"].get("moe"):
        for key in ("expert_bias", "swiglu_alpha", "swiglu_limit"):
            data["mlp"]["moe"].pop(key, None)
        data["mlp"]["moe"]["router"]["bias"] = False
    return data


@quick(60)
@given(family_shaped())
def test_family_shaped_specs_are_written_for_transformers(data):
    spec = parse_spec_text(to_yaml(data), "gen.yaml")
    config = hf_config_from_spec(spec)  # never refused: the family can say it all
    back = spec_from_hf_config(config, name=spec.name)
    assert hf_fields(back) == hf_fields(spec)


# ---- invalid specs -------------------------------------------------------------------

UNSAFE = ["os.system('x')", "x; import os", "__import__('os')", "A-B", "class",
          "ÄÖ", "a b", "Model\nimport os", ""]  # fmt: skip


def _paths(data, prefix=()):
    """Every (path, value) pair of scalars in a spec dict."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _paths(v, prefix + (i,))
    else:
        yield prefix, data


def _set(data, path, value):
    for part in path[:-1]:
        data = data[part]
    data[path[-1]] = value


def _typo(draw, word: str) -> str:
    i = draw(st.integers(0, len(word) - 1))
    kind = draw(st.sampled_from(["drop", "double", "swap", "x"]))
    if kind == "drop" and len(word) > 1:
        return word[:i] + word[i + 1 :]
    if kind == "swap" and i + 1 < len(word) and word[i] != word[i + 1]:
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    if kind == "double":
        return word[:i] + word[i] + word[i:]
    return word + "x"


SECTIONS = {
    (): ModelSpec,
    ("attention",): Attention,
    ("norm",): Norm,
    ("rope",): Rope,
    ("mlp",): MLP,
}


@st.composite
def invalid_spec_text(draw) -> tuple[str, str]:
    """(YAML text, what was broken) for a spec that must be refused."""
    data = draw(valid_spec_data())
    kind = draw(st.sampled_from([
        "type", "range", "typo", "kv_heads", "topk", "kv_sharing", "unsafe",
        "missing", "yaml", "duplicate", "enum", "groups",
    ]))  # fmt: skip
    att, moe = data["attention"], data["mlp"].get("moe")
    if kind == "type":
        scalars = [(p, v) for p, v in _paths(data) if not isinstance(v, str)]
        path, _ = draw(st.sampled_from(scalars))
        _set(data, path, draw(st.sampled_from(["abc", [1, 2], {"a": 1}])))
    elif kind == "range":
        choices = [
            (("vocab_size",), 0),
            (("hidden_size",), -3),
            (("num_hidden_layers",), 0),
            (("norm", "eps"), 0.0),
            (("norm", "eps"), 1.5),
            (("attention", "num_heads"), 0),
            (("rope", "theta"), -1.0),
        ]
        if att["type"] == "gqa":
            choices.append((("attention", "partial_rotary_factor"), 1.5))
        if moe:
            choices.append((("mlp", "moe", "num_experts"), 0))
        if data["speculators"]:
            choices.append((("speculators", 0, "num_speculative_tokens"), 17))
        path, value = draw(st.sampled_from(choices))
        _set(data, path, value)
    elif kind == "typo":
        section = draw(st.sampled_from(sorted(SECTIONS)))
        target = data
        for part in section:
            target = target[part]
        fields = list(SECTIONS[section].model_fields)
        word = draw(st.sampled_from(fields))
        typo = _typo(draw, word)
        if typo in fields:
            typo = word + "_typo"
        target[typo] = 1
    elif kind == "kv_heads":
        if att["type"] == "gqa":
            att["num_kv_heads"] = att["num_heads"] + 1  # never a divisor
        else:
            att["num_kv_heads"] = 1  # does not apply to MLA
    elif kind == "topk":
        if moe:
            moe["num_experts_per_tok"] = moe["num_experts"] + 1
        else:
            data["mlp"]["moe"] = {"num_experts": 2, "num_experts_per_tok": 3,
                                  "expert_intermediate_size": 8}  # fmt: skip
    elif kind == "kv_sharing":
        n = data["num_hidden_layers"]
        layer = draw(st.integers(0, n + 2))
        # An MLA layer, a missing layer, or a target at or after the layer.
        target = layer + draw(st.integers(0, 3)) if layer < n else 0
        att["kv_sharing"] = {layer: target}
    elif kind == "unsafe":
        field = draw(st.sampled_from(["architecture", "model_type", "name"]))
        unsafe = [u for u in UNSAFE if not (field == "name" and u == "class")]
        data[field] = draw(st.sampled_from(unsafe))
    elif kind == "missing":
        path = draw(
            st.sampled_from(
                [("vocab_size",), ("attention",), ("mlp",), ("name",),
                 ("attention", "num_heads")]
            )
        )  # fmt: skip
        target = data
        for part in path[:-1]:
            target = target[part]
        del target[path[-1]]
    elif kind == "enum":
        path, value = draw(st.sampled_from([
            (("activation",), "relu"),
            (("attention", "type"), "mqa"),
            (("norm", "type"), "batchnorm"),
            (("checkpoint", "layout"), "gpt2"),
            (("targets",), ["tpu"]),
            (("quantization",), ["int3"]),
        ]))  # fmt: skip
        _set(data, path, value)
    elif kind == "groups":
        experts = moe["num_experts"] if moe else 4
        data["mlp"]["moe"] = moe = moe or {"num_experts": 4, "num_experts_per_tok": 1,
                                           "expert_intermediate_size": 8}  # fmt: skip
        data["mlp"].setdefault("intermediate_size", 8)
        moe["router"] = {"num_groups": experts + 1, "topk_groups": 1}
    text = to_yaml(data)
    if kind == "yaml":
        lines = text.splitlines()
        at = draw(st.integers(0, len(lines)))
        broken = draw(st.sampled_from(["bad: [unclosed", "\tx: 1", "key: 'open",
                                       ": nothing", "- item"]))  # fmt: skip
        text = "\n".join(lines[:at] + [broken] + lines[at:]) + "\n"
    elif kind == "duplicate":
        key = draw(st.sampled_from(["vocab_size", "name", "hidden_size"]))
        text += f"{key}: {data.get(key, 1)!r}\n"
    return text, kind


def assert_located(message: str, file: str, text: str) -> None:
    lines = message.splitlines()
    assert lines, "an error must say something"
    n_lines = text.count("\n") + 1
    for line in lines:
        m = LOCATED.match(line)
        assert m, f"not FILE:LINE:COL: path: message -> {line!r}"
        assert m["file"] == file
        assert 1 <= int(m["line"]) <= n_lines and int(m["col"]) >= 1


def test_invalid_specs_always_give_located_errors():
    checked: list[str] = []

    @quick(1100)
    @given(invalid_spec_text())
    def check(case):
        text, kind = case
        try:
            parse_spec_text(text, "bad.yaml")
        except SpecError as exc:
            assert exc.problems
            assert_located(str(exc), "bad.yaml", text)
        else:
            raise AssertionError(f"{kind} mutation was accepted:\n{text}")
        checked.append(kind)

    check()
    assert len(checked) >= 1000
    assert len(set(checked)) == 12  # every kind of mutation was tried


def _cli_in_process(args: list[str]) -> tuple[int, str]:
    from onboard.cli import main

    err = io.StringIO()
    with (
        mock.patch.object(sys, "argv", ["onboard", *args]),
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        try:
            main()
        except SystemExit as exc:
            return int(exc.code or 0), err.getvalue()
    return 0, err.getvalue()


@quick(60)
@given(invalid_spec_text())
def test_cli_spec_check_in_process_exits_2_with_located_errors(tmp_path_factory, case):
    text, _ = case
    path = tmp_path_factory.mktemp("cli") / "spec.yaml"
    path.write_text(text, encoding="utf-8")
    code, stderr = _cli_in_process(["spec", "check", str(path)])
    assert code == 2
    assert stderr.startswith("error: ")
    assert_located(stderr.removeprefix("error: ").rstrip("\n"), str(path), text)


@quick(12)
@given(invalid_spec_text())
def test_cli_spec_check_subprocess_exits_2_with_located_errors(tmp_path_factory, case):
    text, _ = case
    path = tmp_path_factory.mktemp("cli") / "spec.yaml"
    path.write_text(text, encoding="utf-8")
    result = subprocess.run(
        [str(ONBOARD), "spec", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert_located(result.stderr.removeprefix("error: ").rstrip("\n"), str(path), text)


def test_hf_writer_refusals_are_input_errors():
    # A spec transformers' llama class cannot express is refused, not mis-written.
    spec = parse_spec_text(
        to_yaml(
            {
                "name": "x",
                "architecture": "LlamaForCausalLM",
                "model_type": "llama",
                "vocab_size": 8,
                "hidden_size": 16,
                "num_hidden_layers": 2,
                "max_position_embeddings": 32,
                "attention": {
                    "num_heads": 2,
                    "sliding_window": 4,
                    "kv_sharing": {1: 0},
                },
                "mlp": {"intermediate_size": 8},
            }
        ),  # fmt: skip
        "x.yaml",
    )
    try:
        hf_config_from_spec(spec)
    except InputError as exc:
        assert "attention.kv_sharing" in str(exc)
        assert "attention.layer_types" in str(exc)
    else:
        raise AssertionError("llama cannot express sliding windows or KV sharing")


# ---- config.json robustness ---------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 10**6)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=5,
)


@quick(200)
@given(valid_spec_data(), st.data())
def test_any_config_value_gives_a_spec_or_an_input_error(data, draw):
    # config.json is user input: a wrong value anywhere is an InputError, never a
    # traceback.
    config = hf_config_from_spec(parse_spec_text(to_yaml(data), "gen.yaml"))
    keys = draw.draw(st.lists(st.sampled_from(sorted(config)), min_size=1,
                              max_size=3, unique=True))  # fmt: skip
    for key in keys:
        config[key] = draw.draw(json_values)
    try:
        spec = spec_from_hf_config(config)
    except InputError as exc:
        assert str(exc).startswith("config.json: ")
    else:
        assert isinstance(spec, ModelSpec)
