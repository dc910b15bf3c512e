//! Builds the C++ helper that raises exceptions for the dispatcher-registered ops.

fn main() {
    println!("cargo:rerun-if-changed=src/throw.cc");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("src/throw.cc")
        .compile("tessera_throw");
}
