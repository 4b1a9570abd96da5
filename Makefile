# The two commands a newcomer needs:  make demo  and  make test.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PIP    := $(PY) -m pip install --disable-pip-version-check -q
# The oldest Python eventop runs on; pyproject.toml (requires-python) and eventop/__init__.py
# say the same, and a test keeps the three equal.
MIN_PYTHON := 3.11
# make lock resolves with uv, this exact version.
UV_VERSION := 0.13.8
# Options of python -m demo, e.g. make demo DEMO_ARGS=--keep-running
DEMO_ARGS ?=

.PHONY: demo test lint bench cluster-test clean lock

# "ok", or what $(PYTHON) is instead. Expanded only when the virtualenv is (re)made.
python_check = $(shell $(PYTHON) -c 'import sys; want = tuple(map(int, "$(MIN_PYTHON)".split("."))); print("ok" if sys.version_info[:2] >= want else "Python %d.%d.%d" % sys.version_info[:3])' 2>/dev/null || echo "not found")

# An old Python is refused before anything is made (pip would fail half-way, on a dependency
# that needs a newer one); a failed install removes the half-made virtualenv.
$(STAMP): requirements.txt pyproject.toml
	$(if $(filter ok,$(python_check)),,$(error eventop needs Python $(MIN_PYTHON) or newer, but $(PYTHON) is $(python_check): run make with PYTHON set to a newer one, e.g. make PYTHON=python3.12 $(or $(MAKECMDGOALS),test)))
	$(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements.txt || { rm -rf $(VENV); exit 1; }
	$(PIP) --no-deps -e . || { rm -rf $(VENV); exit 1; }
	touch $(STAMP)

## Run the whole pipeline on an embedded local API server (DEMO_ARGS=--cluster: on your cluster).
demo: $(STAMP)
	$(PY) -m demo $(DEMO_ARGS)

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

## Pin requirements.txt again: the newest versions pyproject.toml allows, transitive ones included.
lock: $(STAMP)
	$(PIP) uv==$(UV_VERSION)
	$(PY) -m uv pip compile -q --no-header --no-annotate --python-version $(MIN_PYTHON) \
		pyproject.toml -o $(VENV)/lock-runtime.txt
	$(PY) -m uv pip compile -q --no-header --no-annotate --python-version $(MIN_PYTHON) \
		pyproject.toml --extra testing --extra dev -c $(VENV)/lock-runtime.txt \
		-o $(VENV)/lock-all.txt
	{ echo "# Every dependency pinned, transitive ones included (regenerate: make lock)."; \
	  echo "# --- runtime (installed in the image) ---"; \
	  cat $(VENV)/lock-runtime.txt; \
	  echo "# --- test and development: make test, make demo (not installed in the image) ---"; \
	  grep -vxFf $(VENV)/lock-runtime.txt $(VENV)/lock-all.txt; } > requirements.txt

## Remove the virtualenv and the caches (make test or make demo makes them again).
clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build eventop.egg-info
