"""The training recipe of a draft head for the real (full-size) model.

A shell script of ``speculators`` commands — data preparation, hidden-state
extraction from a vLLM server (offline, to files), training (offline from those
files, or online with the server generating hidden states on demand) — with the
sizes that follow from the spec: the verifier layers to extract, the bytes each
training token costs on disk, the head's size, the draft vocabulary.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from onboard.spec.model import ModelSpec
from onboard.speculators.heads import (
    EAGLE_METHODS,
    NUM_LAYERS,
    aux_layer_ids,
    draft_vocab_size,
    mask_token_id,
    speculators_type,
)

# Training data defaults: speculators' own (seq length 8192) and a dataset of the
# size its examples use; both are variables in the script.
SEQ_LENGTH = 8192
NUM_SAMPLES = 20000
HIDDEN_BYTES = 2  # bf16 hidden states on disk


def head_parameters(head: dict[str, Any]) -> int:
    """Trainable parameters of a head (embeddings and output head are the
    verifier's, frozen)."""
    layer = head["transformer_layer_config"]
    h, inter = layer["hidden_size"], layer["intermediate_size"]
    q = layer["num_attention_heads"] * layer["head_dim"]
    kv = layer["num_key_value_heads"] * layer["head_dim"]
    n_aux = len(
        head.get("eagle_aux_hidden_state_layer_ids")
        or head.get("aux_hidden_state_layer_ids")
        or []
    )
    target = head.get("target_hidden_size") or h
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * inter
    # An EAGLE layer's attention reads [embedding, fc(states)]: twice as wide.
    eagle = head["speculators_model_type"] in ("eagle3", "peagle")
    first_extra = h * (q + 2 * kv) if eagle else 0
    return n_aux * target * h + layer["num_hidden_layers"] * per_layer + first_extra


def sizes(spec: ModelSpec, head: dict[str, Any]) -> dict[str, Any]:
    aux = aux_layer_ids(spec.num_hidden_layers)
    extract = sorted({*aux, spec.num_hidden_layers})  # + the last layer's output
    per_token = len(extract) * spec.hidden_size * HIDDEN_BYTES
    seq = min(SEQ_LENGTH, spec.max_position_embeddings)
    return {
        "aux_layer_ids": aux,
        "extract_layer_ids": extract,
        "hidden_state_bytes_per_token": per_token,
        "seq_length": seq,
        "num_samples": NUM_SAMPLES,
        "hidden_state_storage_gib_at_full_length": round(
            per_token * seq * NUM_SAMPLES / 2**30, 1
        ),
        "draft_vocab_size": draft_vocab_size(spec),
        "head_layers": head["transformer_layer_config"]["num_hidden_layers"],
        "head_trainable_parameters": head_parameters(head),
    }


def recipe_script(spec: ModelSpec, method: str, k: int, head: dict[str, Any]) -> str:
    """The shell recipe that trains ``method``'s head for the full-size model.

    It saves the head into its own directory (found when it runs, so no path is
    written into it), where the speculative config expects it. Every value it
    interpolates is shell-quoted."""
    q = shlex.quote
    s = sizes(spec, head)
    verifier = spec.base_checkpoint or "PATH/TO/VERIFIER"
    layer_ids = " ".join(q(str(i)) for i in s["aux_layer_ids"])
    extract_cfg = json.dumps(
        {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {
                "hf_config": {
                    "eagle_aux_hidden_state_layer_ids": s["extract_layer_ids"]
                }
            },
        }
    )
    connector = json.dumps(
        {
            "kv_connector": "ExampleHiddenStatesConnector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": "hs-cache"},
        }
    )
    train_flags = [
        f"--speculator-type {q(speculators_type(method))}",
        '--verifier-name-or-path "$VERIFIER"',
        '--data-path "$WORK/data"',
        f"--target-layer-ids {layer_ids}",
        f"--num-layers {q(str(NUM_LAYERS[method]))}",
        f"--draft-arch {q('llama' if method in EAGLE_METHODS else 'qwen3')}",
        '--total-seq-len "$SEQ_LENGTH"',
        '--save-path "$HEAD_DIR"',
    ]
    mask = f"--mask-token-id {q(str(mask_token_id(spec)))}"
    if method == "eagle3":
        train_flags += [
            f"--draft-vocab-size {q(str(s['draft_vocab_size']))}",
            f"--ttt-steps {q(str(k))}",
        ]
    elif method == "p_eagle":
        # P-EAGLE trains k parallel depths (speculators' PEagleArgs.num_depths).
        train_flags += [
            f"--draft-vocab-size {q(str(s['draft_vocab_size']))}",
            f"--num-depths {q(str(k))}",
            mask,
        ]
    else:
        block = k if method == "dspark" else k + 1
        train_flags += [f"--block-size {q(str(block))}", mask]
    flags = " \\\n  ".join(train_flags)
    return f"""#!/usr/bin/env bash
# Train the {method} draft head of {spec.name} ({spec.architecture}) with speculators.
# Written by `onboard speculators`; sizes derived from the spec:
#   verifier layers read by the head (vLLM ids): {s["aux_layer_ids"]}
#   layers extracted (+ the last, for the training targets): {s["extract_layer_ids"]}
#   hidden states on disk: {s["hidden_state_bytes_per_token"]} bytes per token (bf16);
#     {s["num_samples"]} samples x {s["seq_length"]} tokens is at most \
{s["hidden_state_storage_gib_at_full_length"]} GiB
#   head: {s["head_layers"]} decoder layer(s), \
{s["head_trainable_parameters"]:,} trainable parameters
#   draft vocabulary: {s["draft_vocab_size"]} of {spec.vocab_size} tokens (d2t/t2d
#     mapping built by `speculators train` from the token frequencies)
# Needs GPUs that hold the verifier; set TP to their count.
set -euo pipefail
# The head's directory (this script's): the speculative config reads it from there.
HEAD_DIR="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
VERIFIER=${{VERIFIER:-{q(verifier)}}}
DATASET=${{DATASET:-sharegpt}}
WORK=${{WORK:-{q(f"./work-{method}")}}}
TP=${{TP:-8}}
SEQ_LENGTH=${{SEQ_LENGTH:-{q(str(s["seq_length"]))}}}
PORT=${{PORT:-8000}}
mkdir -p "$WORK"

# 1. Serve the verifier (chat rendering for prepare-data, and the hidden states).
vllm serve "$VERIFIER" --port "$PORT" --tensor-parallel-size "$TP" \\
  --max-model-len "$SEQ_LENGTH" \\
  --speculative-config {q(extract_cfg)} \\
  --kv-transfer-config {q(connector)} &
SERVER=$!
trap 'kill $SERVER' EXIT
until curl -sf "http://localhost:$PORT/health" >/dev/null; do sleep 10; done

# 2. Tokenize the dataset with the verifier's chat template; token frequencies for
#    the reduced draft vocabulary.
speculators prepare-data --model "$VERIFIER" --data "$DATASET" \\
  --output "$WORK/data" --seq-length "$SEQ_LENGTH" \\
  --max-samples {q(str(s["num_samples"]))} --render-endpoint "http://localhost:$PORT"

# 3a. Offline: extract the hidden states to files, then train from them.
speculators generate-offline-data --model "$VERIFIER" \\
  --endpoint "http://localhost:$PORT" --preprocessed-data "$WORK/data" \\
  --output "$WORK/data/hidden_states"
speculators train \\
  {flags}

# 3b. Online instead (no files up front): let training ask the server for the
#     hidden states it misses:
#   speculators train ... --on-missing generate --vllm-endpoint http://localhost:$PORT

# 4. Serve with the trained head:
#   vllm serve "$VERIFIER" \\
#     --speculative-config "$(cat speculative-config.{method}.json)"
"""
