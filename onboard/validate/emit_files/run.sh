#!/usr/bin/env bash
# Validation run written by `onboard validate MODEL --spec SPEC --target T --emit DIR`.
# Run it on the target machine from anywhere: `bash DIR/run.sh` (every phase), or
# `bash DIR/run.sh PHASE...` with the phases below. Results land in DIR/results/;
# bring DIR back and run `onboard validate --target T --ingest DIR --out OUT`.
#
# Phases: install | serve:VARIANT | model-class:VARIANT | stop | accuracy |
#         lm-eval | bench:VARIANT | scrape:VARIANT | reference | env | proxy | all
# Emitted with --disaggregate P:D (PD_SPLIT in manifest.env): the prefill and the
# decode side each run `ROLE=prefill|decode NIXL_HOST=<this node's IP> bash
# run.sh serve` on their head node (in the foreground; a side spanning several
# nodes starts its Ray cluster first, see manifest.json pd_layout), then
# `PREFILL_HOST=.. DECODE_HOST=.. bash run.sh proxy` (vLLM's NIXL proxy on
# PORT; PROXY_SCRIPT, else fetched from PD_PROXY_URL), then the other phases
# with BASE_URL=http://<proxy host>:PORT.
# Overrides (environment): BASE_URL (use a running server: serve/stop do nothing),
# SKIP_INSTALL=1, CONCURRENCY="1 4 16 64", LM_EVAL_TASKS, LM_EVAL_INCLUDE (a
# directory of lm-eval task yamls), LM_EVAL_LIMIT, LM_EVAL_NUM_FEWSHOT, REF_DTYPE,
# REF_DEVICE, PYTHON, PORT, IN_TREE=1 (serve vLLM's own class instead of the
# generated plugin), BENCH_INPUT_LEN, BENCH_OUTPUT_LEN, BENCH_PROMPTS_PER_SLOT,
# BENCH_MIN_PROMPTS.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=/dev/null
source "$HERE/manifest.env"

PYTHON="${PYTHON:-python3}"
PORT="${PORT:-8000}"
CONCURRENCY="${CONCURRENCY:-$CONCURRENCY_DEFAULT}"
LM_EVAL_TASKS="${LM_EVAL_TASKS:-$LM_EVAL_TASKS_DEFAULT}"
REF_DTYPE="${REF_DTYPE:-$REF_DTYPE_DEFAULT}"
LM_EVAL_FEWSHOT="${LM_EVAL_NUM_FEWSHOT:-$LM_EVAL_FEWSHOT}"
INPUT_LEN="${BENCH_INPUT_LEN:-$INPUT_LEN}"
OUTPUT_LEN="${BENCH_OUTPUT_LEN:-$OUTPUT_LEN}"
PROMPTS_PER_SLOT="${BENCH_PROMPTS_PER_SLOT:-$PROMPTS_PER_SLOT}"
MIN_PROMPTS="${BENCH_MIN_PROMPTS:-$MIN_PROMPTS}"
RESULTS="$HERE/results"
mkdir -p "$RESULTS"
URL="${BASE_URL:-http://127.0.0.1:$PORT}"
SERVER_PID=""

