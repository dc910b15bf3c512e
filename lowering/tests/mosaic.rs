//! The Mosaic lowering: TPU rule errors, and every library kernel checked with the real
//! `tpu` dialect from jaxlib and compiled by libtpu's Mosaic compiler for v5e and v6e
//! (`check_mosaic.py`), plus a comparison with the module JAX Pallas emits for the same
//! matmul. The jaxlib checks need the venv that `make setup`
//! fills; `make test` sets TESSERA_REQUIRE_JAX=1 so a missing jaxlib fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use kernels::{all, find, Params};
use lowering::mosaic;
use lowering::tpu_rules::{check, TpuLimits};

fn python() -> Option<PathBuf> {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let has_jax = Command::new(&python)
        .args(["-c", "import jax, jaxlib, libtpu"])
        .output()
        .is_ok_and(|o| o.status.success());
    if has_jax {
        return Some(python);
    }
    assert!(
        std::env::var_os("TESSERA_REQUIRE_JAX").is_none(),
        "jax/jaxlib/libtpu are not installed in .venv: run `make setup`"
    );
    eprintln!("skipping: jax/jaxlib/libtpu are not installed in .venv (run `make setup`)");
    None
}

fn run_checker(python: &Path, args: &[&str]) -> String {
    // libtpu allows one process at a time (its lockfile), and every mode of the checker
    // may load it (JAX initialises its backends): the runs take turns.
    static LIBTPU: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = LIBTPU.lock().unwrap_or_else(|e| e.into_inner());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/check_mosaic.py");
    let out = Command::new(python)
        .arg(script)
        .args(args)
        .output()
        .expect("python runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "check_mosaic.py {args:?} failed:\n{text}"
    );
    text
}

