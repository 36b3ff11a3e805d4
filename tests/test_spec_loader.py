"""The spec loader: located errors, cross-field rules, bundled specs, CLI contract."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from onboard.arch import build_plan
from onboard.spec import SpecError, dump_spec, load_spec, parse_spec_text
from onboard.spec.docs import render_spec_docs

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = sorted((ROOT / "model_specs").glob("*.yaml"))
LOCATED = re.compile(r"^[^:]+:\d+:\d+: [\w.\[\]<>]+: .+$")

BASE = """\
name: tiny
architecture: TinyForCausalLM
model_type: tiny
vocab_size: 1000
hidden_size: 256
num_hidden_layers: 4
max_position_embeddings: 2048
attention:
  num_heads: 8
  num_kv_heads: 2
mlp:
  intermediate_size: 512
"""


def problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, "s.yaml")
    lines = str(info.value).splitlines()
    for line in lines:
        assert LOCATED.match(line), line
    return lines


def test_bundled_specs_are_valid_and_round_trip():
    assert {p.name for p in BUNDLED} >= {
        "dense-gqa.yaml",
        "deepseek-v3-style.yaml",
        "novel-launch.yaml",
    }
    for path in BUNDLED:
        spec = load_spec(path)
        text = dump_spec(spec)
        assert dump_spec(parse_spec_text(text)) == text


def test_base_spec_is_valid():
    spec = parse_spec_text(BASE)
    assert spec.head_dim == 32 and spec.num_kv_heads == 2
    assert build_plan(spec).moe_layers == (False,) * 4


def test_error_points_at_the_value():
    [line] = problems(BASE.replace("num_kv_heads: 2", "num_kv_heads: 3"))
    assert line.startswith("s.yaml:10:3: attention.num_kv_heads: ")
    assert "divisible" in line


def test_unknown_key_suggests_the_right_one():
    [line] = problems(BASE.replace("  num_kv_heads: 2", "  num_kv_head: 2"))
    assert line.startswith("s.yaml:10:3: attention.num_kv_head: unknown field")
    assert "did you mean 'num_kv_heads'" in line


def test_every_problem_is_reported():
    text = (
        BASE.replace("vocab_size: 1000", "vocab_size: -1")
        .replace("hidden_size: 256", "hidden_size: big")
        .replace("  num_heads: 8", "  num_hedas: 8")
    )
    lines = problems(text)
    assert len(lines) == 4  # vocab, hidden, typo'd key, and the now-missing num_heads
    assert any("vocab_size" in x for x in lines)
    assert any("hidden_size" in x for x in lines)
    assert any("did you mean 'num_heads'" in x for x in lines)


def test_cross_field_rules_all_reported():
    text = (
        BASE
        + """\
  moe:
    num_experts: 6
    num_experts_per_tok: 8
    expert_intermediate_size: 64
    router: {num_groups: 4, topk_groups: 2}
