#!/usr/bin/env bash
# lm-eval end to end on the H200 (issue 41): --model asyncbackends with engines="auto" against lm-eval's own vllm
# model, the MMLU shape, both eager; and lm-eval with a model that answers at once (--ceiling: lm-eval's own
# work, the most any model could gain). Two device calls, back to back, from the repository root:
#   call 1, carry [".vp/s1"]:                          mkdir -p /tmp/parts && cp .vp/s1/site.part-0 /tmp/parts/
#   call 2, carry [".vp/s2", ".lmw", "<model dir>"]:   MODEL=<model dir> bash benchmarks/gpu/gpu_lm_eval_scoring.sh
# .vp/s1 and .vp/s2 come from benchmarks/gpu/gpu_bundle.sh; .lmw holds lm-eval's wheels and those the GPU image
# lacks (pip download lm_eval==0.4.13 and its pure-Python dependencies); the model directory is a 1b-shaped one
# from gpu_workload.py's build_model (config and tokenizer only: load_format dummy). Work files go under $OUT,
# so a run cut by its time limit still tells start-up from scoring.
set -u
nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9  # a cut run's engine cores
[ -d /tmp/site/vllm ] || bash .vp/s2/install.sh > "$OUT/install.log" 2>&1 || { tail -5 "$OUT/install.log"; exit 10; }
[ -d /tmp/lm/lm_eval ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/lm .lmw/*.whl || exit 11
export PYTHONPATH=/tmp/site:/tmp/lm:$PWD PATH=/tmp/site/bin:$PATH VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TMPDIR=$OUT/lmrun
mkdir -p "$TMPDIR"
OPTS='{"load_format": "dummy", "dtype": "bfloat16", "max_model_len": 4096, "seed": 1234, "enforce_eager": true}'
setsid timeout "${LIMIT:-520}" python3 benchmarks/integrations/lm_eval_scoring.py --model "$PWD/$MODEL" \
    --options "$OPTS" --ours-options "${OURS:-{\"engines\": \"auto\"\}}" --tasks score_mmlu \
    --mmlu "${MMLU:-200}" --rounds "${ROUNDS:-2}" --ceiling \
    > "$OUT/lm_eval_scoring.txt" 2> "$OUT/lm_eval_scoring.log" &
wait $!
echo "lm_eval_scoring exit $?"
cat "$OUT/lm_eval_scoring.txt"
for f in "$TMPDIR"/lm-eval-scoring-*/round*.log; do
    echo "== $f"
    grep -E "built in|score_mmlu [0-9]|Error" "$f" | tail -8
done
