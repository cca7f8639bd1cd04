# The two set-up commands of the README: `make demo` and `make test`.
# Both create .venv on first use and install what they need (torch from pip;
# on the development machines the pinned wheels lie on local disk).
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.14.1 torchvision==0.29.1
STAMP  := $(VENV)/.musubi-installed

.PHONY: demo test lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev,eval,tb,mlflow]'
	touch $@

demo: $(STAMP)
	$(VENV)/bin/musubi run examples/fleet-demo.yaml

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check musubi tests bench

clean:
	rm -rf $(VENV) runs musubi.db