"""
    )
    text = text.replace("num_kv_heads: 2", "num_kv_heads: 3")
    lines = problems(text)
    assert any("num_experts_per_tok" in x and "exceeds" in x for x in lines)
    assert any("router.num_groups" in x and "divide" in x for x in lines)
    assert any("num_kv_heads" in x for x in lines)


@pytest.mark.parametrize("value", ["os.system('x')", "Foo; import os", "class", "Ünï"])
def test_identifiers_cannot_inject_code(value):
    lines = problems(BASE.replace("TinyForCausalLM", json.dumps(value)))
    assert any("architecture" in x for x in lines)


def test_mla_accepts_kv_sharing_under_the_same_rules():
    full = (ROOT / "model_specs" / "deepseek-v3-style.yaml").read_text()
    # Generated without rope scaling and MTP heads (docs/spec.md): rules, located.
    data = yaml.safe_load(full)
    data.pop("mtp")
    data["rope"].pop("scaling")
    data["speculators"] = []
    spec = yaml.safe_dump(data, sort_keys=False)
    ok = spec.replace("  type: mla\n", "  type: mla\n  kv_sharing: {5: 4, 6: 4}\n")
    assert parse_spec_text(ok, "s.yaml").attention.kv_sharing == {5: 4, 6: 4}
    bad = spec.replace("  type: mla\n", "  type: mla\n  kv_sharing: {5: 6, 7: 5}\n")
    lines = problems(bad)
    assert any("must come before layer 5" in x for x in lines)
    assert any("itself shares" in x for x in lines)
    limits = problems(
        full.replace("  type: mla\n", "  type: mla\n  kv_sharing: {5: 4}\n")
    )
    assert any(": rope.scaling: MLA layers that share" in x for x in limits), limits
    assert any(": mtp: MLA layers that share" in x for x in limits), limits


def test_attention_softcap_rules():
    """The soft-cap applies to GQA only, and not beside sinks (each has its own
    softmax core in the reference)."""
    ok = BASE.replace(
        "  num_kv_heads: 2\n", "  num_kv_heads: 2\n  logit_softcap: 50.0\n"
    )
    assert parse_spec_text(ok, "s.yaml").attention.logit_softcap == 50.0
    sinks = ok.replace(
        "  logit_softcap: 50.0\n", "  logit_softcap: 50.0\n  sinks: true\n"
    )
    [line] = problems(sinks)
    assert "attention.logit_softcap" in line and "attention sinks" in line
    spec = (ROOT / "model_specs" / "deepseek-v3-style.yaml").read_text()
    mla = spec.replace("  type: mla\n", "  type: mla\n  logit_softcap: 30.0\n")
    [line] = problems(mla)
    assert "attention.logit_softcap: logit_softcap does not apply to MLA" in line


def test_llama_4_scaling_rules():
    spec = (ROOT / "model_specs" / "deepseek-v3-style.yaml").read_text()
    scaling = "  llama_4_scaling: {beta: 0.1, original_max_position_embeddings: %d}\n"
    ok = spec.replace("  type: mla\n", "  type: mla\n" + scaling % 4096)
    assert parse_spec_text(ok, "s.yaml").attention.llama_4_scaling.beta == 0.1
    bad = spec.replace("  type: mla\n", "  type: mla\n" + scaling % 8)
    assert any("disagrees with rope.scaling" in x for x in problems(bad))
    gqa = BASE.replace("  num_kv_heads: 2\n", "  num_kv_heads: 2\n" + scaling % 8)
    assert any("needs attention.type mla" in x for x in problems(gqa))


def test_kv_sharing_rules():
    text = BASE.replace(
        "  num_kv_heads: 2\n",
        "  num_kv_heads: 2\n  sliding_window: 64\n  sliding_window_pattern: 2\n"
        "  kv_sharing: {2: 1, 3: 1, 1: 3}\n",
    )
    lines = problems(text)
    assert any("kv_sharing[2]" in x and "same window type" in x for x in lines)
    assert any("kv_sharing[1]" in x and "must come before" in x for x in lines)
    # 3 -> 1 is fine in itself (both full), but 1 shares too and must not be a target.
    assert any("kv_sharing[3]" in x and "itself shares" in x for x in lines)


def test_qk_norm_forms_need_a_qk_norm_and_one_form():
    lines = problems(
        BASE.replace(
            "  num_kv_heads: 2\n", "  num_kv_heads: 2\n  qk_norm_scope: projection\n"
        )
    )
    assert any("qk_norm_scope applies only with qk_norm: true" in x for x in lines)
    lines = problems(
        BASE.replace(
            "  num_kv_heads: 2\n",
            "  num_kv_heads: 2\n  qk_norm: true\n  qk_norm_scope: projection\n"
            "  qk_norm_after_rope: true\n",
        )
    )
    assert any("qk_norm_after_rope needs qk_norm_scope: head" in x for x in lines)


def test_nope_layers_must_exist_and_agree_with_kv_sharing():
    lines = problems(BASE + "rope:\n  nope_layers: [1, 9]\n")
    assert any("nope_layers" in x and "[9] do not exist" in x for x in lines), lines
    lines = problems(
        BASE.replace("  num_kv_heads: 2\n", "  num_kv_heads: 2\n  kv_sharing: {1: 0}\n")
        + "rope:\n  nope_layers: [1]\n"
    )
    assert any("both use rope or both not" in x for x in lines), lines


def test_gemma_parts_are_refused_where_nothing_generates_them():
    lines = problems(
        BASE.replace("  num_kv_heads: 2\n", "  num_kv_heads: 2\n  sliding_window: 64\n")
        + "norm: {type: layernorm, placement: sandwich, unit_offset: true}\n"
        "rope:\n  scaling: {type: linear, factor: 2.0}\n"
        "  sliding: {theta: 10000.0, scaling: {type: yarn, factor: 4.0}}\n"
        "scale_embedding: true\nmtp: {num_heads: 1, mlp: dense}\n"
    )
    for expected in (
        "norm.placement: sandwich norms are generated for rmsnorm only",
        "norm.unit_offset: applies to rmsnorm only",
        "rope.sliding.scaling.type: yarn differs from rope.scaling.type (linear)",
        "mtp: MTP heads are not generated with scale_embedding",
        "mtp: MTP heads are not generated with rope.sliding",
    ):
        assert any(expected in x for x in lines), (expected, lines)
    # A rope for the sliding layers needs some layer that slides.
    lines = problems(BASE + "rope:\n  sliding: {theta: 10000.0}\n")
    assert any("rope.sliding: no layer slides" in x for x in lines), lines


def test_gemma_and_granite_scales_of_one_thing_are_not_combined():
    # Each pair sets the same factor; no family has both, so the order is unproven.
    lines = problems(
        BASE.replace(
            "  num_kv_heads: 2\n", "  num_kv_heads: 2\n  softmax_scale: 0.1\n"
        ).replace(
            "  num_kv_heads: 2\n", "  num_kv_heads: 2\n  query_pre_attn_scalar: 64\n"
        )
        + "scale_embedding: true\nembedding_multiplier: 12.0\n"
        "final_logit_softcap: 30.0\nlogits_scaling: 8.0\n"
    )
    for expected in (
        "scale_embedding: is not generated beside an embedding_multiplier",
        "final_logit_softcap: is not generated beside a logits_scaling",
        "attention.query_pre_attn_scalar: and attention.softmax_scale both set",
    ):
        assert any(expected in x for x in lines), (expected, lines)
    # Either half alone is a valid spec.
    parse_spec_text(BASE + "scale_embedding: true\nlogits_scaling: 8.0\n")
    parse_spec_text(BASE + "embedding_multiplier: 12.0\nfinal_logit_softcap: 30.0\n")


def test_granite_multipliers_and_fused_experts_rules():
    # Each combination no family has (so nothing proves) is refused at its field.
    post = BASE + "residual_multiplier: 0.5\nnorm: {placement: post}\n"
    assert any(
        "residual_multiplier: needs norm.placement pre" in x for x in problems(post)
    )
    mtp = BASE + "logits_scaling: 8.0\nmtp: {num_heads: 1, mlp: dense}\n"
    assert any(
        "mtp: MTP heads need neutral multipliers (logits_scaling)" in x
        for x in problems(mtp)
    )
    dense = BASE + "checkpoint: {fused: [experts, shared_gate_up_proj]}\n"
    lines = problems(dense)
    assert any(
        "checkpoint.fused: experts: the model has no MoE layer" in x for x in lines
    )
    assert any(
        "shared_gate_up_proj: the model has no shared expert" in x for x in lines
    )
    mla = (ROOT / "model_specs" / "deepseek-v3-style.yaml").read_text()
    mla = mla.replace("  type: mla\n", "  type: mla\n  softmax_scale: 0.1\n")
    assert any(
        "attention.softmax_scale: MLA's softmax scale follows qk_head_dim" in x
        for x in problems(mla)
    )
    for bad in ("0", "-1.0", ".inf"):
        assert any(
            "embedding_multiplier" in x
            for x in problems(BASE + f"embedding_multiplier: {bad}\n")
        )
    # Neutral values are the defaults: the spec stays as it was.
    spec = parse_spec_text(BASE + "embedding_multiplier: 1.0\n")
    assert spec == parse_spec_text(BASE)


def test_duplicate_keys_are_errors():
    lines = problems(BASE + "vocab_size: 1000\n")
    assert any("duplicate key" in x for x in lines)


def test_invalid_yaml_is_located():
    [line] = problems("name: [unclosed\n")
    assert line.startswith("s.yaml:")
    assert "invalid YAML" in line


def test_docs_are_current():
    assert (ROOT / "docs" / "spec.md").read_text() == render_spec_docs(), (
        "docs/spec.md is stale: python -m onboard.spec.docs > docs/spec.md"
    )


def run_cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("onboard")
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, timeout=120
    )


def test_cli_check_exit_codes(tmp_path):
    ok = run_cli("spec", "check", str(BUNDLED[0]))
    assert ok.returncode == 0, ok.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE.replace("num_kv_heads: 2", "num_kv_heads: 3"))
    res = run_cli("spec", "check", str(bad))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert f"{bad}:10:3: attention.num_kv_heads:" in res.stderr
    missing = run_cli("spec", "check", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "cannot read spec" in missing.stderr


def test_cli_schema_is_json_schema():
    res = run_cli("spec", "schema")
    assert res.returncode == 0
    schema = json.loads(res.stdout)
    assert schema["additionalProperties"] is False
    assert {"attention", "mlp", "mtp", "checkpoint"} <= set(schema["properties"])
