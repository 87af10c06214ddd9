# `make run` starts the main job, `make test` runs the lint gate and the whole suite; both create
# .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test lint bench install clean

# the compiled parts are built at install: a changed source installs again
$(BIN)/.installed: pyproject.toml tidemq/store/log/_append.c tidemq/store/_dispatch.c tidemq/store/queues/_queue_file.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,pipeline]'
	touch $@

install: $(BIN)/.installed

run: install
	$(BIN)/tidemq serve

# ruff and mypy over tidemq/ (their settings are in pyproject.toml): zero findings
lint: install
	$(BIN)/ruff check tidemq
	$(BIN)/ruff format --check tidemq
	$(BIN)/mypy tidemq

test: lint
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python bench/store.py
	$(BIN)/python bench/grpc.py

clean:
	rm -rf $(VENV) build *.egg-info
