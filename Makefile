# The README's two commands: `make run` and `make test`. Each sets up .venv with python3.12 when missing.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# python3.12 from PATH, or from pyenv when its shim has another version selected.
PYTHON312 ?= $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3.12; do \
	$$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && { echo $$p; break; }; done)

# Exact versions (with hashes) of everything `make` installs: bit-exactness depends on the JAX/XLA release.
# `make lock` re-resolves it from pyproject.toml's bounds (see below).
LOCK := requirements.lock
.PHONY: setup run test check test-interop lint lock bench clean

$(VENV)/.installed: pyproject.toml $(LOCK)
	@test -n "$(PYTHON312)" || { echo "error: python3.12 not found; install Python 3.12 (jax >= 0.11 needs it)"; exit 2; }
	test -x $(PY) || $(PYTHON312) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --require-hashes -r $(LOCK)
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m pip check || { echo "error: $(LOCK) does not satisfy pyproject.toml; run make lock"; exit 2; }
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/fp4lm train configs/default.yaml

test: lint
	$(PY) -m pytest -q -n 2 --dist loadgroup --timeout 900 --durations=15

# The edit loop: lint, then the tests not marked slow (pytest.mark.slow in the test's module); under 5 minutes on 2 cores.
check: lint
	$(PY) -m pytest -q -n 2 --dist loadgroup --timeout 900 -m "not slow"

# fp4lm's exports read by the real consumers (transformers, compressed-tensors), which live in their own
# environment: .venv-interop, Python 3.11 (torch's CPU build), pinned in tests/interop/requirements.txt.
# `make test-interop INTEROP=newest`: the newest releases instead (.venv-interop-newest,
# tests/interop/requirements-newest.txt).
ifeq ($(INTEROP),newest)
INTEROP_VENV := .venv-interop-newest
INTEROP_REQUIREMENTS := tests/interop/requirements-newest.txt
else
INTEROP_VENV := .venv-interop
INTEROP_REQUIREMENTS := tests/interop/requirements.txt
endif

$(INTEROP_VENV)/.installed: $(INTEROP_REQUIREMENTS)
	@command -v python3.11 >/dev/null || { echo "error: python3.11 not found; the interop environment needs it"; exit 2; }
	test -x $(INTEROP_VENV)/bin/python || python3.11 -m venv $(INTEROP_VENV)
	$(INTEROP_VENV)/bin/python -m pip install -q -r $(INTEROP_REQUIREMENTS)
	touch $@

test-interop: setup $(INTEROP_VENV)/.installed
	INTEROP_PYTHON=$(INTEROP_VENV)/bin/python $(PY) -m pytest -q tests/interop -rs

# The row-scaled / 4over6 test vectors, from TransformerEngine's own reference quantizer (plain PyTorch) run in
# the interop environment: TE=<a TransformerEngine checkout at commit d0067d0>.
vectors-nvfp4-options: $(INTEROP_VENV)/.installed
	@test -n "$(TE)" || { echo "error: set TE=<a TransformerEngine checkout (commit d0067d0)>"; exit 2; }
	$(INTEROP_VENV)/bin/python tests/fixtures/make_nvfp4_option_vectors.py $(TE)

# ruff (lint + format check) over the repository; basedpyright over the packages pyproject.toml lists.
# All three run, so one call lists every finding, one line each (`ruff format --diff` shows the changes).
lint: setup
	@status=0; \
	$(VENV)/bin/ruff check --output-format concise . || status=1; \
	$(VENV)/bin/ruff format --check --output-format concise . || status=1; \
	$(VENV)/bin/basedpyright || status=1; \
	exit $$status

# Re-resolve the lock after editing pyproject.toml's dependencies: versions already locked stay unless they no
# longer fit; `make lock UPGRADE=1` moves everything to the newest versions the bounds allow.
lock:
	$(VENV)/bin/uv pip compile pyproject.toml --extra dev --universal --python-version 3.12 --generate-hashes \
		--no-emit-package fp4lm --custom-compile-command 'make lock' $(if $(UPGRADE),--upgrade) -o $(LOCK)

bench: setup
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .venv-interop .venv-interop-newest runs .pytest_cache
