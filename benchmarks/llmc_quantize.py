"""Quantize a checkpoint with llm-compressor (run with .venv-llmc/bin/python).

    llmc_quantize.py MODEL_DIR OUT_DIR SCHEME {model_free,oneshot} [IGNORE_JSON]

SCHEME is onboard's name (fp8-dynamic, fp8-block, nvfp4, nvfp4a16, mxfp4, w4a16,
w4a16-asym, w8a8-int8), mapped
to the same compressed-tensors preset. IGNORE_JSON is a JSON list of module names
(or ``re:`` patterns) to leave unquantized. ``model_free`` is llm-compressor's
``model_free_ptq`` (safetensors in, safetensors out, no model class);
``oneshot`` loads the transformers model, calibrates on token ids (for nvfp4) and
saves with ``save_pretrained(save_compressed=True)``. Used by the interoperability
test and the benchmark; it lives here because it must run in llm-compressor's own
virtualenv, which cannot hold vLLM.
"""

import json
import sys
from pathlib import Path

# onboard's calibration samples (pure Python + tokenizers), so both tools see the
# same tokens; onboard itself is not installed in this virtualenv.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PRESETS = {
    "fp8-dynamic": "FP8_DYNAMIC",
    "fp8-block": "FP8_BLOCK",
    "nvfp4": "NVFP4",
    "nvfp4a16": "NVFP4A16",
    "mxfp4": "MXFP4",
    "w4a16": "W4A16",
    "w4a16-asym": "W4A16_ASYM",
    "w8a8-int8": "W8A8",
}


def main() -> None:
    model_dir, out_dir, scheme, method = sys.argv[1:5]
    ignore = json.loads(sys.argv[5]) if len(sys.argv) > 5 else []
    preset = PRESETS[scheme]
    if method == "model_free":
        from llmcompressor import model_free_ptq

        model_free_ptq(model_dir, out_dir, scheme=preset, ignore=ignore, max_workers=2)
        return
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    recipe = QuantizationModifier(targets="Linear", scheme=preset, ignore=ignore)
    kwargs = {}
    if preset == "NVFP4":
        from datasets import Dataset

        from onboard.quantize.calibrate import NUM_SAMPLES, SEQ_LEN, calibration_ids

        ids = calibration_ids(model_dir, model.config.vocab_size, NUM_SAMPLES, SEQ_LEN)
        kwargs = dict(
            dataset=Dataset.from_dict(
                {
                    "input_ids": ids.tolist(),
                    "attention_mask": [[1] * SEQ_LEN] * NUM_SAMPLES,
                }
            ),
            num_calibration_samples=NUM_SAMPLES,
            max_seq_length=SEQ_LEN,
        )
    oneshot(model=model, recipe=recipe, **kwargs)
    model.save_pretrained(out_dir, save_compressed=True)


if __name__ == "__main__":
    main()
