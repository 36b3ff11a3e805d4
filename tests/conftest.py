"""Fixtures and helpers the test modules share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def dense_tiny(tmp: Path):
    """The dense-gqa spec's tiny checkpoint in ``tmp``/tiny (seed 0) and its
    spec: the verifier the draft-training tests train on."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.spec import load_spec

    spec = load_spec(ROOT / "model_specs" / "dense-gqa.yaml")
    model_dir = write_tiny_checkpoint(spec, tmp / "tiny", seed=0)
    return model_dir, load_spec(model_dir / "spec.yaml")


def changed_copy(draft: Path, out: Path, change) -> Path:
    """A copy of the saved ``draft`` in ``out`` whose tensors ``change(tensors,
    config)`` altered in place (a fault of the same shapes and names)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True)
    for name in ("config.json", "training.json"):
        shutil.copy(draft / name, out / name)
    tensors = load_file(draft / "model.safetensors")
    change(tensors, json.loads((draft / "config.json").read_text()))
    save_file(tensors, str(out / "model.safetensors"))
    return out


def stage_trained_check(tmp: Path, method: str, k: int, no_steps: tuple, faults):
    """The dense-gqa tiny checkpoint in ``tmp``, the ``method`` draft the
    speculators stage trains for it (the prior alone: ``no_steps`` is the
    (module, name) of the steps' budget, set to 0 here; the steps do not raise
    held-out acceptance, docs/speculators.md) and the ``spec-decode:<method>``
    check on vLLM's engine; each of ``faults`` (name: ``make(draft, out)``, a
    faulty copy) replayed on the check's prompts as vLLM would count it
    (``dflash_train.replay_acceptance``). Returns (check, replays by name, the
    draft's directory)."""
    import json

    import yaml
    from rich.console import Console

    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.pipeline import stage_speculators
    from onboard.pipeline.runner import Context
    from onboard.runtime.prompts import PROMPTS
    from onboard.runtime.reference import tokenize_prompts
    from onboard.spec import load_spec
    from onboard.speculators.dflash_train import replay_acceptance
    from onboard.validate import validate

    data = yaml.safe_load((ROOT / "model_specs" / "dense-gqa.yaml").read_text())
    data["speculators"] = [{"method": method, "num_speculative_tokens": k}]
    (tmp / "spec.yaml").write_text(yaml.safe_dump(data))
    spec = load_spec(tmp / "spec.yaml")
    out = tmp / "out"
    bf16 = write_tiny_checkpoint(spec, out / "checkpoints" / "bf16", seed=0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(*no_steps, 0.0)
        stage_speculators.run(
            Context(spec=spec, out=out, full=False, console=Console())
        )
    result = validate(
        bf16,
        bf16 / "spec.yaml",
        "cpu",
        out / "validation",
        checks=f"spec-decode:{method}",
        speculators_dir=out / "speculators",
        log=print,
    )
    check = result.check(f"spec-decode:{method}")
    print(check.details)
    tiny = load_spec(bf16 / "spec.yaml")
    prompts, _ = tokenize_prompts(bf16, PROMPTS, tiny.vocab_size)
    draft = out / "speculators" / "tiny" / method
    replays = {
        name: replay_acceptance(make(draft, tmp / name), bf16, tiny, prompts, k, 32)
        for name, make in faults.items()
    }
    print(json.dumps(replays, indent=2))
    return check, replays, draft


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread: tiny models gain nothing from threads, and on a
    shared 2-core machine OpenMP threads waiting for each other make generate()
    20x slower. Modules use it with ``pytestmark = usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def generated_engine_run(
    spec,
    work: Path,
    *,
    every: int = 1,
    max_tokens: int = 16,
    max_model_len: int = 256,
    standalone: bool = False,
):
    """A tiny checkpoint of ``spec`` through its generated plugin on vLLM's CPU
    engine (the engine options validation gives the spec: dtype, state dtype,
    CPU shims): greedy outputs with top-5 logprobs and prompt logprobs of every
    ``every``-th validation prompt, and the engine's cache report.
    ``standalone``: the whole generated model even where the spec is a family
    vLLM ships (onboard.generate.render_model).

    Returns (spec as the checkpoint has it, checkpoint dir, work dir, prompts,
    engine info, outputs)."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.generate import generate_files, write_trees
    from onboard.runtime.engine import (
        Engine,
        EngineOptions,
        engine_state_options,
        read_plugin,
    )
    from onboard.runtime.prompts import PROMPTS
    from onboard.runtime.reference import tokenize_prompts
    from onboard.spec import load_spec

    ckpt = work / "ckpt"
    write_tiny_checkpoint(spec, ckpt, seed=0)
    spec = load_spec(ckpt / "spec.yaml")
    write_trees(generate_files(spec, standalone), work / "gen")
    prompts, _ = tokenize_prompts(ckpt, PROMPTS, spec.vocab_size)
    prompts = prompts[::every]
    options = EngineOptions(
        model_dir=ckpt,
        plugin=read_plugin(work / "gen" / "plugin"),
        max_model_len=max_model_len,
        **engine_state_options(spec),
    )
    engine = Engine(options, work / "engine", work / "engine.log")
    engine.start()
    try:
        info = engine.wait_ready()
        reply = engine.generate(
            prompts,
            temperature=0.0,
            max_tokens=max_tokens,
            logprobs=5,
            prompt_logprobs=5,
            ignore_eos=True,
        )
    finally:
        engine.close()
    return spec, ckpt, work, prompts, info, reply["outputs"]


def installed_plugin_env(site: Path, spec, work: Path) -> dict[str, str]:
    """The environment of a vLLM process that finds a generated plugin
    pip-installed into ``site`` as a user's vLLM would (every plugin on the
    path loads), lets it serve an architecture vLLM has in-tree (as a user opts
    in), and installs onboard's CPU shims for ``spec`` as validation does."""
    from onboard.runtime import compat
    from onboard.runtime.engine import compat_plugin, plugin_site
    from onboard.spec.naming import OVERRIDE_ENV

    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # apply_model / collective_rpc send a function to the engine process.
        "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
        OVERRIDE_ENV: "all",
    }
    env.pop("VLLM_PLUGINS", None)
    paths = [str(site)]
    shims = compat.shims_for(spec)
    if shims:
        paths += [str(plugin_site(compat_plugin(), work / "compat-site")), str(ROOT)]
        env[compat.ENV] = ",".join(shims)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def judge_engine_outputs(outputs, reference_model, prompts, max_tokens: int = 16):
    """The accuracy check's verdict (float32 tolerance) on a generated_engine_run's
    engine outputs against ``reference_model`` run on the same prompts."""
    from onboard.runtime.compare import GreedyOutput, judge_accuracy
    from onboard.runtime.reference import run_reference

    ref = [run_reference(reference_model, p, max_tokens) for p in prompts]
    return judge_accuracy(
        [o["prompt_logprobs"] for o in outputs],
        [lp for lp, _ in ref],
        [GreedyOutput(o["token_ids"], o["logprobs"]) for o in outputs],
        [g for _, g in ref],
    )