log() { printf '[onboard %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

export_target_env() {
    local kv
    for kv in "${TARGET_ENV[@]}"; do
        export "${kv?}"
    done
    if [[ "${IN_TREE:-0}" == 1 ]]; then
        export VLLM_PLUGINS=""
    elif [[ -n "$PLUGIN_ENTRY_POINT" ]]; then
        export VLLM_PLUGINS="$PLUGIN_ENTRY_POINT"
    fi
}

phase_install() {
    if [[ "${SKIP_INSTALL:-0}" == 1 ]]; then
        log "install: skipped (SKIP_INSTALL=1)"
        return
    fi
    log "install: $INSTALL_CMD"
    eval "$INSTALL_CMD"
    "$PYTHON" -m pip install "$LM_EVAL_PACKAGE" "transformers" "accelerate"
    if [[ -d "$HERE/plugin" ]]; then
        "$PYTHON" -m pip install "$HERE/plugin"
    fi
}

phase_env() {
    {
        echo "{"
        echo "  \"target\": \"$TARGET\","
        echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
        echo "  \"host\": \"$(hostname)\","
        echo "  \"vllm\": \"$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null || echo unknown)\""
        echo "}"
    } >"$RESULTS/environment.json"
    (nvidia-smi || rocm-smi || true) >"$RESULTS/devices.txt" 2>&1
}

variant_flags() {
    # The speculative config of a variant (baseline: none).
    local variant="$1" name
    name="SPEC_CONFIG_${variant//[-:]/_}"
    if [[ "$variant" != baseline ]]; then
        printf '%s\n' --speculative-config "${!name}"
    fi
}

phase_serve() {
    local variant="${1:-baseline}"
    if [[ -n "${BASE_URL:-}" ]]; then
        log "serve: using $BASE_URL"
        return
    fi
    export_target_env
    local extra=()
    mapfile -t extra < <(variant_flags "$variant")
    # The model-class phase asks every worker which class it built: a worker
    # extension (onboard_probe.py, one added method) and vLLM's /collective_rpc,
    # which only dev mode serves.
    extra+=(--worker-extension-cls onboard_probe.ModelClassProbe)
    if [[ -n "${PD_SPLIT:-}" ]]; then
        serve_pd_side "${extra[@]}"
    fi
    log "serve $variant: vllm serve $MODEL ${SERVE_FLAGS[*]} ${extra[*]}"
    PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" VLLM_SERVER_DEV_MODE=1 \
        vllm serve "$MODEL" "${SERVE_FLAGS[@]}" "${extra[@]}" --port "$PORT" \
        >"$RESULTS/server-$variant.log" 2>&1 &
    SERVER_PID=$!
    local waited=0
    until curl -sf "$URL/health" >/dev/null; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            log "vllm serve exited; see $RESULTS/server-$variant.log"
            tail -n 30 "$RESULTS/server-$variant.log" >&2
            exit 1
        fi
        sleep 5
        waited=$((waited + 5))
        if ((waited > 3600)); then
            log "vllm serve not ready after an hour"
            exit 1
        fi
    done
    log "serve $variant: ready after ${waited} s"
}

# One side of the prefill/decode layout, in the foreground (see the header).
serve_pd_side() {
    local flags=() port
    case "${ROLE:-}" in
        prefill) flags=("${PD_PREFILL_FLAGS[@]}") port="$PD_PREFILL_PORT" ;;
        decode) flags=("${PD_DECODE_FLAGS[@]}") port="$PD_DECODE_PORT" ;;
        *)
            log "serve: this run is disaggregated ($PD_SPLIT prefill:decode nodes);" \
                "set ROLE=prefill or ROLE=decode (and NIXL_HOST), or BASE_URL"
            exit 2
            ;;
    esac
    if [[ -z "${NIXL_HOST:-}" ]]; then
        log "serve $ROLE: set NIXL_HOST to this node's IP (NIXL's side channel)"
        exit 2
    fi
    log "serve $ROLE: vllm serve $MODEL ${flags[*]} $* --port $port"
    PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" VLLM_SERVER_DEV_MODE=1 \
        VLLM_NIXL_SIDE_CHANNEL_HOST="$NIXL_HOST" \
        exec vllm serve "$MODEL" "${flags[@]}" "$@" --port "$port"
}

phase_proxy() {
    if [[ -z "${PD_SPLIT:-}" ]]; then
        log "proxy: this run was emitted without --disaggregate"
        exit 2
    fi
    if [[ -z "${PREFILL_HOST:-}" || -z "${DECODE_HOST:-}" ]]; then
        log "proxy: set PREFILL_HOST and DECODE_HOST (the sides' head nodes)"
        exit 2
    fi
    local script="${PROXY_SCRIPT:-$HERE/toy_proxy_server.py}"
    if [[ ! -f "$script" ]]; then
        log "proxy: fetching $PD_PROXY_URL"
        curl -sfL "$PD_PROXY_URL" -o "$script"
    fi
    log "proxy: port $PORT -> prefill $PREFILL_HOST:$PD_PREFILL_PORT," \
        "decode $DECODE_HOST:$PD_DECODE_PORT"
    exec "$PYTHON" "$script" --port "$PORT" --host 0.0.0.0 \
        --prefiller-hosts "$PREFILL_HOST" --prefiller-ports "$PD_PREFILL_PORT" \
        --decoder-hosts "$DECODE_HOST" --decoder-ports "$PD_DECODE_PORT"
}

phase_stop() {
    if [[ -n "$SERVER_PID" ]]; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
    fi
}
trap phase_stop EXIT

