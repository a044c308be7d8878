# The README's two commands: `make demo` and `make test`. Each creates the virtual environment if
# it is missing, installs xrl into it, then runs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.xrl-installed

.PHONY: demo test lint bench clean-venv client

$(STAMP): pyproject.toml
	@test -x $(PY) || { \
	  if $(PYTHON) -c 'import torch' 2>/dev/null; then \
	    echo "xrl: using the torch already installed for $(PYTHON)"; \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else $(PYTHON) -m venv $(VENV); fi; }
	@$(PY) -c 'import torch' 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,bench,ray]'
	@# the Hydra Ray launcher without its stale cloudpickle<3 pin (see pyproject.toml's ray extra)
	$(PY) -m pip install -q --no-deps 'hydra-ray-launcher==1.2.2'
	@touch $(STAMP)

# The main job on the embedded default, twice: the shipped policy in the research setting it was trained
# for (target paper), then the deployment path for this machine's default target (onnxruntime here);
# each result is verified with onnxruntime before it is written to out/.
demo: $(STAMP)
	@mkdir -p out
	$(VENV)/bin/xrl optimize bert --search rl --target paper -o out/bert.paper.onnx --force
	$(VENV)/bin/xrl optimize bert -o out/bert.xrl.onnx --force --measure

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup

lint: $(STAMP)
	$(VENV)/bin/ruff check xrl tests graphs experiments

bench: $(STAMP)
	$(PY) experiments/bench_foundation.py

# The C client of the policy server (docs/release_and_pipes.md); tests/test_c_client.py compiles its own copy.
client: build/xrl_client

build/xrl_client: clients/c/xrl_client.c
	@mkdir -p build
	$(CC) -std=c99 -Wall -Wextra -O2 -o $@ $<

clean-venv:
	rm -rf $(VENV)
