//! The subcommands. Each returns a [`Failure`] carrying the exit code.

use std::path::Path;
use std::time::{Duration, Instant};

use kernel_ir::{parse_kernel, print_kernel, AllocError, Array, Kernel};
use kernels::{all, compare, find, tuning, BoxError, LibraryKernel, Params};
use runtime::tune::TuneTarget;
use runtime::{Backend, Resolution};

use crate::in_place::InPlaceOp;

/// A failed command: exit code 1 (wrong result, runtime failure) or 2 (bad input).
pub struct Failure {
    pub code: u8,
    pub message: String,
}

pub(crate) fn usage(message: impl Into<String>) -> Failure {
    Failure {
        code: 2,
        message: message.into(),
    }
}

pub(crate) fn runtime_failure(message: impl Into<String>) -> Failure {
    Failure {
        code: 1,
        message: message.into(),
    }
}

/// A failed run: exit 2 when an array could not be allocated (its size came from the
/// command line) or a kernel's `check` failed (bad input data), 1 otherwise.
pub(crate) fn run_failure(context: &str, e: BoxError) -> Failure {
    let message = format!("{context}: {e}");
    if AllocError::in_chain(&*e) || kernel_ir::ops::CheckFailure::in_chain(&*e).is_some() {
        usage(message)
    } else {
        runtime_failure(message)
    }
}

pub(crate) fn library_kernel(name: &str) -> Result<&'static dyn LibraryKernel, Failure> {
    find(name).ok_or_else(|| {
        let names: Vec<_> = all().iter().map(|k| k.name()).collect();
        usage(format!(
            "unknown kernel `{name}`; available: {}",
            names.join(", ")
        ))
    })
}

pub(crate) fn params(k: &dyn LibraryKernel, overrides: &[String]) -> Result<Params, Failure> {
    Params::parse(k.params(), overrides).map_err(|e| usage(format!("{}: {e}", k.name())))
}

/// Kernels built from bad parameters (a zero size, an odd head dim) are usage errors.
pub(crate) fn build(k: &dyn LibraryKernel, p: &Params) -> Result<Vec<Kernel>, Failure> {
    k.build(p)
        .map_err(|e| usage(format!("{} {p}: {e}", k.name())))
}

pub fn list(long: bool) -> Result<(), Failure> {
    for k in all() {
        println!("{}", k.name());
        if long {
            println!("    {}", k.summary());
            for p in k.params() {
                println!("    {}={:<8} {}", p.name, p.default, p.help);
            }
        }
    }
    Ok(())
}

pub fn ir(kernel: Option<&str>, overrides: &[String], parse: Option<&Path>) -> Result<(), Failure> {
    if let Some(path) = parse {
        let text = std::fs::read_to_string(path)
            .map_err(|e| usage(format!("cannot read {}: {e}", path.display())))?;
        let k = parse_kernel(&text).map_err(|e| usage(format!("{}: {e}", path.display())))?;
        println!(
            "ok: kernel @{} is valid ({} refs, grid {:?})",
            k.name,
            k.refs.len(),
            k.grid
        );
        return Ok(());
    }
    let Some(name) = kernel else {
        return Err(usage("`tessera ir` needs a kernel name or `--parse FILE`"));
    };
    let k = library_kernel(name)?;
    let p = params(k, overrides)?;
    for (i, kernel) in build(k, &p)?.iter().enumerate() {
        if i > 0 {
            println!();
        }
        print!("{}", print_kernel(kernel));
    }
    Ok(())
}

/// The parameters of `k` for `overrides`, with the blocks `tessera tune` chose for
/// `target` (or, for `None`, for the backend `requested` resolves to) filling the
/// tunable parameters `overrides` does not set.
fn tuned_params(
    k: &dyn LibraryKernel,
    overrides: &[String],
    requested: Backend,
    target: Option<TuneTarget>,
) -> Result<Params, Failure> {
    let mut p = params(k, overrides)?;
    tuning::apply_stored(k, &mut p, &tuning::named_in(overrides), |p, problem| {
        let first_kernel = || k.build(p).ok()?.into_iter().next();
        runtime::tune::stored_config(k.name(), problem, target, requested, first_kernel)
    });
    Ok(p)
}

