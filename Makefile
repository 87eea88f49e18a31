# The README's commands. Both create (or reuse) the virtual environment in .venv.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench fetch clean

# llama-cpp-python is built here with llama.cpp's RPC backend (--target-rpc, rpc-worker),
# once per CPU: the build is native (-march=native), so its wheel is kept under a key of
# this CPU's flags, and a fresh checkout on the same machine reuses it (pip's own wheel
# cache would hand back a build without RPC, made with other flags).
LLAMA_CPP_PYTHON := llama-cpp-python==0.3.16
CPU_KEY := $(shell (grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -m) | cksum | cut -d' ' -f1)
WHEELS := $(HOME)/.cache/specsample/wheels/llama-rpc-$(CPU_KEY)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	ls $(WHEELS)/llama_cpp_python-0.3.16-*.whl >/dev/null 2>&1 || CMAKE_ARGS="-DGGML_RPC=ON" \
		$(BIN)/python -m pip wheel --quiet --no-deps --no-cache-dir --no-binary llama-cpp-python -w $(WHEELS) $(LLAMA_CPP_PYTHON)
	$(BIN)/python -m pip install --quiet --force-reinstall --no-deps $(WHEELS)/llama_cpp_python-0.3.16-*.whl
	$(BIN)/python -m pip install --quiet -e '.[all]'
	touch $(STAMP)

fetch: $(STAMP)
	$(BIN)/specsample fetch

# llama-server, built once from the llama.cpp our backend runs (benchmarks/llama_server.py),
# then the bench beside it (benchmarks/bench.py --preset demo: specsample bench, with
# plain llama-server and llama-server -md as peers on the same files); without cmake the
# demo goes on, its llama-server rows noted as not run.
demo: fetch
	-$(BIN)/python -m benchmarks.llama_server
	$(BIN)/python -m benchmarks.bench --preset demo --backend llamacpp --out results/demo

# Every test is marked pure, system or real (tests/conftest.py refuses one that is not).
# tests/suite.sh runs the rest (processes, servers, the real models) with the cores it
# needs, and the pure part (toy and tiny models) beside it in the idle scheduling class,
# on the cycles the rest leaves idle. Each part prints its 20 slowest tests
# (docs/testing.md: where the time goes), and the end its total wall time (not the
# fetch before it), whether the parts passed or not.
test: fetch
	@bash tests/suite.sh $(BIN)/python

# The paper's measurements: the research bench (benchmarks/bench.py), run from the checkout.
bench: fetch
	$(BIN)/python -m benchmarks.bench --out results/bench

clean:
	rm -rf $(VENV) results
