//! Builds the C++ helper that raises exceptions for the dispatcher-registered ops, and,
//! when PyTorch's headers are found, the native autograd kernels (src/autograd.cc) as a
//! shared library the extension embeds (cfg `autograd_shim`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/throw.cc");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("src/throw.cc")
        .compile("tessera_throw");

    println!("cargo::rustc-check-cfg=cfg(autograd_shim)");
    println!("cargo:rerun-if-changed=src/autograd.cc");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    let Some(torch) = torch_dir() else {
        println!(
            "cargo:warning=PyTorch's headers not found (LIBTORCH, or `import torch` in \
             PYO3_PYTHON/python3): the ops' autograd kernels stay in Python"
        );
        return;
    };
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    match build_shim(&torch, &out.join("libtessera_autograd.so")) {
        Ok(()) => println!("cargo:rustc-cfg=autograd_shim"),
        Err(e) => println!("cargo:warning=native autograd kernels not built: {e}"),
    }
}

/// The PyTorch install whose headers and libraries the shim builds against: `$LIBTORCH`
/// (this repository's cargo config points it at the venv's torch), else the package
/// `import torch` finds in `$PYO3_PYTHON` (maturin's interpreter) or `python3`.
fn torch_dir() -> Option<PathBuf> {
    let has_headers = |dir: &Path| dir.join("include/torch/library.h").is_file();
    if let Some(dir) = std::env::var_os("LIBTORCH").map(PathBuf::from) {
        if has_headers(&dir) {
            return Some(dir);
        }
    }
    let python = std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".into());
    let found = Command::new(python)
        .args([
            "-c",
            "import os, torch; print(os.path.dirname(torch.__file__))",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let dir = PathBuf::from(String::from_utf8(found.stdout).ok()?.trim());
    has_headers(&dir).then_some(dir)
}

/// Compiles src/autograd.cc into the shared library `out`, linked to `torch`'s libraries
/// (by their sonames: at run time they are the ones `import torch` loaded).
fn build_shim(torch: &Path, out: &Path) -> Result<(), String> {
    let include = torch.join("include");
    let compiler = cc::Build::new().cpp(true).get_compiler();
    let status = compiler
        .to_command()
        .args([
            "-std=c++20",
            "-O2",
            "-fPIC",
            "-shared",
            "-D_GLIBCXX_USE_CXX11_ABI=1",
        ])
        .arg("-I")
        .arg(&include)
        .arg("-I")
        .arg(include.join("torch/csrc/api/include"))
        .arg("src/autograd.cc")
        .arg("-L")
        .arg(torch.join("lib"))
        .args(["-ltorch_cpu", "-lc10", "-o"])
        .arg(out)
        .status()
        .map_err(|e| format!("cannot run the C++ compiler: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("compiling src/autograd.cc failed ({status})"))
}
