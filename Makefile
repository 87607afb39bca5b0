# Two commands, each doing its own set-up on a fresh machine:
#   make run    the main job on the embedded default (local Ray head, CPU, offline corpus)
#   make test   the test suite (what CI runs)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.memprism-installed

# Ray and Hugging Face settings for every entry point: no usage reporting, no hub access.
# `make run` starts its head with Ray token auth (a fresh token, printed, kept outside the
# checkout); `make run RAY_AUTH_MODE=disabled` turns it off. Tests run without auth (their
# Ray instances listen on 127.0.0.1 only).
export RAY_USAGE_STATS_ENABLED := 0
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export HF_HUB_DISABLE_PROGRESS_BARS := 1
export TRANSFORMERS_VERBOSITY := error

.PHONY: run test test-baselines setup lint bench clean-venv

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "==> installing memprism-ray and its pinned dependencies into $(VENV) (first run: a few minutes)"
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[dev]"
	@touch $(STAMP)

setup: $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check .

# Two pytest workers: the suite's long tests wait on Ray start-ups and whole jobs more than
# they compute, so one core idles while a single process runs them (issue 40 item 9); each
# worker takes whole modules, the cluster and job modules first (tests/conftest.py).
PYTEST_WORKERS ?= 2
test: export RAY_AUTH_MODE := disabled
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations 25

# The external memory baselines' tests (docs/baselines.md) in their own venv: the `baselines`
# extra lowers some transitive packages (huggingface-hub, protobuf), so the main venv and CI
# stay without it. First run: about 6 minutes of install on 2 cores.
BVENV := .venv-baselines
BSTAMP := $(BVENV)/.memprism-installed
$(BSTAMP): pyproject.toml
	@test -x $(BVENV)/bin/python || $(PYTHON) -m venv $(BVENV)
	@echo "==> installing memprism-ray with the baselines extra into $(BVENV)"
	$(BVENV)/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev,baselines]"
	@touch $(BSTAMP)

test-baselines: export RAY_AUTH_MODE := disabled
test-baselines: $(BSTAMP)
	$(BVENV)/bin/python -m pytest tests/baselines tests/render/test_flat_history.py

run: $(STAMP)
	$(PY) scripts/run_local.py $(if $(filter disabled,$(RAY_AUTH_MODE)),--no-auth,)

clean-venv:
	rm -rf $(VENV) $(BVENV)
