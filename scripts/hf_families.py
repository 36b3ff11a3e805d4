"""Which transformers families `onboard spec from-hf` proves: the table of
docs/hf-mapping.md.

For every causal-LM model type of the installed transformers, its config class's
defaults are shrunk to a few-second model (the sizes below, set where the class
has the key) and inferred and proven as `spec from-hf` does
(onboard.reference.infer); a proven spec is generated as well. With
``--validate`` each proven family also runs `onboard validate --checks accuracy`
on the CPU engine, on a tiny checkpoint transformers wrote (minutes per family).

    .venv/bin/python scripts/hf_families.py                  # print the table
    .venv/bin/python scripts/hf_families.py --write          # into the docs
    .venv/bin/python scripts/hf_families.py --only glm4_moe,olmoe --validate --write

With ``--only``, ``--write`` replaces those families' rows and keeps the others
(validation, minutes per family, can be added a few families at a time).

The time column is the inference and proof in this process (transformers and
torch already imported), on the machine that ran it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "hf-mapping.md"
BEGIN, END = "<!-- families:begin -->", "<!-- families:end -->"

# The shrunk sizes, each set only where the family's config class has the key
# (head_dim 32: vLLM's CPU attention takes multiples of 32), and a few values
# away from a class default that would hide a feature.
SMALL = dict(
    vocab_size=256,
    hidden_size=128,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=4,
    max_position_embeddings=256,
    head_dim=32,
    moe_intermediate_size=64,
    n_routed_experts=16,  # DeepSeek: 8 groups of at least 2
    num_experts=8,
    num_local_experts=8,
    num_experts_per_tok=2,
    num_experts_per_token=2,  # Kimi Linear's name (all 8 would hide the routing)
    moe_topk=2,  # HunYuan-MoE: top-1 routing cannot tell scoring functions apart
    moe_k=2,
    # Linear attention (Qwen3-Next, Qwen3.5): vLLM's CPU Gated DeltaNet prefill
    # kernel takes equal key and value head dims of 64 or 128.
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    # Kimi Linear: one kind of linear-attention head.
    linear_num_heads=2,
    linear_head_dim=64,
    shared_intermediate_size=64,  # Granite-MoE-Shared: its default 0 has none
    # Granite's multipliers (its classes default them to 1): granite-3.0-8b's,
    # the softmax scale 1/head_dim as there, so that each one shows.
    embedding_multiplier=12.0,
    residual_multiplier=0.22,
    logits_scaling=16.0,
    attention_multiplier=1 / 32,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


# Per family: a layer of each kind in the four layers (Kimi Linear's class marks
# every fourth layer after the first full attention: none of four).
FAMILY_SMALL: dict[str, dict] = {
    "kimi_linear": {
        "layer_types": [
            "linear_attention",
            "full_attention",
            "linear_attention",
            "full_attention",
        ]
    },
    # Llama-4's router weighs each expert's input, which vLLM's fused MoE does
    # for top-1 routing only (Llama-4's own).
    "llama4_text": {"num_experts_per_tok": 1},
    # Mistral-4's rope with a short original context, so that its query scaling
    # (llama_4_scaling_beta) grows past 64 tokens; vLLM's yarn rope caches
    # original x factor positions (256), which the validation's tokens fit in.
    "mistral4": {
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "max_position_embeddings": 256,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale_all_dim": 1.0,
            "mscale": 1.0,
            "llama_4_scaling_beta": 0.1,
        }
    },
}


@dataclass
class Row:
    model_type: str
    # proven and validated | proven | proven, not generated | refused | not validated
    status: str
    detail: str
    seconds: float | None = None


def small_config(model_type: str) -> dict:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from onboard.reference.prove import shrink_vision
    from onboard.spec.hf import text_model_type

    cls = CONFIG_MAPPING[model_type]
    declared = cls().to_dict()
    inner = text_model_type(model_type)
    if isinstance(declared.get("text_config"), dict) and inner in CONFIG_MAPPING:
        # A multimodal wrapper: its language model at the sizes below, its vision
        # tower at the proof's.
        config = cls(text_config=small_config(inner))
        shrink_vision(config)
        return config.to_dict()
    small = {k: v for k, v in SMALL.items() if k in declared}
    if "n_shared_experts" in declared and declared["n_shared_experts"] is None:
        small["n_shared_experts"] = 1  # dots1: the class's None does not build
    if declared.get("kv_lora_rank"):  # MLA: as many KV heads as heads
        small["num_key_value_heads"] = small.get("num_attention_heads")
        small.pop("head_dim", None)
        # vLLM's CPU MLA kernel takes only a 576-wide latent (512 + 64 rope dims).
        small.update(kv_lora_rank=512, qk_nope_head_dim=32, qk_rope_head_dim=64)
        small.update(v_head_dim=32)
        if declared.get("q_lora_rank"):
            small["q_lora_rank"] = 64
    small.update(FAMILY_SMALL.get(model_type, {}))
    return cls(**small).to_dict()


def family_types() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    )

    return sorted(t for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if t in CONFIG_MAPPING)


def first_reason(message: str) -> str:
    """The first problem of a refusal, on one line, for a table cell."""
    where = re.search(r"first divergence: (.*?)\. The family", message)
    if where:
        return f"the proof fails; first divergence: {where.group(1)}"
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if lines and lines[0].endswith(":") and len(lines) > 1:
        lines[0] = f"{lines[0]} {lines[1]}"  # transformers' own validation
    bullets = [line.removeprefix("- ") for line in lines if line.startswith("- ")]
    if bullets:
        text = bullets[0]
    else:  # without the file or spec name in front
        text = re.sub(r"^[\w./-]+: ", "", lines[0] if lines else message)
    text = text.replace("|", "\\|")
    return text if len(text) <= 150 else text[:147] + "..."


def run_one(model_type: str, validate: bool, work: Path) -> Row:
    from onboard.arch.config_keys import GenerationError
    from onboard.errors import InputError
    from onboard.pipeline.generate import generate_all
    from onboard.reference.infer import infer_spec
    from onboard.spec.hf import OPEN_CONCEPTS

    try:
        config = small_config(model_type)
    except Exception as exc:  # the class refuses its own defaults at these sizes
        return Row(model_type, "refused", f"no small config: {first_reason(str(exc))}")
    start = time.perf_counter()
    try:
        spec, proof = infer_spec(config, name=model_type.replace("_", "-"))
    except InputError as exc:
        return Row(model_type, "refused", first_reason(str(exc)))
    except Exception as exc:  # transformers' own code on its defaults
        return Row(
            model_type, "refused", f"{type(exc).__name__}: {first_reason(str(exc))}"
        )
    seconds = time.perf_counter() - start
    # What the proof found other than the Llama defaults.
    found = ", ".join(
        f"`{k}: {json.dumps(v)}`"
        for k, v in proof.found.items()
        if k not in OPEN_CONCEPTS or v != OPEN_CONCEPTS[k][0]
    )
    detail = found
    try:
        generate_all(spec, work / model_type / "gen")
    except GenerationError as exc:  # proven, but the vLLM model is not generated
        return Row(model_type, "proven, not generated", first_reason(str(exc)), seconds)
    if not validate:
        return Row(model_type, "proven", detail, seconds)
    ok, why = validate_family(model_type, config, spec, work / model_type)
    return Row(
        model_type,
        "proven and validated" if ok else "proven, not validated",
        detail if ok else why,
        seconds,
    )


def validate_family(
    model_type: str, config: dict, spec, work: Path
) -> tuple[bool, str]:
    """`onboard validate --checks accuracy` on a checkpoint transformers wrote of
    the small config itself (the spec's sizes)."""
    import torch
    from transformers import AutoModelForImageTextToText
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from onboard.reference.prove import auto_class
    from onboard.spec import dump_spec

    tiny = CONFIG_MAPPING[model_type].from_dict(config)  # already small
    torch.manual_seed(0)
    if spec.checkpoint.language_model_prefix is not None:
        # A multimodal wrapper's checkpoint, vision tower and all, as published.
        model = AutoModelForImageTextToText.from_config(tiny, dtype=torch.float32)
    else:
        model = auto_class(model_type).from_config(tiny, dtype=torch.float32)
    text = tiny.get_text_config()
    with torch.no_grad():  # decisive logits (std ~8), as tests/hf_tiny.py writes
        head = model.get_output_embeddings().weight
        # (Granite divides the logits by logits_scaling: the head makes up for it.)
        std = 8.0 * getattr(text, "logits_scaling", 1.0)
        head.normal_(0.0, std / text.hidden_size**0.5)
    ckpt = work / "ckpt"
    model.save_pretrained(ckpt)
    (work / "spec.yaml").write_text(dump_spec(spec))
    onboard = str(Path(sys.executable).with_name("onboard"))
    proc = subprocess.run(
        [onboard, "validate", str(ckpt), "--spec", str(work / "spec.yaml"),
         "--checks", "accuracy", "--out", str(work / "validation")],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    path = work / "validation" / "validation.json"
    if not path.is_file():
        return False, first_reason(proc.stderr or proc.stdout)
    result = json.loads(path.read_text())
    check = next(c for c in result["checks"] if c["name"] == "accuracy")
    engine = check.get("metrics", {}).get("engine_error")
    why = f"the engine's own error: {engine}" if engine else check.get("details", "")
    return check["status"] == "passed", first_reason(why)


def table(rows: list[Row]) -> str:
    import transformers

    statuses = dict.fromkeys(r.status for r in rows)
    counts = ", ".join(f"{sum(r.status == s for r in rows)} {s}" for s in statuses)
    lines = [
        f"transformers {transformers.__version__}: {len(rows)} causal-LM model "
        f"types; {counts}.",
        "",
        "| model_type | status | proof (s) | found by the proof, or why refused |",
        "| --- | --- | --- | --- |",
    ]
    for r in rows:
        seconds = "" if r.seconds is None else f"{r.seconds:.1f}"
        lines.append(f"| {r.model_type} | {r.status} | {seconds} | {r.detail} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated model types")
    parser.add_argument("--validate", action="store_true")
    parser.add_argument("--write", action="store_true", help=f"update {DOC.name}")
    args = parser.parse_args()

    from tqdm import tqdm
    from transformers.utils import logging

    from onboard.spec.hf import quiet_transformers

    logging.disable_progress_bar()
    types = args.only.split(",") if args.only else family_types()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, quiet_transformers():
        for model_type in tqdm(types, desc="families", unit="family"):
            rows.append(run_one(model_type, args.validate, Path(tmp)))
    if args.write:
        doc = DOC.read_text()
        start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
        if args.only:  # the rows run now replace theirs; the others stay
            rows = merged(rows, doc[start:end])
        DOC.write_text(doc[:start] + "\n" + table(rows) + doc[end:])
    print(table(rows))
    return 0


def merged(rows: list[Row], old_table: str) -> list[Row]:
    """The table's rows with ``rows`` in place of their families'."""
    new = {r.model_type: r for r in rows}
    out = []
    for line in old_table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) != 4 or cells[0] in ("model_type", "---"):
            continue
        model_type, status, seconds, detail = cells
        out.append(
            new.pop(model_type, None)
            or Row(model_type, status, detail, float(seconds) if seconds else None)
        )
    return sorted(out + list(new.values()), key=lambda r: r.model_type)


if __name__ == "__main__":
    sys.exit(main())
