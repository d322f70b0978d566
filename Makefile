# Route Tuner: `make demo` runs the bundled study; `make test` runs the whole test suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)

.PHONY: demo test venv test-deps clean

$(STAMP):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: the CPU wheel (never a multi-GB CUDA build) for the inductor backend's tests
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e '.[dev,inductor]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(VENV)/bin/tuner run studies/efficientnet_lite0.toml
	$(VENV)/bin/tuner best studies/efficientnet_lite0.toml

test-deps: venv
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

test: test-deps
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) studies/.tuner test-artifacts