fn requested_backend(flag: Option<&str>) -> Result<Backend, Failure> {
    match flag {
        Some(b) => b.parse().map_err(|e: runtime::Error| usage(e.to_string())),
        None => Ok(runtime::backend_from_env()
            .map_err(|e| usage(e.to_string()))?
            .unwrap_or(Backend::Auto)),
    }
}

fn debug_log(r: &Resolution) {
    if runtime::config::debug_log() {
        for f in &r.fallbacks {
            eprintln!("debug: skipped {f}");
        }
        eprintln!("debug: running on {}", r.backend);
    }
}

/// Runs `k` with every kernel on `requested`; returns outputs and the backend used.
pub(crate) fn execute(
    k: &dyn LibraryKernel,
    p: &Params,
    inputs: &[Array],
    requested: Backend,
) -> Result<(Vec<Array>, Backend), BoxError> {
    let mut used = Backend::Interp;
    let outputs = k.run(p, inputs, &mut |kernel, ins| {
        let (out, resolution) = runtime::run(kernel, ins, requested)?;
        debug_log(&resolution);
        used = resolution.backend;
        Ok(out)
    })?;
    Ok((outputs, used))
}

pub fn run(
    name: &str,
    backend: Option<&str>,
    overrides: &[String],
    seed: u64,
) -> Result<(), Failure> {
    let k = library_kernel(name)?;
    let requested = requested_backend(backend)?;
    let p = tuned_params(k, overrides, requested, None)?;
    let kernels = build(k, &p)?;
    for kernel in &kernels {
        runtime::resolve(requested, kernel).map_err(|e| usage(e.to_string()))?;
    }
    let inputs = k.inputs(&p, seed).map_err(|e| usage(e.to_string()))?;
    let context = format!("{name} {p}");
    let (got, used) = execute(k, &p, &inputs, requested).map_err(|e| run_failure(&context, e))?;
    let want = k
        .reference(&p, &inputs)
        .map_err(|e| run_failure(&format!("{context}: reference"), e))?;
    let tol = k.tolerance(&p);
    let c = compare(&got, &want, tol);
    let line = format!(
        "max_abs_err={:.3e} max_rel_err={:.3e} backend={used}",
        c.max_abs_err, c.max_rel_err
    );
    match c.first_bad {
        None => {
            println!("{line} ok");
            Ok(())
        }
        Some((o, i, g, w)) => {
            println!("{line} MISMATCH");
            Err(runtime_failure(format!(
                "{name} {p}: output {o} element {i} is {g}, expected {w} (tolerance abs {} rel {})",
                tol.abs, tol.rel
            )))
        }
    }
}

/// How many timed calls: a fixed count, or as many as fit a time budget.
#[derive(Clone, Copy)]
pub(crate) enum Runs {
    Count(usize),
    /// At least [`MIN_BUDGET_RUNS`], at most [`MAX_BUDGET_RUNS`], else until the calls
    /// have taken this long.
    Budget(Duration),
}

/// The fewest calls a [`Runs::Budget`] times (a median of one is no median).
const MIN_BUDGET_RUNS: usize = 3;
/// The most calls a [`Runs::Budget`] times.
const MAX_BUDGET_RUNS: usize = 101;

/// How the demo times each row: enough calls of a small kernel that one slow call (this
/// VM's neighbours) cannot move the median, three of a slow one.
const DEMO_RUNS: Runs = Runs::Budget(Duration::from_millis(100));

