//! `tessera tune`: searches a kernel's block sizes for one problem and one target, and
//! stores the winner where `tessera run/bench/lower`, the torch ops and graph mode find
//! it ([`runtime::tune`]).
//!
//! Candidates come from the kernel's tunable parameters ([`kernels::tuning`]), the
//! current (default) values first. Each is pruned before it is timed: it must build,
//! the target must take it (the TPU tiling and VMEM rules for Mosaic) and, on the
//! native backend, one program's blocks must fit in L2 (or take no more than the
//! current blocks do, where those do not fit). Native and XLA candidates are
//! run on the same inputs, checked against the kernel's reference (a wrong result never
//! wins) and timed; Mosaic candidates are ranked by a cost model, since no TPU is here.
//! `--budget` bounds the search; the defaults are always measured.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use kernel_ir::{Array, Kernel, MemorySpace};
use kernels::tuning::{self, Candidate};
use kernels::{compare, LibraryKernel, ParamValue, Params};
use lowering::tpu_rules::{self, TpuLimits};
use runtime::tune::{Store, TuneKey, TuneTarget, Tuned};
use runtime::Backend;

use crate::commands::{
    build, execute, library_kernel, median_ms, params, run_failure, runtime_failure, usage, Failure,
};

/// The flags of `tessera tune KERNEL`.
pub struct TuneArgs<'a> {
    /// native, xla or mosaic.
    pub target: &'a str,
    /// `name=value` overrides (the problem; tunable values given here are the baseline).
    pub overrides: &'a [String],
    /// Seconds the search may take (the defaults are always measured).
    pub budget: f64,
    /// Timed runs per candidate.
    pub runs: usize,
    /// Measure again even when a tuned configuration exists.
    pub force: bool,
}

/// What happened to one candidate.
enum Outcome {
    /// Median time (modeled for Mosaic), ms.
    Timed(f64),
    /// Not timed: why.
    Pruned(String),
    /// Ran, but its result is wrong.
    Wrong(String),
}

/// The Mosaic cost model's machine (v5e): HBM bandwidth, matrix-unit peak, fixed cost
/// of one grid step.
const TPU_HBM_BYTES_PER_S: f64 = 819e9;
const TPU_FLOPS_PER_S: f64 = 197e12;
const TPU_STEP_S: f64 = 0.35e-6;
/// Grids with more steps than this are modeled as fetching every block at every step.
const MODELED_STEPS_LIMIT: u64 = 1 << 20;

