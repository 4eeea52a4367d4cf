# Graphene's developer commands. `make help` lists them.
#
# Everything runs from the virtualenv in .venv (Python 3.11), which `make setup` creates and
# keeps in sync with requirements/*.txt and pyproject.toml; the other targets depend on it.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
# The interpreter a new virtualenv is made from: python3.11, else a python3 that is 3.11.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
# The stamp names a hash of everything that decides the installed set, so a change to any of
# these files (or a switch between branches that differ) reinstalls, and nothing else does.
SETUP_INPUTS := requirements/base.txt requirements/dev.txt requirements/codegen.txt pyproject.toml
# openapi-python-client (tests/api/test_generated_client.py) pins an older typer than
# graphenectl's, so it lives in a virtualenv of its own, inside .venv.
CODEGEN := $(VENV)/codegen
STAMP := $(VENV)/.setup-$(shell cat $(SETUP_INPUTS) 2>/dev/null | sha256sum | cut -c1-16)

# `manage.py check --deploy` needs production settings; these dummies only satisfy their
# presence checks (nothing connects to them). The key is long and varied so the check
# judges it as it would a real one.
LINT_PROD_ENV := DJANGO_SETTINGS_MODULE=graphene_project.settings.prod \
	GRAPHENE_SECRET_KEY=lint-only-Zq8vN3kR7wT1yB5mC9xE2hJ6pL4sD0fG8aU3iO7eW1rY5tQ9 \
	GRAPHENE_SECRETS_KEY=lint-only-secrets-key-not-secret \
	GRAPHENE_DATABASE_URL=postgresql://graphene:lint@127.0.0.1:5432/graphene \
	GRAPHENE_BROKER_URL=redis://127.0.0.1:6379/0 \
	GRAPHENE_CHANNEL_LAYER_URL=redis://127.0.0.1:6379/1 \
	GRAPHENE_DATA_DIR=$(CURDIR)/.graphene-lint

PYTEST_ARGS ?=
# pytest-xdist processes for `make test`, each a session of its own (queue, database, data dir,
# shared workers and web server); 0 runs the tests in this one process.
TEST_PROCESSES ?= 3

.PHONY: help setup demo up test lint fmt typecheck migrate-check deploy-check lock vendor-xterm vendor-htmx clean

help:  ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

setup: $(STAMP)  ## create .venv (Python 3.11) and install the pinned requirements and Graphene

$(STAMP): $(SETUP_INPUTS)
	@if ! $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then \
		test -n "$(PYTHON)" || { echo "make setup: Python 3.11 is required (python3.11 not found)" >&2; exit 1; }; \
		$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
			|| { echo "make setup: $(PYTHON) is not Python 3.11; run: make setup PYTHON=/path/to/python3.11" >&2; exit 1; }; \
		echo "make setup: creating $(VENV) with $(PYTHON)"; \
		rm -rf $(VENV); \
		$(PYTHON) -m venv $(VENV); \
	fi
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements/dev.txt
	@# The build backend's warnings (editable-install advice) are noise unless the install fails.
	@echo "$(PY) -m pip install --quiet --no-deps -e ."
	@$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e . >$(VENV)/.setup.log 2>&1 \
		|| { cat $(VENV)/.setup.log; exit 1; }
	@# pip installs but never removes: name what is installed beyond the pins (CI will not have it).
	@extra=$$(comm -23 <($(PY) -m pip freeze --exclude-editable 2>/dev/null | grep -v '^#' | cut -d= -f1 | tr A-Z a-z | sort) \
		<(grep -h '==' requirements/base.txt requirements/dev.txt | cut -d= -f1 | tr A-Z a-z | sort) | xargs); \
	if [ -n "$$extra" ]; then echo "make setup: note: installed in $(VENV) but not in requirements/*.txt: $$extra" >&2; fi
	$(PY) -m venv --clear $(CODEGEN)
	$(CODEGEN)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements/codegen.txt
	@rm -f $(VENV)/.setup-*
	@touch $@

demo: setup  ## start Graphene embedded, run examples/ end to end, print the resource tree, stop
	$(PY) examples/demo.py

up: setup  ## serve Graphene embedded on http://127.0.0.1:8000 until Ctrl-C (data in .graphene/)
	$(VENV)/bin/graphene up

test: setup  ## the whole test suite, the crash test included (needs PostgreSQL on :5432, Redis on :6379)
	$(PY) -m pytest -m "chaos or not chaos" -n $(TEST_PROCESSES) --dist loadgroup $(PYTEST_ARGS)

lint: setup  ## formatting, lint rules, types, Django's deploy checks, missing migrations
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(MAKE) --no-print-directory typecheck deploy-check migrate-check

fmt: setup  ## format the code and apply safe lint fixes
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: setup  ## mypy once over the project as configured in pyproject.toml (strict for sdk/ and agent/)
	@# One run, incremental through .mypy_cache: the SDK's and the agent's strictness is set per
	@# module in pyproject.toml ([[tool.mypy.overrides]]), so they need no second, cold run.
	$(VENV)/bin/mypy --explicit-package-bases .

