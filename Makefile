# Tessera: the README's two commands are `make demo` and `make test`.
# Every install step lives here, and each is idempotent (skipped when already done).

CARGO ?= cargo
PYTHON ?= python3
VENV := .venv
PIP := $(VENV)/bin/pip
BIN := target/release/tessera

# Debian packages: libclang for bindgen (PJRT bindings from the plugin's header); LLVM
# and MLIR 22 for the native backend (melior links them statically); g++ for the Python
# extension's exception helper (and torch.compile's Inductor).
APT_PACKAGES := libclang-14-dev llvm-22-dev libmlir-22-dev mlir-22-tools libclang-22-dev \
	libzstd-dev libpolly-22-dev g++
# The XLA CPU PJRT plugin; its wheel also ships the pjrt_c_api.h the bindings come from.
PJRT_PLUGIN := xla-cpu-pjrt==0.0.1
PJRT_STAMP := $(VENV)/.pjrt-$(PJRT_PLUGIN)
# jax/jaxlib: their `tpu` dialect checks the Mosaic output in the tests (CPU only);
# libtpu compiles it for device-free v5e/v6e targets.
JAX := jax==0.10.2 jaxlib==0.10.2 libtpu==0.0.42.1
JAX_STAMP := $(VENV)/.jax-0.10.2-libtpu-0.0.42.1
# PyTorch (a CUDA build that runs on CPU), maturin for the extension, pytest, and
# torch-mlir (graph mode imports FX graphs to StableHLO with it).
TORCH := torch==2.13.0 maturin==1.16.0 pytest torch-mlir==20261001
TORCH_STAMP := $(VENV)/.torch-2.13.0-torch-mlir-20261001
# Optional test dependencies: the real models graph mode is tested on (Transformers,
# timm, diffusers), with torch pinned in the same call so their requirements cannot
# replace it.
MODEL_LIBS := transformers==5.23.0 timm==1.0.31 diffusers==0.42.1 torchvision==0.28.0 torch==2.13.0
MODEL_LIBS_STAMP := $(VENV)/.transformers-5.23.0-timm-1.0.31-diffusers-0.42.1
# The Python linter and formatter (`make lint`; its rules are in python/pyproject.toml).
RUFF := ruff==0.17.6
RUFF_STAMP := $(VENV)/.ruff-0.17.6

.PHONY: demo test setup apt python build lint fmt-check clippy ruff fuzz clean

## setup: install what the build and tests need (system packages; the venv with the
## PJRT plugin, jax/jaxlib/libtpu, torch, maturin and pytest).
setup: apt $(PJRT_STAMP) $(JAX_STAMP) $(TORCH_STAMP) $(MODEL_LIBS_STAMP) $(RUFF_STAMP) $(VENV)/torch
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (rustup)"; exit 1; }

apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(PJRT_STAMP): $(VENV)/bin/python
	$(PIP) install -q --no-deps $(PJRT_PLUGIN)
	touch $@

$(JAX_STAMP): $(VENV)/bin/python
	$(PIP) install -q $(JAX)
	touch $@

$(TORCH_STAMP): $(VENV)/bin/python
	$(PIP) install -q $(TORCH)
	touch $@

$(MODEL_LIBS_STAMP): $(TORCH_STAMP)
	$(PIP) install -q $(MODEL_LIBS)
	touch $@

$(RUFF_STAMP): $(VENV)/bin/python
	$(PIP) install -q $(RUFF)
	touch $@

# tch links this PyTorch's libtorch through .venv/torch (LIBTORCH in .cargo/config.toml).
$(VENV)/torch: | $(TORCH_STAMP)
	ln -sfn "$$($(VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torch" $@

## python: build the extension into the venv (`import tessera` registers torch.ops.tessera.*).
python: setup
	cd python && VIRTUAL_ENV=$(CURDIR)/$(VENV) PATH=$(CURDIR)/$(VENV)/bin:$$PATH maturin develop --release -q

# Every crate with every feature (the facade's `cli` feature builds the `tessera` binary).
build: setup
	$(CARGO) build --release --workspace --all-features

## demo: build, run every library kernel on every backend, print errors and timings.
demo: build
	$(BIN) demo

## test: every test (XLA, jaxlib and torch required), formatting and lints, and a
## bounded fuzzing run.
test: setup lint python
	TESSERA_REQUIRE_XLA=1 TESSERA_REQUIRE_JAX=1 $(CARGO) test --release --workspace --all-features
	$(VENV)/bin/python -m pytest -q python/tests
	$(MAKE) --no-print-directory fuzz

## fuzz: coverage-guided fuzzing (libFuzzer, stable Rust) of the IR parser + verifier and
## the cache-entry reader, FUZZ_SECONDS each; the committed regression inputs are
## replayed first. Crashes land in target/fuzz-artifacts/.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := parse cache_entry
FUZZ_RUSTFLAGS := -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
	-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
	-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks
# An explicit --target keeps the instrumentation out of build scripts and proc macros.
HOST := $(shell rustc -vV 2>/dev/null | sed -n 's/^host: //p')
FUZZ_BIN := target/fuzz/$(HOST)/release
# Seeds: the kept inputs, plus every library kernel's IR when the CLI is built.
fuzz:
	cd kernel-ir/fuzz && CARGO_TARGET_DIR=$(CURDIR)/target/fuzz RUSTFLAGS="$(FUZZ_RUSTFLAGS)" \
		$(CARGO) build --release --bins -q --target $(HOST)
	@mkdir -p target/fuzz-corpus/parse target/fuzz-corpus/cache_entry target/fuzz-artifacts
	@if [ -x $(BIN) ]; then for k in $$($(BIN) list); do $(BIN) ir $$k > target/fuzz-corpus/parse/$$k.ir; done; fi
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz $$t: $(FUZZ_SECONDS) s"; \
		$(FUZZ_BIN)/$$t target/fuzz-corpus/$$t kernel-ir/fuzz/regressions/$$t \
			-max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
			-artifact_prefix=target/fuzz-artifacts/$$t- > target/fuzz-artifacts/$$t.log 2>&1; \
		rc=$$?; grep -E "^stat::(number_of_executed_units|new_units_added)|panicked|SUMMARY" target/fuzz-artifacts/$$t.log; \
		test $$rc -eq 0 || { tail -30 target/fuzz-artifacts/$$t.log; echo "fuzz $$t failed: see target/fuzz-artifacts/"; exit 1; }; \
	done

lint: fmt-check clippy ruff

## ruff: the Python package, tests and examples linted and format-checked.
ruff: $(RUFF_STAMP)
	$(VENV)/bin/ruff check python
	$(VENV)/bin/ruff format --check python

# The user op library example is its own workspace (as a user's crate is).
USER_OPS := --manifest-path python/examples/user_ops/Cargo.toml

fmt-check:
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt $(USER_OPS) -- --check

# Also the light configuration (no features: interpreter only, no LLVM or libtorch).
clippy: setup
	$(CARGO) clippy --release --workspace --all-targets --all-features -- -D warnings
	$(CARGO) clippy --release -p tessera -p runtime --all-targets -- -D warnings
	$(CARGO) clippy --release $(USER_OPS) --target-dir target/outside-crate -- -D warnings

clean:
	$(CARGO) clean
