"""Tiny checkpoints: the shrink rule, the files written, determinism, the tokenizer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from onboard.checkpoint import plan_tensors, select_layers, shrink_spec
from onboard.checkpoint.safetensors_io import to_bf16_bits
from onboard.checkpoint.tiny import INDEX_FILE, LOGIT_STD, write_tiny_checkpoint
from onboard.checkpoint.tokenizer import BOS_ID, EOS_ID
from onboard.cli import app
from onboard.errors import InputError
from onboard.spec import ModelSpec, dump_spec, load_spec, parse_spec_text
from onboard.spec.rules import check_rules
from onboard.spec.shrink import layer_kind

SPECS = Path(__file__).resolve().parents[1] / "model_specs"
BUNDLED = ["dense-gqa", "deepseek-v3-style", "novel-launch"]
# vllm/v1/attention/backends/cpu_attn.py: CPUAttentionBackend.get_supported_head_sizes
CPU_HEAD_SIZES = {32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}


def bundled(name: str) -> ModelSpec:
    return load_spec(SPECS / f"{name}.yaml")


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Path]:
    """Each bundled spec's tiny checkpoint (seed 0), written once for the module."""
    root = tmp_path_factory.mktemp("tiny")
    return {n: write_tiny_checkpoint(bundled(n), root / n, seed=0) for n in BUNDLED}


# ---- the shrink rule --------------------------------------------------------------


@pytest.mark.parametrize("name", BUNDLED)
def test_shrink_keeps_structure(name: str) -> None:
    full = bundled(name)
    tiny = shrink_spec(full)
    assert check_rules(tiny) == []
    assert parse_spec_text(dump_spec(tiny)) == tiny  # a valid spec file, too

    # Structure is unchanged ...
    for field in (
        "architecture",
        "model_type",
        "activation",
        "norm",
        "rope",
        "tie_word_embeddings",
        "mtp",
        "checkpoint",
        "quantization",
        "speculators",
        "targets",
    ):
        assert getattr(tiny, field) == getattr(full, field), field
    fa, ta = full.attention, tiny.attention
    for field in (
        "type",
        "qk_norm",
        "qkv_bias",
        "o_bias",
        "partial_rotary_factor",
        "sliding_window_pattern",
    ):
        assert getattr(ta, field) == getattr(fa, field), field
    assert (ta.sliding_window is None) == (fa.sliding_window is None)
    assert bool(ta.kv_sharing) == bool(fa.kv_sharing)
    if fa.type == "mla":
        # The CPU MLA decode kernel needs the 576-wide latent; per-head dims kept.
        assert ta.mla.model_copy(update={"q_lora_rank": None}) == fa.mla.model_copy(
            update={"q_lora_rank": None}
        )
        assert ta.mla.kv_lora_rank + ta.mla.qk_rope_head_dim == 576
        assert (ta.mla.q_lora_rank is None) == (fa.mla.q_lora_rank is None)
    else:
        assert tiny.head_dim == full.head_dim
        assert tiny.head_dim in CPU_HEAD_SIZES
        assert tiny.attention.num_heads % tiny.num_kv_heads == 0
        assert (tiny.num_kv_heads < ta.num_heads) == (full.num_kv_heads < fa.num_heads)
    if full.mlp.moe is not None:
        fm, tm = full.mlp.moe, tiny.mlp.moe
        assert tm.router.model_dump(exclude={"num_groups", "topk_groups"}) == (
            fm.router.model_dump(exclude={"num_groups", "topk_groups"})
        )
        assert tm.layer_frequency == fm.layer_frequency
        assert (tm.first_k_dense > 0) == (fm.first_k_dense > 0)
        assert (tm.num_shared_experts > 0) == (fm.num_shared_experts > 0)
        assert 1 < tm.num_experts_per_tok < tm.num_experts
        if fm.router.num_groups is not None:
            per_group = tm.num_experts // tm.router.num_groups
            assert per_group >= 2  # DeepSeek scores a group by its two best experts
            assert tm.router.topk_groups < tm.router.num_groups

    # ... every kind of layer survives ...
    full_kinds = {layer_kind(full, i) for i in range(full.num_hidden_layers)}
    tiny_kinds = {layer_kind(tiny, i) for i in range(tiny.num_hidden_layers)}
    assert tiny_kinds == full_kinds
    types = tiny.layer_attention_types()
    full_types = full.layer_attention_types()
    assert {types[layer] for layer in ta.kv_sharing} == {
        full_types[layer] for layer in fa.kv_sharing
    }

    # ... and the sizes are seconds-sized.
    assert tiny.vocab_size == 512
    original = (
        full.rope.scaling.original_max_position_embeddings
        if full.rope.scaling
        else None
    )
    assert tiny.max_position_embeddings == max(
        min(full.max_position_embeddings, 2048), original or 0
    )
    assert tiny.num_hidden_layers <= 8
    assert tiny.hidden_size <= 512
    if ta.sliding_window is not None:
        assert ta.sliding_window <= 16
    params = sum(int(np.prod(p.shape)) for p in plan_tensors(tiny))
    assert params < 10_000_000


