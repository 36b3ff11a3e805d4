"""Modular output: a new model type that is a family vLLM and transformers ship
under a new name is generated as subclasses of their classes
(onboard.spec.bases, onboard.generate.modular, onboard.reference.modular)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from onboard.generate import generate_files, render_model
from onboard.reference import render_reference
from onboard.spec import load_spec
from onboard.spec.bases import BASES
from onboard.spec.hf import find_base, hf_config_from_spec
from onboard.spec.model import ModelSpec
from onboard.spec.mtp import mtp_draft

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
# A DeepSeek-V3 whose checkpoint names the embedding and q_a_proj its own way,
# as Mistral Large 3's does (vLLM's mistral_large_3.py).
RENAMES = {
    "embed": "tok_embeddings",
    "q_a_proj": "model.layers.{layer}.attention.wq_a",
}


def bundled(name: str) -> ModelSpec:
    return load_spec(ROOT / "model_specs" / f"{name}.yaml")


def renamed(
    source: str, model_type: str, tensor_names: dict[str, str], **changes
) -> ModelSpec:
    data = bundled(source).model_dump(mode="json")
    data.update(
        name=model_type.replace("_", "-"),
        model_type=model_type,
        architecture="".join(p.title() for p in model_type.split("_")) + "ForCausalLM",
    )
    data["checkpoint"]["tensor_names"] = tensor_names
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[leaf] = value
    if data.get("mtp") is None:
        data["speculators"] = [s for s in data["speculators"] if s["method"] != "mtp"]
    return ModelSpec.model_validate(data)


def renamed_deepseek() -> ModelSpec:
    return renamed("deepseek-v3-style", "renamed_ds", RENAMES, mtp=None)


# ---- which family, if any -------------------------------------------------------


def test_every_base_is_what_the_installed_vllm_and_transformers_register():
    import importlib
    import inspect

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    )
    from vllm.model_executor.models.registry import (
        _SPECULATIVE_DECODING_MODELS,
        _TEXT_GENERATION_MODELS,
    )

    for base in BASES:
        assert _TEXT_GENERATION_MODELS[base.architecture] == (
            base.vllm_module,
            base.architecture,
        ), base
        cls = getattr(importlib.import_module(base.vllm_import), base.architecture)
        has_mapper = any("hf_to_vllm_mapper" in vars(k) for k in cls.__mro__)
        assert has_mapper == base.mapper, base
        assert CONFIG_MAPPING_NAMES[base.model_type] == base.config_class
        assert MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[base.model_type] == base.architecture
        if base.mtp_architecture is not None:
            module, name = _SPECULATIVE_DECODING_MODELS[base.mtp_architecture]
            assert (module, name) == (base.mtp_module, base.mtp_class), base
            draft = getattr(
                importlib.import_module(f"vllm.model_executor.models.{module}"), name
            )
            # The draft's load_weights reads the family's names for each head role.
            if base.mtp_paths:
                source = inspect.getsource(importlib.import_module(draft.__module__))
                for _, path in base.mtp_paths:
                    if path:
                        leaf = path.rsplit(".", 1)[-1]
                        assert f"self.{leaf} =" in source or leaf.isdigit(), (
                            base,
                            path,
                        )


def test_a_renamed_family_is_found_with_the_names_to_map():
    match = find_base(renamed_deepseek())
    assert match is not None and match.base.model_type == "deepseek_v3"
    assert match.renames == {
        "embed": ("tok_embeddings", "model.embed_tokens"),
        "q_a_proj": (
            "model.layers.{layer}.attention.wq_a",
            "model.layers.{layer}.self_attn.q_a_proj",
        ),
    }


def test_a_llama_with_qk_norms_is_qwen3_and_one_with_a_window_is_no_family():
    assert find_base(renamed("dense-gqa", "plain_llama", {})).base.model_type == (
        "llama"
    )
    normed = renamed("dense-gqa", "normed", {}, **{"attention.qk_norm": True})
    assert find_base(normed).base.model_type == "qwen3"
    # Qwen3's class has q/k norms without a config key: config.json states it,
    # so the new model type reads back as the spec.
    assert hf_config_from_spec(normed)["qk_norm"] is True
    assert "(Qwen3ForCausalLM)" in render_model(normed)
    windowed = renamed("dense-gqa", "windowed", {}, **{"attention.sliding_window": 64})
    assert find_base(windowed) is None


def test_no_family_where_the_checkpoint_stores_tensors_otherwise():
    # Fused q/k/v: a rename cannot split a tensor.
    fused = renamed(
        "dense-gqa", "fused_llama", {}, **{"checkpoint.fused": ["qkv_proj"]}
    )
    assert find_base(fused) is None
    # MTP heads with renamed tensors: vLLM's MTP loader reads its own names only.
    assert find_base(renamed("deepseek-v3-style", "ds_named", RENAMES)) is None
    assert find_base(renamed("deepseek-v3-style", "ds_plain", {})) is not None


def qwen3_next_plain_norms(model_type: str = "qn_plain") -> ModelSpec:
    """qwen3-next-style without its MTP head: Qwen3-Next but for its RMSNorms,
    which scale by weight, not 1 + weight."""
    return renamed("qwen3-next-style", model_type, {}, mtp=None)


def test_plain_norms_are_qwen3_next_with_the_norm_weights_bridged():
    match = find_base(qwen3_next_plain_norms())
    assert match is not None and match.base.architecture == "Qwen3NextForCausalLM"
    assert match.as_base.norm.unit_offset and not match.renames
    (delta,) = match.deltas
    assert delta.shift == -1.0 and "linear_norm" not in delta.roles
    # The family's own norms need no bridge.
    exact = renamed(
        "qwen3-next-style", "qn_offset", {}, mtp=None, **{"norm.unit_offset": True}
    )
    assert find_base(exact).deltas == ()
    # With its MTP head too: the proof is of the model without it (Qwen3-Next's
    # config states no heads); vLLM's Qwen3NextMTP, renaming, drafts it.
    with_head = find_base(bundled("qwen3-next-style"))
    assert with_head.base.architecture == "Qwen3NextForCausalLM"
    assert with_head.deltas == match.deltas and with_head.as_base.mtp is None
    # Qwen3NextMTP reads one head, and its block's MLP is the first layer's.
    two_heads = renamed("qwen3-next-style", "qn_two", {}, **{"mtp.num_heads": 2})
    dense_head = renamed("qwen3-next-style", "qn_dense", {}, **{"mtp.mlp": "dense"})
    assert find_base(two_heads) is None and find_base(dense_head) is None


def test_the_bridged_model_file_loads_the_norm_weights_less_one():
    spec = qwen3_next_plain_norms()
    source = render_model(spec)
    assert len(source.splitlines()) < 60
    assert "class QnPlainForCausalLM(Qwen3NextForCausalLM):" in source
    scope: dict = {}
    exec(compile(source, "qn_plain.py", "exec"), scope)  # noqa: S102
    names = {
        "model.layers.3.input_layernorm.weight": 0.0,
        "model.layers.3.self_attn.q_norm.weight": 0.0,
        "model.norm.weight": 0.0,
        # The linear-attention layers' gated norm is Qwen3-Next's own.
        "model.layers.0.linear_attn.norm.weight": 1.0,
        "model.layers.3.self_attn.q_proj.weight": 1.0,
    }
    loaded = dict(scope["as_qwen3_next"]((n, torch.ones(2)) for n in names))
    assert {n: t[0].item() for n, t in loaded.items()} == names
    # config.json has Qwen3-Next's keys, which the family's config class reads.
    cfg = hf_config_from_spec(spec)
    assert cfg["num_experts"] == cfg["n_routed_experts"] == spec.mlp.moe.num_experts
    assert "norm_unit_offset" not in cfg
    # The PR says what the model file is.
    from onboard.pr import pr_tree_files

    pr_md = pr_tree_files(spec, generate_files(spec))["vllm-pr/PR.md"]
    assert "`qn_plain.py` subclasses vLLM's `Qwen3NextForCausalLM`" in pr_md
    assert "scale by 1 + weight, which `load_weights` bridges" in pr_md


def test_generate_standalone_writes_the_whole_files_and_says_so(tmp_path):
    """`onboard generate --standalone`: the whole model and MTP files of a spec
    that has modular ones, a PR.md that says so, and `pr describe` keeps it."""
    from typer.testing import CliRunner

    from onboard.cli import app

    spec_path = ROOT / "model_specs" / "qwen3-next-style.yaml"
    files = {}
    for flag in ([], ["--standalone"]):
        out = tmp_path / ("whole" if flag else "modular")
        result = CliRunner().invoke(
            app, ["generate", str(spec_path), "--out", str(out), *flag]
        )
        assert result.exit_code == 0, result.output
        package = out / "plugin" / "onboard_plugin_qwen3_next_style"
        files[bool(flag)] = (
            (package / "qwen3_next_style.py").read_text(),
            (out / "hf" / "modeling_qwen3_next_style.py").read_text(),
        )
    spec = bundled("qwen3-next-style")
    modeling = "modeling_qwen3_next_style.py"
    assert files[True] == (
        render_model(spec, standalone=True),
        render_reference(spec, standalone=True)[modeling],
    )
    assert files[False] == (render_model(spec), render_reference(spec)[modeling])
    for _ in range(2):  # as generated, then as `pr describe` rewrites it
        whole = (tmp_path / "whole" / "vllm-pr" / "PR.md").read_text()
        modular = (tmp_path / "modular" / "vllm-pr" / "PR.md").read_text()
        assert "written the way vLLM's own models are" in whole
        assert "subclasses vLLM's `Qwen3NextForCausalLM`" in modular
        for out in ("whole", "modular"):
            result = CliRunner().invoke(
                app,
                ["pr", "describe", str(tmp_path / out), "--spec", str(spec_path)],
            )
            assert result.exit_code == 0, result.output


def test_one_bundled_spec_is_a_family_across_a_bridge():
    """qwen3-next-style is Qwen3-Next across the norms' bridge; every other
    bundled spec with a new model type differs from each family vLLM ships in
    some component that no bridge covers (docs/generate.md lists which)."""
    found = {
        path.stem: find_base(load_spec(path))
        for path in sorted((ROOT / "model_specs").glob("*.yaml"))
    }
    assert {name for name, match in found.items() if match} == {"qwen3-next-style"}


# ---- the generated files ---------------------------------------------------------


def test_the_model_file_subclasses_vllms_class_and_maps_the_names():
    spec = renamed_deepseek()
    source = render_model(spec)
    tree = ast.parse(source)
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    assert [(c.name, [b.id for b in c.bases]) for c in classes] == [
        ("RenamedDsForCausalLM", ["DeepseekV3ForCausalLM"])
    ]
    assert "from vllm.model_executor.models.deepseek_v2 import" in source
    assert len(source.splitlines()) < 60
    standalone = render_model(spec, standalone=True)
    assert len(standalone.splitlines()) > 400
    # The mapper maps the checkpoint's names to DeepSeek-V3's.
    scope: dict = {}
    exec(compile(source, "renamed_ds.py", "exec"), scope)  # noqa: S102
    mapper = scope["checkpoint_names"]
    assert mapper.map_name("tok_embeddings.weight") == "model.embed_tokens.weight"
    assert (
        mapper.map_name("model.layers.7.attention.wq_a.weight_scale")
        == "model.layers.7.self_attn.q_a_proj.weight_scale"
    )
    assert mapper.map_name("model.layers.7.self_attn.kv_b_proj.weight") == (
        "model.layers.7.self_attn.kv_b_proj.weight"
    )


def test_config_json_loads_with_the_families_config_class_as_the_spec():
    spec = renamed_deepseek()
    cfg = hf_config_from_spec(spec)
    assert cfg["model_type"] == "renamed_ds"
    assert cfg["n_routed_experts"] == spec.mlp.moe.num_experts
    assert cfg["topk_method"] == "noaux_tc"
    files = generate_files(spec)
    config_py = files["plugin/onboard_plugin_renamed_ds/config.py"]
    scope: dict = {}
    exec(compile(config_py, "config.py", "exec"), scope)  # noqa: S102
    config = scope["RenamedDsConfig"](**cfg)
    assert config.model_type == "renamed_ds"
    assert config.q_lora_rank == spec.attention.mla.q_lora_rank
    assert type(config).__mro__[1].__name__ == "DeepseekV3Config"


def test_mtp_heads_of_a_renamed_family_are_vllms_own_draft():
    spec = renamed("deepseek-v3-style", "ds_plain", {})
    draft = mtp_draft(spec)
    assert draft.architecture == "DeepSeekMTPModel" and draft.class_name is None
    files = generate_files(spec)
    assert not any(path.endswith("_mtp.py") for path in files)
    init = files["plugin/onboard_plugin_ds_plain/__init__.py"]
    assert 'MTP_ARCHITECTURE = "DeepSeekMTPModel"' in init
    assert "MTP_CLASS" not in init
    # The standalone form keeps its own draft class.
    assert mtp_draft(spec, standalone=True).class_name == "DsPlainMTP"


def test_the_pr_tree_registers_the_subclass_and_maps_the_mtp_type():
    from onboard.pr.build import pr_changes

    spec = renamed("deepseek-v3-style", "ds_plain", {})
    files = generate_files(spec)
    plugin = {k.removeprefix("plugin/"): v for k, v in files.items()}
    plan = pr_changes(spec, plugin)
    assert "vllm/model_executor/models/ds_plain.py" in plan.new_files
    assert not any(p.endswith("_mtp.py") for p in plan.new_files)
    texts = [e.text for e in plan.edits]
    entry = '"DsPlainForCausalLM": ("ds_plain", "DsPlainForCausalLM")'
    assert any(entry in t for t in texts)
    assert any('["DeepSeekMTPModel"]' in t for t in texts)
    assert not any(e.anchor == "_SPECULATIVE_DECODING_MODELS" for e in plan.edits)


# ---- the reference ---------------------------------------------------------------


def _load(ckpt: Path, files: dict[str, str], work: Path):
    from transformers import AutoModelForCausalLM

    from onboard.reference import auto_map

    work.mkdir()
    for item in ckpt.iterdir():
        (work / item.name).symlink_to(item.resolve())
    (work / "config.json").unlink()
    config = json.loads((ckpt / "config.json").read_text())
    spec = load_spec(ckpt / "spec.yaml")
    config["auto_map"] = auto_map(spec)
    (work / "config.json").write_text(json.dumps(config))
    for name, text in files.items():
        (work / name).write_text(text)
    return AutoModelForCausalLM.from_pretrained(
        work, trust_remote_code=True, dtype=torch.float32
    ).eval()


def test_the_modular_reference_is_transformers_class_with_the_names_renamed(
    tmp_path,
):
    """On a tiny checkpoint written with the spec's names, the modular reference
    (transformers' DeepseekV3ForCausalLM, renames registered) computes what the
    standalone generated reference computes; without the renames it does not."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint

    # Renames the standalone reference can also express (it needs each block's
    # modules beside each other).
    spec = renamed(
        "deepseek-v3-style",
        "ds_attn",
        {
            role: f"model.layers.{{layer}}.attn.{leaf}"
            for role, leaf in (
                ("q_a_proj", "q_a_proj"),
                ("q_a_norm", "q_a_layernorm"),
                ("q_b_proj", "q_b_proj"),
                ("kv_a_proj", "kv_a_proj_with_mqa"),
                ("kv_a_norm", "kv_a_layernorm"),
                ("kv_b_proj", "kv_b_proj"),
                ("o_proj", "o_proj"),
            )
        },
        mtp=None,
    )
    ckpt = tmp_path / "ckpt"
    write_tiny_checkpoint(spec, ckpt, seed=0)
    tiny = load_spec(ckpt / "spec.yaml")
    modular = render_reference(tiny)
    assert "(DeepseekV3ForCausalLM)" in modular["modeling_ds_attn.py"]
    standalone = render_reference(tiny, standalone=True)
    ids = torch.tensor([[1, 5, 9, 200, 3, 77, 41, 8]])
    with torch.no_grad():
        got = _load(ckpt, modular, tmp_path / "modular")(ids).logits
        want = _load(ckpt, standalone, tmp_path / "standalone")(ids).logits
    assert (got - want).abs().max().item() < 1e-4
    # The check fails when the names are not mapped: attention loads nothing.
    unmapped = dict(modular)
    text = unmapped["modeling_ds_attn.py"]
    unmapped["modeling_ds_attn.py"] = text.replace(r"\.attn\.", r"\.no_such\.")
    with torch.no_grad():
        bad = _load(ckpt, unmapped, tmp_path / "unmapped")(ids).logits
    assert (bad - want).abs().max().item() > 1e-2


def test_the_modular_reference_converts_the_familys_checkpoint_without_renames(
    tmp_path,
):
    """transformers applies DeepSeek-V3's expert stacking to remote code only where
    it is registered for the model type: with no name to map, the reference still
    registers the family's conversions and loads every tensor."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint

    spec = renamed("deepseek-v3-style", "ds_same", {}, mtp=None)
    ckpt = tmp_path / "ckpt"
    write_tiny_checkpoint(spec, ckpt, seed=0)
    tiny = load_spec(ckpt / "spec.yaml")
    ids = torch.tensor([[1, 5, 9, 200, 3, 77, 41, 8]])
    with torch.no_grad():
        got = _load(ckpt, render_reference(tiny), tmp_path / "modular")(ids).logits
        want = _load(
            ckpt, render_reference(tiny, standalone=True), tmp_path / "standalone"
        )(ids).logits
    assert (got - want).abs().max().item() < 1e-4


def test_the_bridged_reference_is_qwen3_next_with_the_norm_weights_shifted(
    tmp_path,
):
    """transformers' Qwen3NextForCausalLM, its norm weights loaded less one,
    computes what the standalone reference of plain norms computes; loaded as
    they are, it does not."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint

    ckpt = tmp_path / "ckpt"
    write_tiny_checkpoint(qwen3_next_plain_norms(), ckpt, seed=0)
    tiny = load_spec(ckpt / "spec.yaml")
    modular = render_reference(tiny)
    assert "(Qwen3NextForCausalLM)" in modular["modeling_qn_plain.py"]
    ids = torch.tensor([[1, 5, 9, 200, 3, 77, 41, 8]])
    with torch.no_grad():
        # The modular file registers its conversions for the model type, which
        # transformers offers every later load of it in the process: the
        # standalone reference, loaded after it, must not take them.
        got = _load(ckpt, modular, tmp_path / "modular")(ids).logits
        want = _load(
            ckpt, render_reference(tiny, standalone=True), tmp_path / "standalone"
        )(ids).logits
    assert (got - want).abs().max().item() < 1e-4
    unshifted = dict(modular)
    text = unshifted["modeling_qn_plain.py"]
    assert text.count("[Shift(-1)]") == 5
    unshifted["modeling_qn_plain.py"] = text.replace("[Shift(-1)]", "[Shift(0)]")
    with torch.no_grad():
        bad = _load(ckpt, unshifted, tmp_path / "unshifted")(ids).logits
    assert (bad - want).abs().max().item() > 1e-2


# ---- the engine ------------------------------------------------------------------


@pytest.mark.engine
def test_the_modular_model_passes_validation_on_the_cpu_engine(tmp_path):
    """vLLM's DeepseekV3ForCausalLM, subclassed with the checkpoint's names, against
    transformers' class, subclassed with the same names: accuracy passes."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.generate import write_model_code
    from onboard.validate.harness import validate

    spec = renamed_deepseek()
    ckpt = tmp_path / "ckpt"
    write_tiny_checkpoint(spec, ckpt, seed=0)
    tiny = load_spec(ckpt / "spec.yaml")
    write_model_code(tiny, tmp_path / "gen")
    result = validate(
        ckpt,
        ckpt / "spec.yaml",
        "cpu",
        tmp_path / "out",
        generated=tmp_path / "gen",
        checks="accuracy",
    )
    data = json.loads((tmp_path / "out" / "validation.json").read_text())
    assert result.passed, data
    assert data["vllm_model_class"] == (
        "onboard_plugin_renamed_ds.renamed_ds.RenamedDsForCausalLM"
    )
    assert "modeling_renamed_ds.RenamedDsForCausalLM" in data["reference"]
    assert "a subclass of transformers" in data["reference"]
    assert data["reference"].endswith("DeepseekV3ForCausalLM")


@pytest.mark.engine
def test_the_bridged_qwen3_next_passes_validation_on_the_cpu_engine(tmp_path):
    """qwen3-next-style: vLLM's own Qwen3NextForCausalLM (its Gated DeltaNet
    included), the norm weights loaded less one, against transformers' class with
    the same bridge; its MTP head drafted by vLLM's Qwen3NextMTP reading the
    head's tensors renamed. Without the bridge, accuracy fails."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.generate import write_model_code
    from onboard.validate.harness import validate

    ckpt = tmp_path / "ckpt"
    write_tiny_checkpoint(bundled("qwen3-next-style"), ckpt, seed=0)
    tiny = load_spec(ckpt / "spec.yaml")
    write_model_code(tiny, tmp_path / "gen")
    package = tmp_path / "gen" / "plugin" / "onboard_plugin_qwen3_next_style"
    assert "(Qwen3NextMTP):" in (package / "qwen3_next_style_mtp.py").read_text()
    result = validate(
        ckpt,
        ckpt / "spec.yaml",
        "cpu",
        tmp_path / "out",
        generated=tmp_path / "gen",
        checks="accuracy,spec-decode:mtp",
    )
    data = json.loads((tmp_path / "out" / "validation.json").read_text())
    assert result.passed, data
    prefix = "onboard_plugin_qwen3_next_style.qwen3_next_style"
    assert data["vllm_model_class"] == f"{prefix}.Qwen3NextStyleForCausalLM"
    assert data["reference"].endswith("Qwen3NextForCausalLM")
    (mtp,) = [c for c in data["checks"] if c["name"] == "spec-decode:mtp"]
    drafter = mtp["metrics"]["drafter"]
    assert drafter["draft_model_class"] == f"{prefix}_mtp.Qwen3NextStyleMTP"
    assert mtp["metrics"]["num_drafts"] > 0
    # The check fails when the model file loads the norm weights as they are.
    model_file = package / "qwen3_next_style.py"
    text = model_file.read_text()
    assert "tensor = tensor - 1\n" in text
    model_file.write_text(text.replace("tensor = tensor - 1\n", "tensor = tensor\n"))
    result = validate(
        ckpt,
        ckpt / "spec.yaml",
        "cpu",
        tmp_path / "unbridged",
        generated=tmp_path / "gen",
        checks="accuracy",
    )
    assert not result.passed


