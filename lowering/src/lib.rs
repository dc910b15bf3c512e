//! Lowerings of verified `kernel_ir::Kernel`s. [`stablehlo`] produces the XLA fallback
//! module; Mosaic TPU (a `tpu_custom_call`) and upstream MLIR for the native CPU backend
//! get their modules here as their issues land. The interpreter in `kernel-ir` defines
//! the semantics every lowering must match.

pub mod hlo;
pub mod mosaic;
pub mod stablehlo;
mod text;
pub mod tpu_rules;
