# Each target creates .venv on first use and installs the project into it.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench audit lock clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/bide demo

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