deploy-check: setup  ## manage.py check --deploy under production settings (dummy values)
	$(LINT_PROD_ENV) $(PY) manage.py check --deploy --fail-level WARNING
	@rm -rf .graphene-lint

migrate-check: setup  ## fail if a model change has no migration
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	env -u GRAPHENE_DATABASE_URL -u GRAPHENE_BROKER_URL -u GRAPHENE_CHANNEL_LAYER_URL \
		DJANGO_SETTINGS_MODULE=graphene_project.settings.dev GRAPHENE_DATA_DIR="$$tmp" \
		$(PY) manage.py makemigrations --check --dry-run

lock: setup  ## re-resolve requirements/*.in into the pinned requirements/*.txt (newest allowed)
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PY) -m venv "$$tmp/base"; "$$tmp/base/bin/pip" install --quiet -r requirements/base.in; \
	"$$tmp/base/bin/pip" freeze --exclude-editable | grep -v '^#' > "$$tmp/base.txt"; \
	$(PY) -m venv "$$tmp/dev"; "$$tmp/dev/bin/pip" install --quiet -r requirements/dev.in -c "$$tmp/base.txt"; \
	{ echo "# Runtime dependencies, fully pinned: the closure of requirements/base.in."; \
	  echo "# Edit base.in (direct dependencies, loose ranges) and regenerate with \`make lock\`."; \
	  cat "$$tmp/base.txt"; } > requirements/base.txt; \
	{ echo "# Development and CI tools, fully pinned: the closure of requirements/dev.in minus base.txt."; \
	  echo "# Edit dev.in and regenerate with \`make lock\`."; \
	  echo "-r base.txt"; \
	  "$$tmp/dev/bin/pip" freeze --exclude-editable | grep -v '^#' | grep -vxF -f "$$tmp/base.txt"; } > requirements/dev.txt; \
	$(PY) -m venv "$$tmp/codegen"; "$$tmp/codegen/bin/pip" install --quiet -r requirements/codegen.in; \
	{ echo "# openapi-python-client (tests/api/test_generated_client.py), fully pinned, in a virtualenv of its own"; \
	  echo "# (.venv/codegen): it pins an older typer than graphenectl's. Edit codegen.in and run \`make lock\`."; \
	  "$$tmp/codegen/bin/pip" freeze | grep -v '^#'; } > requirements/codegen.txt; \
	echo "make lock: wrote requirements/base.txt, dev.txt and codegen.txt; run make setup to install them"

# The Studio's front-end libraries, vendored as Django's admin vendors jQuery: built files of npm
# tarballs, pinned by version and by the registry's integrity (sha512), checked by tools/vendor-npm
# before anything is copied. To move to a newer version, change a pin, run the target, and update
# the README next to the files.
XTERM_DIR := apps/agents/static/agents/vendor/xterm
XTERM_PIN := @xterm/xterm@5.5.0 sha512-hqJHYaQb5OptNunnyAnkHyM8aCjZ1MEIDTQu1iIbbTD/xops91NB5yq1ZK/dC2JDbVWtF23zUtl9JE2NqwT87A==
XTERM_FIT_PIN := @xterm/addon-fit@0.10.0 sha512-UFYkDm4HUahf2lnEyHvio51TNGiLK66mqP2JoATy7hRZeXaGMRDr00JiSF7m63vR5WKATF605yEggJKsw0JpMQ==
HTMX_DIR := apps/studio/static/studio/vendor/htmx
HTMX_PIN := htmx.org@2.0.11 sha512-Thx/WtpeOQqSrqBCw/A1cwGJGg4UrVa3+sW0GmrM3p4gJgO89ecH4qtbnyzDDWFvBTqjnIMCgELTNt636dtamA==

vendor-xterm:  ## re-fetch the pinned xterm.js files into apps/agents/static (npm pack, integrity checked)
	tools/vendor-npm $(XTERM_DIR) $(XTERM_PIN) lib/xterm.js:xterm.js css/xterm.css:xterm.css LICENSE:LICENSE.xterm
	tools/vendor-npm $(XTERM_DIR) $(XTERM_FIT_PIN) lib/addon-fit.js:addon-fit.js LICENSE:LICENSE.addon-fit

vendor-htmx:  ## re-fetch the pinned htmx into apps/studio/static (npm pack, integrity checked)
	tools/vendor-npm $(HTMX_DIR) $(HTMX_PIN) dist/htmx.min.js:htmx.min.js LICENSE:LICENSE.htmx

clean:  ## remove caches and the demo's data (keeps .venv and your .graphene/ data)
	rm -rf .graphene-demo .graphene-lint .mypy_cache .ruff_cache .pytest_cache
	find . -path ./.venv -prune -o -name __pycache__ -type d -exec rm -rf {} +
