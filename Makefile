# Both entry points bootstrap .venv from nothing: torch's CPU build first (an unpinned torch
# would pull a multi-GB CUDA build), then the project with every extra the tests use.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast crds pipeline bench clean system-deps

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

test: $(STAMP) system-deps
	$(PY) -m pytest -q tests

test-fast: $(STAMP)
	$(PY) -m pytest -q tests -m "not slow"

crds: $(STAMP)
	$(VENV)/bin/tlt crd --out crds/tlt.dev_tltrainingruns.yaml

pipeline: $(STAMP)
	$(PY) -m tlt_components.pipeline

bench: $(STAMP)
	$(VENV)/bin/tlt bench engine --json bench-engine.json

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
