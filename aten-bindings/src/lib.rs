//! Tessera kernels callable on `tch::Tensor`s, with PyTorch's own kernel as the
//! fallback beside each one. The tch dependency (and its libtorch build) arrives with
//! the ATen issue; until then this crate is empty so the workspace stays light.
