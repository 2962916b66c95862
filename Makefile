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
	# The embedded store (falkordblite) for `demo` and `serve` without FALKORDB_URL; OTel for traces.
	$(PY) -m pip install --quiet -e '.[server,embedded,otel,rerank,test]'
	# arq is vendored (memory_service/_vendor/arq); a venv made before still has it, with its redis<6 pin.
	-$(PY) -m pip uninstall --quiet --yes arq 2>/dev/null
	$(PY) -m pip check
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
