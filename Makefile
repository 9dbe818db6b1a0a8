# Every target creates .venv by itself; only Python 3.11+, git and make are needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SEED ?= 1
DURATION ?= 1200
# nats-server sync_interval in the chaos runs' power-loss faults: always (shipped) or default.
SYNC ?= always
# Seconds of work before the first fault (130: past nats-server's default two-minute flush).
WARMUP ?= 0
# scheduler.holders of the chaos runs' replicas: 0 (each holds every job) or 2 (shares).
HOLDERS ?= 0

# Test worker processes: most tests wait on real servers and replicas rather than compute, so
# twice the cores keeps a 2-core machine busy without starving the timing-sensitive ones. An
# idle worker steals tests from a busy one, so the long ones (the bounded chaos run, engine
# tests waiting on real seconds) do not pile up at the end on one worker.
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$((n * 2)))
PYTEST_PARALLEL := -n $(JOBS) --dist worksteal

.PHONY: run test check lint docs fmt bench bench-full chaos clean venv system-deps js-worker

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("hrwcron needs Python 3.11 or newer") if sys.version_info < (3, 11) else None'
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The plots of a benchmark run; only `make bench` waits for them.
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

run: $(STAMP)
	$(BIN)/hrwcron dev

lint: $(STAMP)
	$(BIN)/ruff check service tests bench
	$(BIN)/ruff format --check service tests bench
	$(BIN)/mypy --strict service/hrwcron
	$(BIN)/lint-imports

# The documentation site, from docs/ by mkdocs.yml, into build/site/. Strict: a link to a page
# or anchor that does not exist, or a page left out of the navigation, fails the build. (The
# variable silences the theme's banner, which is not a warning about the docs.)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

fmt: $(STAMP)
	$(BIN)/ruff format service tests bench
	$(BIN)/ruff check --fix service tests bench

# Debian packages some tests use (libfaketime for clock skew, a C compiler for the tracer that
# moves a NATS server's clock, chromium and chromium-driver for the console in a real browser,
# promtool from prometheus for the alert rules, fuse3 for the power-loss filesystem of the chaos
# suite). Best effort: without root or apt the tests that need them skip with a reason. Only
# promtool is taken from the prometheus package, unpacked into /usr/local/bin: installing the
# package would add a user and start or enable a server (through its init script in a container,
# through systemd elsewhere), which tests never want.
system-deps:
	-@if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  missing=""; \
	  [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || [ -e /usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1 ] || missing="$$missing libfaketime"; \
	  command -v cc >/dev/null 2>&1 || missing="$$missing gcc libc6-dev"; \
	  command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	  command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	  ldconfig -p 2>/dev/null | grep -q 'libfuse3\.so' || missing="$$missing fuse3"; \
	  promtool=""; command -v promtool >/dev/null 2>&1 || promtool=yes; \
	  if [ -n "$$missing$$promtool" ]; then apt-get update -qq >/dev/null 2>&1; fi; \
	  if [ -n "$$missing" ]; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null 2>&1 \
	      || echo "note: could not install$$missing; tests that need them will skip"; \
	  fi; \
	  if [ -n "$$promtool" ]; then \
	    unpack=$$(mktemp -d) && \
	    ( cd "$$unpack" && apt-get download -qq prometheus && \
	      dpkg-deb --fsys-tarfile prometheus_*.deb | tar -x ./usr/bin/promtool && \
	      install -m 0755 usr/bin/promtool /usr/local/bin/promtool ) >/dev/null 2>&1 \
	      || echo "note: could not install promtool (Debian: prometheus); the alert rule tests will skip"; \
	    rm -rf "$$unpack"; \
	  fi; \
	fi

# The JavaScript worker example's packages, pinned by its package-lock.json, for its test. Best
# effort and without root: where npm is missing or the install fails, that test skips, saying why.
JS_WORKER := examples/js-worker
JS_STAMP := $(JS_WORKER)/node_modules/.installed
js-worker: $(JS_STAMP)

$(JS_STAMP): $(JS_WORKER)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
	  npm ci --prefix $(JS_WORKER) --no-audit --no-fund --loglevel=error && touch $@ \
	    || echo "note: npm ci in $(JS_WORKER) failed; the JavaScript worker's test will skip"; \
	else \
	  echo "note: no npm; the JavaScript worker's test will skip"; \
	fi

# Everything CI runs: lint, the docs build, then the whole suite in parallel, with the slowest
# tests listed.
test: lint docs system-deps $(JS_STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) --durations=15

# The inner loop: lint, the docs build, the unit tests and the contract tests on the in-memory
# stores, no server. Under a minute; run `make test` before you push.
check: lint docs
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) tests/unit tests/contract -k 'not jetstream' --durations=5

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench

bench-full: $(BENCH_STAMP)
	$(BIN)/python -m bench --full

chaos: $(STAMP) system-deps
	$(BIN)/python -m pytest -q -m chaos --chaos-seed=$(SEED) --chaos-duration=$(DURATION) --chaos-sync=$(SYNC) --chaos-warmup=$(WARMUP) --chaos-holders=$(HOLDERS) tests/chaos

clean:
	rm -rf $(VENV) build *.egg-info service/*.egg-info $(JS_WORKER)/node_modules
