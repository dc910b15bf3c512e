//! Every op of the IR (`kernel_ir::testing::op_zoo`), including those no library kernel
//! uses, on the native and XLA backends against the interpreter.

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
    std::env::set_var(
        "TESSERA_CACHE_DIR",
        std::env::temp_dir().join("tessera-ops-test-cache"),
    );
    let mut backends = vec![Backend::Native];
    match Backend::Xla.unavailable_because(&op_zoo()) {
        None => backends.push(Backend::Xla),
        Some(reason) => assert!(
            std::env::var_os("TESSERA_REQUIRE_XLA").is_none(),
            "{reason}"
        ),
    }
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