/// Library kernels at their defaults and in variants that meet the TPU tiling rules.
fn cases() -> Vec<(&'static str, Vec<String>)> {
    let mut cases: Vec<(&'static str, Vec<String>)> =
        all().iter().map(|k| (k.name(), vec![])).collect();
    for attention in ["flash_attention", "flash_attention_bwd"] {
        cases.push((
            attention,
            vec!["causal=true,heads=8,kv_heads=2,dtype=bf16,q_len=256,kv_len=384".into()],
        ));
        cases.push((
            attention,
            vec!["q_len=200,kv_len=72,block_q=64,block_k=64,head_dim=128".into()],
        ));
        cases.push((
            attention,
            vec!["causal=true,window=100,softcap=30,q_len=512,kv_len=512,dtype=bf16".into()],
        ));
    }
    cases.push(("matmul", vec!["m=200,k=384,n=256,dtype=bf16".into()]));
    cases.push((
        "softmax",
        vec!["rows=100,cols=384,block_rows=16,dtype=bf16".into()],
    ));
    cases
}

#[test]
fn every_library_kernel_verifies_with_jaxlibs_tpu_dialect() {
    let dir = tempfile::tempdir().unwrap();
    let mut written = 0;
    for (i, (name, overrides)) in cases().into_iter().enumerate() {
        let k = find(name).unwrap();
        let p = Params::parse(k.params(), &overrides).unwrap();
        for (j, kernel) in k.build(&p).unwrap().iter().enumerate() {
            let text = mosaic::lower(kernel, &TpuLimits::default())
                .unwrap_or_else(|e| panic!("{name} {p}: {e}"));
            assert!(text.contains("stablehlo.custom_call @tpu_custom_call"));
            std::fs::write(
                dir.path()
                    .join(format!("{i:02}_{j}_{}.mosaic.mlir", kernel.name)),
                text,
            )
            .unwrap();
            written += 1;
        }
    }
    let Some(python) = python() else { return };
    let report = run_checker(&python, &[dir.path().to_str().unwrap()]);
    assert_eq!(
        report.lines().filter(|l| l.starts_with("ok ")).count(),
        written,
        "{report}"
    );
}

#[test]
fn matmul_matches_what_jax_pallas_emits() {
    let k = find("matmul").unwrap();
    let p = Params::parse(
        k.params(),
        &["m=256,k=256,n=256,bm=128,bk=128,bn=128".into()],
    )
    .unwrap();
    let kernel = &k.build(&p).unwrap()[0];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("matmul.mlir");
    std::fs::write(&path, mosaic::lower(kernel, &TpuLimits::default()).unwrap()).unwrap();
    let Some(python) = python() else { return };
    let report = run_checker(
        &python,
        &["--compare-pallas", "matmul", path.to_str().unwrap()],
    );
    for key in [
        "iteration_bounds",
        "dimension_semantics",
        "window_bounds",
        "arg_types",
        "index_maps",
    ] {
        assert!(report.contains(&format!("same {key}")), "{report}");
    }
}

/// Scalar prefetch as Pallas's `PrefetchScalarGridSpec` emits it: the table a leading
/// SMEM argument with no window, `scalar_prefetch = 1`, transforms that take it and
/// `memref.load` from it; libtpu compiles it for v5e.
#[test]
fn scalar_prefetch_matches_what_jax_pallas_emits_and_compiles() {
    let kernel = kernel_ir::testing::prefetch_gather(4, 5, 8, 128);
    let text = mosaic::lower(&kernel, &TpuLimits::default()).unwrap();
    let body = mosaic::lower_body(&kernel, &TpuLimits::default()).unwrap();
    assert!(body.contains("scalar_prefetch = 1 : i64"), "{body}");
    assert!(
        body.contains(
            "func.func @transform_0(%arg0: i32, %arg1: memref<5xi32, #tpu.memory_space<smem>>)"
        ),
        "{body}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("prefetch_gather.mosaic.mlir");
    std::fs::write(&path, text).unwrap();
    let Some(python) = python() else { return };
    let report = run_checker(
        &python,
        &[
            "--compare-pallas",
            "prefetch_gather",
            path.to_str().unwrap(),
        ],
    );
    for key in [
        "iteration_bounds",
        "dimension_semantics",
        "scalar_prefetch",
        "window_bounds",
        "arg_types",
        "index_maps",
    ] {
        assert!(report.contains(&format!("same {key}")), "{report}");
    }
    let dir = dir.path().to_str().unwrap();
    let compiled = run_checker(&python, &["--compile", "v5e:2x2", dir]);
    assert!(
        compiled.contains("compiled prefetch_gather.mosaic.mlir for v5e:2x2"),
        "{compiled}"
    );
}

fn rule_error(name: &str, overrides: &str, limits: TpuLimits) -> String {
    let k = find(name).unwrap();
    let p = Params::parse(k.params(), &[overrides.to_string()]).unwrap();
    let kernel = &k.build(&p).unwrap()[0];
    check(kernel, &limits).unwrap_err().to_string()
}

#[test]
fn tpu_rules_name_the_operand_dim_rule_and_a_fix() {
    let e = rule_error(
        "matmul",
        "m=256,k=256,n=256,bm=128,bk=100,bn=128",
        TpuLimits::default(),
    );
    assert!(
        e.contains("`in %x`") && e.contains("block dim 1 (the last) is 100"),
        "{e}"
    );
    assert!(
        e.contains("divisible by 128 or equal the array dim 256; try block shape [128, 128]"),
        "{e}"
    );
    let e = rule_error(
        "softmax",
        "rows=64,cols=256,block_rows=4",
        TpuLimits::default(),
    );
    assert!(
        e.contains("block dim 0 (the second-to-last) is 4")
            && e.contains("try block shape [8, 256]"),
        "{e}"
    );
    let e = rule_error("swiglu", "dtype=f16", TpuLimits::default());
    assert!(e.contains("f16 is not supported by Mosaic"), "{e}");
    let e = rule_error(
        "matmul",
        "m=512,k=512,n=512,bm=512,bk=512,bn=512",
        TpuLimits {
            vmem_bytes: 1 << 20,
        },
    );
    assert!(
        e.contains("`kernel @matmul`") && e.contains("over the limit of 1048576 bytes"),
        "{e}"
    );
    let int_dot = kernel_ir::dsl::pallas_call(|x: kernel_ir::dsl::Ref, o: kernel_ir::dsl::Ref| {
        o.write(x.read().dot(x.read()))
    })
    .grid([1])
    .input(
        kernel_ir::TensorType::new(kernel_ir::DType::I32, [8, 8]),
        kernel_ir::dsl::block_spec([8, 8], |_| vec![0.into(), 0.into()]),
    )
    .output(
        kernel_ir::TensorType::new(kernel_ir::DType::I32, [8, 8]),
        kernel_ir::dsl::block_spec([8, 8], |_| vec![0.into(), 0.into()]),
    )
    .build()
    .unwrap();
    let e = check(&int_dot, &TpuLimits::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`dot of i32[8, 8]`") && e.contains("f32 or bf16 operands"),
        "{e}"
    );
    // Whole-array last dims are always allowed.
    assert!(check_passes("rms_norm", "rows=16,cols=300,block_rows=8"));
}

fn check_passes(name: &str, overrides: &str) -> bool {
    let k = find(name).unwrap();
    let p = Params::parse(k.params(), &[overrides.to_string()]).unwrap();
    k.build(&p)
        .unwrap()
        .iter()
        .all(|kernel| check(kernel, &TpuLimits::default()).is_ok())
}

/// Element-wise ops no library kernel uses (`erf`, for exact GELU; `sin`, `cos`) lower to a body
/// that jaxlib's `tpu` dialect verifies and libtpu compiles for v5e; its `debug_print`
/// is dropped.
#[test]
fn erf_verifies_and_compiles_for_v5e() {
    let kernel = kernel_ir::parse_kernel(
        "kernel @erf grid [2] semantics [parallel] {\n\
         in %x : f32[16, 128] block [8, 128] map (i0) -> (i0, 0) vmem\n\
         out %o : f32[16, 128] block [8, 128] map (i0) -> (i0, 0) vmem\n\
         body {\n%0 = load %x[:, :] : f32[8, 128]\n%1 = erf %0 : f32[8, 128]\n\
         debug_print \"erf \\\"x\\\":\" [%0, %1]\n%2 = sin %1 : f32[8, 128]\n\
         %3 = cos %2 : f32[8, 128]\nstore %o[:, :], %3\n}\n}",
    )
    .unwrap();
    assert!(kernel_ir::print_kernel(&kernel).contains(r#"debug_print "erf \"x\":" ["#));
    let text = mosaic::lower(&kernel, &TpuLimits::default()).unwrap();
    assert!(!text.contains("erf \\\"x"), "the print is dropped");
    assert!(text.contains("stablehlo.custom_call @tpu_custom_call"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("erf.mosaic.mlir"), text).unwrap();
    let Some(python) = python() else { return };
    let dir = dir.path().to_str().unwrap();
    assert!(run_checker(&python, &[dir]).contains("ok "));
    let compiled = run_checker(&python, &["--compile", "v5e:2x2", dir]);
    assert!(
        compiled.contains("compiled erf.mosaic.mlir for v5e:2x2"),
        "{compiled}"
    );
}

/// `gather` along lanes and along sublanes lowers to `tpu.dynamic_gather` (indices
/// clamped first), which jaxlib's `tpu` dialect verifies and libtpu compiles for v5e;
/// a gather Mosaic cannot do is refused by the TPU rules, naming it and what to do.
#[test]
fn gather_verifies_and_compiles_for_v5e() {
    let kernel = |axis: usize| {
        kernel_ir::parse_kernel(&format!(
            "kernel @gather grid [2] semantics [parallel] {{\n\
             in %x : f32[16, 128] block [8, 128] map (i0) -> (i0, 0) vmem\n\
             in %i : i32[16, 128] block [8, 128] map (i0) -> (i0, 0) vmem\n\
             out %o : f32[16, 128] block [8, 128] map (i0) -> (i0, 0) vmem\n\
             body {{\n%0 = load %x[:, :] : f32[8, 128]\n%1 = load %i[:, :] : i32[8, 128]\n\
             %2 = gather %0, %1 axis {axis} : f32[8, 128]\nstore %o[:, :], %2\n}}\n}}"
        ))
        .unwrap()
    };
    let rows_of_other_count = kernel_ir::parse_kernel(
        "kernel @gather grid [2] semantics [parallel] {\n\
         in %x : f32[16, 128] block [8, 128] map (i0) -> (i0, 0) vmem\n\
         in %i : i32[8, 128] block [4, 128] map (i0) -> (i0, 0) vmem\n\
         out %o : f32[8, 128] block [4, 128] map (i0) -> (i0, 0) vmem\n\
         body {\n%0 = load %x[:, :] : f32[8, 128]\n%1 = load %i[:, :] : i32[4, 128]\n\
         %2 = gather %0, %1 axis 0 : f32[4, 128]\nstore %o[:, :], %2\n}\n}",
    )
    .unwrap();
    let refused = mosaic::lower(&rows_of_other_count, &TpuLimits::default())
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("gather of f32[8, 128] at i32[4, 128] along axis 0")
            && refused.contains("indices shaped like it"),
        "{refused}"
    );
    let dir = tempfile::tempdir().unwrap();
    for axis in [0, 1] {
        let body = mosaic::lower_body(&kernel(axis), &TpuLimits::default()).unwrap();
        assert!(body.contains("tpu.dynamic_gather"), "{body}");
        let text = mosaic::lower(&kernel(axis), &TpuLimits::default()).unwrap();
        std::fs::write(dir.path().join(format!("gather{axis}.mosaic.mlir")), text).unwrap();
    }
    let Some(python) = python() else { return };
    let dir = dir.path().to_str().unwrap();
    assert!(run_checker(&python, &[dir]).contains("ok "));
    let compiled = run_checker(&python, &["--compile", "v5e:2x2", dir]);
    for axis in [0, 1] {
        assert!(
            compiled.contains(&format!("compiled gather{axis}.mosaic.mlir for v5e:2x2")),
            "{compiled}"
        );
    }
}

/// Paged attention (its block table and lengths read as scalars from SMEM inside the
/// body, `memref.load`), f32 and bf16, attention with a sliding window and a soft-cap
/// (`tanh`), and every kernel of varlen attention (tile tables in SMEM, per-row key
/// spans, loops bounded by scalars): libtpu compiles them for v5e.
#[test]
fn paged_varlen_and_windowed_attention_compile_for_v5e() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("paged_attention", "dtype=f32", "paged_f32"),
        ("paged_attention", "dtype=bf16", "paged_bf16"),
        (
            "flash_attention",
            "causal=true,window=100,softcap=30,q_len=512,kv_len=512,dtype=bf16",
            "windowed",
        ),
    ];
    let varlen = [
        (
            "varlen_attention_bwd",
            "causal=true,total_q=640,block_q=128,block_k=128",
            "varlen_f32",
        ),
        (
            "varlen_attention_bwd",
            "total_q=512,total_k=384,dtype=bf16,block_q=128,block_k=128",
            "varlen_bf16",
        ),
    ];
    let mut files = Vec::new();
    for (name, overrides, file) in cases.into_iter().chain(varlen) {
        let k = find(name).unwrap();
        let p = Params::parse(k.params(), &[overrides.to_string()]).unwrap();
        // The first kernel of each op; every kernel of varlen attention's backward (its
        // first is the forward).
        let kernels = k.build(&p).unwrap();
        let take = if name == "varlen_attention_bwd" {
            kernels.len()
        } else {
            1
        };
        for (i, kernel) in kernels.iter().take(take).enumerate() {
            let text = mosaic::lower(kernel, &TpuLimits::default()).unwrap();
            let file = format!("{file}_{i}.mosaic.mlir");
            std::fs::write(dir.path().join(&file), text).unwrap();
            files.push(file);
        }
    }
    let Some(python) = python() else { return };
    let dir = dir.path().to_str().unwrap();
    let compiled = run_checker(&python, &["--compile", "v5e:2x2", dir]);
    for file in files {
        assert!(
            compiled.contains(&format!("compiled {file} for v5e:2x2")),
            "{compiled}"
        );
    }
}

/// The one lowering interface: every target by name, its checks before its emitter.
#[test]
fn every_target_lowers_through_one_interface() {
    use lowering::{LowerError, Lowering, Target};
    let k = find("softmax").unwrap();
    let kernel = &k.build(&Params::parse(k.params(), &[]).unwrap()).unwrap()[0];
    for name in Target::NAMES {
        let text = Target::named(name, TpuLimits::default())
            .unwrap()
            .lower_text(kernel)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(text.contains("softmax"), "{name}");
    }
    assert!(Target::named("ptx", TpuLimits::default()).is_none());
    // A kernel the TPU rules reject fails in the Mosaic check, before any emitting.
    let narrow = &k
        .build(&Params::parse(k.params(), &["block_rows=4".into()]).unwrap())
        .unwrap()[0];
    let mosaic = lowering::Mosaic {
        limits: TpuLimits::default(),
        body_only: false,
    };
    assert!(matches!(mosaic.check(narrow), Err(LowerError::Tpu(_))));
    assert_eq!(mosaic.lower(narrow).err(), mosaic.check(narrow).err());
}