@pytest.mark.engine
@pytest.mark.acceptance
def test_a_renamed_family_with_mtp_heads_drafts_with_vllms_own_class(tmp_path):
    """DeepSeek-V3 under a new name with its MTP head: no MTP file is generated;
    vLLM's DeepSeekMTP drafts (the plugin maps the model type to it) and the
    spec-decode check passes, as does accuracy."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.generate import write_model_code
    from onboard.speculators.mtp_train import train_mtp_heads
    from onboard.validate.harness import validate

    spec = renamed("deepseek-v3-style", "ds_plain", {})
    ckpt = tmp_path / "ckpt"
    write_tiny_checkpoint(spec, ckpt, seed=0)
    tiny = load_spec(ckpt / "spec.yaml")
    # Trained with the standalone reference's mtp_forward (the modular reference
    # is transformers' class, which has no MTP heads).
    train_mtp_heads(ckpt, tiny)
    write_model_code(tiny, tmp_path / "gen")
    result = validate(
        ckpt,
        ckpt / "spec.yaml",
        "cpu",
        tmp_path / "out",
        generated=tmp_path / "gen",
        checks="accuracy,spec-decode:mtp",
    )
    data = json.loads((tmp_path / "out" / "validation.json").read_text())
    assert result.passed, data
    (mtp,) = [c for c in data["checks"] if c["name"] == "spec-decode:mtp"]
    drafter = mtp["metrics"]["drafter"]
    assert drafter["draft_model_class"] == (
        "vllm.model_executor.models.deepseek_mtp.DeepSeekMTP"
    )
