//! aten-bindings
