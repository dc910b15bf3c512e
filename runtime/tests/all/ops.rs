//! Every op of the IR (`kernel_ir::testing::op_zoo`), including those no library kernel
//! uses, on the native and XLA backends against the interpreter.

use crate::common::compiled_backends;
use kernel_ir::testing::op_zoo;
use kernel_ir::{interpret, InterpretOptions};
use runtime::Backend;

fn matches_the_interpreter_on(backend: Backend) {
    let k = op_zoo();
    let inputs = kernel_ir::testing::op_zoo_inputs();
    let want = interpret(&k, &inputs, &InterpretOptions::default()).unwrap();
    let (got, _) = runtime::run(&k, &inputs, backend).unwrap();
    let (wf, gf) = (want[0].to_f64(), got[0].to_f64());
    for (i, (a, b)) in wf.iter().zip(&gf).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
            "float output {i}: interp {a} {backend} {b}"
        );
    }
    assert_eq!(want[1], got[1], "integer outputs differ on {backend}");
}

#[test]
fn every_op_matches_the_interpreter_on_native() {
    assert_eq!(Backend::Native.unavailable_because(&op_zoo()), None);
    matches_the_interpreter_on(Backend::Native);
}

#[cfg(tessera_pjrt)]
#[test]
fn every_op_matches_the_interpreter_on_xla() {
    std::env::set_var(
        "TESSERA_CACHE_DIR",
        std::env::temp_dir().join("tessera-ops-test-cache"),
    );
    let k = op_zoo();
    if let Some(reason) = Backend::Xla.unavailable_because(&k) {
        assert!(
            std::env::var_os("TESSERA_REQUIRE_XLA").is_none(),
            "{reason}"
        );
        return;
    }
    matches_the_interpreter_on(Backend::Xla);
}

/// Index maps that read a scalar-prefetch table place the same blocks on every backend
/// as in the interpreter (repeated, permuted, ragged sizes); a table entry outside the
/// input is refused before running, naming the program and the ref, on every backend.
#[test]
fn scalar_prefetch_places_the_same_blocks_on_every_backend() {
    let backends = compiled_backends(&op_zoo(), "tessera-ops-test-cache");
    for (in_blocks, table, rows, cols) in [
        (4u64, vec![3, 0, 0, 2, 1], 8u64, 16u64),
        (1, vec![0], 1, 1),
        (3, vec![2, 2, 1, 0, 1, 2, 0], 5, 33),
    ] {
        let k = kernel_ir::testing::prefetch_gather(in_blocks, table.len() as u64, rows, cols);
        let x = kernel_ir::Array::from_f32(
            kernel_ir::DType::F32,
            [in_blocks * rows, cols],
            (0..in_blocks * rows * cols)
                .map(|i| i as f32 * 0.5)
                .collect(),
        )
        .unwrap();
        let t = kernel_ir::Array::from_i32([table.len() as u64], table.clone()).unwrap();
        let inputs = [t, x.clone()];
        let want = interpret(&k, &inputs, &InterpretOptions::default()).unwrap();
        for &backend in &backends {
            let (got, _) = runtime::run(&k, &inputs, backend).unwrap();
            assert_eq!(got, want, "{backend} table {table:?}");
            let mut bad = table.clone();
            bad[table.len() - 1] = in_blocks as i32;
            let t = kernel_ir::Array::from_i32([bad.len() as u64], bad).unwrap();
            let e = runtime::run(&k, &[t, x.clone()], backend)
                .unwrap_err()
                .to_string();
            let program = format!("program [{}]", table.len() - 1);
            assert!(
                e.contains(&program) && e.contains("in %x") && e.contains("outside the array"),
                "{backend}: {e}"
            );
        }
    }
}

