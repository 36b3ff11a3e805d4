"""NVFP4 activation calibration: the model's own forward, one decoder layer at a time.

The reference model is the transformers class named by the checkpoint's config.json
(built on the meta device: no weights). Calibration runs the bundled text
(:mod:`onboard.quantize.calibration_text`, tokenized with the checkpoint's own
tokenizer; fixed pseudo-random token ids when it has none) as ``NUM_SAMPLES``
sequences of ``SEQ_LEN`` tokens through it, one decoder layer at a time: a layer's
weights are read from the checkpoint, the layer runs on every sample, and it is
freed before the next. Only one decoder layer is resident, whatever the model size.

Recorded per quantized Linear: the largest absolute value of its input, from which
compressed-tensors' ``generate_gparam`` makes the ``input_global_scale`` (as
llm-compressor's static min-max observer does). Routed experts are calibrated on
every token (llm-compressor's ``calibrate_all_experts``): their gate/up input is the
MoE block's input, and each expert's down_proj input is computed from its own
weights, so no expert is left without a scale however the router picks.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from onboard.arch import ArchPlan, build_plan
from onboard.errors import InputError
from onboard.quantize import st_io
from onboard.quantize.selection import Selection
from onboard.spec.model import ModelSpec

NUM_SAMPLES = 16
SEQ_LEN = 128
BATCH = 4  # samples per forward: bounds activation memory


def calibration_ids(model_dir: Path, vocab: int, samples: int, seq_len: int):
    """``samples`` x ``seq_len`` token ids of the bundled text (or fixed ids).

    The text's tokens, repeated as needed, cut into consecutive windows.
    """
    from onboard.quantize.calibration_text import TEXT

    tok_path = Path(model_dir) / "tokenizer.json"
    ids: list[int] = []
    if tok_path.is_file():
        from tokenizers import Tokenizer

        ids = Tokenizer.from_file(str(tok_path)).encode(TEXT).ids
        ids = [i for i in ids if 0 <= i < vocab]
    if len(ids) < 16:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (samples * seq_len,), generator=g).tolist()
    need = samples * seq_len
    ids = (ids * math.ceil(need / len(ids)))[:need]
    return torch.tensor(ids, dtype=torch.long).view(samples, seq_len)


class _Reader:
    """Tensors of the checkpoint by name (one pread each)."""

    def __init__(self, selection: Selection):
        self.selection = selection
        self.infos = {t.name: (s.name, t) for s in selection.shards for t in s.tensors}

    def has(self, name: str) -> bool:
        return name in self.infos

    def get(self, name: str) -> torch.Tensor:
        import os

        shard, info = self.infos[name]
        fd = os.open(self.selection.model_dir / shard, os.O_RDONLY)
        try:
            return st_io.read_tensor(fd, info)
        finally:
            os.close(fd)


def _knows_model_type(selection: Selection) -> bool:
    from onboard.spec.hf import transformers_knows

    config = json.loads((selection.model_dir / "config.json").read_text())
    return transformers_knows(config.get("model_type", ""))


def _reference(selection: Selection):
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(selection.model_dir)
        with torch.device("meta"):
            try:
                model = AutoModelForCausalLM.from_config(
                    config, dtype=torch.float32, attn_implementation="sdpa"
                )
            except ValueError:
                # A family without an SDPA path (gpt-oss: its attention sinks).
                model = AutoModelForCausalLM.from_config(
                    config, dtype=torch.float32, attn_implementation="eager"
                )
    except (ValueError, KeyError, OSError) as exc:
        raise InputError(
            f"{selection.model_dir}: nvfp4 calibration needs the reference model, and "
            f"transformers cannot build it from config.json: {exc}"
        ) from None
    return config, model


def _materialize(
    module: torch.nn.Module, prefix: str, reader: _Reader, arch: ArchPlan, layer
):
    """Load ``module``'s weights from the checkpoint (fused experts assembled)."""
    module.to_empty(device="cpu")
    state = {}
    for name, p in list(module.named_parameters()) + list(module.named_buffers()):
        full = f"{prefix}.{name}"
        fused = arch.moe is not None and arch.moe.stacked and p.ndim == 3
        if reader.has(full):
            state[name] = reader.get(full).to(p.dtype)
        elif fused and name.endswith(("gate_up_proj", "down_proj")):
            # The checkpoint's stacked experts (checkpoint.fused: experts).
            role = "experts_gate_up_proj" if "gate_up" in name else "experts_down_proj"
            stacked = arch.tensors.checkpoint_name(role, layer) + ".weight"
            state[name] = reader.get(stacked).to(p.dtype)
        elif name.endswith("gate_up_proj") and p.ndim == 3:
            state[name] = torch.stack(
                [
                    torch.cat(
                        [
                            reader.get(_expert(arch, "expert_gate_proj", layer, e)),
                            reader.get(_expert(arch, "expert_up_proj", layer, e)),
                        ]
                    )
                    for e in range(p.shape[0])
                ]
            ).to(p.dtype)
        elif name.endswith("down_proj") and p.ndim == 3:
            state[name] = torch.stack(
                [
                    reader.get(_expert(arch, "expert_down_proj", layer, e))
                    for e in range(p.shape[0])
                ]
            ).to(p.dtype)
        else:
            raise InputError(
                f"{plan_dir(reader)}: calibration: reference parameter {full} has "
                "no tensor in the checkpoint (does the spec's layout match?)"
            )
    module.load_state_dict(state, strict=True)


