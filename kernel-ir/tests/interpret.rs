mod common;

use common::*;
use kernel_ir::dsl::prelude::*;
use kernel_ir::{interpret, Array, InterpretOptions, RunError};

fn run(k: &kernel_ir::Kernel, inputs: &[Array]) -> Vec<Array> {
    interpret(
        k,
        inputs,
        &InterpretOptions {
            poison_uninitialized: true,
            threads: 0,
        },
    )
    .unwrap()
}

#[test]
fn add_one_matches_reference() {
    let k = add_one(24, 128, 8);
    let x = random(DType::F32, &[24, 128], 1);
    let out = run(&k, std::slice::from_ref(&x));
    let want: Vec<f64> = x.to_f64().iter().map(|v| v + 1.0).collect();
    assert!(max_abs_diff(&out[0].to_f64(), &want) < 1e-6);
}

#[test]
fn recip_and_sigmoid_match_their_formulas() {
    let ty = TensorType::new(DType::F32, [8, 128]);
    let whole = || block_spec([8, 128], |_| vec![0.into(), 0.into()]);
    let k = pallas_call(|x: Ref, r: Ref, s: Ref| {
        r.write(x.read().recip());
        s.write(x.read().sigmoid());
    })
    .grid([1])
    .input(ty.clone(), whole())
    .output(ty.clone(), whole())
    .output(ty, whole())
    .build()
    .unwrap();
    assert!(
        print_kernel(&k).contains("div"),
        "print_kernel is in the prelude"
    );
    let x = random(DType::F32, &[8, 128], 3);
    let out = run(&k, std::slice::from_ref(&x));
    let xs = x.to_f64();
    let recip: Vec<f64> = xs.iter().map(|v| 1.0 / v).collect();
    let sigmoid: Vec<f64> = xs.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect();
    assert!(
        max_abs_diff(&out[0].to_f64(), &recip)
            <= 1e-6 * recip.iter().fold(1.0, |m, v| v.abs().max(m))
    );
    assert!(max_abs_diff(&out[1].to_f64(), &sigmoid) < 1e-6);
}

#[test]
fn masked_softmax_handles_a_partial_last_block() {
    for (m, n, bm) in [(13, 7, 8), (1, 1, 8), (16, 32, 8), (9, 128, 4)] {
        let k = softmax_masked(m, n, bm.min(m));
        let x = random(DType::F32, &[m, n], m * 31 + n);
        let out = run(&k, std::slice::from_ref(&x));
        let xs = x.to_f64();
        let got = out[0].to_f64();
        for r in 0..m as usize {
            let row = &xs[r * n as usize..(r + 1) * n as usize];
            let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = row.iter().map(|v| (v - mx).exp()).sum();
            for c in 0..n as usize {
                let want = (row[c] - mx).exp() / sum;
                assert!(
                    (got[r * n as usize + c] - want).abs() < 1e-5,
                    "m={m} n={n} r={r} c={c}"
                );
            }
        }
    }
}

#[test]
fn matmul_with_grid_reduction_and_scratch() {
    let (m, kk, n) = (32, 64, 48);
    let k = matmul_grid_k(m, kk, n, 16, 16, 16);
    let a = random(DType::F32, &[m, kk], 3);
    let b = random(DType::F32, &[kk, n], 4);
    for threads in [1, 2, 3] {
        let out = interpret(
            &k,
            &[a.clone(), b.clone()],
            &InterpretOptions {
                poison_uninitialized: true,
                threads,
            },
        )
        .unwrap();
        let want = naive_matmul(
            a.as_f32().unwrap(),
            b.as_f32().unwrap(),
            m as usize,
            kk as usize,
            n as usize,
        );
        assert!(
            max_abs_diff(&out[0].to_f64(), &want) < 1e-4,
            "threads={threads}"
        );
    }
}

