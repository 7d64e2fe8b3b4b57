# Both entry points bootstrap .venv from nothing: torch's CPU build first (an unpinned torch
# would pull a multi-GB CUDA build), then the project with every extra the tests use.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast crds bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[operator,pipelines,test]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tlt demo

test: $(STAMP)
	$(PY) -m pytest -q tests

test-fast: $(STAMP)
	$(PY) -m pytest -q tests -m "not slow"

crds: $(STAMP)
	$(VENV)/bin/tlt crd --out crds/tlt.dev_tltrainingruns.yaml

bench: $(STAMP)
	$(VENV)/bin/tlt bench engine --json bench-engine.json

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
