"""The components' shared machinery (onboard/components/base.py): what a component
declares (its field, config key and slots) gives the hooks every stage calls."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from onboard import components
from onboard.arch import build_plan
from onboard.components.base import LAYER_TYPES, ConfigProblem
from onboard.components.residual_stream import NORM_SITES
from onboard.spec import parse_spec_text
from onboard.spec.model import ModelSpec

sys.path.insert(0, str(Path(__file__).parent))
from generate_variants import BUNDLED, VARIANTS, any_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "templates"
ALL = [*BUNDLED, *VARIANTS]

# Llama-4's attention parts beside dense-gqa's, and MLA's output gate: the
# components no bundled spec or variant has.
LLAMA4_ATTENTION = """
  chunk_size: 8192
  qk_l2_norm: true
  nope_temperature: {floor_scale: 8192, attn_scale: 0.1}
"""


def _more_specs() -> dict[str, ModelSpec]:
    from test_mla_output_gate import gated

    text = (ROOT / "model_specs" / "dense-gqa.yaml").read_text()
    text = text.replace("  head_dim: 128\n", "  head_dim: 128" + LLAMA4_ATTENTION)
    text = text.replace("rope:\n", "rope:\n  nope_layers: [3, 7]\n")
    return {
        "llama4-attention": parse_spec_text(text),
        "mla-gate-element": gated("element"),
        "mla-gate-head": gated("head"),
    }


MORE = _more_specs()


def _spec(name: str) -> ModelSpec:
    return MORE[name] if name in MORE else any_spec(name)


def _getter(config: dict):
    """A config reader as hf.py's: a concept under its canonical key."""
    return lambda concept, default=None: config.get(concept, default)


@pytest.mark.parametrize("component", components.every(), ids=lambda c: c.name)
def test_every_declared_fragment_is_a_template(component):
    for fragments in (component.vllm_fragments, component.hf_fragments):
        for slot, template in fragments.items():
            assert (TEMPLATES / template).is_file(), (slot, template)


def test_every_component_is_in_some_spec_here():
    names = {c.name for n in [*ALL, *MORE] for c in components.present(_spec(n))}
    assert names == {c.name for c in components.every()}


@pytest.mark.parametrize("name", [*ALL, *MORE])
def test_what_a_component_writes_it_reads_back(name):
    """config() then read() gives each present component's spec fields back, so
    a config onboard writes says what the spec said."""
    spec = _spec(name)
    for component in components.present(spec):
        # The reader gives the layer kinds it made of the config (linear
        # attention's section is read where some layer is linear).
        config = {**component.config(spec), LAYER_TYPES: spec.layer_attention_types()}
        fields = component.read(_getter(config))
        section = spec
        for key in (component.extends or "").split("."):
            section = getattr(section, key) if key else section
        for field, value in fields.items():
            held = getattr(section, field)
            if isinstance(held, BaseModel):  # a nested section (a temperature)
                value = type(held).model_validate(value)
            assert held == value, (component.name, field)


def test_a_flag_reads_any_true_value_and_nothing_else():
    sinks = next(c for c in components.every() if c.name == "attention_sinks")
    assert sinks.read(_getter({"attention_sinks": 1})) == {"sinks": True}
    assert sinks.read(_getter({"attention_sinks": False})) == {}
    assert sinks.read(_getter({})) == {}
    softcap = next(c for c in components.every() if c.name == "attention_softcap")
    # A value component keeps the value, 0 included (the spec refuses it, located).
    assert softcap.read(_getter({"attn_logit_softcapping": 0})) == {"logit_softcap": 0}


@pytest.mark.parametrize("config", [{}, {"rms_norm_eps": 1e-6, "layer_norm_eps": 1e-5}])
def test_the_norms_need_exactly_one_eps_key(config):
    norms = next(c for c in components.every() if c.name == "norms")
    with pytest.raises(ConfigProblem, match="exactly one must be set"):
        norms.read(_getter(config))
    assert norms.read(_getter({"layer_norm_eps": 1e-5}))["type"] == "layernorm"


