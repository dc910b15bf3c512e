//! The CLI contract: outputs and exit codes (0 ok, 1 wrong result/runtime failure,
//! 2 bad usage or bad input).

use std::process::{Command, Output};

fn tessera(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env_remove("TESSERA_BACKEND")
        .env(
            "TESSERA_CACHE_DIR",
            std::env::temp_dir().join("tessera-cli-test-cache"),
        )
        .output()
        .expect("the tessera binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn list_prints_one_kernel_per_line() {
    let o = tessera(&["list"]);
    assert!(o.status.success());
    let names: Vec<String> = kernels::all()
        .iter()
        .map(|k| k.name().to_string())
        .collect();
    assert_eq!(stdout(&o).lines().collect::<Vec<_>>(), names);
}

#[test]
fn run_checks_against_the_reference() {
    let o = tessera(&[
        "run",
        "flash_attention",
        "--backend",
        "interp",
        "--shape",
        "q_len=33,kv_len=47,causal=true,heads=4,kv_heads=2",
        "--seed",
        "3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.starts_with("max_abs_err=")
            && out.contains(" max_rel_err=")
            && out.trim_end().ends_with("backend=interp ok"),
        "{out}"
    );
}

#[test]
fn every_kernel_runs_with_auto_and_native() {
    for k in kernels::all() {
        for (backend, expect) in [("auto", " backend="), ("native", " backend=native ok")] {
            let o = tessera(&[
                "run",
                k.name(),
                "--backend",
                backend,
                "--shape",
                small_shape(k.name()),
            ]);
            assert!(o.status.success(), "{}: {}", k.name(), stderr(&o));
            let out = stdout(&o);
            assert!(
                out.contains(expect) && out.trim_end().ends_with(" ok"),
                "{out}"
            );
        }
    }
}

fn small_shape(name: &str) -> &'static str {
    match name {
        "matmul" => "m=40,k=33,n=20,bm=16,bk=16,bn=8",
        "rope" => "seq=20,block_seq=8",
        "flash_attention" | "flash_attention_bwd" => "q_len=20,kv_len=30,block_q=8,block_k=16",
        "varlen_attention" | "varlen_attention_bwd" => {
            "batch=3,heads=4,kv_heads=2,total_q=37,total_k=29,head_dim=16,block_q=8,block_k=16"
        }
        "paged_attention" => {
            "batch=3,heads=4,kv_heads=2,head_dim=16,page_size=4,num_pages=9,max_pages=5"
        }
        _ => "rows=19,cols=40,block_rows=4",
    }
}

/// `tessera config` lists the variables with their values.
#[test]
fn config_lists_every_variable_with_its_value() {
    let o = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .arg("config")
        .env("TESSERA_BACKEND", "interp")
        .output()
        .unwrap();
    assert!(o.status.success());
    let out = stdout(&o);
    assert!(
        out.contains("TESSERA_BACKEND=interp [default: auto]"),
        "{out}"
    );
    assert!(
        out.contains("TESSERA_GRAPH_SHAPES=(unset) [default: 8]"),
        "{out}"
    );
}

/// The element-wise sweep prints a row per op, each correct to a few ulp.
#[test]
fn bench_elementwise_times_every_op_against_a_copy() {
    let o = tessera(&[
        "bench",
        "elementwise",
        "--shape",
        "rows=9,cols=130",
        "--runs",
        "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for op in [
        "copy",
        "exp",
        "log",
        "tanh",
        "erf",
        "sin",
        "cos",
        "sigmoid",
        "pow 1.5",
        "gelu (erf)",
    ] {
        let row = out
            .lines()
            .find(|l| l.starts_with(op))
            .unwrap_or_else(|| panic!("no `{op}` row:\n{out}"));
        let max_ulp: f64 = row.split_whitespace().last().unwrap().parse().unwrap();
        assert!(max_ulp <= 3.0, "{row}");
    }
}

#[test]
fn bad_usage_exits_2_with_one_message() {
    for args in [
        &["run", "nope"][..],
        &["run", "matmul", "--backend", "tpu"],
        &["bench", "softmax", "--vs", "numpy"],
        &["run", "matmul", "--shape", "m=0"],
        &["run", "matmul", "--shape", "mm=3"],
        &["run", "rope", "--shape", "head_dim=7"],
        &["ir"],
        &["frobnicate"],
        &["bench", "elementwise", "--shape", "rows=0"],
        &["bench", "elementwise", "--shape", "depth=3"],
        &["bench", "elementwise", "--vs", "torch"],
    ] {
        let o = tessera(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{args:?}");
    }
}

#[test]
fn oversized_shapes_exit_2_naming_the_array_and_its_size() {
    let cases = [
        // Outputs too large for memory, on every backend.
        (
            "matmul",
            "m=3000000,n=3000000,k=8",
            "interp",
            "out %o (f32[3000000, 3000000])",
        ),
        (
            "matmul",
            "m=3000000,n=3000000,k=8",
            "native",
            "out %o (f32[3000000, 3000000])",
        ),
        (
            "matmul",
            "m=3000000,n=3000000,k=8",
            "xla",
            "out %o (f32[3000000, 3000000])",
        ),
        (
            "softmax",
            "rows=100000000,cols=100000",
            "auto",
            "(f32[100000000, 100000])",
        ),
        // Inputs too large to generate.
        (
            "matmul",
            "m=100000000,n=100000000,k=100000",
            "interp",
            "a random input",
        ),
    ];
    for (kernel, shape, backend, array) in cases {
        let o = tessera(&["run", kernel, "--backend", backend, "--shape", shape]);
        let err = stderr(&o);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{kernel} {shape} on {backend}: {err}"
        );
        assert!(
            err.contains("cannot allocate") && err.contains(array) && err.contains(" bytes ("),
            "{kernel} {shape} on {backend}: {err}"
        );
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "one clear message: {err}"
        );
    }
    // Sizes whose products overflow are rejected before anything is allocated.
    let o = tessera(&[
        "run",
        "matmul",
        "--shape",
        "m=10000000000,n=10000000000,k=10000000000",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

fn parse_file(text: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.ir");
    std::fs::write(&path, text).unwrap();
    tessera(&["ir", "--parse", path.to_str().unwrap()])
}

fn printed(name: &str, shape: &str) -> String {
    stdout(&tessera(&["ir", name, "--shape", shape]))
}

#[test]
fn ir_prints_and_parses_back() {
    let text = printed("softmax", "rows=16,cols=128");
    assert!(
        text.starts_with("kernel @softmax grid [2] semantics [parallel] {"),
        "{text}"
    );
    let o = parse_file(&text);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("ok: kernel @softmax"));
}

#[test]
fn bad_ir_exits_2_naming_the_problem() {
    let text = printed("softmax", "rows=16,cols=128");
    let cases = [
        (
            text.replace("reduce_max", "reduce_mux"),
            "unknown op `reduce_mux`",
        ),
        (
            text.replacen("block [8, 128]", "block [8, 256]", 1),
            "does not tile the array dim of 128",
        ),
        (
            text.replacen(
                "%4 = sub %0, %3 : f32[8, 128]",
                "%4 = sub %0, %1 : f32[8, 128]",
                1,
            ),
            "operand 1 has type f32[8], expected f32[8, 128]",
        ),
        (
            text.replacen("in %x : f32[16, 128]", "in %x : bf16[16, 128]", 1),
            "result 0 has type f32[8, 128], expected bf16[8, 128]",
        ),
        (text[..text.len() / 3].to_string(), "parse error"),
        (
            text.replacen(
                "in %x : f32[16, 128]",
                "in %x : f32[4294967296, 4294967296, 16]",
                1,
            ),
            "is larger than any allocation can be",
        ),
    ];
    for (bad, expected) in cases {
        let o = parse_file(&bad);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains(expected), "expected `{expected}` in: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "one clear message: {err}"
        );
    }
}

#[test]
fn every_kernel_benches_natively_in_place_where_it_can() {
    for name in stdout(&tessera(&["list"])).lines() {
        let name = name.split_whitespace().next().unwrap();
        let o = tessera(&[
            "bench",
            name,
            "--backend",
            "native",
            "--shape",
            small_shape(name),
            "--runs",
            "1",
        ]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        // Every library op is f32 by default and runs in place on reused outputs: its
        // one kernel, or its chain (the backwards; varlen's tile plan derived per call).
        assert!(
            stdout(&o).contains("backend=native (in place)"),
            "{name}: {}",
            stdout(&o)
        );
    }
    // bf16 too, held in 2-byte elements as tensors hold them; other backends run through
    // arrays, with fresh outputs.
    for (backend, in_place) in [("native", true), ("interp", false)] {
        let o = tessera(&[
            "bench",
            "varlen_attention",
            "--backend",
            backend,
            "--shape",
            "total_q=20,dtype=bf16",
            "--runs",
            "1",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(
            stdout(&o).contains("(in place)"),
            in_place,
            "{}",
            stdout(&o)
        );
    }
}

#[test]
fn bench_reports_time_throughput_and_peaks() {
    let o = tessera(&[
        "bench",
        "matmul",
        "--backend",
        "interp",
        "--shape",
        "m=64,k=64,n=64",
        "--runs",
        "3",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let line = stdout(&o);
    for key in [
        "\"median_ms\":",
        "\"gflops\":",
        "\"peak_gflops\":",
        "\"pct_of_peak\":",
        "\"backend\":\"interp\"",
        "\"baseline\":null",
    ] {
        assert!(line.contains(key), "{key} missing in {line}");
    }
    let o = tessera(&[
        "bench",
        "flash_attention",
        "--backend",
        "native",
        "--vs",
        "torch",
        "--shape",
        "q_len=64,kv_len=64",
        "--runs",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("\"baseline\":{\"name\":\"torch\",\"median_ms\":"),
        "{}",
        stdout(&o)
    );
    let o = tessera(&["bench", "flash_attention_bwd", "--vs", "xla"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("has no XLA baseline"), "{}", stderr(&o));
    let o = tessera(&[
        "bench",
        "softmax",
        "--vs",
        "xla",
        "--shape",
        "rows=16,cols=64",
        "--runs",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("ratio tessera/xla"), "{}", stdout(&o));
    let o = tessera(&[
        "bench",
        "flash_attention_bwd",
        "--vs",
        "xla",
        "--shape",
        "q_len=16,kv_len=16",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        tessera(&["bench", "softmax", "--runs", "0"]).status.code(),
        Some(2)
    );
}

#[test]
fn bench_sweeps_print_a_table_and_draw_a_plot() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("softmax.svg");
    let o = tessera(&[
        "bench",
        "softmax",
        "--backend",
        "interp",
        "--shape",
        "cols=32",
        "--sweep",
        "rows=8,16,32",
        "--vs",
        "torch",
        "--runs",
        "1",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.trim_start().starts_with(['8', '1', '3']))
        .collect();
    assert_eq!(rows.len(), 3, "one row per swept value: {out}");
    assert!(
        out.contains("roofline ms") && out.contains("torch ms"),
        "{out}"
    );
    let drawn = std::fs::read_to_string(&svg).unwrap();
    for text in [
        "<svg",
        "tessera",
        "torch",
        "roofline",
        "rows",
        "median time (ms)",
    ] {
        assert!(drawn.contains(text), "{text} missing in the plot");
    }
    for (sweep, message) in [
        ("rows=8", "give at least two values of `rows`"),
        ("rows=8,x", "`x` is not a number"),
        ("rows", "expected NAME=v1,v2,..."),
        ("bogus=1,2", "unknown parameter `bogus`"),
    ] {
        let o = tessera(&["bench", "softmax", "--sweep", sweep, "--runs", "1"]);
        assert_eq!(o.status.code(), Some(2), "{sweep}");
        assert!(stderr(&o).contains(message), "{sweep}: {}", stderr(&o));
    }
    let o = tessera(&["bench", "softmax", "--plot", svg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "--plot needs --sweep");
}

#[test]
fn lower_prints_modules_for_each_target() {
    let o = tessera(&[
        "lower",
        "softmax",
        "--target",
        "stablehlo",
        "--shape",
        "rows=16,cols=128",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("\"stablehlo.while\""));
    let o = tessera(&[
        "lower",
        "softmax",
        "--target",
        "mosaic",
        "--shape",
        "rows=16,cols=128",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("stablehlo.custom_call @tpu_custom_call"));
    let o = tessera(&[
        "lower",
        "softmax",
        "--target",
        "mosaic-body",
        "--shape",
        "rows=16,cols=128",
    ]);
    assert!(stdout(&o).contains("window_params = [{transform_indices = @transform_0"));
    let o = tessera(&[
        "lower",
        "softmax",
        "--target",
        "mosaic",
        "--shape",
        "rows=16,cols=128,block_rows=4",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("TPU rule broken by `in %x`"),
        "{}",
        stderr(&o)
    );
    let o = tessera(&["lower", "softmax", "--target", "cpu-mlir"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("func.func @softmax(%lo: index, %hi: index, %step: index"));
    let o = tessera(&["lower", "softmax", "--target", "ptx"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(
            "unknown target `ptx`: expected one of stablehlo, mosaic, mosaic-body, cpu-mlir"
        ),
        "{}",
        stderr(&o)
    );
}

#[test]
fn cache_stats_and_clear() {
    let o = tessera(&["cache", "stats"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("xla: "), "{}", stdout(&o));
    assert!(stdout(&o).contains("xla-jaxlib: "), "{}", stdout(&o));
    let o = tessera(&["cache", "clear"]);
    assert!(o.status.success() && stdout(&o).starts_with("removed "));
}

#[test]
fn run_with_poison_still_passes_for_kernels_that_write_everything() {
    let o = tessera(&[
        "run",
        "matmul",
        "--backend",
        "interp",
        "--poison",
        "--shape",
        "m=40,k=33,n=20,bm=16,bk=16,bn=8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).trim_end().ends_with("backend=interp ok"));
}

/// The XLA disk cache end to end, with PJRT's own serialized executables: a second
/// process loads what the first compiled, and a corrupted entry is dropped, reported
/// and recompiled.
#[test]
fn xla_disk_cache_serves_new_processes_and_survives_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args([
                "run",
                "softmax",
                "--backend",
                "xla",
                "--shape",
                "rows=8,cols=16",
            ])
            .env("TESSERA_CACHE_DIR", dir.path())
            .env("TESSERA_LOG", "debug")
            .output()
            .unwrap()
    };
    let first = run();
    if !first.status.success() && std::env::var_os("TESSERA_REQUIRE_XLA").is_none() {
        return; // no PJRT plugin in this build
    }
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(
        stderr(&first).contains("xla @softmax: compiled"),
        "{}",
        stderr(&first)
    );
    let second = run();
    assert!(
        stderr(&second).contains("xla @softmax: loaded from the disk cache"),
        "{}",
        stderr(&second)
    );
    let entry = std::fs::read_dir(dir.path().join("xla"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&entry).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&entry, bytes).unwrap();
    let third = run();
    assert!(third.status.success(), "{}", stderr(&third));
    let err = stderr(&third);
    assert!(
        err.contains("warning: tessera cache: dropping") && err.contains("checksum mismatch"),
        "{err}"
    );
    assert!(err.contains("xla @softmax: compiled"), "{err}");
    assert!(stdout(&third).trim_end().ends_with("backend=xla ok"));
}

#[test]
fn two_processes_compiling_into_one_cache_leave_valid_entries() {
    let dir = tempfile::tempdir().unwrap();
    let spawn = |delay_ms: &str| {
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["run", "flash_attention_bwd", "--backend", "xla"])
            .args(["--shape", "heads=2,kv_heads=1,q_len=20,kv_len=20"])
            .env("TESSERA_CACHE_DIR", dir.path())
            .env("TESSERA_LOG", "debug")
            // Slow writers widen the window in which both write the same entries.
            .env("TESSERA_CACHE_WRITE_DELAY_MS", delay_ms)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn("150"), spawn("150"));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    if !a.status.success() && std::env::var_os("TESSERA_REQUIRE_XLA").is_none() {
        return; // no PJRT plugin in this build
    }
    for o in [&a, &b] {
        assert!(o.status.success(), "{}", stderr(o));
        assert!(!stderr(o).contains("warning"), "{}", stderr(o));
    }
    assert_eq!(stdout(&a), stdout(&b), "the two processes' results differ");
    let stats = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["cache", "stats"])
        .env("TESSERA_CACHE_DIR", dir.path())
        .output()
        .unwrap();
    assert!(
        stdout(&stats).contains("xla: 4 entries") && stdout(&stats).contains(" 0 leftover"),
        "{}",
        stdout(&stats)
    );
    // A third process loads all four kernels from the entries they left.
    let c = spawn("0").wait_with_output().unwrap();
    let err = stderr(&c);
    assert_eq!(
        err.matches("loaded from the disk cache").count(),
        4,
        "{err}"
    );
    assert!(!err.contains("warning"), "{err}");
    assert_eq!(stdout(&c), stdout(&a));
}

/// `tessera tune` measures candidates, stores the best, and every later
/// command in a new process uses it; corrupt entries are reported and re-tuned.
#[test]
fn tune_stores_a_config_that_later_runs_use() {
    let dir = tempfile::tempdir().unwrap();
    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(args)
            .env_remove("TESSERA_BACKEND")
            .env("TESSERA_CACHE_DIR", dir.path())
            .env("TESSERA_LOG", "debug")
            .output()
            .unwrap()
    };
    let shape = "rows=16,cols=64";
    let tune = ["tune", "softmax", "--shape", shape, "--runs", "2"];
    let first = cli(&tune);
    assert!(first.status.success(), "{}", stderr(&first));
    let report = stdout(&first);
    assert!(report.contains("(current)"), "{report}");
    assert!(report.contains("tuned softmax"), "{report}");
    assert!(report.contains("saved "), "{report}");

    let listed = cli(&["tune", "--list"]);
    assert!(stdout(&listed).contains("softmax"), "{}", stdout(&listed));
    let again = cli(&tune);
    assert!(
        stdout(&again).contains("already tuned"),
        "{}",
        stdout(&again)
    );
    let run = cli(&["run", "softmax", "--shape", shape]);
    assert!(run.status.success());
    assert!(stderr(&run).contains("tuned config"), "{}", stderr(&run));

    let entries: Vec<_> = std::fs::read_dir(dir.path().join("tune"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    std::fs::write(&entries[0], b"garbage").unwrap();
    let run = cli(&["run", "softmax", "--shape", shape]);
    assert!(run.status.success(), "a corrupt entry must not fail a run");
    assert!(stderr(&run).contains("warning"), "{}", stderr(&run));
    let retuned = cli(&tune);
    assert!(stdout(&retuned).contains("tuned softmax"));

    let mosaic = cli(&[
        "tune",
        "matmul",
        "--backend",
        "mosaic",
        "--shape",
        "m=256,k=256,n=256",
    ]);
    assert!(mosaic.status.success(), "{}", stderr(&mosaic));
    assert!(stdout(&mosaic).contains("on mosaic"), "{}", stdout(&mosaic));

    let cleared = cli(&["tune", "--clear"]);
    assert!(cleared.status.success(), "{}", stderr(&cleared));
    let listed = cli(&["tune", "--list"]);
    assert!(
        stdout(&listed).contains("(0 entries)"),
        "{}",
        stdout(&listed)
    );

    for bad in [
        &["tune", "paged_attention"][..],
        &["tune", "softmax", "--backend", "nope"],
        &["tune", "softmax", "--budget", "0"],
        &["tune", "no_such_kernel"],
    ] {
        let o = cli(bad);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
        assert!(stderr(&o).starts_with("error: "), "{bad:?}: {}", stderr(&o));
    }
}
