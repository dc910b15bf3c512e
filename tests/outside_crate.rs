//! Tessera as a dependency, and the docs' Rust snippets: a fresh crate outside this
//! repository that depends only on the `tessera` facade (no features) builds without
//! LLVM or libtorch, expands `#[kernel]` through the facade, runs the README's kernel on
//! the interpreter, and compiles every other Rust snippet of README.md, python/README.md
//! and kernel-macros/README.md (each in its own module, with the context the snippet
//! leaves out declared in [`CONTEXTS`]).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The documents whose Rust snippets are compiled.
const DOCS: &[&str] = &["README.md", "python/README.md", "kernel-macros/README.md"];

/// Where a snippet is compiled, found by a line it contains.
enum Home {
    /// `src/readme.rs`: built and run by the crate's `main`.
    Run,
    /// A module of the crate: `preamble` items (what the text refers to but does not
    /// define) before the snippet's items; its statements go in a function taking
    /// `params` and returning `Result<(), Box<dyn Error>>`.
    Compiled {
        preamble: &'static str,
        params: &'static str,
    },
    /// A doc-test of another crate (it needs that crate's dependencies): every line of
    /// the snippet is a line of that file's docs.
    DocTest(&'static str),
}

/// Each snippet's home, by a line that identifies it.
const CONTEXTS: &[(&str, Home)] = &[
    ("fn rms_norm(x: Ref, w: Ref, o: Ref", Home::Run),
    (
        "fn softmax(x: Ref, o: Ref, #[comptime] rows: u64)",
        Home::Compiled {
            preamble: "",
            params: "m: u64, n: u64",
        },
    ),
    (
        "let kernel = pallas_call(body)",
        Home::Compiled {
            preamble: "fn body(table: Ref, cache: Ref, o: Ref) { o.write(cache.read()) }",
            params: "batch: u64, max_pages: u64, page_size: u64, d: u64, cache_ty: TensorType, \
                     out_ty: TensorType, out_spec: BlockSpecFn",
        },
    ),
    (
        "fn flash_attention_fwd(q: Ref, k: Ref, v: Ref, o: Ref, lse: Ref",
        Home::Compiled {
            // The library's helpers the README's trimmed kernel calls.
            preamble: "use tessera::kernels::AttentionConfig;
                #[kernel_fn]
                fn load_tile(r: Ref, rows: u64, cols: u64, row0: Tensor, col0: Tensor,
                             nrows: u64, ncols: u64) -> Tensor {
                    r.read()
                }
                #[kernel_fn]
                fn causal_mask(scores: Tensor, bq: u64, bk: u64, q0: Tensor, k0: Tensor) -> Tensor {
                    let later = (iota([bq, bk], 1) + k0).gt(iota([bq, bk], 0) + q0);
                    select(later, f64::NEG_INFINITY, scores)
                }",
            params: "",
        },
    ),
    (
        "fn build_bias_gelu_tanh(args: &OpArgs) -> Result<Built, String> {",
        Home::Compiled {
            preamble: "",
            params: "",
        },
    ),
    (
        "let (out, lse) = aten_bindings::flash_attention(",
        Home::DocTest("aten-bindings/src/lib.rs"),
    ),
];

/// A fenced Rust block of a document: where it starts and its text.
struct Snippet {
    place: String,
    text: String,
}

/// The Rust blocks (```` ```rust ````, with or without attributes) of `doc`.
fn rust_snippets(repo: &Path, doc: &str) -> Vec<Snippet> {
    let text = std::fs::read_to_string(repo.join(doc)).unwrap();
    let mut snippets = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        match &mut open {
            None if line.starts_with("```rust") => open = Some((i + 1, String::new())),
            None => {}
            Some((start, body)) if line.starts_with("```") => {
                snippets.push(Snippet {
                    place: format!("{doc}:{start}"),
                    text: std::mem::take(body),
                });
                open = None;
            }
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
        }
    }
    snippets
}

