//! Binaries that link libtorch find it through an rpath to the venv's PyTorch.
fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if let Ok(dir) = std::env::var("LIBTORCH") {
        let lib = std::fs::canonicalize(std::path::Path::new(&dir).join("lib"))
            .unwrap_or_else(|_| std::path::PathBuf::from(&dir).join("lib"));
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    }
}