def plan_dir(reader: _Reader):
    return reader.selection.model_dir


def _expert(arch: ArchPlan, role: str, layer: int, expert: int) -> str:
    return arch.tensors.checkpoint_name(role, layer, expert) + ".weight"


@torch.no_grad()
def calibrate(
    selection: Selection,
    spec: ModelSpec,
    samples: int = NUM_SAMPLES,
    seq_len: int = SEQ_LEN,
    log: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Input absmax of every quantized module, by module name."""
    from transformers.masking_utils import (
        create_causal_mask,
        create_sliding_window_causal_mask,
    )

    log = log or (lambda msg: None)
    arch = build_plan(spec)
    if not _knows_model_type(selection):
        return _calibrate_generated_reference(selection, arch, samples, seq_len, log)
    config, model = _reference(selection)
    reader = _Reader(selection)
    inner = model.model
    wanted = {q.module for q in selection.quantized.values()}
    stats: dict[str, float] = {}

    embed_path = arch.tensors.checkpoint_name("embed")
    _materialize(inner.embed_tokens, embed_path, reader, arch, None)
    ids = calibration_ids(selection.model_dir, config.vocab_size, samples, seq_len)
    hidden = inner.embed_tokens(ids)
    inner.embed_tokens.to_empty(device="meta")
    log(f"calibrating on {samples} samples x {seq_len} tokens, layer by layer")

    rotary = type(inner.rotary_emb)(config=config)
    position_ids = torch.arange(seq_len).unsqueeze(0)
    batch0 = hidden[:BATCH]
    position_embeddings = rotary(batch0, position_ids)
    masks = {
        "full_attention": create_causal_mask(
            config=config,
            inputs_embeds=batch0,
            attention_mask=None,
            past_key_values=None,
            position_ids=position_ids,
        )
    }
    if getattr(config, "sliding_window", None):
        masks["sliding_attention"] = create_sliding_window_causal_mask(
            config=config,
            inputs_embeds=batch0,
            attention_mask=None,
            past_key_values=None,
            position_ids=position_ids,
        )
    layer_types = getattr(config, "layer_types", None)

    for i, layer in enumerate(inner.layers[: config.num_hidden_layers]):
        prefix = f"model.layers.{i}"
        _materialize(layer, f"{prefix}", reader, arch, i)
        hooks, moe_inputs = _attach(layer, prefix, wanted, stats)
        mask = masks[layer_types[i]] if layer_types else masks["full_attention"]
        outs = []
        for b in range(0, samples, BATCH):
            x = hidden[b : b + BATCH]
            outs.append(
                layer(
                    x,
                    attention_mask=mask,
                    position_ids=position_ids,
                    position_embeddings=position_embeddings,
                )
            )
        hidden = torch.cat([o[0] if isinstance(o, tuple) else o for o in outs])
        for h in hooks:
            h.remove()
        for experts, xs in moe_inputs.items():
            if not (arch.moe and arch.moe.stacked):  # stacked experts stay 16-bit
                _expert_stats(experts, torch.cat(xs), arch, i, config, stats)
        layer.to_empty(device="meta")

    _refuse_missing(
        selection.model_dir,
        wanted,
        stats,
        "the reference model has no module for",
        " (the spec's layout and the transformers class disagree)",
    )
    return {m: stats[m] for m in sorted(stats)}


def _attach(layer, prefix, wanted, stats):
    hooks = []
    moe_inputs: dict[torch.nn.Module, list[torch.Tensor]] = {}

    def record(name):
        def hook(_module, args):
            a = float(args[0].abs().amax())
            stats[name] = max(stats.get(name, 0.0), a)

        return hook

    def capture(module):
        def hook(_module, args):
            moe_inputs[module].append(args[0].reshape(-1, args[0].shape[-1]))

        return hook

    for name, module in layer.named_modules():
        full = f"{prefix}.{name}" if name else prefix
        if isinstance(module, torch.nn.Linear) and full in wanted:
            hooks.append(module.register_forward_pre_hook(record(full)))
        gate_up = getattr(module, "gate_up_proj", None)
        if isinstance(gate_up, torch.nn.Parameter) and gate_up.ndim == 3:
            moe_inputs[module] = []
            hooks.append(module.register_forward_pre_hook(capture(module)))
    return hooks, moe_inputs


def _expert_stats(experts, x, arch: ArchPlan, layer, config, stats) -> None:
    """Every expert on every token: gate/up input is x, down input is act(g) * u."""
    from transformers.activations import ACT2FN

    act = ACT2FN[config.hidden_act]
    a_in = float(x.abs().amax())
    for e in range(experts.gate_up_proj.shape[0]):
        gate, up = torch.nn.functional.linear(x, experts.gate_up_proj[e]).chunk(2, -1)
        a_down = float((act(gate) * up).abs().amax())
        for role, a in (
            ("expert_gate_proj", a_in),
            ("expert_up_proj", a_in),
            ("expert_down_proj", a_down),
        ):
            name = arch.tensors.checkpoint_name(role, layer, e)
            stats[name] = max(stats.get(name, 0.0), a)


def _calibrate_generated_reference(
    selection: Selection,
    arch: ArchPlan,
    samples: int,
    seq_len: int,
    log: Callable[[str], None],
) -> dict[str, float]:
    """Calibration through onboard's generated Hugging Face reference, for a model
    type transformers does not know. That code has no per-layer entry point with
    transformers' calling convention, so the model runs whole: this path needs the
    checkpoint to fit in memory (a launch's real model has its own reference code
    by then; the tiny checkpoints always fit)."""
    from transformers import AutoModelForCausalLM

    from onboard.reference.overlay import overlay_with_remote_code

    config = json.loads((selection.model_dir / "config.json").read_text())
    wanted = {q.module for q in selection.quantized.values()}
    stats: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="onboard-calibrate-") as tmp:
        # The standalone reference: its modules carry the checkpoint's names,
        # which the hooks below find (a renamed family's modular reference
        # would carry the family's).
        overlay = overlay_with_remote_code(
            selection.model_dir, arch.spec, None, config, Path(tmp), standalone=True
        )
        model = AutoModelForCausalLM.from_pretrained(
            overlay, dtype=torch.float32, trust_remote_code=True
        )
    model.eval()
    hooks = _attach_generated(model, arch, wanted, stats)
    ids = calibration_ids(selection.model_dir, config["vocab_size"], samples, seq_len)
    log(f"calibrating on {samples} samples x {seq_len} tokens (generated reference)")
    with torch.no_grad():
        for b in range(0, samples, BATCH):
            model(input_ids=ids[b : b + BATCH], use_cache=False)
    for hook in hooks:
        hook.remove()
    _refuse_missing(
        selection.model_dir, wanted, stats, "the generated reference ran no module for"
    )
    return {m: stats[m] for m in sorted(stats)}


def _attach_generated(model, arch: ArchPlan, wanted: set[str], stats: dict) -> list:
    """Input-absmax hooks on every wanted Linear; every routed expert also runs on
    every token its MoE block sees (as `_expert_stats` does for transformers)."""
    hooks = []

    def record(name):
        def hook(_module, args):
            stats[name] = max(stats.get(name, 0.0), float(args[0].abs().amax()))

        return hook

    def all_experts(experts):
        def hook(_module, args):
            x = args[0].reshape(-1, args[0].shape[-1])
            for expert in experts:
                expert(x)  # its Linear hooks record the inputs

        return hook

    modules = dict(model.named_modules())
    for name, module in modules.items():
        if isinstance(module, torch.nn.Linear) and name in wanted:
            hooks.append(module.register_forward_pre_hook(record(name)))
    # The experts' ModuleList sits where the spec's layout puts routed experts
    # (stacked experts stay 16-bit: nothing to calibrate).
    if arch.has_moe and not (arch.moe and arch.moe.stacked):
        experts_path = arch.tensors.checkpoint["expert_gate_proj"].split(".{expert}")[0]
        pattern = re.compile(re.escape(experts_path).replace(r"\{layer\}", r"\d+"))
        for name, module in modules.items():
            parent = name.rsplit(".", 1)[0]
            if pattern.fullmatch(name) and parent in modules:
                hook = all_experts(module)
                hooks.append(modules[parent].register_forward_pre_hook(hook))
    return hooks


def _refuse_missing(
    model_dir: Path, wanted: set[str], stats: dict, what: str, why: str = ""
) -> None:
    """InputError naming the first modules of ``wanted`` that calibration never
    saw (their statistics absent from ``stats``)."""
    missing = sorted(m for m in wanted if m not in stats)
    if missing:
        more = " ..." if len(missing) > 5 else ""
        raise InputError(
            f"{model_dir}: calibration: {what} {', '.join(missing[:5])}{more}{why}"
        )