def test_novel_launch_layers_and_kv_sharing_are_remapped() -> None:
    full = bundled("novel-launch")
    # Layer 0 (the dense one), then 37..43: aligned to the 4-layer sliding period,
    # the shortest run holding a sliding and a full KV-sharing pair.
    assert select_layers(full) == [0, 37, 38, 39, 40, 41, 42, 43]
    tiny = shrink_spec(full)
    assert tiny.attention.kv_sharing == {5: 1, 6: 2, 7: 3}  # 41->37, 42->38, 43->39
    assert tiny.layer_attention_types() == [
        "sliding_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
    ]
    assert [tiny.is_moe_layer(i) for i in range(8)] == [False] + [True] * 7


def _variant(name: str, **changes) -> ModelSpec:
    data = bundled(name).model_dump(mode="python")
    for path, value in changes.items():
        node = data
        *parents, leaf = path.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    spec = ModelSpec.model_validate(data)
    assert check_rules(spec) == []
    return spec


def test_moe_frequency_first_k_and_dense_list_are_kept() -> None:
    full = _variant(
        "novel-launch",
        attention__kv_sharing={},
        mlp__moe__first_k_dense=3,
        mlp__moe__layer_frequency=2,
        mlp__moe__dense_layers=[21],
    )
    keep = select_layers(full)
    tiny = shrink_spec(full)
    # first_k 3 with period lcm(4, 2) = 4 keeps three leading dense layers.
    assert tiny.mlp.moe.first_k_dense == 3
    assert tiny.mlp.moe.layer_frequency == 2
    assert [keep[i] for i in tiny.mlp.moe.dense_layers] == [21]
    for j, i in enumerate(keep):
        assert layer_kind(tiny, j) == layer_kind(full, i)


