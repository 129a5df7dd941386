PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# the oldest supported dependency versions (pyproject's floors), tested in a second environment
FLOOR_VENV := .venv-floor
FLOOR_PY := $(FLOOR_VENV)/bin/python
FLOOR_STAMP := $(FLOOR_VENV)/.installed
FLOOR_CONSTRAINTS := .ci/floor-constraints.txt

.PHONY: test lint test-floor docs demo bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

# docs first: tests/test_docs_site.py checks the site it builds
test: lint $(STAMP)
	$(MAKE) docs
	$(PY) -m pytest
	$(MAKE) test-floor

lint: $(STAMP)
	$(PY) -m ruff check quantsim adaround mixed_precision quantsim_cli tests benchmarks examples
	$(PY) -m mypy

DOCS_STAMP := $(VENV)/.installed-docs

$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,docs]'
	touch $(DOCS_STAMP)

# the documentation site into docs/_build/html; warnings (a broken cross-reference, a bad docstring) fail it
docs: $(DOCS_STAMP)
	rm -rf docs/_build/html
	$(PY) -m sphinx -b html -W --keep-going -q -j auto docs docs/_build/html

$(FLOOR_PY):
	$(PYTHON) -m venv $(FLOOR_VENV)

$(FLOOR_STAMP): $(FLOOR_PY) pyproject.toml $(FLOOR_CONSTRAINTS)
	$(FLOOR_PY) -m pip install -q --upgrade pip
	$(FLOOR_PY) -m pip install -q -c $(FLOOR_CONSTRAINTS) -e . pytest hypothesis jsonschema
	touch $(FLOOR_STAMP)

# the suite against the floor versions (examples and benchmarks helpers need only the main environment)
test-floor: $(FLOOR_STAMP)
	$(FLOOR_PY) -m pytest -p no:cacheprovider

demo: $(STAMP)
	$(PY) examples/demo_magika.py

clean:
	rm -rf $(VENV) $(FLOOR_VENV) build *.egg-info docs/_build docs/_generated

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) -m benchmarks.bench_core
	$(PY) -m benchmarks.bench_integer
	$(PY) -m benchmarks.bench_qdq
	$(PY) -m benchmarks.bench_prepare
	$(PY) -m benchmarks.bench_light
	$(PY) -m benchmarks.bench_onnx_nodes
	$(PY) -m benchmarks.bench_adaround
	$(PY) -m benchmarks.bench_large --sizes 0.1 0.8 2.4 --export
	$(PY) -m benchmarks.suite.run
