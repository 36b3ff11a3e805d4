"""DeepSeek-V4's router scoring, ``sqrtsoftplus``: weight = sqrt(softplus(logit)),
the experts chosen by weight + the correction bias, the chosen weights
renormalised and scaled (onboard/components/router.py).

The generated reference's Router against transformers' DeepseekV4TopKRouter on
the same weights (in make test); the generated vLLM model, whose FusedMoE routes
with vLLM's own sqrtsoftplus kernel (biased_topk_cpu on CPU), against the
reference on the CPU engine (acceptance).
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import generated_engine_run, judge_engine_outputs

from onboard.reference import install_reference
from onboard.spec.hf import hf_config_from_spec, spec_from_hf_config
from onboard.spec.loader import SpecError, parse_spec_text

SPEC = """
name: tiny-sqrtsoftplus-moe
architecture: TinySqrtsoftplusMoeForCausalLM
model_type: tiny_sqrtsoftplus_moe
vocab_size: 512
hidden_size: 256
num_hidden_layers: 2
max_position_embeddings: 512
attention: {num_heads: 4, num_kv_heads: 2, head_dim: 64}
mlp:
  moe:
    num_experts: 64
    num_experts_per_tok: 6
    expert_intermediate_size: 32
    num_shared_experts: 1
    router: {scoring: sqrtsoftplus, bias_correction: true, routed_scaling_factor: 1.5}
"""


def _reference_router(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = parse_spec_text(SPEC)
    (tmp_path / "config.json").write_text(json.dumps(hf_config_from_spec(spec)))
    install_reference(spec, tmp_path)
    config = AutoConfig.from_pretrained(tmp_path, trust_remote_code=True)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=True)
    return model.float().eval().model.layers[0].mlp.gate


def _deepseek_v4_router():
    from transformers.models.deepseek_v4 import configuration_deepseek_v4 as cfg
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as modeling

    config = cfg.DeepseekV4Config(
        hidden_size=256,
        num_local_experts=64,
        num_experts_per_tok=6,
        scoring_func="sqrtsoftplus",
        routed_scaling_factor=1.5,
    )
    return modeling.DeepseekV4TopKRouter(config).float().eval()


def _routes(weights: torch.Tensor, experts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each token's chosen experts in ascending order, with their weights."""
    order = experts.argsort(dim=-1)
    return experts.gather(1, order), weights.gather(1, order)


def test_the_spec_config_and_rules():
    spec = parse_spec_text(SPEC)
    config = hf_config_from_spec(spec)
    assert config["scoring_func"] == "sqrtsoftplus"
    assert config["topk_method"] == "noaux_tc"
    assert spec_from_hf_config(config) == spec
    # vLLM routes it with the correction bias, ungrouped.
    unbiased = SPEC.replace("bias_correction: true", "bias_correction: false")
    with pytest.raises(SpecError, match="needs bias_correction: true"):
        parse_spec_text(unbiased)
    grouped = SPEC.replace("true,", "true, num_groups: 2, topk_groups: 1,")
    with pytest.raises(SpecError, match="not generated with groups"):
        parse_spec_text(grouped)


def test_the_reference_router_is_deepseek_v4s(tmp_path):
    ours = _reference_router(tmp_path)
    theirs = _deepseek_v4_router()
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 256, generator=generator) * 0.1
    # A bias that changes which experts are chosen, not how much they weigh.
    bias = torch.randn(64, generator=generator) * 0.5
    with torch.no_grad():
        ours.weight.copy_(weight)
        ours.e_score_correction_bias.copy_(bias)
        theirs.weight.copy_(weight)
        theirs.e_score_correction_bias.copy_(bias)
    x = torch.randn(64, 256, generator=generator)
    with torch.no_grad():
        got = _routes(*ours(x))
        _, their_weights, their_experts = theirs(x)
    want = _routes(their_weights, their_experts)
    assert torch.equal(got[0], want[0])
    assert (got[1] - want[1]).abs().max() < 1e-6
    # The score function matters: softmax scores weigh the same choice otherwise.
    ours.scoring_func = "softmax"
    with torch.no_grad():
        softmax = _routes(*ours(x))
    assert (softmax[1] - want[1]).abs().max() > 1e-2


def test_the_cpu_engine_limit_names_vllms_kernel():
    """vLLM's CPU sqrtsoftplus kernel (biased_topk_cpu) is in the AMX kernel
    build only and takes 64, 128, 256 or 384 experts with top-k 6 or 8."""
    from onboard.targets.cpu_kernels import cpu_engine_limit

    spec = parse_spec_text(SPEC)
    eight = parse_spec_text(SPEC.replace("num_experts: 64", "num_experts: 8"))
    limit = cpu_engine_limit(eight)
    assert limit is not None and "biased_topk_cpu" in limit
    if hasattr(torch.ops._C, "biased_topk_cpu"):
        assert cpu_engine_limit(spec) is None
        assert "unsupported num_experts 8" in limit
    else:
        assert "kernel build" in cpu_engine_limit(spec)


@pytest.mark.acceptance
@pytest.mark.engine
def test_the_generated_model_routes_as_the_reference_on_the_engine(tmp_path):
    """vLLM's FusedMoE with scoring_func sqrtsoftplus and the correction bias
    (the CPU build's biased_topk_cpu) against the float32 reference; the same
    outputs against the reference with its routers' weights negated fail."""
    from onboard.runtime.reference import load_reference
    from onboard.targets.cpu_kernels import cpu_engine_limit

    limit = cpu_engine_limit(parse_spec_text(SPEC))
    if limit is not None:
        # Validation reports the accuracy check not-run with this reason.
        assert "biased_topk_cpu" in limit and "kernel build" in limit
        return
    spec, ckpt, work, prompts, info, outputs = generated_engine_run(
        parse_spec_text(SPEC), tmp_path, every=2
    )
    ref = load_reference(ckpt, spec, work / "gen" / "hf", work / "ref")
    good = judge_engine_outputs(outputs, ref.model, prompts)
    assert good.passed, good.details
    routers = [p for n, p in ref.model.named_parameters() if n.endswith("gate.weight")]
    assert len(routers) == spec.num_hidden_layers
    with torch.no_grad():
        for router in routers:
            router.neg_()
    flipped = judge_engine_outputs(outputs, ref.model, prompts)
    print(f"sqrtsoftplus on the engine: {good.details}; negated: {flipped.details}")
    assert not flipped.passed
