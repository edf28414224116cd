# Two entry points: `make demo` (the main job) and `make test` (the test suite); `make docs`
# builds the documentation site (docs/, mkdocs.yml) strictly into site/.
# Both create .venv on first use, installing the CPU build of torch first so that no
# CUDA wheels are pulled in, then the package with its test/plot extras.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION := 2.13.0

.PHONY: demo test tutorials docs lint format clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -e ".[test,plots]"
	touch $@

demo: $(VENV)/.installed
	$(PY) -m streamgp.demo

# The test suite also covers the optional extras: Ax (streamgp[ax]), Dask (streamgp[cluster])
# and the tutorial notebooks (streamgp[tutorials], executed in their quick mode).
$(VENV)/.installed-extras: $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[test,plots,ax,cluster,tutorials]"
	touch $@

test: $(VENV)/.installed-extras
	$(PY) -m pytest -q

# Re-execute every notebook with full settings and store its outputs (figures included).
tutorials: $(VENV)/.installed-extras
	$(PY) tutorials/run_notebooks.py

# The docs extra: mkdocs, Material, mkdocstrings (reads the docstrings from src/ without
# importing them) and mkdocs-jupyter (renders the stored tutorial notebooks, not executed).
$(VENV)/.installed-docs: $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[docs]"
	touch $@

docs: $(VENV)/.installed-docs
	$(VENV)/bin/mkdocs build --strict

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests benchmarks conftest.py
	$(VENV)/bin/ruff format --check src tests benchmarks conftest.py

format: $(VENV)/.installed
	$(VENV)/bin/ruff format src tests benchmarks conftest.py
	$(VENV)/bin/ruff check --fix src tests benchmarks conftest.py

clean:
	rm -rf $(VENV) build site .cache *.egg-info src/*.egg-info .pytest_cache
