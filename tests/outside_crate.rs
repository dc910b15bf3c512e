//! Tessera as a dependency: a fresh crate outside this repository that depends only on
//! the `tessera` facade (no features) builds without LLVM or libtorch, expands
//! `#[kernel]` through the facade, and runs the README's kernel on the interpreter.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The README's first Rust block: the 20-line kernel.
fn readme_kernel(repo: &Path) -> String {
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let start = readme
        .find("```rust\n")
        .expect("the README has a Rust block")
        + 8;
    let len = readme[start..].find("```").unwrap();
    readme[start..start + len].to_string()
}

/// Copies `tests/outside-crate` to a temporary directory outside the repository.
fn outside_crate(repo: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let template = repo.join("tests/outside-crate");
    let manifest = std::fs::read_to_string(template.join("Cargo.toml"))
        .unwrap()
        .replace("TESSERA_PATH", repo.to_str().unwrap());
    std::fs::write(dir.path().join("Cargo.toml"), manifest).unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::copy(template.join("src/main.rs"), dir.path().join("src/main.rs")).unwrap();
    std::fs::write(dir.path().join("src/readme.rs"), readme_kernel(repo)).unwrap();
    // The workspace's lock file pins the versions (cargo drops what is not needed).
    std::fs::copy(repo.join("Cargo.lock"), dir.path().join("Cargo.lock")).unwrap();
    dir
}

/// `cargo` in `dir` with none of this repository's build environment.
fn cargo(dir: &Path, target: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target);
    for var in [
        "MLIR_SYS_220_PREFIX",
        "TABLEGEN_220_PREFIX",
        "LIBCLANG_PATH",
        "LIBTORCH",
        "LIBTORCH_CXX11_ABI",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
    ] {
        cmd.env_remove(var);
    }
    cmd.output().expect("cargo runs")
}

#[test]
fn a_crate_depending_only_on_tessera_builds_without_llvm_and_runs() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let krate = outside_crate(&repo);
    // Kept between runs (it is outside the crate's directory, under this repo's target).
    let target = repo.join("target/outside-crate");
    let tree = cargo(
        krate.path(),
        &target,
        &["tree", "-e", "normal", "--prefix", "none"],
    );
    assert!(
        tree.status.success(),
        "{}",
        String::from_utf8_lossy(&tree.stderr)
    );
    let tree = String::from_utf8_lossy(&tree.stdout);
    for heavy in ["melior", "mlir-sys", "tch ", "torch-sys", "bindgen", "pyo3"] {
        assert!(
            !tree.contains(heavy),
            "the light build pulls `{heavy}`:\n{tree}"
        );
    }
    let run = cargo(krate.path(), &target, &["run", "--quiet"]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&run.stdout).trim(),
        "ok: rms_norm on interp"
    );
}
