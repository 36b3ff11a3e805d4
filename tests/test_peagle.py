"""P-EAGLE heads onboard trains (onboard/speculators/peagle.py), offline: the
plain-torch pass is vLLM's P-EAGLE pass, the prior's mask slots repeat the
bonus token, and the saved head is what speculators and vLLM read. The engine
run is in tests/test_peagle_engine.py (`make test-all`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import dense_tiny

from onboard.spec import load_spec
from onboard.speculators import eagle3, peagle
from onboard.speculators.heads import head_config

ROOT = Path(__file__).resolve().parents[1]
K = 3


def _random_head(seed: int = 0):
    import torch

    spec = load_spec(ROOT / "model_specs" / "dense-gqa.yaml")
    tiny = spec.model_copy(
        update={"hidden_size": 64, "vocab_size": 96, "num_hidden_layers": 2}
    )
    tiny = tiny.model_copy(
        update={
            "attention": tiny.attention.model_copy(
                update={"num_heads": 4, "num_kv_heads": 2, "head_dim": 16}
            )
        }
    )
    config = head_config(tiny, "p_eagle", K, draft_vocab=96)
    gen = torch.Generator().manual_seed(seed)
    head = eagle3.make_head_class()(
        config["transformer_layer_config"],
        2,
        torch.randn(96, 64, generator=gen),
        torch.randn(96, 64, generator=gen),
        parallel=True,
    )
    head.mask_token_id = config["mask_token_id"]
    with torch.no_grad():
        for p in head.parameters():
            # Norm weights (and mask_hidden) around 1, matrices around 0.
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3 + (p.dim() == 1))
    return head


def _literal(head, seq, aux, p: int, k: int, shift: int = 0):
    """vLLM's P-EAGLE input after a verification at slot p, run as one causal
    pass: slots 0..p (token s + 1, states s, position s + 1), then k - 1 mask
    slots (the mask token, fc(mask_hidden)) at the next positions (``shift``
    further on: a fault)."""
    import torch

    mask = torch.full((1, k - 1), head.mask_token_id)
    tokens = torch.cat([seq[:, 1 : p + 2], mask], 1)
    masks = head.combine(head.mask_hidden).expand(1, k - 1, -1)
    hidden = torch.cat([head.combine(aux[:, : p + 1]), masks], 1)
    positions = torch.arange(1, p + 1 + k)
    positions[p + 1 :] += shift
    logits, _ = head.step(tokens, hidden, positions[None], [], 0)
    return logits[0, p : p + k]


def test_parallel_unroll_is_vllms_pass():
    # Every position's block at once equals the block vLLM builds and runs for
    # that position alone (a random head: no prior to hide an indexing fault).
    import torch

    head = _random_head()
    gen = torch.Generator().manual_seed(1)
    seq = torch.randint(0, 95, (1, 24), generator=gen)
    aux = torch.randn(1, 24, 2 * 64, generator=gen)
    data = eagle3.TrainingData(seq, aux, torch.zeros(1, 24, 1), 0)
    with torch.no_grad():
        out = peagle.parallel_unroll(head, data, torch.arange(1), K)
        for p in range(1, 22):
            literal = _literal(head, seq, aux, p, K)
            for j in range(K):
                got = out[j][0][0, p]
                torch.testing.assert_close(got, literal[j], rtol=0, atol=1e-4)
        # The fault this catches: mask slots one position off.
        shifted = _literal(head, seq, aux, 5, K, shift=1)
        assert not torch.allclose(out[1][0][0, 5], shifted[1], atol=1e-2)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("peagle")
    model_dir, tiny = dense_tiny(tmp)
    report = peagle.train_peagle_head(
        tiny, model_dir, tmp / "head", num_speculative_tokens=K, num_prompts=64,
        max_steps=0,
    )  # fmt: skip
    return tmp / "head", model_dir, tiny, report


def _repeat_rate(head, model_dir, tiny) -> float:
    """Share of positions where a mask slot drafts the bonus token, over the
    greedy continuations of a few calibration prompts."""
    import torch

    data = eagle3.verifier_data(
        tiny, model_dir, model_dir.parent / "rate", num_prompts=8, seed=1
    ).data
    with torch.no_grad():
        out = peagle.parallel_unroll(head, data, torch.arange(8), K)
    bonus = data.tokens[:, 1:]
    return float(
        sum((out[j][0].argmax(-1) == bonus).float().mean() for j in range(1, K))
        / (K - 1)
    )


def test_mask_slots_repeat_the_bonus_token(trained):
    import torch

    head_dir, model_dir, tiny, report = trained
    head, _ = peagle.load_head(head_dir)
    assert _repeat_rate(head, model_dir, tiny) > 0.95
    # Without the recency score a mask slot cannot find the bonus slot.
    half = head.hd // 2
    with torch.no_grad():
        for w in (head.q_proj.weight, head.k_proj.weight):
            w.view(-1, head.hd, w.shape[-1])[:, : half // 2] = 0
            w.view(-1, head.hd, w.shape[-1])[:, half : half + half // 2] = 0
    assert _repeat_rate(head, model_dir, tiny) < 0.5
    # Scored as vLLM drafts on the held-aside prompts (8 of the 64 here: the
    # stage's 512 give 1.82): the later positions are accepted too.
    kept = report["validation_decoded_kept"]
    assert kept["mean_acceptance_length"] > 1.25, kept
    assert kept["per_position"][2] > 0.05, kept


def test_saved_head_is_what_speculators_and_vllm_read(trained, tmp_path):
    import torch
    from safetensors.torch import load_file
    from speculators.models.peagle import PEagleDraftModel
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    head_dir, model_dir, tiny, _ = trained
    loaded = PEagleDraftModel.from_pretrained(str(head_dir))
    state = loaded.state_dict()
    saved = load_file(str(head_dir / "model.safetensors"))
    for name, tensor in saved.items():
        assert name in state and state[name].shape == tensor.shape, name
    assert torch.equal(state["mask_hidden"], saved["mask_hidden"])
    config = json.loads((head_dir / "config.json").read_text())
    target = ModelConfig(
        model=str(model_dir), dtype="float32", skip_tokenizer_init=True,
        max_model_len=256,
    )  # fmt: skip
    cfg = SpeculativeConfig(
        method="eagle3",
        parallel_drafting=True,
        model=str(head_dir),
        num_speculative_tokens=K,
        target_model_config=target,
        target_parallel_config=ParallelConfig(),
    )
    assert cfg.draft_model_config.architectures == ["PeagleLlamaForCausalLM"]
    assert cfg.draft_model_config.hf_config.pard_token == config["mask_token_id"]
    assert config["mask_token_id"] == tiny.vocab_size - 1
