//! Lowerings of Tessera kernels.