@pytest.mark.parametrize("name", [*ALL, *MORE])
def test_each_block_normalises_each_site_at_most_once(name):
    """The residual stream's roles: one norm per site, the input norm first,
    and every role the layer runs is one the tensors hold."""
    plan = build_plan(_spec(name))
    for layer in plan.layers:
        stream = layer.stream
        sites = [NORM_SITES[role] for role in stream.roles]
        assert len(set(sites)) == len(sites)
        if "attention_input" in sites:
            assert sites[0] == "attention_input"
        for site in ("attention_input", "attention_output", "mlp_input", "mlp_output"):
            role = stream.at(site)
            assert (role is not None) == (site in sites)


@pytest.mark.parametrize(
    "targets",
    [
        {"4": 2},  # a mapping, not a list per layer
        [None, 0, True, None],  # a boolean is no layer index
        [None, 0, "1", None],
        [None, 0, None],  # one entry short
    ],
)
def test_kv_sharing_reads_one_index_or_null_per_layer(targets):
    sharing = next(c for c in components.every() if c.name == "kv_sharing")
    config = {"kv_sharing_target_layers": targets, "num_hidden_layers": 4}
    with pytest.raises(ConfigProblem, match="one layer index or null per layer"):
        sharing.read(_getter(config))
    config["kv_sharing_target_layers"] = [None, 0, None, 1]
    assert sharing.read(_getter(config)) == {"kv_sharing": {1: 0, 3: 1}}


def test_kv_sharing_is_a_node_of_the_sharing_layers_only():
    """Each sharing layer's attention names its source; the others, the MTP
    block and the model-wide attention have none."""
    spec = any_spec("novel-launch")
    arch = build_plan(spec)
    assert arch.kv_sources == spec.attention.kv_sharing
    for layer in arch.layers:
        assert layer.mixer.kv_source == spec.attention.kv_sharing.get(layer.index)
    assert arch.mtp is not None and arch.mtp.block.mixer.kv_source is None
    assert arch.attention.kv_source is None


def test_indexer_is_a_node_of_every_mla_layer_and_knows_its_cache():
    """Each MLA layer of a sparse-MLA spec has the indexer, a shared layer
    marked as running none, an MTP head's block its own; the serving plan's
    KV bytes add vLLM's FP8 index key (one byte per dim, a float32 scale per
    128 dims) to the latent."""
    from onboard.components.indexer import LightningIndexer
    from onboard.serving.kv import kv_report

    spec = any_spec("glm-5-style")
    idx = spec.attention.indexer
    assert idx is not None and spec.mtp is not None
    shared = spec.model_copy(
        update={
            "mtp": None,
            "attention": spec.attention.model_copy(
                update={"indexer": idx.model_copy(update={"shared_layers": [1]})}
            ),
        }
    )
    for case, own in ((spec, {}), (shared, {1: False})):
        arch = build_plan(case)
        for layer in arch.layers:
            node = layer.mixer.part(LightningIndexer)
            assert node == LightningIndexer(
                idx.num_heads, idx.head_dim, idx.topk, idx.rope_interleave,
                own.get(layer.index, True),
            )  # fmt: skip
            assert layer.mixer.indexer is node
    assert build_plan(spec).mtp.block.mixer.indexer.own
    assert build_plan(shared).shared_index_layers == (1,)
    index_key = idx.head_dim + idx.head_dim // 128 * 4
    assert LightningIndexer(1, idx.head_dim, 1, False).cache_bytes_per_token == 132
    dense = spec.model_copy(
        update={"attention": spec.attention.model_copy(update={"indexer": None})}
    )
    with_index, without = kv_report(spec), kv_report(dense)
    assert [a.bytes_per_token - b.bytes_per_token for a, b in zip(
        with_index.layers, without.layers, strict=True
    )] == [index_key] * spec.num_hidden_layers  # fmt: skip


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"index_n_heads": 4}, "index_n_heads: set but index_topk is not"),
        ({"indexer_types": ["full"]}, "indexer_types: set but index_topk is not"),
        ({"index_topk": 8, "index_head_dim": 64}, "index_n_heads: required"),
        (
            {"index_topk": 8, "index_n_heads": 2, "index_head_dim": 64,
             "indexer_types": ["full", "dense"], "num_hidden_layers": 2},
            "must list full or shared for each of the 2 layers",
        ),
    ],
)  # fmt: skip
def test_indexer_reads_a_whole_indexer_or_none(config, message):
    indexer = next(c for c in components.every() if c.name == "indexer")
    with pytest.raises(ConfigProblem, match=message):
        indexer.read(_getter(config))
    assert indexer.read(_getter({})) == {}


