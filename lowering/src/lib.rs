//! Lowerings of verified `kernel_ir::Kernel`s: [`stablehlo`] for the XLA fallback,
//! [`mosaic`] for TPUs (a `tpu_custom_call`), [`cpu`] (upstream MLIR) for the native
//! CPU backend. All emit MLIR text; the runtime parses and compiles it. The interpreter
//! in `kernel-ir` defines the semantics every lowering must match. Callers go through
//! one interface, [`Lowering`] (its checks and emitter behind one fallible entry).

pub mod cpu;
pub mod hlo;
pub mod mosaic;
pub mod stablehlo;
mod target;
mod text;
pub mod tpu_rules;

pub use target::{Cpu, LowerError, Lowering, Mosaic, StableHlo, Target};
