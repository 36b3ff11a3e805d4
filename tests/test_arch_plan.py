"""The architecture plan: what each layer is, decided once, read by every stage."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from test_spec_properties import to_yaml, valid_spec_data

from onboard.arch import DenseMLP, MoEMLP, build_plan
from onboard.components.residual_stream import NORM_ROLES
from onboard.errors import InputError
from onboard.spec import parse_spec_text

sys.path.insert(0, str(Path(__file__).parent))
from generate_variants import ALL, any_spec  # noqa: E402


def _expected(spec, i):
    att = spec.attention
    types = spec.layer_attention_types()
    return (
        spec.is_moe_layer(i),
        att.sliding_window if types[i] == "sliding_attention" else None,
        att.kv_sharing.get(i),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(valid_spec_data())
def test_each_layer_is_what_the_spec_says(data):
    spec = parse_spec_text(to_yaml(data))
    plan = build_plan(spec)
    assert len(plan.layers) == spec.num_hidden_layers
    for layer in plan.layers:
        mlp = layer.mlp
        got = (layer.is_moe, layer.mixer.window, layer.mixer.kv_source)
        assert got == _expected(spec, layer.index)
        assert isinstance(mlp, MoEMLP if layer.is_moe else DenseMLP)
        assert layer.mixer.kind == spec.attention.type
        assert (layer.norms.kind, layer.norms.eps) == (spec.norm.type, spec.norm.eps)
        stream = layer.stream
        assert (stream.placement, stream.multiplier) == (
            spec.norm.placement,
            spec.residual_multiplier,
        )
        assert stream.roles == NORM_ROLES[spec.norm.placement]
        # Gemma-3: the sliding layers rotate with their own theta and scaling.
        theta, scaling = spec.rope.theta, spec.rope.scaling
        if spec.rope.sliding is not None and layer.mixer.sliding:
            theta, scaling = spec.rope.sliding.theta, spec.rope.sliding.scaling
        assert (layer.mixer.rope_theta, layer.mixer.rope_scaling) == (
            theta,
            scaling.type if scaling else None,
        )
    if spec.mtp is not None:
        block = plan.mtp.block
        assert block.index == spec.num_hidden_layers == plan.mtp.first_layer
        assert block.mixer.window is None and block.mixer.kv_source is None
        assert block.is_moe == (spec.mtp.mlp == "moe")
    dense_blocks = [not x.is_moe for x in plan.layers]
    if spec.mtp is not None:
        dense_blocks.append(spec.mtp.mlp == "dense")
    assert plan.has_dense == any(dense_blocks)
    for role, path in plan.tensors.checkpoint.items():
        assert path == spec.tensor_path(role)


def test_the_plan_is_frozen():
    plan = build_plan(any_spec("deepseek-v3-style"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.layers[0].mixer.window = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.tensors.checkpoint["q_proj"] = "x"  # type: ignore[index]


@pytest.mark.parametrize("name", ALL)
def test_generated_model_and_reference_follow_the_plans_moe_layers(name):
    """Both generated files decide MoE layers from the config; each rule is
    checked against the plan when it is generated (so they cannot disagree)."""
    from onboard.generate.context import build_context
    from onboard.reference.context import reference_context

    spec = any_spec(name)
    plan = build_plan(spec)
    ctx = build_context(spec)
    if ctx["moe"] is not None and ctx["moe"].layer_expr is not None:
        assert not all(plan.moe_layers)
    try:
        ref = reference_context(spec)
    except InputError as exc:  # a layout the reference cannot express
        assert "reference" in str(exc)
        return
    if ref["f"]["moe"]:
        assert ref["per_layer"]["moe"]


def test_a_reference_moe_rule_that_disagrees_with_the_plan_is_refused():
    from onboard.reference.context import _check_layer_plan

    spec = any_spec("deepseek-v3-style")
    plan = build_plan(spec)
    config = {"first_k_dense_replace": 0}
    with pytest.raises(InputError, match="MoE layer rule"):
        _check_layer_plan(spec, config, "i >= config.first_k_dense_replace",
                          plan.moe_layers)  # fmt: skip
