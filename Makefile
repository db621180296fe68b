# Two commands: `make demo` and `make test`. Both create .venv if it is missing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

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
	$(PY) -m pytest -q -p no:cacheprovider

clean:
	rm -rf $(VENV) demo-data .bench
