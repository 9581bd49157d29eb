# Everything a fresh machine needs, then the job. `make demo` and `make test` do all set-up.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# Pinned and installed first: an unpinned torch would pull gigabytes of CUDA wheels.
TORCH  ?= torch==2.13.0

.PHONY: setup lint test test-unit demo bench clean

setup: $(VENV)/.ready

$(VENV)/.ready: pyproject.toml scripts/system-deps.sh
	bash scripts/system-deps.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,lab]'
	touch $@

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Two workers: the lab tests one after another on one lab, the unit tests beside them
# (tests/conftest.py), the 30 slowest tests named at the end. `pytest` alone runs everything in one process.
test: lint
	$(PY) -m pytest -n 2 --dist loadgroup --durations=30

test-unit: setup
	$(PY) -m pytest -m 'not lab'

demo: setup
	bash scripts/demo.sh $(PY)

bench: setup
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
