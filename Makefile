# Two commands set up and use a fresh machine: `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test test-cluster lint serve bench clean

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

# The suite's cluster part (marker cluster: recording, formation, the outbox, keys, rate
# limits, retention, erasure, the scripts' slots) with the state store on a Redis Cluster of
# three masters that the session starts on loopback from the shipped redis-server and stops
# (tests/redis_cluster.py); the job queue and the graphs stay on the embedded server.
test-cluster: $(STAMP)
	TEST_REDIS_CLUSTER=start $(PY) -m pytest -m cluster $(PYTEST_ARGS)

# ruff over the whole project; mypy --strict over the service's packages (pyproject.toml, [tool.mypy]).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

serve: $(STAMP)
	$(VENV)/bin/memory-service serve

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/context_bench.py
	$(PY) bench/formation_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
