# Two commands set up and use a fresh machine: `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test serve bench clean

install: $(STAMP)

# The default python3 may be older than 3.12: scripts/find-python looks in PATH and pyenv.
$(STAMP): pyproject.toml
	@test -x $(PY) || "$$(scripts/find-python)" -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $@

demo: $(STAMP)
	$(VENV)/bin/memory-service demo

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

serve: $(STAMP)
	$(VENV)/bin/memory-service serve

bench: $(STAMP)
	$(PY) bench/context_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
