# Each target creates .venv on first use and installs the project into it: `make demo` the
# core only (CORE), the others the test stack and every extra (STAMP, which includes the core).
# Either order works on one .venv.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
CORE := $(VENV)/.installed-core
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench audit lock clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(CORE): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e .
	touch $(CORE)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP) $(CORE)

demo: $(CORE)
	$(VENV)/bin/bide demo
	@echo "bide is installed in $(VENV)/bin: run \`. $(VENV)/bin/activate\` to have it on your PATH"

lint: $(STAMP)
	$(VENV)/bin/ruff format --check daemon eventlog replay tests
	$(VENV)/bin/ruff check daemon eventlog replay tests
	$(VENV)/bin/mypy --strict daemon eventlog replay tests

test: lint
	$(VENV)/bin/pytest

bench: $(STAMP)
	$(PY) -m tests.bench

# The locks pin the daemon's dependencies with hashes (deploy/README.md installs from them);
# the audit checks every pinned release against the advisories PyPI serves (CI runs it).
LOCKS := deploy/requirements.lock deploy/requirements-extras.lock
LOCK_FLAGS := --generate-hashes --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
	--index-url https://pypi.org/simple --custom-compile-command 'make lock'

audit: $(STAMP)
	$(PY) -m tests.supply.audit $(LOCKS)

lock: $(STAMP)
	$(PY) -m pip install --quiet uv
	$(VENV)/bin/uv pip compile pyproject.toml $(LOCK_FLAGS) -o deploy/requirements.lock
	$(VENV)/bin/uv pip compile pyproject.toml --extra mcp --extra postgres --extra aws $(LOCK_FLAGS) \
		-o deploy/requirements-extras.lock

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
