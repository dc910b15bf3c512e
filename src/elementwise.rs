//! `tessera bench elementwise`: every element-wise math op of the kernel language as a
//! one-op kernel on the native backend, timed beside the copy kernel (the bandwidth
//! bound of such a kernel) and PyTorch's op in the same run, with its largest error in
//! ulps on the inputs.

use benches::elementwise::{inputs, torch_input, OPS};
use runtime::native::NativeArray;

use crate::commands::{median_ms, run_failure, usage, Failure};

/// The array shape from `--shape rows=R,cols=C` (default 4096 x 4096).
fn shape(overrides: &[String]) -> Result<(u64, u64), Failure> {
    let (mut rows, mut cols) = (4096, 4096);
    for item in overrides.iter().flat_map(|o| o.split(',')) {
        let (name, value) = item
            .split_once('=')
            .ok_or_else(|| usage(format!("--shape `{item}`: expected NAME=VALUE")))?;
        let value: u64 = value
            .trim()
            .parse()
            .ok()
            .filter(|&v| v > 0)
            .ok_or_else(|| usage(format!("--shape `{item}`: expected a positive integer")))?;
        match name.trim() {
            "rows" => rows = value,
            "cols" => cols = value,
            other => {
                return Err(usage(format!(
                    "`tessera bench elementwise` takes rows and cols, not `{other}`"
                )))
            }
        }
    }
    Ok((rows, cols))
}

/// Times each op `runs` times, the ops interleaved round by round, and prints the table.
pub fn bench(overrides: &[String], runs: usize) -> Result<(), Failure> {
    let (rows, cols) = shape(overrides)?;
    let fail = |e: Box<dyn std::error::Error + Send + Sync>| run_failure("elementwise", e);
    let x = inputs(rows, cols);
    let native = runtime::native::backend();
    let mut ops = Vec::new();
    for op in OPS {
        let kernel = op.build(rows, cols).map_err(|e| fail(e.into()))?;
        let prepared = native.prepare(&kernel).map_err(|e| fail(e.into()))?;
        let out = NativeArray::zeros(kernel.output_types()[0].clone(), "the output")
            .map_err(|e| fail(e.into()))?;
        ops.push((op, prepared, out, Vec::new(), Vec::new()));
    }
    let input = [NativeArray::from_array(&x).map_err(|e| fail(e.into()))?];
    let torch_x = torch_input(&x);
    for _ in 0..runs + 1 {
        for (op, prepared, out, ours, theirs) in &mut ops {
            let once = || Ok(prepared.run_on(&input, std::slice::from_mut(out))?);
            ours.push(median_ms(1, once).map_err(fail)?);
            let torch_once = || {
                op.run_torch(&torch_x);
                Ok(())
            };
            theirs.push(median_ms(1, torch_once).map_err(fail)?);
        }
    }
    let bandwidth = runtime::peak::memory_bandwidth_gbs();
    let gb = 2.0 * (rows * cols * 4) as f64 / 1e9;
    println!(
        "element-wise ops, f32 [{rows}, {cols}], native, median of {runs} interleaved runs; \
         copy bandwidth {bandwidth:.1} GB/s"
    );
    println!(
        "{:<11} {:>10} {:>7} {:>7} {:>9} {:>13} {:>8}",
        "op", "tessera ms", "GB/s", "x copy", "torch ms", "tessera/torch", "max ulp"
    );
    let median = |times: &mut Vec<f64>| {
        times.remove(0); // the warm-up round
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    };
    let mut copy_ms = None;
    for (op, _, out, ours, theirs) in &mut ops {
        let (ms, torch_ms) = (median(ours), median(theirs));
        let copy = *copy_ms.get_or_insert(ms);
        let got = out.clone().into_array().map_err(|e| fail(e.into()))?;
        println!(
            "{:<11} {ms:>10.2} {:>7.1} {:>7.2} {torch_ms:>9.2} {:>13.2} {:>8.1}",
            op.name,
            gb / (ms * 1e-3),
            ms / copy,
            ms / torch_ms,
            op.max_ulp_error(&x, &got)
        );
    }
    Ok(())
}
