//! Tessera's block-level kernel IR.
//!
//! A [`Kernel`] is a grid, refs whose [`BlockSpec`]s place one block per program, and
//! an SSA body of block ops. This crate holds the IR itself, the [`KernelBuilder`] that
//! the `#[kernel]` macro expands into, the [`verify`] pass, the text form
//! ([`print_kernel`] / [`parse_kernel`]) and the reference interpreter ([`interpret`]),
//! which defines the semantics every backend is checked against.

mod array;
mod builder;
pub mod chain;
mod check_outputs;
pub mod dsl;
mod interp;
mod ir;
pub mod op_library;
pub mod ops;
mod parse;
mod print;
pub mod testing;
mod types;
mod verify;

pub use array::{
    from_half_bits, human_bytes, round_to, to_half_bits, try_vec, try_with_capacity, AllocError,
    Array, ArrayData, ArrayError,
};
pub use builder::KernelBuilder;
pub use check_outputs::CheckOutputs;
pub use interp::{
    check_allocatable, check_inputs, check_scalar_prefetch, interpret, prefetch_data,
    InterpretOptions, RunError,
};
pub use ir::*;
pub use ops::{OpFamily, OpTraits};
pub use parse::{parse_kernel, ParseError};
pub use print::{print_kernel, Namer};
pub use types::{row_major_strides, DType, TensorType};
pub use verify::{unflatten, verify, VerifyError};

/// Any error of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Malformed IR text.
    #[error("parse error: {0}")]
    Parse(#[from] ParseError),
    /// A kernel that breaks an IR rule.
    #[error("{0}")]
    Verify(#[from] VerifyError),
    /// A failed run.
    #[error("{0}")]
    Run(#[from] RunError),
}