/// Median wall time of `runs` calls, in milliseconds.
pub(crate) fn median_ms(
    runs: impl Into<Runs>,
    mut f: impl FnMut() -> Result<(), BoxError>,
) -> Result<f64, BoxError> {
    let (least, most, budget) = match runs.into() {
        Runs::Count(n) => (n, n, Duration::ZERO),
        Runs::Budget(b) => (MIN_BUDGET_RUNS, MAX_BUDGET_RUNS, b),
    };
    let mut times = Vec::with_capacity(least);
    let start = Instant::now();
    while times.len() < least || (times.len() < most && start.elapsed() < budget) {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

impl From<usize> for Runs {
    fn from(n: usize) -> Runs {
        Runs::Count(n)
    }
}

pub fn demo() -> Result<(), Failure> {
    println!(
        "{:<20} {:<7} {:>12} {:>12} {:>10}  status",
        "kernel", "backend", "max_abs_err", "max_rel_err", "median_ms"
    );
    let mut failures = 0;
    for k in all() {
        let p = params(k, &[])?;
        let kernels = build(k, &p)?;
        for backend in [Backend::Interp, Backend::Xla, Backend::Native] {
            if let Some(reason) = kernels
                .iter()
                .find_map(|kernel| backend.unavailable_because(kernel))
            {
                println!(
                    "{:<20} {:<7} {:>12} {:>12} {:>10}  unavailable: {reason}",
                    k.name(),
                    backend.name(),
                    "-",
                    "-",
                    "-"
                );
                continue;
            }
            let outcome = (|| -> Result<(kernels::Comparison, f64), BoxError> {
                let inputs = k.inputs(&p, 0)?;
                let (got, used) = execute(k, &p, &inputs, backend)?;
                let c = compare(&got, &k.reference(&p, &inputs)?, k.tolerance(&p));
                let (ms, _) = time_op(k, &p, &inputs, used, DEMO_RUNS)?;
                Ok((c, ms))
            })();
            match outcome {
                Ok((c, ms)) => {
                    let status = if c.ok() { "ok" } else { "MISMATCH" };
                    failures += usize::from(!c.ok());
                    println!(
                        "{:<20} {:<7} {:>12.3e} {:>12.3e} {:>10.2}  {status}",
                        k.name(),
                        backend.name(),
                        c.max_abs_err,
                        c.max_rel_err,
                        ms
                    );
                }
                Err(e) => {
                    failures += 1;
                    println!(
                        "{:<20} {:<7} {:>12} {:>12} {:>10}  FAILED: {e}",
                        k.name(),
                        backend.name(),
                        "-",
                        "-",
                        "-"
                    );
                }
            }
        }
        // PyTorch's op on the same inputs, for scale (not a Tessera backend).
        let torch = (|| -> Result<Option<(kernels::Comparison, f64)>, BoxError> {
            let case = benches::Case::new(k, &[])?;
            let Some(torch) = case.torch_baseline() else {
                return Ok(None);
            };
            let want = k.reference(&p, &case.inputs)?;
            let c = torch.check(&want, k.tolerance(&p))?;
            let ms = median_ms(DEMO_RUNS, || {
                drop(torch.run());
                Ok(())
            })?;
            Ok(Some((c, ms)))
        })();
        match torch {
            Ok(Some((c, ms))) => println!(
                "{:<20} {:<7} {:>12.3e} {:>12.3e} {:>10.2}  PyTorch's op, for comparison",
                k.name(),
                "torch",
                c.max_abs_err,
                c.max_rel_err,
                ms
            ),
            Ok(None) => {}
            Err(e) => println!(
                "{:<20} {:<7} {:>12} {:>12} {:>10}  FAILED: {e}",
                k.name(),
                "torch",
                "-",
                "-",
                "-"
            ),
        }
        // No TPU here: the mosaic row says whether every kernel passes the TPU rules and
        // lowers (the tests verify the output with jaxlib's tpu dialect).
        use lowering::Lowering;
        let mosaic = lowering::Mosaic {
            limits: lowering::tpu_rules::TpuLimits::default(),
            body_only: false,
        };
        let status = match kernels
            .iter()
            .try_for_each(|kernel| mosaic.lower(kernel).map(|_| ()))
        {
            Ok(()) => "lowered, TPU rules ok (no TPU here to run it)".to_string(),
            Err(e) => format!("not lowered: {e}"),
        };
        println!(
            "{:<20} {:<7} {:>12} {:>12} {:>10}  {status}",
            k.name(),
            "mosaic",
            "-",
            "-",
            "-"
        );
    }
    if failures > 0 {
        return Err(runtime_failure(format!(
            "{failures} kernel/backend pairs failed"
        )));
    }
    Ok(())
}

/// One timed configuration: Tessera's median, the baseline's, and the work done.
struct Timing {
    params: Params,
    used: String,
    ms: f64,
    baseline_ms: Option<f64>,
    flops: f64,
    bytes: f64,
}

/// Checks the flags shared by `bench` and `bench --sweep`.
fn bench_flags(vs: Option<&str>, runs: usize) -> Result<(), Failure> {
    match vs {
        None | Some("xla") | Some("torch") => {}
        Some(other) => {
            return Err(usage(format!(
                "unknown baseline `{other}`: expected torch or xla"
            )))
        }
    }
    if runs == 0 {
        return Err(usage("--runs must be at least 1"));
    }
    Ok(())
}

/// Times library kernel `k` with `overrides` (and the baseline `vs`) over `runs` runs.
fn time_kernel(
    k: &'static dyn LibraryKernel,
    overrides: &[String],
    requested: Backend,
    vs: Option<&str>,
    runs: usize,
) -> Result<Timing, Failure> {
    let name = k.name();
    let p = tuned_params(k, overrides, requested, None)?;
    for kernel in build(k, &p)? {
        runtime::resolve(requested, &kernel).map_err(|e| usage(e.to_string()))?;
    }
    let case = benches::Case::new(k, overrides).map_err(|e| usage(e.to_string()))?;
    let context = format!("{name} {p}");
    let fail = |e: BoxError| run_failure(&context, e);
    let (outputs, used) = execute(k, &p, &case.inputs, requested).map_err(fail)?;
    let (ms, in_place) = time_op(k, &p, &case.inputs, used, runs).map_err(fail)?;
    let baseline_ms = match vs {
        Some("torch") => {
            let Some(torch) = case.torch_baseline() else {
                return Err(usage(format!("`{name}` has no PyTorch baseline")));
            };
            drop(torch.run());
            Some(
                median_ms(runs, || {
                    drop(torch.run());
                    Ok(())
                })
                .map_err(fail)?,
            )
        }
        Some(_) => {
            if case.run_xla_baseline().map_err(fail)?.is_none() {
                return Err(usage(format!("`{name}` has no XLA baseline")));
            }
            Some(median_ms(runs, || case.run_xla_baseline().map(|_| ())).map_err(fail)?)
        }
        None => None,
    };
    let bytes: usize = case
        .inputs
        .iter()
        .chain(&outputs)
        .map(|a| a.ty().num_elements() as usize * a.dtype().size_bytes())
        .sum();
    Ok(Timing {
        flops: k.flops(&p),
        params: p,
        used: if in_place {
            format!("{used} (in place)")
        } else {
            used.to_string()
        },
        ms,
        baseline_ms,
        bytes: bytes as f64,
    })
}

/// The median ms of `runs` calls of `k` on `inputs` on `used` (the backend that ran it),
/// and whether they ran in place: native runs of ops with a chain (or one kernel) run on
/// the inputs' storage and reused outputs, as the torch ops do ([`InPlaceOp`]); the rest
/// allocate their outputs per call.
fn time_op(
    k: &dyn LibraryKernel,
    p: &Params,
    inputs: &[Array],
    used: Backend,
    runs: impl Into<Runs> + Copy,
) -> Result<(f64, bool), BoxError> {
    match InPlaceOp::new(k, p, used, inputs) {
        Some(mut op) => Ok((median_ms(runs, || op.run())?, true)),
        None => Ok((
            median_ms(runs, || execute(k, p, inputs, used).map(|_| ()))?,
            false,
        )),
    }
}

impl Timing {
    fn gflops(&self) -> f64 {
        self.flops / (self.ms * 1e-3) / 1e9
    }

    fn gbs(&self) -> f64 {
        self.bytes / (self.ms * 1e-3) / 1e9
    }

    /// The roofline: the least time the work allows at the measured FMA peak and copy
    /// bandwidth, in ms.
    fn roofline_ms(&self, peak_gflops: f64, bandwidth_gbs: f64) -> f64 {
        (self.flops / (peak_gflops * 1e9)).max(self.bytes / (bandwidth_gbs * 1e9)) * 1e3
    }
}

/// `tessera bench --json`: one line per run.
#[derive(serde::Serialize)]
struct BenchReport<'a> {
    kernel: &'a str,
    params: String,
    backend: String,
    runs: usize,
    median_ms: f64,
    gflops: f64,
    gbs: f64,
    peak_gflops: f64,
    pct_of_peak: f64,
    bandwidth_gbs: f64,
    pct_of_bandwidth: f64,
    baseline: Option<BaselineReport>,
}

/// The baseline of a [`BenchReport`].
#[derive(serde::Serialize)]
struct BaselineReport {
    name: String,
    median_ms: f64,
    ratio: f64,
}

/// `x` to `digits` decimals (what the report prints).
fn rounded(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

pub fn bench(
    name: &str,
    backend: Option<&str>,
    overrides: &[String],
    vs: Option<&str>,
    runs: usize,
    json: bool,
) -> Result<(), Failure> {
    let k = library_kernel(name)?;
    let requested = requested_backend(backend)?;
    bench_flags(vs, runs)?;
    let t = time_kernel(k, overrides, requested, vs, runs)?;
    let (p, used, ms) = (&t.params, &t.used, t.ms);
    let (gflops, gbs) = (t.gflops(), t.gbs());
    let peak = runtime::peak::fma_peak_gflops();
    let bandwidth = runtime::peak::memory_bandwidth_gbs();
    if json {
        let report = BenchReport {
            kernel: name,
            params: p.to_string(),
            backend: used.to_string(),
            runs,
            median_ms: rounded(ms, 4),
            gflops: rounded(gflops, 3),
            gbs: rounded(gbs, 3),
            peak_gflops: rounded(peak, 1),
            pct_of_peak: rounded(100.0 * gflops / peak, 2),
            bandwidth_gbs: rounded(bandwidth, 1),
            pct_of_bandwidth: rounded(100.0 * gbs / bandwidth, 2),
            baseline: t.baseline_ms.map(|b| BaselineReport {
                name: vs.unwrap_or("xla").to_string(),
                median_ms: rounded(b, 4),
                ratio: rounded(ms / b, 3),
            }),
        };
        let line = serde_json::to_string(&report).map_err(|e| runtime_failure(e.to_string()))?;
        println!("{line}");
    } else {
        println!("{name} {p} backend={used} runs={runs}");
        println!(
            "median {ms:.3} ms  {gflops:.2} GFLOP/s ({:.1}% of {peak:.0} GFLOP/s FMA peak)  \
             {gbs:.2} GB/s ({:.1}% of {bandwidth:.1} GB/s copy bandwidth)",
            100.0 * gflops / peak,
            100.0 * gbs / bandwidth
        );
        if let Some(b) = t.baseline_ms {
            let base = vs.unwrap_or("xla");
            println!(
                "{base} baseline median {b:.3} ms  ratio tessera/{base} {:.2}",
                ms / b
            );
        }
    }
    Ok(())
}

/// `NAME=v1,v2,...`: the swept parameter and its values (at least two numbers, which
/// the plot's axis needs), as written and as numbers.
fn parse_sweep(sweep: &str) -> Result<(String, Vec<(String, f64)>), Failure> {
    let (name, values) = sweep
        .split_once('=')
        .ok_or_else(|| usage(format!("--sweep `{sweep}`: expected NAME=v1,v2,...")))?;
    let name = name.trim().to_string();
    let values = values
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| match v.parse::<f64>() {
            Ok(x) => Ok((v.to_string(), x)),
            Err(_) => Err(usage(format!(
                "--sweep: `{v}` is not a number (`{name}` is plotted against it)"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if values.len() < 2 {
        return Err(usage(format!(
            "--sweep `{sweep}`: give at least two values of `{name}`"
        )));
    }
    Ok((name, values))
}

/// `tessera bench KERNEL --sweep NAME=v1,v2,...`: one timing per value, printed as a
/// table and, with `plot`, drawn against the value with the baseline and the roofline.
pub fn bench_sweep(
    name: &str,
    backend: Option<&str>,
    overrides: &[String],
    sweep: &str,
    vs: Option<&str>,
    runs: usize,
    plot: Option<&Path>,
) -> Result<(), Failure> {
    let k = library_kernel(name)?;
    let requested = requested_backend(backend)?;
    bench_flags(vs, runs)?;
    let (param, values) = parse_sweep(sweep)?;
    // A parameter the kernel does not take fails here, before anything is printed.
    params(
        k,
        &[overrides, &[format!("{param}={}", values[0].0)]].concat(),
    )?;
    let peak = runtime::peak::fma_peak_gflops();
    let bandwidth = runtime::peak::memory_bandwidth_gbs();
    let base = vs.unwrap_or("-");
    println!(
        "{name}: {param} swept; FMA peak {peak:.0} GFLOP/s, copy bandwidth {bandwidth:.1} GB/s"
    );
    println!(
        "{param:>10} {:>11} {:>9} {:>8} {:>12} {:>6} {:>12}",
        "tessera ms",
        "GFLOP/s",
        "GB/s",
        format!("{base} ms"),
        "ratio",
        "roofline ms"
    );
    let mut points = Vec::new();
    for (value, x) in values {
        let mut o = overrides.to_vec();
        o.push(format!("{param}={value}"));
        let t = time_kernel(k, &o, requested, vs, runs)?;
        let roof = t.roofline_ms(peak, bandwidth);
        let (b, ratio) = t.baseline_ms.map_or(("-".into(), "-".into()), |b| {
            (format!("{b:.3}"), format!("{:.2}", t.ms / b))
        });
        println!(
            "{value:>10} {:>11.3} {:>9.2} {:>8.2} {b:>12} {ratio:>6} {roof:>12.3}",
            t.ms,
            t.gflops(),
            t.gbs()
        );
        points.push(crate::plot::Point {
            x,
            ms: t.ms,
            baseline_ms: t.baseline_ms,
            roofline_ms: roof,
        });
    }
    if let Some(path) = plot {
        let title = format!("{name} ({})", params(k, overrides)?);
        crate::plot::sweep(path, &title, &param, vs, &points)
            .map_err(|e| usage(format!("--plot {}: {e}", path.display())))?;
        println!("plot: {}", path.display());
    }
    Ok(())
}

pub fn lower(
    name: &str,
    target: &str,
    vmem_limit: Option<u64>,
    overrides: &[String],
    out: Option<&Path>,
) -> Result<(), Failure> {
    let k = library_kernel(name)?;
    let tuned_for = match target {
        "mosaic" | "mosaic-body" => Some(TuneTarget::Mosaic),
        "stablehlo" => Some(TuneTarget::Xla),
        "cpu-mlir" => Some(TuneTarget::Native),
        _ => None,
    };
    let p = tuned_params(k, overrides, Backend::Auto, tuned_for)?;
    let mut limits = lowering::tpu_rules::TpuLimits::default();
    if let Some(bytes) = vmem_limit {
        limits.vmem_bytes = bytes;
    }
    let mut lowering = lowering::Target::named(target, limits).ok_or_else(|| {
        usage(format!(
            "unknown target `{target}`: expected one of {}",
            lowering::Target::NAMES.join(", ")
        ))
    })?;
    if let lowering::Target::Cpu(cpu) = &mut lowering {
        // What the native backend would compile.
        cpu.registers = runtime::native_registers().map_err(usage)?;
    }
    let modules = build(k, &p)?
        .iter()
        .map(|kernel| lowering.lower_text(kernel))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| usage(e.to_string()))?;
    let text = modules.join("\n");
    match out {
        Some(path) => std::fs::write(path, text)
            .map_err(|e| runtime_failure(format!("cannot write {}: {e}", path.display()))),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// Subdirectories of the cache directory, one per compiling backend.
const CACHE_TIERS: &[&str] = &["xla", "xla-jaxlib"];

fn cache_dir() -> Result<std::path::PathBuf, Failure> {
    runtime::cache::default_dir()
        .ok_or_else(|| usage("no cache directory: set TESSERA_CACHE_DIR (or HOME)"))
}

pub fn cache_stats() -> Result<(), Failure> {
    let dir = cache_dir()?;
    println!("dir {}", dir.display());
    for tier in CACHE_TIERS {
        let path = dir.join(tier);
        let u = runtime::cache::disk_usage(&path)
            .map_err(|e| runtime_failure(format!("{}: {e}", path.display())))?;
        println!(
            "{tier}: {} entries, {} bytes, {} leftover temporary files",
            u.entries, u.bytes, u.leftovers
        );
    }
    Ok(())
}

pub fn cache_clear() -> Result<(), Failure> {
    let dir = cache_dir()?;
    let mut removed = 0;
    for tier in CACHE_TIERS {
        let path = dir.join(tier);
        removed += runtime::cache::clear(&path)
            .map_err(|e| runtime_failure(format!("{}: {e}", path.display())))?;
    }
    println!("removed {removed} files from {}", dir.display());
    Ok(())
}