#[test]
fn matmul_with_carried_loop() {
    let (m, kk, n) = (16, 96, 24);
    let k = matmul_loop(m, kk, n, 8, 32);
    let a = random(DType::F32, &[m, kk], 5);
    let b = random(DType::F32, &[kk, n], 6);
    let out = run(&k, &[a.clone(), b.clone()]);
    let want = naive_matmul(
        a.as_f32().unwrap(),
        b.as_f32().unwrap(),
        m as usize,
        kk as usize,
        n as usize,
    );
    assert!(max_abs_diff(&out[0].to_f64(), &want) < 1e-4);
}

/// `body` over an f32[rows, 128] input and output in two programs of 8-row blocks.
fn two_row_blocks(rows: u64, body: impl Fn(Ref, Ref) + 'static) -> kernel_ir::Kernel {
    let ty = TensorType::new(DType::F32, [rows, 128]);
    let spec = || block_spec([8, 128], |i| vec![i[0].clone(), 0.into()]);
    pallas_call(move |x: Ref, o: Ref| body(x, o))
        .grid([2])
        .input(ty.clone(), spec())
        .output(ty, spec())
        .build()
        .unwrap()
}

#[test]
fn an_edge_block_overhanging_the_array_reads_poison_and_drops_writes() {
    // 13 rows in blocks of 8: the second block covers rows 8..16 of a 13-row array.
    for (m, bm) in [(13, 8), (37, 8), (1, 1), (9, 4)] {
        let k = add_one(m, 128, bm);
        let x = random(DType::F32, &[m, 128], m);
        let out = run(&k, std::slice::from_ref(&x));
        let want: Vec<f64> = x.to_f64().iter().map(|v| v + 1.0).collect();
        assert_eq!(out[0].shape(), &[m, 128]);
        assert!(
            max_abs_diff(&out[0].to_f64(), &want) < 1e-6,
            "m={m} bm={bm}"
        );
    }
    // A kernel that lets the overhang reach real outputs (a column sum over the block's
    // rows) shows NaN there, so the tests catch it.
    let k = two_row_blocks(13, |x, o| {
        let v = x.read();
        o.write(v.sum_keepdims(0).broadcast_to([8, 128]));
    });
    let out = run(&k, &[random(DType::F32, &[13, 128], 2)]);
    let got = out[0].as_f32().unwrap();
    assert!(got[..8 * 128].iter().all(|v| v.is_finite()));
    assert!(got[8 * 128..].iter().all(|v| v.is_nan()));
}

