# Route Tuner: `make demo` runs the bundled study; `make test` runs the whole test suite; `make lint` checks the code
# with ruff.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HASH := $(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)
CORE := $(VENV)/.core-$(HASH)
TESTDEPS := $(VENV)/.test-$(HASH)

.PHONY: demo test lint clean

$(CORE):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	rm -f $(VENV)/.core-*
	touch $@

$(TESTDEPS): $(CORE)
	# torch and torchvision pinned together first (onnx2torch imports torchvision; this pair is the one
	# pip takes from the machine's local wheel store): the inductor backend's CPU tests
	$(PY) -m pip install -q "torch==2.14.1" "torchvision==0.29.1"
	$(PY) -m pip install -q -e '.[dev,inductor]'
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)
	rm -f $(VENV)/.test-*
	touch $@

demo: $(CORE)
	$(VENV)/bin/tuner run studies/efficientnet_lite0.toml
	$(VENV)/bin/tuner best studies/efficientnet_lite0.toml

# Tests run side by side in TEST_WORKERS pytest-xdist processes (README, design notes); TEST_WORKERS=0 runs them in one.
TEST_WORKERS ?= 3

test: $(TESTDEPS)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

lint: $(TESTDEPS)
	$(VENV)/bin/ruff check tuner tests bench
	$(VENV)/bin/ruff format --check tuner tests bench

clean:
	rm -rf $(VENV) studies/.tuner test-artifacts
