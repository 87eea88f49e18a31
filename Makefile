# The README's commands. Both create (or reuse) the virtual environment in .venv.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench fetch clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all]'
	touch $(STAMP)

fetch: $(STAMP)
	$(BIN)/specsample fetch

demo: fetch
	$(BIN)/specsample bench --preset demo --backend llamacpp --out results/demo

# Every test is marked pure, system or real (tests/conftest.py refuses one that is not).
# The pure ones (toy and tiny models, no clock, process or real model) run on every core
# at once, one thread each; then the rest, alone: processes, servers and timings must
# not be crowded, and the real models need the cores.
test: fetch
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m pure -n auto
	$(BIN)/python -m pytest -q -m "not pure"

bench: fetch
	$(BIN)/specsample bench --out results/bench

clean:
	rm -rf $(VENV) results
