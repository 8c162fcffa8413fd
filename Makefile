# sessionflow: `make demo` runs the product on the embedded default, `make test` runs the suite.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CHROMIUM := /usr/bin/chromium

.PHONY: install test test-fast lint demo bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Three processes on two cores: much of a test's time is spent waiting on Temporal, a worker
# process or a timer (about 15 minutes here with three; four are no faster: the suite is
# CPU-bound on two cores, 1.7 cores busy on average).
# Every test is independent (its own store, schema or database, task queue and ports).
TEST_JOBS ?= 3

test: $(STAMP) $(CHROMIUM)
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist worksteal $(PYTEST_ARGS)

# Everything but the slow fault-injection tests (marked ``fault``), for the edit-test loop.
test-fast: $(STAMP) $(CHROMIUM)
	$(PY) -m pytest -q -n $(TEST_JOBS) -m "not fault" $(PYTEST_ARGS)

# The live page's test drives Debian's Chromium (never a downloaded browser).
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else \
		echo "The page test needs Debian's Chromium: sudo apt-get update && sudo apt-get install -y chromium" >&2; \
		exit 1; \
	fi

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

demo: $(STAMP)
	$(VENV)/bin/sessionflow demo $(ARGS)

# The drain benchmark runs on SQLite, and on PostgreSQL too when a server is named
# (BENCH_POSTGRES_URL, by default the test suite's SESSIONFLOW_TEST_POSTGRES_URL).
BENCH_POSTGRES_URL ?= $(SESSIONFLOW_TEST_POSTGRES_URL)
bench: $(STAMP)
	$(PY) bench/store.py
	$(PY) bench/drain.py --database sqlite $(if $(BENCH_POSTGRES_URL),--database $(BENCH_POSTGRES_URL))
	$(if $(BENCH_POSTGRES_URL),SESSIONFLOW_BENCH_POSTGRES_URL=$(BENCH_POSTGRES_URL)) $(PY) bench/api.py
	$(PY) bench/writes.py $(if $(BENCH_POSTGRES_URL),--database $(BENCH_POSTGRES_URL))
	$(PY) bench/long_session.py
	$(PY) bench/mcp.py
	$(PY) bench/subagents.py --database sqlite $(if $(BENCH_POSTGRES_URL),--database $(BENCH_POSTGRES_URL))
	$(PY) bench/operator.py --database sqlite $(if $(BENCH_POSTGRES_URL),--database $(BENCH_POSTGRES_URL))
	$(PY) bench/faults.py --database sqlite $(if $(BENCH_POSTGRES_URL),--database $(BENCH_POSTGRES_URL))
	$(PY) bench/worker_faults.py --database sqlite $(if $(BENCH_POSTGRES_URL),--database $(BENCH_POSTGRES_URL))
	$(PY) bench/hosts.py --database sqlite $(if $(BENCH_POSTGRES_URL),--database $(BENCH_POSTGRES_URL))
	$(PY) bench/governor.py --database sqlite $(if $(BENCH_POSTGRES_URL),--database $(BENCH_POSTGRES_URL))
	$(PY) bench/rewind.py --database sqlite $(if $(BENCH_POSTGRES_URL),--database $(BENCH_POSTGRES_URL))

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .sessionflow