#[test]
fn a_dynamic_index_leaving_its_block_faults_with_program_and_op() {
    let k = two_row_blocks(16, |x, o| {
        // Program 1 slices rows [5, 13) of an 8-row block.
        let start = program_id(0) * 5;
        o.write(x.load(s![ds(start, 8), ..]));
    });
    let x = random(DType::F32, &[16, 128], 1);
    let err = interpret(&k, &[x], &InterpretOptions::default()).unwrap_err();
    let RunError::Fault {
        program,
        op,
        message,
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(program, &vec![1]);
    assert!(op.contains("load %in0"), "{op}");
    assert!(
        message.contains("slice [5, 13) of dim 0 is outside the block extent 8"),
        "{message}"
    );
}

#[test]
fn wrong_inputs_are_reported() {
    let k = add_one(16, 128, 8);
    let err = interpret(&k, &[], &InterpretOptions::default()).unwrap_err();
    assert!(
        err.to_string().contains("takes 1 inputs, 0 were given"),
        "{err}"
    );
    let bad = random(DType::BF16, &[16, 128], 1);
    let err = interpret(&k, &[bad], &InterpretOptions::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("expects f32[16, 128], got bf16[16, 128]"),
        "{err}"
    );
}

#[test]
fn poisoned_scratch_shows_up_when_read_before_written() {
    // Reads the accumulator without zeroing it first.
    use kernel_ir::dsl::prelude::*;
    let k = pallas_call(|x: Ref, o: Ref, acc: Ref| o.write(acc.read() + x.read()))
        .grid([1])
        .input(
            TensorType::new(DType::F32, [8, 8]),
            block_spec([8, 8], |_| vec![0.into(), 0.into()]),
        )
        .output(
            TensorType::new(DType::F32, [8, 8]),
            block_spec([8, 8], |_| vec![0.into(), 0.into()]),
        )
        .scratch(TensorType::new(DType::F32, [8, 8]))
        .build()
        .unwrap();
    let x = random(DType::F32, &[8, 8], 1);
    let poisoned = interpret(
        &k,
        std::slice::from_ref(&x),
        &InterpretOptions {
            poison_uninitialized: true,
            threads: 1,
        },
    )
    .unwrap();
    assert!(poisoned[0].as_f32().unwrap().iter().all(|v| v.is_nan()));
    let zeroed = interpret(&k, &[x], &InterpretOptions::default()).unwrap();
    assert!(zeroed[0].as_f32().unwrap().iter().all(|v| !v.is_nan()));
}

/// Arrays too large for memory are reported as `RunError::Alloc` naming the array and
/// its byte size; sizes whose byte count overflows are rejected by the verifier.
#[test]
fn arrays_that_cannot_be_allocated_are_errors_not_aborts() {
    let huge = "f32[16777216, 16777216]"; // 2^50 bytes
    let cases = [
        (
            format!(
                "kernel @k grid [1] semantics [parallel] {{\n\
                 out %o : {huge} block [8, 128] map (i0) -> (0, 0) vmem\n\
                 body {{\n%0 = const 1.0 : f32[8, 128]\nstore %o[:, :], %0\n}}\n}}"
            ),
            format!("out %o ({huge})"),
        ),
        (
            format!(
                "kernel @k grid [1] semantics [parallel] {{\n\
                 out %o : f32[8, 128] block [8, 128] map (i0) -> (0, 0) vmem\n\
                 scratch %s : {huge} vmem\n\
                 body {{\n%0 = const 1.0 : f32[8, 128]\nstore %o[:, :], %0\n}}\n}}"
            ),
            format!("scratch %s ({huge})"),
        ),
        (
            format!(
                "kernel @k grid [1] semantics [parallel] {{\n\
                 out %o : f32[8, 128] block [8, 128] map (i0) -> (0, 0) vmem\n\
                 body {{\n%0 = const 1.0 : {huge}\n\
                 %1 = const 1.0 : f32[8, 128]\nstore %o[:, :], %1\n}}\n}}"
            ),
            format!("block value %0 ({huge})"),
        ),
    ];
    for (text, what) in cases {
        let k = kernel_ir::parse_kernel(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let err = interpret(&k, &[], &InterpretOptions::default()).unwrap_err();
        let RunError::Alloc(e) = &err else {
            panic!("expected an allocation error, got {err}");
        };
        assert_eq!(e.bytes, Some(1 << 50));
        let message = err.to_string();
        assert!(
            message.contains(&what) && message.contains("1125899906842624 bytes (1.0 PiB)"),
            "{message}"
        );
    }
    let overflow = "kernel @k grid [1] semantics [parallel] {\n\
                    out %o : f32[8, 128] block [8, 128] map (i0) -> (0, 0) vmem\n\
                    body {\n%0 = const 1.0 : f32[4294967296, 4294967296, 2]\n\
                    %1 = const 1.0 : f32[8, 128]\nstore %o[:, :], %1\n}\n}";
    let err = kernel_ir::parse_kernel(overflow).unwrap_err();
    assert!(
        err.to_string()
            .contains("is larger than any allocation can be"),
        "{err}"
    );
}

#[test]
fn try_vec_reports_what_and_size() {
    let e = kernel_ir::try_vec(|| "a buffer".into(), u64::MAX / 2, 0u32).unwrap_err();
    assert_eq!(e.what, "a buffer");
    assert_eq!(e.bytes, None);
    let v = kernel_ir::try_vec(|| "a buffer".into(), 5, 7u8).unwrap();
    assert_eq!(v, vec![7; 5]);
}

/// Blocks placed by a scalar-prefetch table: any permutation or repetition of input
/// blocks; entries outside the input fault naming the program, the ref and the block.
#[test]
fn scalar_prefetch_places_blocks_from_the_table() {
    let k = kernel_ir::testing::prefetch_gather(4, 5, 8, 16);
    let x = random(DType::F32, &[32, 16], 3);
    let table = [3, 0, 0, 2, 1];
    let t = Array::from_i32([5], table.to_vec()).unwrap();
    let out = run(&k, &[t, x.clone()]);
    let (xs, got) = (x.to_f64(), out[0].to_f64());
    for (i, &b) in table.iter().enumerate() {
        for e in 0..8 * 16 {
            let want = f64::from(xs[b as usize * 128 + e] as f32 * 2.0 + b as f32);
            assert_eq!(got[i * 128 + e], want, "block {i} element {e}");
        }
    }
    for (bad, message) in [
        (4, "gives block index 4 for dim 0, which starts at element 32, outside the array dim of 32"),
        (-1, "gives block index -1 for dim 0"),
    ] {
        let t = Array::from_i32([5], vec![0, 1, bad, 2, 3]).unwrap();
        let e = interpret(&k, &[t, x.clone()], &InterpretOptions::default()).unwrap_err();
        match &e {
            RunError::Fault { program, op, message: m } => {
                assert_eq!(program, &[2]);
                assert_eq!(op, "in %x");
                assert!(m.contains(message), "{m}");
            }
            other => panic!("{other}"),
        }
    }
}

/// Checks as outputs (what the XLA backend runs): the rewritten kernel verifies, keeps
/// its scratch refs working, computes the same outputs, and reports the failure the
/// interpreter reports, for a check inside a loop and a scalar value.
#[test]
fn checks_as_outputs_report_what_the_interpreter_reports() {
    let ty = TensorType::new(DType::F32, [16, 8]);
    let rows = || block_spec([4, 8], |i| vec![i[0].clone(), 0.into()]);
    let k = pallas_call(|x: Ref, o: Ref, acc: Ref| {
        acc.write(x.read());
        kernel_ir::dsl::for_range(0, 2, 1, (), |j, ()| {
            let v = acc.read();
            check!(v.lt(100.0), "too big at step", j, v.max(1));
            acc.write(v * 2.0);
        });
        check_index!(program_id(0).lt(9), "never fails:", program_id(0));
        o.write(acc.read());
    })
    .grid([4])
    .input(ty.clone(), rows())
    .output(ty.clone(), rows())
    .scratch(TensorType::new(DType::F32, [4, 8]))
    .build()
    .unwrap();
    let outputs = kernel_ir::CheckOutputs::new(&k).unwrap();
    kernel_ir::verify(&outputs.kernel).unwrap();
    assert_eq!(outputs.outputs, 1);
    let one_thread = InterpretOptions {
        poison_uninitialized: false,
        threads: 1,
    };
    for big in [None, Some((9 * 8 + 3, 60.0)), Some((14 * 8, 1e4))] {
        let mut xs: Vec<f32> = (0..128).map(|i| i as f32 * 0.1).collect();
        if let Some((i, v)) = big {
            xs[i] = v;
        }
        let x = Array::from_f32(DType::F32, [16, 8], xs).unwrap();
        let want = interpret(&k, std::slice::from_ref(&x), &one_thread);
        let got = interpret(&outputs.kernel, std::slice::from_ref(&x), &one_thread)
            .map(|outs| outputs.finish(outs));
        assert_eq!(big.is_some(), matches!(got, Ok(Err(_))), "{big:?}: {got:?}");
        match (want, got) {
            (Ok(want), Ok(Ok(got))) => assert_eq!(want, got),
            (Err(RunError::CheckFailed(want)), Ok(Err(got))) => assert_eq!(want, got),
            (want, got) => panic!("{big:?}: interpreter {want:?}, as outputs {got:?}"),
        }
    }
    assert!(kernel_ir::CheckOutputs::new(&add_one(8, 128, 8)).is_none());
}