/// `tessera tune KERNEL ...`.
pub fn tune(name: &str, args: &TuneArgs) -> Result<(), Failure> {
    let k = library_kernel(name)?;
    let target: TuneTarget = args.target.parse().map_err(usage)?;
    if args.runs == 0 {
        return Err(usage("--runs must be at least 1"));
    }
    if !(args.budget > 0.0 && args.budget.is_finite()) {
        return Err(usage("--budget must be a positive number of seconds"));
    }
    let base = params(k, args.overrides)?;
    let space = tuning::search_space(k, &base).map_err(|e| usage(format!("{name}: {e}")))?;
    if space.is_empty() {
        return Err(usage(format!(
            "`{name}` has no tunable parameters (its sizes are fixed by its inputs)"
        )));
    }
    build(k, &base)?;
    let store = store()?;
    let key = TuneKey {
        kernel: name.to_string(),
        problem: tuning::problem(k, &base),
        target,
    };
    match store.get(&key) {
        Ok(Some(t)) if !args.force => {
            println!(
                "already tuned: {name} {} on {target}: {} ({:.3} ms, defaults {:.3} ms); \
                 --force measures again",
                key.problem,
                t.config_text(),
                t.best_ms,
                t.default_ms
            );
            return Ok(());
        }
        Ok(_) => {}
        Err(reason) => eprintln!("warning: tessera tune: {reason}; tuning again"),
    }
    let started = Instant::now();
    let mut search = Search::new(k, &base, target, args.runs)?;
    let bar = progress(space.len(), args.budget);
    let mut results = Vec::with_capacity(space.len());
    for (i, candidate) in space.iter().enumerate() {
        let over_budget = started.elapsed().as_secs_f64() > args.budget;
        if i > 0 && over_budget {
            bar.println(format!(
                "budget of {}s reached after {i} of {} candidates",
                args.budget,
                space.len()
            ));
            break;
        }
        bar.set_message(label(candidate));
        let outcome = search.evaluate(candidate, i == 0);
        results.push((candidate.clone(), outcome));
        bar.inc(1);
    }
    bar.finish_and_clear();
    report(k, &base, target, &results);
    // The first candidate (the current blocks) is always evaluated.
    let default_ms = match &results[0].1 {
        Outcome::Timed(ms) => *ms,
        Outcome::Wrong(why) | Outcome::Pruned(why) => {
            return Err(runtime_failure(format!(
                "{name} {base}: the current blocks failed ({why}); nothing stored"
            )))
        }
    };
    let (best, best_ms) = results
        .iter()
        .filter_map(|(c, o)| match o {
            Outcome::Timed(ms) => Some((c, *ms)),
            _ => None,
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .expect("the defaults were timed");
    let tuned = Tuned {
        key,
        machine: runtime::tune::machine(target).to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        config: best
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        best_ms,
        default_ms,
        tried: results.len(),
    };
    let path = store.put(&tuned).map_err(|e| {
        runtime_failure(format!(
            "cannot store the result in {}: {e}",
            store.dir().display()
        ))
    })?;
    let how = if target == TuneTarget::Mosaic {
        "modeled"
    } else {
        "measured"
    };
    println!(
        "tuned {name} {} on {target}: {} {best_ms:.3} ms vs {default_ms:.3} ms with the current \
         blocks ({:.2}x, {how}; {} candidates in {:.1} s)\nsaved {}",
        tuned.key.problem,
        tuned.config_text(),
        default_ms / best_ms,
        results.len(),
        started.elapsed().as_secs_f64(),
        path.display()
    );
    Ok(())
}

/// A progress bar on stderr (drawn only on a terminal).
fn progress(len: usize, budget: f64) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    let style = ProgressStyle::with_template(&format!(
        "tuning [{{bar:30}}] {{pos}}/{{len}} {{elapsed}} of {budget}s budget  {{msg}}"
    ))
    .expect("a valid template")
    .progress_chars("=> ");
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

fn label(c: &Candidate) -> String {
    let parts: Vec<String> = c.iter().map(|(n, v)| format!("{n}={v}")).collect();
    parts.join(",")
}

/// Prints one row per candidate, best first.
fn report(
    k: &dyn LibraryKernel,
    base: &Params,
    target: TuneTarget,
    results: &[(Candidate, Outcome)],
) {
    let unit = if target == TuneTarget::Mosaic {
        "model_ms"
    } else {
        "median_ms"
    };
    println!("{} {base} on {target}", k.name());
    println!("{:<32} {:>10} {:>8}  status", "candidate", unit, "speedup");
    let default_ms = match results.first() {
        Some((_, Outcome::Timed(ms))) => Some(*ms),
        _ => None,
    };
    let mut rows: Vec<&(Candidate, Outcome)> = results.iter().collect();
    rows.sort_by(|a, b| match (&a.1, &b.1) {
        (Outcome::Timed(x), Outcome::Timed(y)) => x.total_cmp(y),
        (Outcome::Timed(_), _) => std::cmp::Ordering::Less,
        (_, Outcome::Timed(_)) => std::cmp::Ordering::Greater,
        _ => std::cmp::Ordering::Equal,
    });
    for (i, (c, o)) in rows.into_iter().enumerate() {
        let is_default = std::ptr::eq(c, &results[0].0);
        let mark = if is_default { " (current)" } else { "" };
        match o {
            Outcome::Timed(ms) => {
                let speedup = default_ms.map_or("-".to_string(), |d| format!("{:.2}x", d / ms));
                let status = if i == 0 { "best" } else { "ok" };
                println!("{:<32} {ms:>10.3} {speedup:>8}  {status}{mark}", label(c));
            }
            Outcome::Pruned(why) | Outcome::Wrong(why) => {
                let status = match o {
                    Outcome::Wrong(_) => "WRONG",
                    _ => "pruned",
                };
                println!(
                    "{:<32} {:>10} {:>8}  {status}: {why}{mark}",
                    label(c),
                    "-",
                    "-"
                )
            }
        }
    }
}

/// What every candidate is evaluated against: the inputs, the reference, the backend.
struct Search<'a> {
    k: &'static dyn LibraryKernel,
    base: &'a Params,
    target: TuneTarget,
    runs: usize,
    /// The inputs and the reference's outputs (timed targets only).
    data: Option<(Vec<Array>, Vec<Vec<f64>>)>,
    l2: u64,
    /// The most bytes one program of the current blocks' kernels touches: where that is
    /// over L2 already (blocks the tuner does not choose), candidates may match it.
    current_bytes: u64,
}

impl<'a> Search<'a> {
    fn new(
        k: &'static dyn LibraryKernel,
        base: &'a Params,
        target: TuneTarget,
        runs: usize,
    ) -> Result<Self, Failure> {
        let data = match target {
            TuneTarget::Mosaic => None,
            TuneTarget::Native | TuneTarget::Xla => {
                let context = format!("{} {base}", k.name());
                let inputs = k
                    .inputs(base, 0)
                    .map_err(|e| usage(format!("{context}: {e}")))?;
                let want = k
                    .reference(base, &inputs)
                    .map_err(|e| run_failure(&format!("{context}: reference"), e))?;
                Some((inputs, want))
            }
        };
        Ok(Search {
            k,
            base,
            target,
            runs,
            data,
            l2: runtime::tune::l2_bytes(),
            current_bytes: k
                .build(base)
                .map_or(0, |ks| ks.iter().map(block_bytes).max().unwrap_or(0)),
        })
    }

    fn backend(&self) -> Backend {
        match self.target {
            TuneTarget::Xla => Backend::Xla,
            TuneTarget::Native | TuneTarget::Mosaic => Backend::Native,
        }
    }

    /// Prunes, checks and times (or models) one candidate. `current` is the baseline,
    /// which is never pruned for its cache footprint.
    fn evaluate(&mut self, candidate: &Candidate, current: bool) -> Outcome {
        let mut p = self.base.clone();
        for (name, value) in candidate {
            p.set_value(name, ParamValue::Int(*value))
                .expect("tunables are parameters");
        }
        let kernels = match self.k.build(&p) {
            Ok(k) => k,
            Err(e) => return Outcome::Pruned(e.to_string()),
        };
        if let Err(why) = self.prune(&kernels, current) {
            return Outcome::Pruned(why);
        }
        match &self.data {
            None => Outcome::Timed(mosaic_model_ms(&kernels, self.k.flops(&p))),
            Some((inputs, want)) => {
                let backend = self.backend();
                let got = match execute(self.k, &p, inputs, backend) {
                    Ok((got, _)) => got,
                    Err(e) => return Outcome::Wrong(e.to_string()),
                };
                let c = compare(&got, want, self.k.tolerance(&p));
                if let Some((o, i, g, w)) = c.first_bad {
                    return Outcome::Wrong(format!("output {o} element {i} is {g}, expected {w}"));
                }
                match median_ms(self.runs, || execute(self.k, &p, inputs, backend).map(drop)) {
                    Ok(ms) => Outcome::Timed(ms),
                    Err(e) => Outcome::Wrong(e.to_string()),
                }
            }
        }
    }

    /// Why the target cannot take (or should not try) these kernels.
    fn prune(&self, kernels: &[Kernel], current: bool) -> Result<(), String> {
        for kernel in kernels {
            match self.target {
                TuneTarget::Mosaic => {
                    tpu_rules::check(kernel, &TpuLimits::default()).map_err(|e| e.to_string())?
                }
                TuneTarget::Native | TuneTarget::Xla => {
                    if let Some(why) = self.backend().unavailable_because(kernel) {
                        return Err(why);
                    }
                    let bytes = block_bytes(kernel);
                    let budget = self.l2.max(self.current_bytes);
                    if self.target == TuneTarget::Native && !current && bytes > budget {
                        return Err(format!(
                            "one program's blocks take {} KiB, over the {} KiB L2{}",
                            bytes >> 10,
                            self.l2 >> 10,
                            if budget > self.l2 {
                                format!(" and the current blocks' {} KiB", budget >> 10)
                            } else {
                                String::new()
                            }
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Bytes one program touches in its blocks and scratch (f32 on the CPU).
fn block_bytes(kernel: &Kernel) -> u64 {
    kernel
        .refs
        .iter()
        .filter(|r| {
            r.block
                .as_ref()
                .is_none_or(|b| b.memory_space == MemorySpace::Vmem)
        })
        .map(|r| r.kernel_type().num_elements() * r.ty.dtype.size_bytes().max(4) as u64)
        .sum()
}

/// Modeled TPU time of `kernels` doing `flops` in all, ms: grid steps at a fixed cost,
/// the block copies Pallas makes (a block is fetched, or written back, when its block
/// index changes from one step to the next) at HBM bandwidth, the flops at the matrix
/// unit's peak.
fn mosaic_model_ms(kernels: &[Kernel], flops: f64) -> f64 {
    let mut seconds = flops / TPU_FLOPS_PER_S;
    for kernel in kernels {
        let steps: u64 = kernel.grid.iter().product();
        seconds += steps as f64 * TPU_STEP_S;
        for r in &kernel.refs {
            let Some(spec) = r
                .block
                .as_ref()
                .filter(|b| b.memory_space == MemorySpace::Vmem)
            else {
                continue;
            };
            let bytes = r.kernel_type().num_elements() * r.ty.dtype.size_bytes() as u64;
            let copies = block_copies(&kernel.grid, |pids| spec.index_map.eval(pids));
            seconds += (copies * bytes) as f64 / TPU_HBM_BYTES_PER_S;
        }
    }
    seconds * 1e3
}

/// How many steps of `grid` (last dimension fastest) see a block index different from
/// the previous step's (every step when the index depends on prefetched data).
fn block_copies(grid: &[u64], index: impl Fn(&[u64]) -> Option<Vec<i64>>) -> u64 {
    let steps: u64 = grid.iter().product();
    if steps > MODELED_STEPS_LIMIT {
        return steps;
    }
    let mut pids = vec![0u64; grid.len()];
    let mut previous: Option<Vec<i64>> = None;
    let mut copies = 0;
    for _ in 0..steps {
        match index(&pids) {
            Some(idx) if previous.as_ref() == Some(&idx) => {}
            Some(idx) => {
                copies += 1;
                previous = Some(idx);
            }
            None => {
                copies += 1;
                previous = None;
            }
        }
        for d in (0..grid.len()).rev() {
            pids[d] += 1;
            if pids[d] < grid[d] {
                break;
            }
            pids[d] = 0;
        }
    }
    copies
}

/// The default store, or a usage error when there is no cache directory.
fn store() -> Result<Store, Failure> {
    Store::default_store().ok_or_else(|| {
        usage("no cache directory for tuned configurations: set TESSERA_CACHE_DIR (or HOME)")
    })
}

/// `tessera tune --list`: every stored configuration.
pub fn list() -> Result<(), Failure> {
    let store = store()?;
    let entries = store
        .list()
        .map_err(|e| runtime_failure(format!("{}: {e}", store.dir().display())))?;
    println!("dir {} ({} entries)", store.dir().display(), entries.len());
    for (path, entry) in entries {
        match entry {
            Ok(t) => println!(
                "{} {} on {}: {} ({:.3} ms vs {:.3} ms, {:.2}x, {} candidates){}",
                t.key.kernel,
                t.key.problem,
                t.key.target,
                t.config_text(),
                t.best_ms,
                t.default_ms,
                t.default_ms / t.best_ms.max(1e-12),
                t.tried,
                if t.is_current() {
                    ""
                } else {
                    "  [other machine or version: not used]"
                }
            ),
            Err(why) => println!("{}: unreadable: {why}", path.display()),
        }
    }
    Ok(())
}

/// `tessera tune --clear [KERNEL]`.
pub fn clear(kernel: Option<&str>) -> Result<(), Failure> {
    if let Some(name) = kernel {
        library_kernel(name)?;
    }
    let store = store()?;
    let removed = store
        .clear(kernel)
        .map_err(|e| runtime_failure(format!("{}: {e}", store.dir().display())))?;
    println!("removed {removed} files from {}", store.dir().display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_copied_when_their_index_changes() {
        // Grid [2, 3]: a block indexed by the first program id changes twice; one
        // indexed by the second changes at every step; a constant one is fetched once.
        assert_eq!(block_copies(&[2, 3], |p| Some(vec![p[0] as i64])), 2);
        assert_eq!(block_copies(&[2, 3], |p| Some(vec![p[1] as i64])), 6);
        assert_eq!(block_copies(&[2, 3], |_| Some(vec![0])), 1);
        assert_eq!(block_copies(&[2, 3], |_| None), 6);
    }
}
