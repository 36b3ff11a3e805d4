"""A DFlash draft trained by onboard, on vLLM's CPU engine (the dense-gqa tiny).

One fixture does the work: the speculators stage trains the draft on the tiny
checkpoint (data collection and the prior, about 25 s), `validate` runs the
`spec-decode:dflash` check (the main engine without speculation and one engine
with the draft), and one more engine serves a copy of the draft with a subtle
fault (its value projection's rows permuted: the same tensors, shapes and
statistics, loaded without complaint). The held-out prompts are the accuracy
check's, never used in training. Three engine starts: part of `make test`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.pipeline import stage_speculators
from onboard.pipeline.runner import Context
from onboard.spec import load_spec
from onboard.speculators.acceptance import run_with_speculation

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.engine]
K = 3


def permute_value_rows(draft: Path, out: Path) -> Path:
    """A copy of ``draft`` whose first layer's v_proj rows are permuted."""
    import torch
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True)
    shutil.copy(draft / "config.json", out / "config.json")
    tensors = load_file(draft / "model.safetensors")
    name = "layers.0.self_attn.v_proj.weight"
    gen = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(tensors[name]), generator=gen)
    tensors[name] = tensors[name][perm].contiguous()
    save_file(tensors, str(out / "model.safetensors"))
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from onboard.runtime.prompts import PROMPTS
    from onboard.runtime.reference import tokenize_prompts
    from onboard.validate import validate

    tmp = tmp_path_factory.mktemp("dflash")
    data = yaml.safe_load((ROOT / "model_specs" / "dense-gqa.yaml").read_text())
    data["speculators"] = [{"method": "dflash", "num_speculative_tokens": K}]
    (tmp / "spec.yaml").write_text(yaml.safe_dump(data))
    spec = load_spec(tmp / "spec.yaml")
    out = tmp / "out"
    bf16 = write_tiny_checkpoint(spec, out / "checkpoints" / "bf16", seed=0)
    with pytest.MonkeyPatch.context() as patch:
        # The prior alone (the gradient steps do not raise held-out acceptance,
        # docs/speculators.md): the stage's 30 s of steps stay out of `make test`.
        patch.setattr(stage_speculators, "DFLASH_BUDGET_S", 0.0)
        stage_speculators.run(
            Context(spec=spec, out=out, full=False, console=Console())
        )
    draft = out / "speculators" / "tiny" / "dflash"
    result = validate(
        bf16,
        bf16 / "spec.yaml",
        "cpu",
        out / "validation",
        checks="spec-decode:dflash",
        speculators_dir=out / "speculators",
        log=print,
    )
    check = result.check("spec-decode:dflash")
    print(check.details)
    faulty = permute_value_rows(draft, tmp / "faulty")
    vocab = load_spec(bf16 / "spec.yaml").vocab_size
    prompts, _ = tokenize_prompts(bf16, PROMPTS, vocab)
    faulty_run = run_with_speculation(
        bf16,
        {"method": "dflash", "model": str(faulty), "num_speculative_tokens": K},
        prompts,
        tmp / "engine-faulty",
    )
    faulty_run.pop("outputs")
    print(json.dumps(faulty_run, indent=2))
    training = json.loads((draft / "training.json").read_text())
    return check, faulty_run, training


def test_vllm_serves_the_trained_draft_losslessly(run):
    check, _, _ = run
    assert check.status == "passed", check.details
    m = check.metrics
    assert m["drafter"]["draft_model_class"].endswith("DFlashQwen3ForCausalLM")
    # k drafted tokens at every verification step.
    assert m["num_drafts"] > 50 and m["num_draft_tokens"] == K * m["num_drafts"]
    # Greedy output with the draft equals the output without, token for token.
    assert m["lossless"]["identical"] == m["lossless"]["prompts"], m["lossless"]


def test_drafts_are_accepted_on_held_out_prompts(run):
    # Measured (docs/speculators.md): 0.43, 0.41, 0.38 per position, mean
    # acceptance length 2.22 on the accuracy check's prompts.
    check, _, training = run
    m = check.metrics
    assert m["mean_acceptance_length"] > 1.5, check.details
    assert m["acceptance_rate_per_position"][0] > 0.25
    # The kept draft was chosen on validation prompts, scored as vLLM drafts.
    assert training["validation_decoded_kept"]["mean_acceptance_length"] > 1.4


def test_the_plain_torch_copy_predicts_vllm_exactly(run):
    # dflash_train's draft module, replayed over the reference's greedy
    # continuations as vLLM drafts, gives vLLM's own counters: the same drafts
    # and the same accepted tokens at every position (measured: 172 drafts,
    # 74 / 70 / 65 accepted).
    check, _, _ = run
    m = check.metrics
    replay = m["dflash_replay"]
    assert replay["num_drafts"] == m["num_drafts"]
    accepted = [round(r * m["num_drafts"]) for r in m["acceptance_rate_per_position"]]
    assert replay["num_accepted_tokens_per_pos"] == accepted


def test_a_permuted_weight_is_caught(run):
    # The same draft with one tensor's rows permuted loads and runs, and its
    # drafts are (almost) never accepted: the acceptance figure is not vacuous.
    check, faulty, _ = run
    assert faulty["num_drafts"] > 50
    assert faulty["mean_acceptance_length"] < 1.1, faulty
    assert (
        check.metrics["mean_acceptance_length"]
        >= faulty["mean_acceptance_length"] + 0.5
    )
