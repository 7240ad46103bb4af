#!/usr/bin/env bash
# Issue 51's sweep on the H200: 4 LoRA adapters x lm-eval's two local tasks, one engine serving all four
# (ours) against one lm-eval `vllm` run per adapter with lora_local_path and batch_size auto (how users
# sweep today), fresh processes, per-sample comparison (benchmarks/integrations/lora_sweep.py).
# STAGED, NOT YET RUN: no device was lent in the session that wrote it (2026-12-05).
# Two device calls, back to back, from the repository root:
#   call 1, carry [".vp/s1"]:                          mkdir -p /tmp/parts && cp .vp/s1/site.part-0 /tmp/parts/
#   call 2, carry [".vp/s2", ".lmw", "<model dir>"]:   MODEL=<model dir> bash benchmarks/gpu/gpu_lora_sweep.sh
# .vp/s1 and .vp/s2 come from benchmarks/gpu/gpu_bundle.sh; .lmw holds the wheels of
# benchmarks/gpu/gpu_lm_eval_scoring.sh (lm-eval 0.4.13 and its pure-Python dependencies) plus peft and
# accelerate (`pip download --no-deps peft==0.21.2 accelerate==1.16.0 -d .lmw`), with which lora_sweep.py builds its
# random adapters for the model's shapes on the GPU machine (build_tiny_lora: a model of the config's shape,
# no weights read). The model directory is a 1b-shaped one from gpu_workload.py's build_model (config and
# tokenizer only): both sides load it with load_format dummy, whose weights vLLM draws from a fixed seed, so
# both run the same weights. float32, so that batches of other shapes on the two sides still give the same
# scores to 1e-4. Work files go under $OUT, so a run cut by its time limit still shows how far it went.
set -u
nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9  # a cut run's engine cores
[ -d /tmp/site/vllm ] || bash .vp/s2/install.sh > "$OUT/install.log" 2>&1 || { tail -5 "$OUT/install.log"; exit 10; }
[ -d /tmp/lm/lm_eval ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/lm .lmw/*.whl || exit 11
python3 -c "import sys; sys.path[:0] = ['/tmp/lm']; import peft" 2>/dev/null || { echo "no peft in .lmw"; exit 12; }
export PYTHONPATH=/tmp/site:/tmp/lm:$PWD PATH=/tmp/site/bin:$PATH VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TMPDIR=$OUT/lmrun ASYNCBACKENDS_CACHE_DIR=/tmp/abcache
mkdir -p "$TMPDIR" /tmp/abcache
OPTS='{"load_format": "dummy", "dtype": "float32", "max_model_len": 4096, "seed": 1234, "enforce_eager": true}'
setsid timeout "${LIMIT:-540}" python3 benchmarks/integrations/lora_sweep.py --model "$PWD/$MODEL" \
    --options "$OPTS" --batch-size auto --adapters "${ADAPTERS:-4}" --mc "${MC:-200}" --gen "${GEN:-200}" \
    --rounds "${ROUNDS:-1}" > "$OUT/lora_sweep.txt" 2> "$OUT/lora_sweep.log" &
wait $!
echo "lora_sweep exit $?"
cat "$OUT/lora_sweep.txt"
tail -20 "$OUT/lora_sweep.log"
