# The two commands a newcomer needs:  make demo  and  make test.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench cluster-test clean

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	$(PY) -m pip install --disable-pip-version-check -q --no-deps -e .
	touch $(STAMP)

## Run the whole pipeline: local API server (or $$KUBECONFIG), router under gunicorn, watcher, examples.
demo: $(STAMP)
	$(PY) -m demo

## Run the default test suite (no cluster needed) and the linter.
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest

## Same scenarios against a real cluster: EVENTOP_TEST_KUBECONFIG=~/.kube/config make cluster-test
cluster-test: $(STAMP)
	$(PY) -m pytest -m cluster

lint: $(STAMP)
	$(PY) -m ruff check .

## Benchmarks print figures; they assert nothing.
bench: $(STAMP)
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
