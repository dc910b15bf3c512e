//! `#[kernel]` and `#[kernel_fn]`: Rust functions that are traced into Tessera's block IR.
//!
//! The macro keeps the function a plain Rust function whose body runs against
//! `kernel_ir::dsl` handles (`Ref`, `Tensor`) and rewrites what Rust cannot overload:
//! `for` loops become IR loops whose carried values are the outer variables the body
//! assigns, `if` on a traced bool becomes an IR `if`, comparisons and `&&`/`||` become
//! trait calls that trace for kernel values and evaluate for Rust values. Constructs
//! that cannot be traced are compile errors at the user's span. See `README.md`.

mod carried;
mod checks;
mod expand;
mod paths;
mod rewrite;
mod signature;

use proc_macro::TokenStream;

/// Marks a kernel body. Parameters are refs (`x: Ref`, one per input, output and
/// scratch buffer, in that order) and compile-time parameters marked `#[comptime]`.
/// Launch it with `pallas_call(|x, o| my_kernel(x, o, block))`.
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(attr.into(), item.into(), expand::Kind::Kernel).into()
}

/// Marks a helper that kernels may call: the same language as `#[kernel]`, taking and
/// returning kernel values (`Tensor`, `Ref`) and Rust values.
#[proc_macro_attribute]
pub fn kernel_fn(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(attr.into(), item.into(), expand::Kind::Helper).into()
}
