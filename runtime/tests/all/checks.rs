//! `check!` / `check_index!`: a failed check is an error naming the first failing program,
//! the message and the values, alike on the interpreter, the native backend and XLA
//! (where checks are outputs read after the run); a check that holds changes nothing.

use crate::common::compiled_backends;
use kernel_ir::dsl::prelude::*;
use kernel_ir::ops::CheckFailure;
use kernel_ir::{Array, CheckKind, RunError};
use runtime::{Backend, Error};

const ROWS: u64 = 30;

/// The backends that run checks: the interpreter, native, and XLA where it is installed.
fn backends() -> Vec<Backend> {
    let mut backends = vec![Backend::Interp];
    backends.extend(compiled_backends(
        &pick_kernel(),
        "tessera-checks-test-cache",
    ));
    backends
}
const CLASSES: i32 = 10;

/// Picks `x[i, t[i]]` per row (8 rows a program, the last block ragged) after checking
/// each target is in `0..CLASSES`, and `x` is finite. Rows past the end of a ragged
/// block hold padding (the interpreter fills it with poison): the checks mask them out.
fn pick_kernel() -> kernel_ir::Kernel {
    let x_ty = TensorType::new(DType::F32, [ROWS, CLASSES as u64]);
    let t_ty = TensorType::new(DType::I32, [ROWS]);
    pallas_call(|x: Ref, t: Ref, o: Ref| {
        let (v, t) = (x.read(), t.read());
        let row = iota([8], 0) + program_id(0) * 8;
        let padding = row.ge(ROWS as i32);
        check_index!(
            padding | (t.ge(0) & t.lt(CLASSES)),
            "target out of bounds:",
            t
        );
        let finite = v.abs().lt(f32::MAX as f64).cast(DType::I32).min(1).eq(1);
        check!(padding | finite, "x is not finite:", program_id(0));
        let hit = iota([8, CLASSES as u64], 1).eq(t.expand_dims(1));
        o.write(select(hit, v, 0.0).sum(1));
    })
    .grid([ROWS.div_ceil(8)])
    .input(
        x_ty,
        block_spec([8, CLASSES as u64], |i| vec![i[0].clone(), 0.into()]),
    )
    .input(t_ty, block_spec([8], |i| vec![i[0].clone()]))
    .output(
        TensorType::new(DType::F32, [ROWS]),
        block_spec([8], |i| vec![i[0].clone()]),
    )
    .build()
    .unwrap()
}

fn inputs(targets: &[i32], x_at: Option<(usize, f32)>) -> Vec<Array> {
    let mut x: Vec<f32> = (0..ROWS as usize * CLASSES as usize)
        .map(|i| i as f32)
        .collect();
    if let Some((i, v)) = x_at {
        x[i] = v;
    }
    vec![
        Array::from_f32(DType::F32, [ROWS, CLASSES as u64], x).unwrap(),
        Array::from_i32([ROWS], targets.to_vec()).unwrap(),
    ]
}

fn failure(backend: Backend, inputs: &[Array]) -> CheckFailure {
    match runtime::run(&pick_kernel(), inputs, backend) {
        Err(Error::Run(RunError::CheckFailed(f))) => f,
        other => panic!("{backend:?}: expected a failed check, got {other:?}"),
    }
}

#[test]
fn checks_that_hold_change_nothing() {
    let targets: Vec<i32> = (0..ROWS as i32).map(|i| (i * 7) % CLASSES).collect();
    let want: Vec<f32> = targets
        .iter()
        .enumerate()
        .map(|(i, &t)| (i as i32 * CLASSES + t) as f32)
        .collect();
    for backend in backends() {
        let (out, _) = runtime::run(&pick_kernel(), &inputs(&targets, None), backend).unwrap();
        assert_eq!(out[0].as_f32().unwrap(), want, "{backend:?}");
    }
}

#[test]
fn the_first_failing_program_is_reported_alike_on_every_backend() {
    let mut targets: Vec<i32> = vec![0; ROWS as usize];
    // Programs 3 and 1 fail; program 1 is reported (grid order), with its block.
    targets[25] = -100;
    targets[13] = CLASSES;
    let interp = failure(Backend::Interp, &inputs(&targets, None));
    for backend in backends() {
        assert_eq!(
            failure(backend, &inputs(&targets, None)),
            interp,
            "{backend:?}"
        );
    }
    assert_eq!(interp.kind, CheckKind::Index);
    assert_eq!(interp.program, vec![1]);
    assert_eq!(
        interp.line,
        "[program (1)] target out of bounds: i32[8] [0, 0, 0, 0, 0, 10, 0, 0]"
    );
    assert_eq!(
        Error::Run(RunError::CheckFailed(interp)).to_string(),
        "check failed: [program (1)] target out of bounds: i32[8] [0, 0, 0, 0, 0, 10, 0, 0]"
    );
}

#[test]
fn value_checks_fail_as_values_on_the_last_ragged_block() {
    let targets = vec![1; ROWS as usize];
    for bad in [f32::NAN, f32::INFINITY] {
        for backend in backends() {
            let f = failure(
                backend,
                &inputs(&targets, Some((29 * CLASSES as usize, bad))),
            );
            assert_eq!(f.kind, CheckKind::Value, "{backend:?}");
            assert_eq!(f.line, "[program (3)] x is not finite: 3", "{backend:?}");
        }
    }
}
