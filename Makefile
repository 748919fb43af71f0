# kbportal: two commands do all set-up.
#   make demo   - install, start the embedded database, ingest real data, serve, answer two questions
#   make test   - install and run the test suite
# Extra demo data: make demo ARGS="--slack-export ../shared/corpora/slack-export-houston --docs PATH"
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint install

install: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q --progress-bar off -r requirements.txt
	touch $@

demo: install
	$(BIN)/python manage.py demo $(ARGS)

test: install
	$(BIN)/python -m pytest -q $(ARGS)

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
