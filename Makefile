# The README's two commands: `make run` and `make test`. Each sets up .venv with python3.12 when missing.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# python3.12 from PATH, or from pyenv when its shim has another version selected.
PYTHON312 ?= $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3.12; do \
	$$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && { echo $$p; break; }; done)

.PHONY: setup run test bench clean

$(VENV)/.installed: pyproject.toml
	@test -n "$(PYTHON312)" || { echo "error: python3.12 not found; install Python 3.12 (jax >= 0.11 needs it)"; exit 2; }
	test -x $(PY) || $(PYTHON312) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/fp4lm train configs/default.yaml

test: setup
	$(PY) -m pytest -q -n 2 --dist loadgroup --timeout 900 --durations=15

bench: setup
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) runs .pytest_cache
