# Tessera: the README's two commands are `make demo` and `make test`.
# Every install step lives here and is idempotent.

CARGO ?= cargo
BIN := target/release/tessera

.PHONY: demo test setup build lint fmt-check clippy clean

## setup: check the toolchain this build needs (Rust, from the machine's rustup).
setup:
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (rustup)"; exit 1; }

build: setup
	$(CARGO) build --release --workspace

## demo: build, run every library kernel on every backend, print errors and timings.
demo: build
	$(BIN) demo

## test: every test, plus formatting and lints.
test: setup lint
	$(CARGO) test --release --workspace

lint: fmt-check clippy

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings

clean:
	$(CARGO) clean