phase_model_class() {
    local variant="${1:-baseline}"
    log "model-class $variant: the class vLLM instantiated ($URL/collective_rpc)"
    # Not fatal: a server started without the probe (BASE_URL) still benchmarks.
    "$PYTHON" "$HERE/onboard_probe.py" --base-url "$URL" \
        --out "$RESULTS/model-class-$variant.json" ||
        log "model-class $variant: no answer (serve with onboard_probe, see run.sh)"
}

phase_accuracy() {
    log "accuracy: vLLM's prompt logprobs and greedy continuations"
    "$PYTHON" "$HERE/accuracy_client.py" --manifest "$HERE/manifest.json" \
        --base-url "$URL" --out "$RESULTS/vllm_accuracy.json"
}

phase_lm_eval() {
    log "lm-eval: $LM_EVAL_TASKS"
    local args=(--model local-completions
        --model_args "model=$MODEL,base_url=$URL/v1/completions,num_concurrent=8,max_retries=3,tokenized_requests=False"
        --tasks "$LM_EVAL_TASKS" --num_fewshot "$LM_EVAL_FEWSHOT" --batch_size 1
        --output_path "$RESULTS/lm_eval" --seed 0)
    if [[ -n "${LM_EVAL_INCLUDE:-}" ]]; then
        args+=(--include_path "$LM_EVAL_INCLUDE")
    fi
    if [[ -n "${LM_EVAL_LIMIT:-}" ]]; then
        args+=(--limit "$LM_EVAL_LIMIT")
    fi
    "$PYTHON" -m lm_eval "${args[@]}"
}

phase_bench() {
    local variant="${1:-baseline}" c n
    mkdir -p "$RESULTS/bench/$variant"
    # /metrics around each level: the engine's own TTFT/TPOT per level (ingest
    # takes the differences; the server may have answered other phases before).
    curl -sf "$URL/metrics" >"$RESULTS/bench/$variant/metrics-before.prom" || true
    for c in $CONCURRENCY; do
        n=$((c * PROMPTS_PER_SLOT))
        ((n < MIN_PROMPTS)) && n=$MIN_PROMPTS
        log "bench $variant: concurrency $c, $n prompts"
        vllm bench serve --backend vllm --base-url "$URL" --model "$MODEL" \
            --dataset-name random --random-input-len "$INPUT_LEN" \
            --random-output-len "$OUTPUT_LEN" --num-prompts "$n" \
            --max-concurrency "$c" --num-warmups 1 --temperature 0 --seed 0 \
            --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 \
            --disable-tqdm --save-result --result-dir "$RESULTS/bench/$variant" \
            --result-filename "bench-c$c.json"
        curl -sf "$URL/metrics" >"$RESULTS/bench/$variant/metrics-c$c.prom" || true
    done
}

phase_scrape() {
    local variant="${1:-baseline}"
    log "scrape $variant: $URL/metrics"
    curl -sf "$URL/metrics" >"$RESULTS/metrics-$variant.prom"
}

phase_reference() {
    log "reference: Hugging Face model at the tokens vLLM reported ($REF_DTYPE)"
    "$PYTHON" "$HERE/reference_logprobs.py" --manifest "$HERE/manifest.json" \
        --vllm "$RESULTS/vllm_accuracy.json" --dtype "$REF_DTYPE" \
        --out "$RESULTS/reference_accuracy.json"
}

phase_all() {
    phase_install
    phase_env
    local variant
    for variant in "${VARIANTS[@]}"; do
        phase_serve "$variant"
        phase_model_class "$variant"
        if [[ "$variant" == baseline ]]; then
            phase_accuracy
            phase_lm_eval
        fi
        phase_bench "$variant"
        phase_scrape "$variant"
        phase_stop
    done
    # After the server has freed the devices: the reference needs them.
    phase_reference
}

main() {
    local phases=("$@") p name arg
    ((${#phases[@]})) || phases=(all)
    for p in "${phases[@]}"; do
        name="${p%%:*}"
        arg=""
        [[ "$p" == *:* ]] && arg="${p#*:}"
        case "$name" in
            install | env | stop | accuracy | reference | proxy | all) "phase_$name" ;;
            lm-eval) phase_lm_eval ;;
            serve | bench | scrape) "phase_$name" "${arg:-baseline}" ;;
            model-class) phase_model_class "${arg:-baseline}" ;;
            *)
                log "unknown phase $p"
                exit 2
                ;;
        esac
    done
}

main "$@"
