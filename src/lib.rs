//! Tessera: Pallas-style block kernels in Rust.
//!
//! Write a kernel with [`kernel`], launch it with [`pallas_call`](dsl::pallas_call),
//! run it with [`runtime::run`] and check it against [`kernels`]' references. This
//! crate re-exports the pieces; the `tessera` binary is the command-line tool.
//!
//! The README follows; its kernel example is compiled as a doctest.
#![doc = include_str!("../README.md")]

pub use kernel_ir::{self, dsl, export_ops};
pub use kernel_macros::{kernel, kernel_fn};
pub use kernels;
pub use runtime;

/// Everything a kernel author needs: the DSL prelude and the attributes.
pub mod prelude {
    pub use kernel_ir::dsl::prelude::*;
    pub use kernel_macros::{kernel, kernel_fn};
}