/// `take_along_axis` against a plain reference on every backend: f32 and i32 values,
/// along rows and columns, indices in range and out of it (clamped), ragged row
/// blocks, a single column.
#[test]
fn take_along_axis_matches_a_reference_on_every_backend() {
    use kernel_ir::dsl::prelude::*;
    use kernel_ir::Array;
    let mut backends = vec![Backend::Interp];
    backends.extend(compiled_backends(&op_zoo(), "tessera-ops-test-cache"));
    // (rows, cols, picks per row, block rows); row gathers stay inside whole blocks.
    for (rows, cols, picks, bm) in [
        (16u64, 8u64, 3u64, 8u64),
        (13, 33, 5, 4),
        (1, 1, 1, 1),
        (7, 130, 17, 4),
    ] {
        let spec = |c: u64| block_spec([bm, c], |i| vec![i[0].clone(), 0.into()]);
        let k = pallas_call(
            |xf: Ref, xi: Ref, at: Ref, rows_at: Ref, of: Ref, oi: Ref, o0: Ref| {
                let at = at.read();
                of.write(xf.read().take_along_axis(at, 1));
                oi.write(xi.read().take_along_axis(at, 1));
                o0.write(xf.read().take_along_axis(rows_at.read(), 0));
            },
        )
        .name("take_along_axis")
        .grid([rows.div_ceil(bm)])
        .input(TensorType::new(DType::F32, [rows, cols]), spec(cols))
        .input(TensorType::new(DType::I32, [rows, cols]), spec(cols))
        .input(TensorType::new(DType::I32, [rows, picks]), spec(picks))
        .input(TensorType::new(DType::I32, [rows, cols]), spec(cols))
        .output(TensorType::new(DType::F32, [rows, picks]), spec(picks))
        .output(TensorType::new(DType::I32, [rows, picks]), spec(picks))
        .output(TensorType::new(DType::F32, [rows, cols]), spec(cols))
        .build()
        .unwrap();
        let n = (rows * cols) as usize;
        let xf: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let xi: Vec<i32> = (0..n as i32).map(|i| i * 7 - 50).collect();
        // Column picks from -2 to cols + 1: the ends are clamped.
        let at: Vec<i32> = (0..(rows * picks) as i32)
            .map(|i| (i * 11) % (cols as i32 + 4) - 2)
            .collect();
        // Row picks from -1 to the block's end (clamped); in a ragged last block, from
        // -1 to its last row (its padding rows differ between backends).
        let rows_at: Vec<i32> = (0..n as i64)
            .map(|i| {
                let r = i as u64 / cols;
                let in_block = (rows - r / bm * bm).min(bm) as i64;
                let over = if in_block == bm as i64 { 1 } else { 0 };
                ((i * 5) % (in_block + 1 + over) - 1) as i32
            })
            .collect();
        let clamp = |i: i32, n: u64| i.clamp(0, n as i32 - 1) as u64;
        let mut want_f = Vec::new();
        let mut want_i = Vec::new();
        for r in 0..rows {
            for p in 0..picks {
                let c = clamp(at[(r * picks + p) as usize], cols);
                want_f.push(xf[(r * cols + c) as usize] as f64);
                want_i.push(xi[(r * cols + c) as usize]);
            }
        }
        let mut want_0 = Vec::new();
        for r in 0..rows {
            let first = r / bm * bm;
            let in_block = (rows - first).min(bm);
            for c in 0..cols {
                let pick = rows_at[(r * cols + c) as usize].clamp(0, in_block as i32 - 1) as u64;
                want_0.push(xf[((first + pick) * cols + c) as usize] as f64);
            }
        }
        let inputs = [
            Array::from_f32(DType::F32, [rows, cols], xf.clone()).unwrap(),
            Array::from_i32([rows, cols], xi.clone()).unwrap(),
            Array::from_i32([rows, picks], at.clone()).unwrap(),
            Array::from_i32([rows, cols], rows_at.clone()).unwrap(),
        ];
        for &backend in &backends {
            let (got, _) = runtime::run(&k, &inputs, backend).unwrap();
            let case = format!("{backend} rows={rows} cols={cols} picks={picks} bm={bm}");
            let first_difference =
                |got: &[f64], want: &[f64]| got.iter().zip(want).position(|(g, w)| g != w);
            let want_i: Vec<f64> = want_i.iter().map(|&v| v as f64).collect();
            for (what, got, want) in [
                ("f32 along columns", &got[0], &want_f),
                ("i32 along columns", &got[1], &want_i),
                ("f32 along rows", &got[2], &want_0),
            ] {
                let got = got.to_f64();
                assert_eq!(got.len(), want.len(), "{case}: {what}");
                if let Some(i) = first_difference(&got, want) {
                    panic!(
                        "{case}: {what}: element {i} is {}, expected {}",
                        got[i], want[i]
                    );
                }
            }
        }
    }
}