/// A snippet's items (`use`, attributes, `fn`, macros... at column 0, to the closing
/// `}` or `;` at column 0) and its statements (the rest).
fn items_and_statements(text: &str) -> (String, String) {
    const ITEM_STARTS: &[&str] = &[
        "use ",
        "#[",
        "fn ",
        "pub ",
        "struct ",
        "enum ",
        "const ",
        "impl ",
        "tessera::",
    ];
    let (mut items, mut statements) = (String::new(), String::new());
    let mut in_item = false;
    for line in text.lines() {
        in_item |= ITEM_STARTS.iter().any(|s| line.starts_with(s));
        let out = if in_item { &mut items } else { &mut statements };
        out.push_str(line);
        out.push('\n');
        let ends_item =
            line.starts_with('}') || (line.starts_with("use ") && line.trim_end().ends_with(';'));
        if ends_item {
            in_item = false;
        }
    }
    (items, statements)
}

/// The lines of a file's doc comments (`//!`, `///`), without the markers and `# `.
fn doc_lines(file: &str) -> Vec<String> {
    file.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            l.strip_prefix("//!").or_else(|| l.strip_prefix("///"))
        })
        .map(|l| l.trim().to_string())
        .collect()
}

/// `src/readme.rs` (the run snippet) and `src/snippets.rs` (a module per compiled
/// snippet); checks snippets whose home is another crate's doc-test.
fn generated_sources(repo: &Path) -> (String, String) {
    let mut readme = None;
    let mut modules = String::new();
    for doc in DOCS {
        for (n, snippet) in rust_snippets(repo, doc).into_iter().enumerate() {
            let home = CONTEXTS
                .iter()
                .find(|(key, _)| snippet.text.contains(key))
                .map(|(_, home)| home)
                .unwrap_or_else(|| {
                    panic!(
                        "{}: a Rust snippet with no home in tests/outside_crate.rs's CONTEXTS:\n{}",
                        snippet.place, snippet.text
                    )
                });
            match home {
                Home::Run => readme = Some(snippet.text),
                Home::Compiled { preamble, params } => {
                    let (items, statements) = items_and_statements(&snippet.text);
                    let body = if statements.trim().is_empty() {
                        String::new()
                    } else {
                        format!(
                            "fn _statements({params}) -> Result<(), Box<dyn std::error::Error>> {{\n\
                             {statements}\nOk(())\n}}\n"
                        )
                    };
                    modules.push_str(&format!(
                        "/// {}\n#[allow(unused, dead_code, clippy::all)]\nmod snippet_{}_{n} {{\n\
                         use tessera::prelude::*;\n{preamble}\n{items}\n{body}}}\n\n",
                        snippet.place,
                        doc.replace(['/', '.', '-'], "_").to_lowercase(),
                    ));
                }
                Home::DocTest(file) => {
                    let docs = doc_lines(&std::fs::read_to_string(repo.join(file)).unwrap());
                    for line in snippet
                        .text
                        .lines()
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                    {
                        assert!(
                            docs.iter().any(|d| d == line),
                            "{}: the line `{line}` is not in the doc-test of {file}",
                            snippet.place
                        );
                    }
                }
            }
        }
    }
    (readme.expect("the README's kernel snippet"), modules)
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
    let (readme, snippets) = generated_sources(repo);
    std::fs::write(dir.path().join("src/readme.rs"), readme).unwrap();
    std::fs::write(dir.path().join("src/snippets.rs"), snippets).unwrap();
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
fn a_crate_depending_only_on_tessera_builds_without_llvm_runs_and_compiles_the_doc_snippets() {
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
        "{}\n(src/snippets.rs:\n{})",
        String::from_utf8_lossy(&run.stderr),
        generated_sources(&repo).1
    );
    assert_eq!(
        String::from_utf8_lossy(&run.stdout).trim(),
        "ok: rms_norm on interp"
    );
}

/// A snippet's items and statements are told apart as the generated module needs.
#[test]
fn snippets_split_into_items_and_statements() {
    let (items, statements) = items_and_statements(
        "use a::b;\n#[kernel]\nfn f(x: Ref) {\n    x.read();\n}\n\nlet k = pallas_call(f)\n    .build()?;\n",
    );
    assert_eq!(
        items,
        "use a::b;\n#[kernel]\nfn f(x: Ref) {\n    x.read();\n}\n"
    );
    assert_eq!(statements, "\nlet k = pallas_call(f)\n    .build()?;\n");
}
