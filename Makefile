# gpugate: `make demo` runs the main job on bundled simulated nodes, `make test` runs every test,
# `make test-fast` the quick run (no test marked slow: none of the end-to-end tests on a real Slurm).
# Both create the virtualenv first; nothing else needs installing by hand (the Slurm tests
# install Slurm and munge from Debian's packages themselves when run as root).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# MkDocs and its Material theme (pyproject's `docs` extra) only where `make docs` needs them, so
# `make test` on a fresh machine installs no more than before.
DOCS_STAMP := $(VENV)/.docs-stamp

.PHONY: venv torch demo test test-fast lint typecheck bench docs clean rpm deb

venv: $(STAMP)

# PyTorch for the jobs the end-to-end tests run under Slurm (issue 17's bandwidth qualification,
# issue 18's flight recorder), in a virtualenv of its own: gpugate itself never imports torch,
# the jobs do, as the job's user. CPU only is enough (the gloo backend). Pinned: 2.13.0 is the
# CPU build these machines keep on disk (about 1 GB installed, against 5.5 GB for a CUDA build
# and its libraries, whose writes also evict the page cache the timing-sensitive tests rely
# on); elsewhere pip takes 2.13.0 from PyPI. GPUGATE_NO_TORCH=1 skips it (those tests then
# skip, unless GPUGATE_REQUIRE_TORCH=1, as .ci/run sets).
TORCH_VENV ?= .venv-torch
# pytest-xdist workers for `make test`, whole modules to a worker (--dist loadfile: a module's
# local Slurm cluster stays in one process). The end-to-end tests mostly wait on Slurm, so 3
# workers on CI's 2 cores took `make test` from 14 to 5.5 minutes (docs/performance.md, "CI"). 0: one process.
TEST_WORKERS ?= 3
PYTEST_WORKERS = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
TORCH_STAMP := $(TORCH_VENV)/.installed-stamp

torch: $(TORCH_STAMP)

$(TORCH_STAMP):
	$(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/pip install --quiet --disable-pip-version-check torch==2.13.0 numpy
	touch $(TORCH_STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

$(DOCS_STAMP): $(STAMP)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[docs]'
	touch $(DOCS_STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

test: $(STAMP)
	@if [ -z "$$GPUGATE_NO_TORCH" ]; then $(MAKE) --no-print-directory torch; fi
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MAKE) --no-print-directory typecheck
	$(BIN)/pytest -q -ra $(PYTEST_WORKERS)

# The quick run while changing code: every test not marked slow (pyproject's markers: the
# end-to-end tests on a real Slurm, the unit modules over 5 s); no root, Slurm or torch needed.
# `make test` (and CI) still runs them all.
test-fast: $(STAMP)
	$(BIN)/pytest -q -ra -m "not slow" $(PYTEST_WORKERS)

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# mypy over the whole package with pyproject's [tool.mypy] (strict, every module): 0 errors,
# or CI fails. About 10 s cold, 2 s with its cache.
typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/bench_check.py

# The docs site (mkdocs.yml) into build/docs: the check pages written from the registry first
# (tools/gen_check_pages.py; commit what it changes), then `mkdocs build --strict`, so a broken
# link or anchor, or a page left out of the nav, fails. About a second. NO_MKDOCS_2_WARNING:
# Material's banner about its successor, not a warning about these docs.
docs: $(DOCS_STAMP)
	$(BIN)/python tools/gen_check_pages.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The RPM for the cluster's nodes (docs/guide/install.md): dist/gpugate-<version>-1.noarch.rpm.
# Needs rpmbuild (Debian: apt-get install rpm) and PyPI for the bundled dependencies.
rpm: $(STAMP)
	PYTHON=$(BIN)/python packaging/rpm/build.sh

# The .deb for Debian 12/13 and Ubuntu 22.04/24.04 nodes: dist/gpugate_<version>_all.deb, the
# same layout as the RPM (packaging/stage.sh stages both). Needs dpkg-deb and PyPI.
deb: $(STAMP)
	PYTHON=$(BIN)/python packaging/deb/build.sh

clean:
	rm -rf $(VENV) $(TORCH_VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache bench/out
