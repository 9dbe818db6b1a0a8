# Every target creates .venv by itself; only Python 3.11+, git and make are needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SEED ?= 1
DURATION ?= 1200

.PHONY: run test lint fmt bench bench-full chaos clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("hrwcron needs Python 3.11 or newer") if sys.version_info < (3, 11) else None'
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/hrwcron dev

lint: $(STAMP)
	$(BIN)/ruff check service tests bench
	$(BIN)/ruff format --check service tests bench
	$(BIN)/mypy --strict service/hrwcron

fmt: $(STAMP)
	$(BIN)/ruff format service tests bench
	$(BIN)/ruff check --fix service tests bench

test: lint
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m bench

bench-full: $(STAMP)
	$(BIN)/python -m bench --full

chaos: $(STAMP)
	$(BIN)/python -m pytest -q -m chaos --chaos-seed=$(SEED) --chaos-duration=$(DURATION) tests/chaos

clean:
	rm -rf $(VENV) build *.egg-info service/*.egg-info