def test_mtp_heads_take_the_models_mlp_kind_unless_the_config_says():
    mtp = next(c for c in components.every() if c.name == "mtp")
    assert mtp.read(_getter({"num_nextn_predict_layers": 0, "mtp_mlp": "dense"})) == {}
    dense = mtp.read(_getter({"num_nextn_predict_layers": 2}))
    assert dense == {"mtp": {"num_heads": 2, "mlp": "dense"}}
    moe = {"num_nextn_predict_layers": 1, "n_routed_experts": 8}
    assert mtp.read(_getter(moe))["mtp"]["mlp"] == "moe"
    stated = mtp.read(_getter({**moe, "mtp_mlp": "dense"}))
    assert stated["mtp"]["mlp"] == "dense"


def test_top_level_components_follow_the_blocks_in_registry_order():
    # The MLPs' activation, the embeddings' two fields, the output head's four,
    # then MTP's section, between the blocks and the launch wishes.
    fields = list(ModelSpec.model_fields)
    # The token mixers' sections sit beside attention, before the MLPs.
    assert fields[fields.index("rope") + 1 : fields.index("mlp")] == [
        "linear_attention"
    ]
    between = fields[fields.index("mlp") + 1 : fields.index("checkpoint")]
    assert between == [
        "activation", "scale_embedding", "embedding_multiplier",
        "tie_word_embeddings", "logit_scale", "final_logit_softcap",
        "logits_scaling", "mtp", "residual_multiplier",
    ]  # fmt: skip
    text = (ROOT / "model_specs" / "dense-gqa.yaml").read_text()
    with pytest.raises(Exception, match=r"mtp\.mlp.*no mlp\.moe section"):
        parse_spec_text(text + "mtp: {num_heads: 1, mlp: moe}\n")


# ---- the logits (model-wide) -------------------------------------------------------


def _logits():
    return next(c for c in components.every() if c.name == "logits")


def test_logits_read_leaves_neutral_values_out_and_refuses_a_non_positive_factor():
    logits = _logits()

    def read(config: dict) -> dict:  # every config states its tie
        return logits.read(_getter({"tie_word_embeddings": False, **config}))

    assert read({"logit_scale": 1.0, "logits_scaling": 1}) == {}
    got = read({"logit_scale": 0.25, "final_logit_softcapping": 30})
    assert got == {"logit_scale": 0.25, "final_logit_softcap": 30}
    assert read({"logits_scaling": 16.0}) == {"logits_scaling": 16.0}
    for key, bad in (
        ("logit_scale", 0),
        ("logits_scaling", -2.0),
        ("final_logit_softcapping", True),
        ("logit_scale", "0.5"),
    ):
        with pytest.raises(ConfigProblem, match=rf"{key}={bad!r}: must be a positive"):
            read({key: bad})


def test_logits_are_one_node_on_the_plan_and_their_keys_among_the_model_wide_ones():
    from onboard.components.activation import Activation
    from onboard.components.embeddings import Embeddings
    from onboard.components.logits import Logits
    from onboard.spec.hf import hf_config_from_spec

    text = (ROOT / "model_specs" / "dense-gqa.yaml").read_text()
    plain = build_plan(parse_spec_text(text))
    assert plain.part(Logits) == Logits()
    assert [(c.name, node) for c, node in components.parts(plain)] == [
        ("activation", Activation("silu")),
        ("embeddings", Embeddings()),
        ("logits", Logits()),
    ]
    novel = text.replace("LlamaForCausalLM", "NovelForCausalLM").replace(
        "model_type: llama", "model_type: novel"
    )
    gemma = parse_spec_text(
        novel + "scale_embedding: true\nfinal_logit_softcap: 30.0\n"
    )
    assert build_plan(gemma).part(Logits) == Logits(softcap=30.0)
    assert build_plan(gemma).part(Embeddings) == Embeddings(sqrt_hidden=True)
    keys = list(hf_config_from_spec(gemma))
    # Gemma's order: the embedding's scale, then the head's tie and soft-cap,
    # among the model-wide keys (before the attention's).
    at = keys.index("scale_embedding")
    assert keys[at + 1 : at + 3] == ["tie_word_embeddings", "final_logit_softcapping"]
    assert at < keys.index("num_key_value_heads")
    neutral = hf_config_from_spec(parse_spec_text(text))
    assert not {"logit_scale", "logits_scaling", "final_logit_softcapping"} & set(
        neutral
    )


