//! Generates PJRT C API bindings from the header that the `xla-cpu-pjrt` wheel ships
//! (installed into `.venv` by `make setup`), and XLA FFI bindings (custom calls that run
//! Tessera kernels inside XLA programs) from the header jaxlib ships. Without the PJRT
//! header the XLA backend is compiled out and reports why it is unavailable; without
//! the FFI header, XLA programs cannot call Tessera kernels (graph mode says so).

use std::path::{Path, PathBuf};

/// `<repo>/.venv/lib/python3.*/site-packages/<package>`, if it holds `file`.
fn site_package(repo: &Path, package: &str, file: &str) -> Option<PathBuf> {
    let lib = repo.join(".venv").join("lib");
    std::fs::read_dir(&lib).ok()?.flatten().find_map(|entry| {
        let dir = entry.path().join("site-packages").join(package);
        dir.join(file).exists().then_some(dir)
    })
}

/// XLA FFI bindings (cfg `tessera_xla_ffi`) from `jaxlib/include/xla/ffi/api/c_api.h`.
fn xla_ffi_bindings(repo: &Path) {
    println!("cargo:rustc-check-cfg=cfg(tessera_xla_ffi)");
    let file = "include/xla/ffi/api/c_api.h";
    let Some(header) = site_package(repo, "jaxlib", file).map(|d| d.join(file)) else {
        println!("cargo:warning=XLA FFI header not found (run `make setup`): XLA programs cannot call Tessera kernels");
        return;
    };
    println!("cargo:rerun-if-changed={}", header.display());
    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_type("XLA_FFI_.*")
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .generate();
    match bindings {
        Ok(b) => {
            let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"))
                .join("xla_ffi_api.rs");
            b.write_to_file(&out).expect("OUT_DIR is writable");
            println!("cargo:rustc-cfg=tessera_xla_ffi");
        }
        Err(e) => println!(
            "cargo:warning=bindgen failed on {}: {e}; XLA programs cannot call Tessera kernels",
            header.display()
        ),
    }
}

fn main() {
    println!("cargo:rustc-check-cfg=cfg(tessera_pjrt)");
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
    println!("cargo:rerun-if-changed={}", header.display());
    let plugin = std::env::var_os("TESSERA_PJRT_PLUGIN")
        .map(PathBuf::from)
        .or_else(|| dir.as_ref().map(|d| d.join("xla_cpu_pjrt.so")))
        .unwrap_or_default();
    println!(
        "cargo:rustc-env=TESSERA_DEFAULT_PJRT_PLUGIN={}",
        plugin.display()
    );
    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_type("PJRT_.*")
        .allowlist_var("PJRT_.*")
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .generate();
    match bindings {
        Ok(b) => {
            let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"))
                .join("pjrt_c_api.rs");
            b.write_to_file(&out).expect("OUT_DIR is writable");
            println!("cargo:rustc-cfg=tessera_pjrt");
        }
        Err(e) => println!(
            "cargo:warning=bindgen failed on {}: {e}; the XLA backend is compiled out",
            header.display()
        ),
    }
}
