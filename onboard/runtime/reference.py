"""The accuracy oracle: the model run by transformers, in float32.

transformers' own class when it knows the config's ``model_type``; otherwise the
generated Hugging Face reference (``configuration_*.py``, ``modeling_*.py``): the
checkpoint's own (config.json ``auto_map``), else ``GEN_DIR/hf``, else generated from
the spec now, loaded with ``trust_remote_code`` from an overlay directory so that the
user's checkpoint is never modified.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onboard.reference.overlay import ReferenceUnavailable, overlay_with_remote_code
from onboard.runtime.compare import TOP_K, GreedyOutput
from onboard.spec.model import ModelSpec

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "tokenizer_config.json",
)
# Prompts are cut to this many tokens so that prompt + continuation fit the engine.
MAX_PROMPT_TOKENS = 64


@dataclass
class Reference:
    model: object  # a transformers PreTrainedModel
    description: str
    kind: str  # "transformers" or "generated-hf"


def load_reference(
    model_dir: Path, spec: ModelSpec, hf_dir: Path | None, work_dir: Path
) -> Reference:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from onboard.reference.prove import auto_class

    config = json.loads((model_dir / "config.json").read_text())
    model_type = config.get("model_type")
    if model_type in CONFIG_MAPPING:
        source, kind, remote = model_dir, "transformers", False
    elif "auto_map" in config:
        # The checkpoint carries its reference code (`install_reference`).
        source, kind, remote = model_dir, "generated-hf", True
    else:
        source = overlay_with_remote_code(model_dir, spec, hf_dir, config, work_dir)
        kind, remote = "generated-hf", True
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its load report: ours is below
    try:
        # Mistral-4's transformers class is registered under another auto class.
        auto = AutoModelForCausalLM if remote else auto_class(model_type)
        model, info = auto.from_pretrained(
            source,
            dtype=torch.float32,
            trust_remote_code=remote,
            output_loading_info=True,
            # transformers' reference math: SDPA drops what it cannot express
            # (Gemma-2's attention soft-capping).
            **({} if remote else {"attn_implementation": "eager"}),
        )
    except Exception as exc:  # any loading failure: report it, do not crash
        raise ReferenceUnavailable(
            f"the reference ({kind}) failed to load {model_dir}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    finally:
        transformers.logging.set_verbosity(verbosity)
    model.eval()
    cls = type(model)
    name = f"{cls.__module__}.{cls.__qualname__}"
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        # Randomly initialised parameters would make a meaningless oracle.
        unexpected = sorted(info.get("unexpected_keys") or [])
        raise ReferenceUnavailable(
            f"{name} found no checkpoint tensor for {len(missing)} parameters "
            f"({', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}); "
            f"checkpoint tensors it did not use: {len(unexpected)} "
            f"({', '.join(unexpected[:8])}{' ...' if len(unexpected) > 8 else ''})"
        )
    if kind == "transformers":
        description = f"transformers {transformers.__version__} {name}"
    else:
        description = f"generated Hugging Face reference {name} (trust_remote_code)"
        # A renamed family's reference (onboard.reference.modular) is
        # transformers' own class underneath: say which.
        family = next(
            (
                f"{k.__module__}.{k.__qualname__}"
                for k in type(model).__mro__[1:]
                if k.__module__.startswith("transformers.models.")
            ),
            None,
        )
        if family is not None and not type(model).__module__.startswith(
            "transformers.models."
        ):
            description += f", a subclass of transformers {transformers.__version__} "
            description += family
    return Reference(model, description, kind)


def tokenize_prompts(
    model_dir: Path, prompts: tuple[str, ...], vocab_size: int
) -> tuple[list[list[int]], str]:
    """Token ids of the prompts with the checkpoint's tokenizer, and a note.

    A checkpoint without a tokenizer (e.g. bare random weights) gets fixed
    pseudo-random ids instead, which compare the models just as well."""
    if any((model_dir / name).exists() for name in TOKENIZER_FILES):
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
        except Exception as exc:
            note = f"tokenizer failed to load ({type(exc).__name__}: {exc}); "
        else:
            ids = [tokenizer(p).input_ids[:MAX_PROMPT_TOKENS] for p in prompts]
            if all(ids) and max(max(i) for i in ids) < vocab_size:
                return ids, f"{len(prompts)} bundled prompts, checkpoint tokenizer"
            note = "tokenizer ids exceed the model's vocabulary; "
    else:
        note = "no tokenizer in the checkpoint; "
    rng = np.random.default_rng(0)
    ids = [
        rng.integers(0, vocab_size, size=int(rng.integers(8, 24))).tolist()
        for _ in prompts
    ]
    return ids, note + f"{len(prompts)} fixed pseudo-random token-id prompts"


def run_reference(
    model, prompt_ids: list[int], max_new_tokens: int, k: int = TOP_K
) -> tuple[np.ndarray, GreedyOutput]:
    """Prompt log-softmax (row j predicts token j + 1) and the greedy continuation
    with its top-k logprobs, from one prefill plus cached decode steps."""
    import torch

    with torch.inference_mode():
        ids = torch.tensor([prompt_ids])
        out = model(input_ids=ids, use_cache=True)
        logprobs = torch.log_softmax(out.logits[0].float(), dim=-1)
        prompt_lp = logprobs[:-1].numpy().copy()
        step_lp = logprobs[-1]
        past = out.past_key_values
        tokens: list[int] = []
        tops: list[dict[int, float]] = []
        for step in range(max_new_tokens):
            values, indices = torch.topk(step_lp, k)
            tops.append(dict(zip(indices.tolist(), values.tolist(), strict=True)))
            token = int(torch.argmax(step_lp))
            tokens.append(token)
            if step + 1 == max_new_tokens:
                break
            out = model(
                input_ids=torch.tensor([[token]]), past_key_values=past, use_cache=True
            )
            past = out.past_key_values
            step_lp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
    return prompt_lp, GreedyOutput(tokens, tops)
