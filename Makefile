# Two commands: `make demo` and `make test`. Both create .venv if it is missing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

# pytest-xdist workers for `make test`: one per core (2 on the 2-core dev machine), at most 4 (each one imports torch
# and collects the whole suite, and the jobs of several processes take turns anyway: tests/conftest.py
# one_job_at_a_time); PYTEST_WORKERS=0: one process, no xdist. --dist worksteal: each worker starts on its own half of
# the suite in file order (a module's fixtures are built once per worker) and takes over part of the other's
# remaining tests when it runs out.
PYTEST_WORKERS ?= auto

.PHONY: demo test install clean

$(STAMP): pyproject.toml .ci/install-torch.sh .ci/install-torchvision.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	bash .ci/install-torch.sh $(PY)
	$(PIP) install -q -e '.[test,dali]'
	bash .ci/install-torchvision.sh $(PY) $(VENV)/torchvision-tests
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gpupipe demo --root demo-data --config configs/quickstart.yaml

test: $(STAMP)
	$(VENV)/bin/ruff check gpupipe tests benchmarks examples
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --maxprocesses 4 --dist worksteal

clean:
	rm -rf $(VENV) demo-data .bench