def test_a_soft_cap_stands_alone():
    text = (ROOT / "model_specs" / "dense-gqa.yaml").read_text()
    for other in ("logit_scale: 0.5", "logits_scaling: 8.0"):
        with pytest.raises(Exception, match=r"final_logit_softcap.*generated beside"):
            parse_spec_text(text + f"final_logit_softcap: 30.0\n{other}\n")


def test_embeddings_read_their_two_factors_and_refuse_them_together():
    embeddings = next(c for c in components.every() if c.name == "embeddings")
    neutral = {"scale_embedding": False, "embedding_multiplier": 1.0}
    assert embeddings.read(_getter(neutral)) == {}
    assert embeddings.read(_getter({"scale_embedding": True})) == {
        "scale_embedding": True
    }
    granite = embeddings.read(_getter({"embedding_multiplier": 12}))
    assert granite == {"embedding_multiplier": 12}
    with pytest.raises(ConfigProblem, match=r"embedding_multiplier=0: must be"):
        embeddings.read(_getter({"embedding_multiplier": 0}))
    with pytest.raises(ConfigProblem, match=r"scale_embedding='yes': must be true"):
        embeddings.read(_getter({"scale_embedding": "yes"}))
    text = (ROOT / "model_specs" / "dense-gqa.yaml").read_text()
    with pytest.raises(Exception, match=r"scale_embedding.*beside an embedding_mult"):
        parse_spec_text(text + "scale_embedding: true\nembedding_multiplier: 2.0\n")


def test_residual_multiplier_reads_a_positive_factor_and_stands_with_pre_norms():
    from onboard.components.residual_stream import ResidualStream
    from onboard.spec.hf import hf_config_from_spec

    factor = next(c for c in components.every() if c.name == "residual_multiplier")
    assert factor.read(_getter({"residual_multiplier": 1.0})) == {}
    assert factor.read(_getter({"residual_multiplier": 0.22})) == {
        "residual_multiplier": 0.22
    }
    for bad in (0, -0.5, "0.22", True):
        with pytest.raises(ConfigProblem, match=rf"residual_multiplier={bad!r}: must"):
            factor.read(_getter({"residual_multiplier": bad}))
    text = (ROOT / "model_specs" / "dense-gqa.yaml").read_text()
    with pytest.raises(Exception, match=r"residual_multiplier: needs norm.placement"):
        parse_spec_text(text + "residual_multiplier: 0.5\nnorm: {placement: post}\n")
    novel = text.replace("LlamaForCausalLM", "NovelForCausalLM").replace(
        "model_type: llama", "model_type: novel"
    )
    spec = parse_spec_text(novel + "residual_multiplier: 0.5\n")
    # The residual stream applies it in every decoder layer, not in MTP blocks.
    plan = build_plan(spec)
    assert {layer.stream for layer in plan.layers} == {ResidualStream("pre", 0.5)}
    config = hf_config_from_spec(spec)
    assert config["residual_multiplier"] == 0.5
    assert "residual_multiplier" not in hf_config_from_spec(parse_spec_text(novel))


# ---- the softmax scale (every GQA layer) -------------------------------------------


def test_softmax_scale_reads_a_stated_default_as_none_and_refuses_it_for_mla():
    scale = next(c for c in components.every() if c.name == "softmax_scale")
    gqa = {"hidden_size": 64, "num_attention_heads": 4}
    # 1/sqrt(16): the default, stated (Granite's class always writes it).
    assert scale.read(_getter({**gqa, "attention_multiplier": 0.25})) == {}
    assert scale.read(_getter({**gqa, "attention_multiplier": 0.1})) == {
        "softmax_scale": 0.1
    }
    # head_dim, where stated, decides the default, not hidden / heads.
    wide = {**gqa, "head_dim": 64}
    assert scale.read(_getter({**wide, "attention_multiplier": 0.125})) == {}
    assert scale.read(_getter({**wide, "attention_multiplier": 0.25})) == {
        "softmax_scale": 0.25
    }
    assert scale.read(_getter({**gqa, "query_pre_attn_scalar": 144})) == {
        "query_pre_attn_scalar": 144
    }
    with pytest.raises(ConfigProblem, match=r"attention_multiplier='x': must be a"):
        scale.read(_getter({**gqa, "attention_multiplier": "x"}))
    mla = {**gqa, "kv_lora_rank": 32}
    with pytest.raises(ConfigProblem, match=r"query_pre_attn_scalar=8: not express"):
        scale.read(_getter({**mla, "query_pre_attn_scalar": 8}))


