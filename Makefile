# kbportal: two commands do all set-up.
#   make demo   - install, start the embedded database, ingest real data, serve, answer two questions
#   make test   - install and run the test suite
# Extra demo data: make demo ARGS="--slack-export ../shared/corpora/slack-export-houston --docs PATH"
# For contributors: make test-fast (the edit-test loop), make check (lint, types, migrations).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo serve test test-fast lint typecheck migrations-check check install install-dev

install: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q --progress-bar off -r requirements.txt
	touch $@

install-dev: $(VENV)/.installed-dev

$(VENV)/.installed-dev: requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q --progress-bar off -r requirements-dev.txt
	touch $(VENV)/.installed $@

demo: install
	$(BIN)/python manage.py demo $(ARGS)

# The portal under gunicorn with its Celery worker and beat (README: "Running in production").
serve: install
	$(BIN)/python manage.py serve $(ARGS)

test: install-dev
	$(BIN)/python -m pytest -q -rs $(ARGS)

# Everything but the tests marked slow (ingesting a corpus, starting servers, waiting out retries, crawling
# every route), on FAST_WORKERS pytest-xdist workers (each with its own test database): the edit-test
# loop, under 3 minutes on 2 cores. CI runs make test: every test, one process.
FAST_WORKERS ?= 2
test-fast: install-dev
	$(BIN)/python -m pytest -q -rs -m "not slow" -n $(FAST_WORKERS) $(ARGS)

lint: install-dev
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

typecheck: install-dev
	$(BIN)/mypy kbportal projects sources search

migrations-check: install-dev
	$(BIN)/python manage.py makemigrations --check --dry-run

check: lint typecheck migrations-check
