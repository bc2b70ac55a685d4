# Two commands do all set-up on a fresh machine (Python, make and apt are enough):
#   make demo   - create .venv, install flightlog, run a real tiny training monitored by it
#   make test   - install what the tests need and run them
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: demo test bench system-deps clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.demo-deps: pyproject.toml requirements/demo.txt | $(BIN)/python
	$(BIN)/python -m pip install -q -e . -r requirements/demo.txt
	touch $@

$(VENV)/.test-deps: pyproject.toml requirements/demo.txt requirements/test.txt | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[all]' -r requirements/test.txt
	touch $@

system-deps:
	@scripts/system-deps

demo: $(VENV)/.demo-deps
	$(BIN)/flightlog demo --output-dir output/demo

test: $(VENV)/.test-deps system-deps
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(VENV)/.test-deps
	$(BIN)/python bench/log_call.py

clean:
	rm -rf $(VENV) output .pytest_cache