def test_every_gqa_layer_prints_its_scale_and_reads_a_key_the_config_holds():
    from onboard.components.softmax_scale import SoftmaxScale, SoftmaxScaleKeys

    granite = any_spec("var-granite-moe-shared-fused")
    arch = build_plan(granite)
    node = arch.attention.part(SoftmaxScale)
    assert node is not None and node.multiplier == granite.attention.softmax_scale
    keys = components.parts(arch.attention)
    scale = next(c for c, _ in keys if c.name == "softmax_scale")
    assert scale.code_context(node, arch.config) == SoftmaxScaleKeys(
        None, "attention_multiplier"
    )
    # At the default, Granite's own config still holds the key, and the model
    # reads it (as vLLM's granite.py does); a Llama config has none to read.
    from transformers import AutoConfig

    from onboard.spec.hf import spec_from_hf_config

    config = AutoConfig.for_model(
        "granite",
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        attention_multiplier=0.25,  # 1/sqrt(head_dim 16): the default
    ).to_dict()
    spec = spec_from_hf_config(config)
    assert spec.attention.softmax_scale is None
    arch = build_plan(spec)
    context = scale.code_context(arch.attention.part(SoftmaxScale), arch.config)
    assert context == SoftmaxScaleKeys(None, "attention_multiplier")
    llama = build_plan(any_spec("dense-gqa"))
    assert scale.code_context(
        llama.attention.part(SoftmaxScale), llama.config
    ) == SoftmaxScaleKeys(None, None)
    assert (
        build_plan(any_spec("deepseek-v3-style")).attention.part(SoftmaxScale) is None
    )


def test_router_reads_nothing_of_a_dense_config_and_every_problem_at_once():
    router = next(c for c in components.every() if c.name == "router")
    # A dense config's router keys are class defaults: they mean nothing.
    dense = {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 8}
    assert router.read(_getter(dense)) == {}
    deepseek = {
        "n_routed_experts": 64,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "n_group": 8,
        "topk_group": 4,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
    }
    assert router.read(_getter(deepseek)) == {
        "scoring": "sigmoid",
        "norm_topk_prob": True,
        "bias_correction": True,
        "num_groups": 8,
        "topk_groups": 4,
        "routed_scaling_factor": 2.5,
        "bias": False,
        "weight_on_input": False,
    }
    # One group of all experts is plain top-k.
    plain = router.read(_getter({**deepseek, "n_group": 1, "topk_group": 1}))
    assert plain["num_groups"] is None and plain["topk_groups"] is None
    # Each problem reported, and the fields read all the same for the family check.
    broken = {**deepseek, "scoring_func": "tanh", "topk_method": "greedy"}
    del broken["norm_topk_prob"]
    with pytest.raises(ConfigProblem) as caught:
        router.read(_getter(broken))
    assert [m.split(":")[0] for m in caught.value.args] == [
        "scoring_func='tanh'",
        "topk_method=greedy with n_group=8",
        "norm_topk_prob",
    ]
    assert caught.value.read["scoring"] == "tanh"


def test_router_is_the_moe_blocks_node_and_writes_what_it_reads():
    from onboard.components.router import Router

    spec = any_spec("deepseek-v3-style")
    moe = build_plan(spec).moe
    assert moe is not None and isinstance(moe.router, Router)
    router = next(c for c in components.present(spec, "moe"))
    assert router.name == "router" and moe.router.bias_correction
    written = router.config(spec)
    assert written["topk_method"] == "noaux_tc"
    read = router.read(_getter({"n_routed_experts": 1, **written}))
    assert read == spec.mlp.moe.router.model_dump()
    assert router not in components.present(any_spec("dense-gqa"))


def test_both_moe_blocks_route_as_the_router_says():
    # gpt-oss's stacked experts have a MoE block of their own; the router's
    # fragment gives it the same FusedMoE arguments as the other block. Before
    # the router was a component, that block dropped routed_scaling_factor: the
    # model's docstring said the output was scaled, and vLLM did not scale it.
    import yaml

    from onboard.generate import render_model

    data = yaml.safe_load((ROOT / "model_specs" / "gpt-oss-style.yaml").read_text())
    data["mlp"]["moe"]["router"]["routed_scaling_factor"] = 2.0
    data.update(
        name="gpt-oss-scaled",
        model_type="gpt_oss_scaled",
        architecture="GptOssScaledForCausalLM",
    )
    source = render_model(parse_spec_text(yaml.safe_dump(data)))
    assert "routed_scaling_factor=config.routed_scaling_factor," in source
    plain = render_model(any_spec("gpt-oss-style"))
    assert "routed_scaling_factor" not in plain


