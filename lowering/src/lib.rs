//! Lowerings of verified `kernel_ir::Kernel`s: Mosaic TPU wrapped in a StableHLO
//! `tpu_custom_call`, plain StableHLO for the XLA fallback, and upstream MLIR for the
//! native CPU backend. Each target gets a module here as its issue lands; the
//! interpreter in `kernel-ir` defines the semantics they must match.
