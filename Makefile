# paywire: `make serve` runs the gateway, `make test` runs the tests. Each sets itself up.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: serve test lint clean

# `make serve` runs the local devnet: the optional extra paywire[devnet] (py-evm, eth-tester).
# A production install is `pip install .`, without it. The test extra includes it.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -e '.[devnet]'
	touch $@

$(VENV)/.test-installed: $(VENV)/.installed pyproject.toml package.json package-lock.json
	$(PIP) install -e '.[test]'
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

serve: $(VENV)/.installed
	$(VENV)/bin/paywire serve

test: $(VENV)/.test-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache

clean:
	rm -rf $(VENV) node_modules .pytest_cache .ruff_cache
