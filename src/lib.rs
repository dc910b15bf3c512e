//! tessera