def test_explicit_layer_types_are_remapped() -> None:
    n = 48
    types = ["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(n)]
    full = _variant(
        "novel-launch",
        attention__sliding_window_pattern=None,
        attention__layer_types=types,
        attention__kv_sharing={},
    )
    keep = select_layers(full)
    tiny = shrink_spec(full)
    assert tiny.attention.layer_types == [types[i] for i in keep]
    assert set(tiny.attention.layer_types) == {"full_attention", "sliding_attention"}


def test_mha_and_mqa_stay_what_they_are() -> None:
    mha = shrink_spec(_variant("dense-gqa", attention__num_kv_heads=32))
    assert mha.num_kv_heads == mha.attention.num_heads
    mqa = shrink_spec(_variant("dense-gqa", attention__num_kv_heads=1))
    assert mqa.num_kv_heads == 1 < mqa.attention.num_heads


def test_untied_hidden_size_keeps_head_dim() -> None:
    # Qwen3-style: hidden (1024) != heads x head_dim (16 x 128).
    full = _variant("dense-gqa", hidden_size=1024, attention__num_heads=16)
    tiny = shrink_spec(full)
    assert tiny.head_dim == 128 and tiny.attention.head_dim == 128
    assert tiny.hidden_size == 256


# ---- the files ----------------------------------------------------------------------


def _headers(ckpt: Path) -> dict[str, tuple[str, list[int], str]]:
    out = {}
    for file in sorted(ckpt.glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                sl = f.get_slice(name)
                out[name] = (sl.get_dtype(), sl.get_shape(), file.name)
    return out


@pytest.mark.parametrize("name", BUNDLED)
def test_shards_and_index_agree(written: dict[str, Path], name: str) -> None:
    ckpt = written[name]
    tiny = load_spec(ckpt / "spec.yaml")
    assert tiny == shrink_spec(bundled(name))
    index = json.loads((ckpt / INDEX_FILE).read_text())
    headers = _headers(ckpt)
    shards = {file for _, _, file in headers.values()}
    assert len(shards) >= 2
    assert index["weight_map"] == {n: file for n, (_, _, file) in headers.items()}
    sizes = {"BF16": 2, "F32": 4}
    assert index["metadata"]["total_size"] == sum(
        sizes[dt] * int(np.prod(shape)) for dt, shape, _ in headers.values()
    )
    plans = {p.name: list(p.shape) for p in plan_tensors(tiny)}
    assert {n: shape for n, (_, shape, _) in headers.items()} == plans
    assert {dt for dt, _, _ in headers.values()} == {"BF16"}

    config = json.loads((ckpt / "config.json").read_text())
    assert config["vocab_size"] == tiny.vocab_size
    assert config["num_hidden_layers"] == tiny.num_hidden_layers
    assert (config["bos_token_id"], config["eos_token_id"]) == (BOS_ID, EOS_ID)
    gen = json.loads((ckpt / "generation_config.json").read_text())
    assert gen["eos_token_id"] == EOS_ID


def test_checkpoint_has_mtp_router_bias_and_scaled_head(written) -> None:
    ckpt = written["novel-launch"]
    tiny = load_spec(ckpt / "spec.yaml")
    names = set(_headers(ckpt))
    n = tiny.num_hidden_layers
    for i in range(tiny.mtp.num_heads):  # two MTP heads after the decoder layers
        for part in (
            "enorm",
            "hnorm",
            "eh_proj",
            "shared_head.norm",
            "shared_head.head",
            "self_attn.q_proj",
            "self_attn.k_norm",
            "mlp.gate",
            "mlp.experts.0.down_proj",
            "mlp.shared_experts.up_proj",
        ):
            assert f"model.layers.{n + i}.{part}.weight" in names, part
        assert f"model.layers.{n + i}.mlp.gate.e_score_correction_bias" in names
    assert f"model.layers.{n + 2}.enorm.weight" not in names
    # KV-sharing layers still hold k/v weights (the checkpoint does not know).
    assert "model.layers.5.self_attn.k_proj.weight" in names

    from safetensors.torch import load_file

    tensors = {}
    for file in ckpt.glob("*.safetensors"):
        tensors.update(load_file(file))
    assert torch.equal(
        tensors["model.layers.1.input_layernorm.weight"],
        torch.ones(tiny.hidden_size, dtype=torch.bfloat16),
    )
    head_std = tensors["lm_head.weight"].float().std().item()
    assert head_std == pytest.approx(LOGIT_STD / tiny.hidden_size**0.5, rel=0.05)
    assert tensors["model.layers.1.mlp.gate.weight"].float().std().item() == (
        pytest.approx(0.02, rel=0.1)
    )
    # MTP heads share the output head's values, as DeepSeek-V3 stores them.
    assert torch.equal(
        tensors[f"model.layers.{n}.shared_head.head.weight"], tensors["lm_head.weight"]
    )


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    spec = bundled("deepseek-v3-style")
    a = write_tiny_checkpoint(spec, tmp_path / "a", seed=7)
    b = write_tiny_checkpoint(spec, tmp_path / "b", seed=7)
    c = write_tiny_checkpoint(spec, tmp_path / "c", seed=8)
    files = sorted(p.name for p in a.iterdir())
    assert files == sorted(p.name for p in b.iterdir())
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    shard = next(a.glob("*.safetensors")).name
    assert (a / shard).read_bytes() != (c / shard).read_bytes()
    for f in ("config.json", "tokenizer.json", "spec.yaml", INDEX_FILE):
        assert (a / f).read_bytes() == (c / f).read_bytes(), f


def test_rewrite_replaces_atomically_and_bad_input_leaves_it(tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    write_tiny_checkpoint(bundled("dense-gqa"), out)
    assert not (out / "stale.txt").exists()
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(InputError, match="dtype"):
        write_tiny_checkpoint(bundled("dense-gqa"), out, dtype="int3")
    assert sorted(p.name for p in out.iterdir()) == before
    assert not list(tmp_path.glob(".ckpt.*"))  # no temporary directory left over


def test_float32_option(tmp_path: Path) -> None:
    ckpt = write_tiny_checkpoint(
        bundled("dense-gqa"), tmp_path / "f32", dtype="float32"
    )
    assert {dt for dt, _, _ in _headers(ckpt).values()} == {"F32"}
    assert json.loads((ckpt / "config.json").read_text())["dtype"] == "float32"


def test_bf16_rounding_matches_torch() -> None:
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 3
    x[:4] = [0.0, -0.0, 1e-30, 65504.0]
    ours = to_bf16_bits(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy()
    assert np.array_equal(ours.view(np.int16), theirs)


def test_cli_writes_checkpoint(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "checkpoint",
            "tiny",
            str(SPECS / "dense-gqa.yaml"),
            "--out",
            str(tmp_path / "cli"),
            "--seed",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cli" / INDEX_FILE).exists()


# ---- tokenizer and decisive logits (real transformers) ------------------------------


def test_tokenizer_round_trip(written: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    ckpt = written["dense-gqa"]
    tok = AutoTokenizer.from_pretrained(ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    assert len(tok) <= config["vocab_size"]
    assert (tok.bos_token_id, tok.eos_token_id) == (BOS_ID, EOS_ID)
    for text in [
        "The capital of France is",
        "Hello, my name is Sam.",
        "naïve café — 日本語 🙂 tabs\tand\nnewlines",
        "  two  spaces  ",
    ]:
        ids = tok(text).input_ids
        assert ids[0] == BOS_ID
        assert tok.decode(ids, skip_special_tokens=True) == text
    # Common words from the bundled text are single tokens.
    assert len(tok(" the", add_special_tokens=False).input_ids) == 1
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert chat.endswith("assistant:")


@pytest.mark.parametrize("name", ["dense-gqa", "deepseek-v3-style"])
def test_logits_decisive_and_router_not_saturated(written, name: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt = written[name]
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(ckpt)
    gate_logits: list[torch.Tensor] = []
    if name == "deepseek-v3-style":
        model.model.layers[1].mlp.gate.register_forward_hook(
            lambda _m, _i, out: gate_logits.append(
                out[0] if isinstance(out, tuple) else out
            )
        )
    text = (
        "Every morning the harbour town wakes slowly. The fishing boats come back "
        "before the sun is high, the market opens, and the bakers carry warm bread."
    )
    with torch.no_grad():
        logits = model(**tok(text, return_tensors="pt")).logits[0]
    top2 = logits.topk(2, dim=-1).values
    margins = top2[:, 0] - top2[:, 1]
    assert margins.median().item() > 1.0
    if gate_logits:
        scores = torch.sigmoid(gate_logits[0].float())
        saturated = ((scores < 0.05) | (scores > 0.95)).float().mean().item()
        assert saturated < 0.01


def test_tied_embeddings_are_decisive_without_echoing_the_input(tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = _variant("dense-gqa", tie_word_embeddings=True)
    ckpt = write_tiny_checkpoint(spec, tmp_path / "tied")
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(ckpt)
    ids = tok(
        "Every morning the harbour town wakes slowly. The fishing boats come back "
        "before the sun is high, the market opens, and the bakers carry warm bread.",
        return_tensors="pt",
    ).input_ids
    with torch.no_grad():
        logits = model(ids).logits[0]
    top2 = logits.topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).median().item() > 1.0
    # A scaled tied embedding would swamp the residual stream and the model would
    # predict the token it just read; the scale sits in the final norm instead.
    echoes = (logits.argmax(-1) == ids[0]).float().mean().item()
    assert echoes < 0.5  # measured 0.18 (and 1.0 with a scaled tied embedding)


@pytest.mark.parametrize("where", ["file", "under-file"])
def test_cli_unwritable_output_is_exit_2(tmp_path: Path, where: str) -> None:
    blocker = tmp_path / "blocker.txt"
    blocker.write_text("not a directory")
    out = blocker if where == "file" else blocker / "ckpt"
    # The installed console script: it maps InputError to exit code 2.
    cli = Path(sys.executable).parent / "onboard"
    result = subprocess.run(
        [
            str(cli),
            "checkpoint",
            "tiny",
            str(SPECS / "dense-gqa.yaml"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2, result.stderr
    assert str(out) in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr
