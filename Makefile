# Two commands: `make demo` and `make test`. Each creates .venv and installs what it needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
TORCH_PIN := torch==2.13.0

.PHONY: proto demo test test-fast pytest pytest-warm warm-kernels lint typecheck docs install bench bench-quick bench-overload clean

# uv installs into the venv: 32 s for torch and the dev extras, bytecode compiled (this machine
# sets PYTHONDONTWRITEBYTECODE), where pip took 74 s. The local wheel directory (this machine's
# /opt/wheels, or pip's PIP_FIND_LINKS) holds the CPU build of torch.
TORCH_WHEELS := $(firstword $(wildcard /opt/wheels) $(PIP_FIND_LINKS))
UV_INSTALL = $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python $(if $(TORCH_WHEELS),--find-links $(TORCH_WHEELS))

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q uv

# torch first, pinned to the CPU wheel: a bare `torch` requirement would pull a CUDA build.
$(STAMP): $(BIN)/python pyproject.toml
	$(UV_INSTALL) $(TORCH_PIN)
	$(BIN)/python -c "import torch, sys; sys.exit(torch.version.cuda and 'a CUDA build of torch was installed: put the CPU wheel in a --find-links directory (PIP_FIND_LINKS)')"
	$(UV_INSTALL) -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/gnnserve demo

# The gRPC messages' descriptor set, from the .proto (the server loads it: server/oip_grpc_messages.py).
PROTO_DIR := src/gnnserve/server/proto
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I$(PROTO_DIR) --descriptor_set_out=$(PROTO_DIR)/grpc_predict_v2.binpb $(PROTO_DIR)/grpc_predict_v2.proto

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The documentation site; --strict fails on a broken link or anchor (make test runs it).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The checks run beside numba's cache fill and then the tests; pytest streams its output.
test: $(STAMP)
	$(MAKE) --no-print-directory -j4 lint typecheck docs pytest-warm

# numba's on-disk cache filled once (tests/warm_kernels.py: the servers' kernels and DGS workers'
# in two processes at once), so the xdist workers, servers and Ray workers load the common
# kernels instead of each compiling them.
warm-kernels: $(STAMP)
	$(BIN)/python -m tests.warm_kernels dgs & $(BIN)/python -m tests.warm_kernels engines; wait

pytest-warm: warm-kernels
	$(MAKE) --no-print-directory pytest

pytest: $(STAMP)
	$(BIN)/python -m pytest -q --durations=15 -n 2 --dist loadgroup

# The inner loop: every test not marked slow or distributed (under 2 minutes on a warm venv).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q --durations=5 -n 2 --dist loadgroup -m "not slow and not distributed"

# Benchmarks need PyG's NeighborLoader baseline: torch-sparse from ../shared/wheels.
bench: $(STAMP)
	$(BIN)/pip install -q ../shared/wheels/*.whl
	$(BIN)/python bench/sampling.py
	$(BIN)/python bench/serving.py
	$(BIN)/python bench/overload.py
	$(BIN)/python bench/cold_start.py
	$(BIN)/python bench/store_check.py
	$(BIN)/python bench/dynamic.py
	$(BIN)/python bench/dynamic_http.py
	$(BIN)/python bench/presample_backends.py
	$(BIN)/python bench/srpe.py
	$(BIN)/python bench/cgp.py
	$(BIN)/python bench/faas.py
	$(BIN)/python bench/fresh.py

bench-overload: $(STAMP)
	$(BIN)/python bench/overload.py

bench-quick: $(STAMP)
	$(BIN)/pip install -q ../shared/wheels/*.whl
	$(BIN)/python bench/sampling.py --quick
	$(BIN)/python bench/serving.py --quick
	$(BIN)/python bench/overload.py --quick
	$(BIN)/python bench/cold_start.py --quick
	$(BIN)/python bench/store_check.py --quick
	$(BIN)/python bench/dynamic.py --quick
	$(BIN)/python bench/dynamic_http.py --quick
	$(BIN)/python bench/presample_backends.py --quick
	$(BIN)/python bench/faas.py --quick
	$(BIN)/python bench/srpe.py --quick
	$(BIN)/python bench/cgp.py --quick
	$(BIN)/python bench/fresh.py --quick

clean:
	rm -rf $(VENV) demo_data site .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
