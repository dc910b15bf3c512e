//! Generates PJRT C API bindings from the header that the `xla-cpu-pjrt` wheel ships
//! (installed into `.venv` by `make setup`), and XLA FFI bindings (custom calls that run
//! Tessera kernels inside XLA programs) from the header jaxlib ships. Without the PJRT
//! header the XLA backend is compiled out and reports why it is unavailable; without
//! the FFI header, XLA programs cannot call Tessera kernels (graph mode says so). Nothing
//! is generated without the `xla` feature.

#[cfg(feature = "xla")]
use std::path::{Path, PathBuf};

/// `<repo>/.venv/lib/python3.*/site-packages/<package>`, if it holds `file`.
#[cfg(feature = "xla")]
fn site_package(repo: &Path, package: &str, file: &str) -> Option<PathBuf> {
    let lib = repo.join(".venv").join("lib");
    std::fs::read_dir(&lib).ok()?.flatten().find_map(|entry| {
        let dir = entry.path().join("site-packages").join(package);
        dir.join(file).exists().then_some(dir)
    })
}

/// Generates bindings for the types (and constants) named `prefix*` in `header` into
/// `OUT_DIR/out` and sets `cfg`; warns `without` if bindgen fails.
#[cfg(feature = "xla")]
fn bindings(header: &Path, prefix: &str, out: &str, cfg: &str, without: &str) {
    println!("cargo:rerun-if-changed={}", header.display());
    let generated = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_type(format!("{prefix}.*"))
        .allowlist_var(format!("{prefix}.*"))
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .generate();
    match generated {
        Ok(b) => {
            let path = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo")).join(out);
            b.write_to_file(&path).expect("OUT_DIR is writable");
            println!("cargo:rustc-cfg={cfg}");
        }
        Err(e) => println!(
            "cargo:warning=bindgen failed on {}: {e}; {without}",
            header.display()
        ),
    }
}

/// XLA FFI bindings (cfg `tessera_xla_ffi`) from `jaxlib/include/xla/ffi/api/c_api.h`.
#[cfg(feature = "xla")]
fn xla_ffi_bindings(repo: &Path) {
    let file = "include/xla/ffi/api/c_api.h";
    let without = "XLA programs cannot call Tessera kernels";
    match site_package(repo, "jaxlib", file) {
        Some(dir) => bindings(
            &dir.join(file),
            "XLA_FFI_",
            "xla_ffi_api.rs",
            "tessera_xla_ffi",
            without,
        ),
        None => println!("cargo:warning=XLA FFI header not found (run `make setup`): {without}"),
    }
}

fn main() {
    println!("cargo:rustc-check-cfg=cfg(tessera_pjrt)");
    println!("cargo:rustc-check-cfg=cfg(tessera_xla_ffi)");
    #[cfg(feature = "xla")]
    xla_bindings();
}

/// PJRT and XLA FFI bindings, for the `xla` feature.
#[cfg(feature = "xla")]
fn xla_bindings() {
    println!("cargo:rerun-if-env-changed=TESSERA_PJRT_HEADER");
    println!("cargo:rerun-if-env-changed=TESSERA_PJRT_PLUGIN");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let repo = manifest
        .parent()
        .expect("runtime/ sits in the repo")
        .to_path_buf();
    println!(
        "cargo:rerun-if-changed={}",
        repo.join(".venv/lib").display()
    );
    xla_ffi_bindings(&repo);
    let dir = site_package(&repo, "xla_plugins/xla_cpu_pjrt", "include/pjrt_c_api.h");
    let header = std::env::var_os("TESSERA_PJRT_HEADER")
        .map(PathBuf::from)
        .or_else(|| dir.as_ref().map(|d| d.join("include/pjrt_c_api.h")));
    let Some(header) = header.filter(|h| h.exists()) else {
        // Rebuild once `make setup` creates the venv.
        println!("cargo:rerun-if-changed={}", repo.join(".venv").display());
        println!("cargo:warning=PJRT header not found (run `make setup`): the XLA backend is compiled out");
        return;
    };
    let plugin = std::env::var_os("TESSERA_PJRT_PLUGIN")
        .map(PathBuf::from)
        .or_else(|| dir.as_ref().map(|d| d.join("xla_cpu_pjrt.so")))
        .unwrap_or_default();
    println!(
        "cargo:rustc-env=TESSERA_DEFAULT_PJRT_PLUGIN={}",
        plugin.display()
    );
    bindings(
        &header,
        "PJRT_",
        "pjrt_c_api.rs",
        "tessera_pjrt",
        "the XLA backend is compiled out",
    );
}
