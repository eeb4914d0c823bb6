# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PIP    := $(BIN)/pip install --disable-pip-version-check -q -c constraints.txt

.PHONY: setup browser demo test docs bench-engine bench-client clean

# The environment, and what the tests need besides: Debian's chromium where it can be installed.
setup: $(STAMP) browser

browser:
	sh scripts/chromium.sh

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) -e '.[all]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/latlab bench

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

# The documentation site (mkdocs.yml), into site/; its reference pages are read from the code.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench-engine: $(STAMP)
	$(BIN)/python benchmarks/engine.py
	$(BIN)/python benchmarks/engine_step.py

bench-client: $(STAMP)
	$(BIN)/python benchmarks/client.py $(if $(wildcard .venv-clients/bin/aiperf),--aiperf .venv-clients/bin/aiperf)

clean:
	rm -rf $(VENV) runs build site *.egg-info
