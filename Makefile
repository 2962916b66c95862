# Two commands set up and use a fresh machine: `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test lint serve bench clean ts-client test-ts

install: $(STAMP)

# The default python3 may be older than 3.12: scripts/find-python looks in PATH and pyenv.
$(STAMP): pyproject.toml
	@test -x $(PY) || "$$(scripts/find-python)" -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[server,rerank,test]'
	# arq pins redis < 6 while falkordb needs redis >= 7.1; arq runs on redis 8 (the worker
	# tests prove it), so it is installed without its pin. See README, "Dependencies".
	$(PY) -m pip install --quiet --no-deps 'arq==0.28.0'
	@touch $@

demo: $(STAMP)
	$(VENV)/bin/memory-service demo

test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

# ruff over the whole project; mypy --strict over the service's packages (pyproject.toml, [tool.mypy]).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The TypeScript client (clients/typescript, README "TypeScript client"): npm packages from the
# registry, pinned by its package-lock.json.
TS := clients/typescript
TS_STAMP := $(TS)/node_modules/.installed

$(TS_STAMP): $(TS)/package-lock.json $(TS)/package.json
	cd $(TS) && npm ci --no-audit --no-fund
	@touch $@

# Regenerate the client after a route or wire model changed: the OpenAPI schema from the app
# (not started), the types from the schema, then the build. Commit openapi.json and src/schema.ts.
ts-client: $(STAMP) $(TS_STAMP)
	$(PY) scripts/openapi-schema
	cd $(TS) && npm run generate && npm run build

# The generated types match the committed schema; the Node tests against a real server.
test-ts: $(STAMP) $(TS_STAMP)
	cd $(TS) && npm run check-generated && npm run build && MEMORY_SERVICE_PYTHON="$(abspath $(PY))" npm test

serve: $(STAMP)
	$(VENV)/bin/memory-service serve

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/context_bench.py
	$(PY) bench/formation_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