def test_the_head_reads_a_tie_a_config_must_state_and_always_writes_it():
    logits = next(c for c in components.every() if c.name == "logits")
    assert logits.read(_getter({"tie_word_embeddings": True})) == {
        "tie_word_embeddings": True
    }
    assert logits.read(_getter({"tie_word_embeddings": False})) == {}
    # transformers' classes mostly default to tied: a config without the key is
    # not read as untied.
    with pytest.raises(ConfigProblem, match="tie_word_embeddings: required"):
        logits.read(_getter({"logit_scale": 2.0}))
    with pytest.raises(ConfigProblem) as caught:
        logits.read(_getter({"logit_scale": 2.0}))
    assert caught.value.read == {"logit_scale": 2.0}
    untied = any_spec("dense-gqa")
    assert logits.config(untied)["tie_word_embeddings"] is False
    tied = any_spec("var-layernorm-mha")
    arch = build_plan(tied)
    from onboard.components.logits import Logits

    assert arch.part(Logits).tied and logits.config(tied)["tie_word_embeddings"]


def test_the_activation_is_required_one_of_its_kinds_and_printed_from_its_row():
    from onboard.components.activation import KINDS, Activation
    from onboard.generate import render_model
    from onboard.reference import render_reference

    activation = next(c for c in components.every() if c.name == "activation")
    assert activation.read(_getter({"hidden_act": "gelu"})) == {"activation": "gelu"}
    with pytest.raises(ConfigProblem, match="hidden_act: required"):
        activation.read(_getter({}))
    with pytest.raises(ConfigProblem, match=r"hidden_act='relu': not one of") as bad:
        activation.read(_getter({"hidden_act": "relu"}))
    assert bad.value.read == {"activation": "relu"}  # the spec names it too
    # Each model prints the row of the plan's node: the dense MLP's fused layer
    # in vLLM, the experts' FusedMoE name, the reference's function.
    gelu = any_spec("var-layernorm-mha")
    node = build_plan(gelu).part(Activation)
    assert node == Activation(gelu.activation)
    assert f"self.act_fn = {KINDS[node.kind].vllm_layer}" in render_model(gelu)
    moe = any_spec("var-qwen-gated")
    assert moe.activation == "gelu"
    assert 'activation="gelu",' in render_model(moe)
    reference = render_reference(moe, standalone=True)
    modeling = next(v for k, v in reference.items() if k.startswith("modeling_"))
    # The config names it (onboard writes hidden_act): transformers' table.
    assert "ACT2FN[config.hidden_act]" in modeling and "def activation" not in modeling


# ---- linear attention (a token mixer) ----------------------------------------------


def _linear():
    return next(c for c in components.every() if c.name == "linear_attention")


def test_linear_attention_reads_its_section_only_where_a_layer_is_linear():
    """Qwen3-Next's class defaults (linear_num_key_heads...) mean nothing without
    a linear layer; with one, every missing size is reported at once, with the
    section read so far (the reader checks it further)."""
    gdn = {"linear_num_key_heads": 2, "linear_num_value_heads": 4}
    kinds = ["linear_attention", "full_attention"]
    assert _linear().read(_getter({**gdn, LAYER_TYPES: ["full_attention"]})) == {}
    with pytest.raises(ConfigProblem) as problem:
        _linear().read(_getter({**gdn, LAYER_TYPES: kinds}))
    assert problem.value.args == (
        "linear_key_head_dim: required, as some layers are linear_attention",
        "linear_value_head_dim: required, as some layers are linear_attention",
    )
    assert problem.value.read["linear_attention"]["num_value_heads"] == 4
    kda = {"linear_attention_type": "kimi_delta", "linear_num_heads": 2,
           "linear_head_dim": 8, LAYER_TYPES: kinds}  # fmt: skip
    section = _linear().read(_getter(kda))["linear_attention"]
    assert (section["num_key_heads"], section["value_head_dim"]) == (2, 8)
