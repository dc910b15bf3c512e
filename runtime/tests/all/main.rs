//! The runtime's integration tests, in one binary: every test binary links LLVM and MLIR
//! statically (a few hundred MB each), so one binary instead of nine saves gigabytes of
//! disk and most of the link time. A test of a backend needs its feature (`make test`
//! builds with every feature).

mod cache;
mod checks;
mod common;

#[cfg(all(feature = "native", feature = "xla"))]
mod backends;
#[cfg(feature = "native")]
mod chain;
#[cfg(all(feature = "native", feature = "xla"))]
mod concurrency;
#[cfg(feature = "xla")]
mod custom_call;
#[cfg(feature = "native")]
mod native;
#[cfg(feature = "native")]
mod native_fallback;
#[cfg(all(feature = "native", feature = "xla"))]
mod ops;
