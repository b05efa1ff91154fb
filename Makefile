# Each target creates .venv on first use and installs the project into it.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/bide demo

lint: $(STAMP)
	$(VENV)/bin/ruff check daemon eventlog replay tests
	$(VENV)/bin/mypy --strict daemon eventlog replay tests

test: lint
	$(VENV)/bin/pytest

bench: $(STAMP)
	$(PY) -m tests.bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
