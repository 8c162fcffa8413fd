# sessionflow: `make demo` runs the product on the embedded default, `make test` runs the suite.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test lint demo bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

demo: $(STAMP)
	$(VENV)/bin/sessionflow demo

bench: $(STAMP)
	$(PY) bench/store.py
	$(PY) bench/drain.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .sessionflow
