# Two commands do all the set-up: `make serve` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CONFIG ?= config/default.yaml
PYTEST_ARGS ?=
# Test files run on this many processes (a file's tests stay together, so its servers start once).
# Most of a file's time is a worker starting or a request waiting (idle timers, backoffs, health
# polls): on 2 cores, 3 files at once finished the suite in 9:38 where 2 took 10:38 (2026-12-01).
TEST_JOBS ?= 3
# Python writes the bytecode of what it imports, even where the caller's PYTHONDONTWRITEBYTECODE
# says not to: else every process (a worker start, a test process) compiles its imports again.
# Compiling what is imported as it is imported cost ~11 s of CPU for the suite's libraries where
# compiling all of .venv at install cost 62 s (2026-12-02).
unexport PYTHONDONTWRITEBYTECODE
# vllmmlxd and its tests, before the processes that all import them start at once.
COMPILE = $(BIN)/python -m compileall -q
# mypy's cache, kept by content hash, so a new clone checks in seconds what did not change.
MYPY_CACHE = $${XDG_CACHE_HOME:-$$HOME/.cache}/vllmmlxd/mypy

.PHONY: serve test test-fast lint bench clean system-deps clients

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "vllmmlxd needs Python >= 3.11 (found: $$($(PYTHON) --version))"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q uv

# linux-fast brings MKL on Linux x86-64 (a real BLAS for MLX's CPU backend); elsewhere it is empty.
# uv (installed into .venv by pip) resolves as pip does, but downloads and unpacks in parallel: about
# 20 s here where pip takes a minute.
INSTALL = $(BIN)/uv pip install -q --python $(BIN)/python

# mlx-vlm runs vision-language models, at the pin of pyproject's `vision` extra. Installed here without
# its dependencies: those the project needs it has, and the rest (opencv, pyarrow, pandas, scipy,
# datasets, mlx-audio: 620 MB) serve mlx-vlm's video, audio and training code, never image chat.
VISION = $(shell sed -n 's/^vision = \["\(mlx-vlm==[^"]*\)"\]/\1/p' pyproject.toml)

$(VENV)/.runtime: pyproject.toml | $(BIN)/python
	$(INSTALL) -e '.[linux-fast,audio]'
	$(INSTALL) --no-deps '$(VISION)'
	@touch $@

# One install for both (a second run would resolve everything again): the dev extra holds the runtime.
$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(INSTALL) -e '.[dev,linux-fast,audio]'
	$(INSTALL) --no-deps '$(VISION)'
	@touch $(VENV)/.runtime $@

## serve: install into .venv and run the daemon on config/default.yaml (http://127.0.0.1:8000/v1)
serve: $(VENV)/.runtime
	@$(COMPILE) vllmmlxd
	$(BIN)/vllmmlxd run --config $(CONFIG)

## test: install the dev extra into .venv, lint and type-check (fast failures first), then run the whole suite
test: $(VENV)/.dev lint system-deps clients
	@$(COMPILE) vllmmlxd tests
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile $(PYTEST_ARGS)

## lint: ruff (lint and format), mypy and the import contract (lint-imports), configured in pyproject.toml
lint: $(VENV)/.dev
	$(BIN)/ruff check vllmmlxd tests
	$(BIN)/ruff format --check vllmmlxd tests
	$(BIN)/mypy --cache-dir "$(MYPY_CACHE)"
	$(BIN)/lint-imports --no-cache

## test-fast: everything but the tests marked slow
test-fast: $(VENV)/.dev clients
	$(BIN)/python -m pytest -m 'not slow' $(PYTEST_ARGS)

## bench: server vs engine streaming speed, written to docs/benchmarks.md
bench: $(VENV)/.dev
	$(BIN)/python bench/stream_overhead.py --write docs/benchmarks.md

# systemd-analyze checks the unit file, ruby parses the Homebrew formula, the BLAS tests compare MKL with system BLIS and OpenBLAS, and the
# gateway page's test drives a headless Chromium: install Debian's packages where they are missing and we can.
system-deps:
	@missing=""; \
	command -v systemd-analyze >/dev/null 2>&1 || missing="$$missing systemd"; \
	[ "$$(uname)" != Linux ] || ls /usr/lib/*/libopenblas.so.0 /usr/lib/*/openblas-pthread/libopenblas.so.0 2>/dev/null | grep -q . || missing="$$missing libopenblas0-pthread"; \
	[ "$$(uname)" != Linux ] || ls /usr/lib/*/libblis.so.4 /usr/lib/*/blis-pthread/libblis.so.4 2>/dev/null | grep -q . || missing="$$missing libblis4-pthread"; \
	[ "$$(uname)" != Linux ] || command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v ruby >/dev/null 2>&1 || missing="$$missing ruby"; \
	[ "$$(uname)" != Linux ] || command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	if [ -n "$$missing" ] && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian's$$missing"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null) || echo "could not install$$missing; the tests that need them will be skipped"; \
	fi

# The clients the tests run for real, pinned: OpenAI's Codex CLI (npm; the wrapper brings its binary),
# and Ollama's JavaScript library (tests/e2e/test_ollama.py).
CODEX_VERSION = 0.171.0
CODEX := .clients/codex-$(CODEX_VERSION)/node_modules/.bin/codex
OLLAMA_JS_VERSION = 0.6.4
OLLAMA_JS := .clients/ollama-js-$(OLLAMA_JS_VERSION)/node_modules/ollama/package.json
NPM_CHECK = command -v npm >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && echo "installing Debian's npm" && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null; } || { echo "the clients' tests need npm (Node.js)"; exit 1; }
clients: $(CODEX) $(OLLAMA_JS)
$(CODEX):
	@$(NPM_CHECK)
	npm install --silent --no-audit --no-fund --prefix .clients/codex-$(CODEX_VERSION) @openai/codex@$(CODEX_VERSION)
$(OLLAMA_JS):
	@$(NPM_CHECK)
	npm install --silent --no-audit --no-fund --prefix .clients/ollama-js-$(OLLAMA_JS_VERSION) ollama@$(OLLAMA_JS_VERSION)

clean:
	rm -rf .clients $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
