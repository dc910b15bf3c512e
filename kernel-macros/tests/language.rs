//! The kernel language end to end: macro -> IR -> interpreter.

use kernel_ir::dsl::prelude::*;
use kernel_ir::{interpret, print_kernel, Array, InterpretOptions};
use kernel_macros::{kernel, kernel_fn};

#[kernel_fn]
fn online_softmax_step(m: Tensor, l: Tensor, s: Tensor) -> (Tensor, Tensor, Tensor) {
    let m_new = m.maximum(s.max(1));
    let p = (s - m_new.expand_dims(1)).exp();
    let alpha = (m - m_new).exp();
    (m_new, l * alpha + p.sum(1), p)
}

/// Row sums of `x` computed in column chunks with an online max: exercises a traced
/// loop with carried values, a helper and a traced `if`.
#[kernel]
fn chunked_logsumexp(
    x: Ref,
    o: Ref,
    #[comptime] rows: u64,
    #[comptime] chunk: u64,
    #[comptime] chunks: u64,
) {
    let mut m = full([rows], f64::NEG_INFINITY, DType::F32);
    let mut l = zeros([rows], DType::F32);
    for c in 0..chunks {
        let s = x.load(s![.., ds(c * chunk, chunk)]);
        let (m_new, l_new, _p) = online_softmax_step(m, l, s);
        m = m_new;
        l = l_new;
    }
    let mut out = m + l.log();
    if program_id(0) == 0 {
        out += 0.0;
    } else {
        out *= 1.0;
    }
    o.store(s![..], out);
}

fn logsumexp_kernel(rows: u64, cols: u64, chunk: u64) -> Kernel {
    pallas_call(move |x, o| chunked_logsumexp(x, o, rows, chunk, cols / chunk))
        .grid([2])
        .input(
            TensorType::new(DType::F32, [2 * rows, cols]),
            block_spec([rows, cols], |i| vec![i[0].clone(), 0.into()]),
        )
        .output(
            TensorType::new(DType::F32, [2 * rows]),
            block_spec([rows], |i| vec![i[0].clone()]),
        )
        .build()
        .unwrap()
}

#[test]
fn traced_loop_helper_and_if_compute_logsumexp() {
    let (rows, cols, chunk) = (8u64, 96u64, 32u64);
    let k = logsumexp_kernel(rows, cols, chunk);
    let text = print_kernel(&k);
    assert!(text.contains("kernel @chunked_logsumexp"), "{text}");
    assert!(text.contains("in %x"), "{text}");
    assert!(text.contains("for %"), "{text}");
    assert!(text.contains("if %"), "{text}");
    let n = (2 * rows * cols) as usize;
    let data: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 101) as f32) / 50.0 - 1.0)
        .collect();
    let x = Array::from_f32(DType::F32, [2 * rows, cols], data.clone()).unwrap();
    let out = interpret(&k, &[x], &InterpretOptions::default()).unwrap();
    let got = out[0].as_f32().unwrap();
    for r in 0..(2 * rows) as usize {
        let row = &data[r * cols as usize..(r + 1) * cols as usize];
        let mx = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let want = mx + row.iter().map(|&v| (v as f64 - mx).exp()).sum::<f64>().ln();
        assert!(
            (got[r] as f64 - want).abs() < 1e-4,
            "row {r}: {} vs {want}",
            got[r]
        );
    }
}

/// Compile-time `if` and `#[unroll]` loops run while tracing and leave no IR control flow.
#[kernel]
fn comptime_control(x: Ref, o: Ref, #[comptime] double: bool, #[comptime] times: u32) {
    let mut v = x.read();
    if double {
        v *= 2.0;
    }
    debug_print!("doubled:", v);
    #[unroll]
    for _ in 0..times {
        v += 1.0;
    }
    o.write(v);
}

#[test]
fn comptime_branches_and_unrolled_loops_specialise() {
    let build = |double, times| {
        pallas_call(move |x, o| comptime_control(x, o, double, times))
            .grid([1])
            .input(
                TensorType::new(DType::F32, [8]),
                block_spec([8], |_| vec![0.into()]),
            )
            .output(
                TensorType::new(DType::F32, [8]),
                block_spec([8], |_| vec![0.into()]),
            )
            .build()
            .unwrap()
    };
    let k = build(true, 3);
    let text = print_kernel(&k);
    assert!(!text.contains("if ") && !text.contains("for "), "{text}");
    assert_eq!(text.matches(" = add ").count(), 3, "{text}");
    assert!(text.contains("debug_print \"doubled:\" [%"), "{text}");
    let x = Array::from_f32(DType::F32, [8], vec![1.0; 8]).unwrap();
    let out = interpret(&k, std::slice::from_ref(&x), &InterpretOptions::default()).unwrap();
    assert_eq!(out[0].as_f32().unwrap(), &[5.0; 8]);
    let out = interpret(&build(false, 0), &[x], &InterpretOptions::default()).unwrap();
    assert_eq!(out[0].as_f32().unwrap(), &[1.0; 8]);
}

#[test]
fn tracing_errors_point_at_the_kernel_source() {
    #[kernel]
    fn bad_shapes(x: Ref, o: Ref) {
        let v = x.read();
        o.write(v.dot(v));
    }
    let err = pallas_call(bad_shapes)
        .grid([1])
        .input(
            TensorType::new(DType::F32, [8, 16]),
            block_spec([8, 16], |_| vec![0.into(), 0.into()]),
        )
        .output(
            TensorType::new(DType::F32, [8, 8]),
            block_spec([8, 8], |_| vec![0.into(), 0.into()]),
        )
        .build()
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("dot at kernel-macros/tests/language.rs:"),
        "{msg}"
    );
    assert!(msg.contains("contracting dims differ"), "{msg}");
}
