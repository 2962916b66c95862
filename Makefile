# Two commands set up and use a fresh machine: `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test test-cluster test-image image lint serve bench clean ts-client test-ts test-browser screenshots inspector-vendor docs docs-serve docs-pages

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

# The suite's cluster part (marker cluster: recording, formation, the outbox, keys, rate
# limits, retention, erasure, the scripts' slots, search and the postings, the graphs'
# placement) with the graphs (FALKORDB_URL) and the state (REDIS_URL) on a Redis Cluster of
# three masters loading FalkorDB, which the session starts on loopback from the shipped
# redis-server and stops (tests/redis_cluster.py); the job queue stays on the embedded
# server (arq needs a plain Redis).
test-cluster: $(STAMP)
	TEST_REDIS_CLUSTER=start $(PY) -m pytest -m cluster $(PYTEST_ARGS)

# The image (deploy/Dockerfile) without Docker or an image registry: scripts/image-build
# builds it with Debian's podman on a Debian base made with mmdebstrap (kept for a month in
# podman's store), then tests/test_image.py runs its API and worker containers, locked down,
# against a FalkorDB on loopback (docs/deploy.md, "Building without Docker"). Needs Debian's
# podman, runc and mmdebstrap: .ci/run installs them. IMAGE_BASE=<image> picks another base.
IMAGE ?= localhost/memory-service:test
image:
	scripts/image-build $(IMAGE)

test-image: $(STAMP) image
	MEMORY_SERVICE_IMAGE=$(IMAGE) $(PY) -m pytest -q tests/test_image.py

# ruff over the whole project; mypy --strict over the service's packages (pyproject.toml, [tool.mypy]).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The TypeScript client (clients/typescript, docs/typescript.md): npm packages from the
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

# The web inspector (docs/inspector.md) in headless Chromium: Debian's chromium and
# chromium-driver (`apt-get install chromium chromium-driver`; .ci/run installs them), driven
# by selenium against `memory-service serve` on loopback. Never a downloaded browser.
CHROMIUM_CHECK := command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	{ echo "no chromium/chromedriver: apt-get install chromium chromium-driver" >&2; exit 1; }
test-browser: $(STAMP)
	@$(CHROMIUM_CHECK)
	$(PY) -m pytest -q tests/test_inspector.py tests/test_inspector_browser.py

# The screenshots of docs/inspector.md, taken by the browser tests on their seeded server.
screenshots: $(STAMP)
	@$(CHROMIUM_CHECK)
	INSPECTOR_SCREENSHOTS=docs/inspector $(PY) -m pytest -q tests/test_inspector_browser.py

# The inspector's browser libraries (Chart.js, Cytoscape.js), from npm at the versions
# scripts/inspector-vendor/package-lock.json pins, copied with their licences into
# memory_service/http/inspector/static/vendor/ (committed: nothing is fetched at run time).
INSPECTOR_VENDOR := memory_service/http/inspector/static/vendor
inspector-vendor:
	cd scripts/inspector-vendor && npm ci --no-audit --no-fund
	sed '/sourceMappingURL/d' scripts/inspector-vendor/node_modules/chart.js/dist/chart.umd.min.js > $(INSPECTOR_VENDOR)/chart.umd.min.js
	cp scripts/inspector-vendor/node_modules/chart.js/LICENSE.md $(INSPECTOR_VENDOR)/chart.js.LICENSE.md
	cp scripts/inspector-vendor/node_modules/@kurkle/color/LICENSE.md $(INSPECTOR_VENDOR)/kurkle-color.LICENSE.md
	sed '/sourceMappingURL/d' scripts/inspector-vendor/node_modules/cytoscape/dist/cytoscape.min.js > $(INSPECTOR_VENDOR)/cytoscape.min.js
	cp scripts/inspector-vendor/node_modules/cytoscape/LICENSE $(INSPECTOR_VENDOR)/cytoscape.LICENSE

# The documentation site (mkdocs.yml, mkdocs-material): `docs` builds it into site/ with
# --strict (a broken link, a missing anchor or a page left out of the nav fails it), as
# tests/test_docs_site.py does; `docs-serve` serves it on 127.0.0.1:8000. `docs-pages`
# regenerates the two generated pages after a setting or a route changed: docs/configuration.md
# (from Settings) and docs/api.md (from the OpenAPI schema); commit them.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP)
	$(VENV)/bin/mkdocs serve --strict

docs-pages: $(STAMP)
	$(PY) scripts/docs-config
	$(PY) scripts/docs-api

serve: $(STAMP)
	$(VENV)/bin/memory-service serve

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/context_bench.py
	$(PY) bench/formation_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis site
