//! XLA programs calling Tessera ops (`stablehlo.custom_call @tessera_op`): the FFI
//! handler decodes operands, results and string attributes, runs the installed runner,
//! and turns its errors into XLA errors; programs run on host memory.

#![cfg(all(tessera_pjrt, tessera_xla_ffi))]

use std::ffi::c_void;

use runtime::custom_call::{set_op_runner, OpCall};
use runtime::pjrt::{Element, HostBuffer};

/// `out = x * factor + y` for f32 buffers; attribute `factor`; fails on `fail = "yes"`.
fn runner(call: &OpCall) -> Result<(), String> {
    if call.attr("fail").is_ok_and(|v| v == "yes") {
        return Err("asked to fail".into());
    }
    let factor: f32 = call
        .attr("factor")?
        .parse()
        .map_err(|e| format!("factor: {e}"))?;
    let [x, y] = call.inputs.as_slice() else {
        return Err(format!("expected 2 operands, got {}", call.inputs.len()));
    };
    let [out] = call.outputs.as_slice() else {
        return Err("expected 1 result".into());
    };
    if x.dtype != "f32" || x.dims != y.dims || x.dims != out.dims {
        return Err(format!("bad operands: {x:?} {y:?} {out:?}"));
    }
    let n = x.dims.iter().product::<u64>() as usize;
    // SAFETY: XLA hands dense f32 buffers of these dims (checked above).
    unsafe {
        let (x, y) = (x.data as *const f32, y.data as *const f32);
        let out = out.data as *mut f32;
        for i in 0..n {
            *out.add(i) = *x.add(i) * factor + *y.add(i);
        }
    }
    Ok(())
}

fn module(config: &str) -> String {
    format!(
        r#"module {{
  func.func @main(%x: tensor<3x5xf32>, %y: tensor<3x5xf32>) -> tensor<3x5xf32> {{
    %a = stablehlo.custom_call @tessera_op(%x, %y) {{api_version = 4 : i32, backend_config = {{{config}}}}} : (tensor<3x5xf32>, tensor<3x5xf32>) -> tensor<3x5xf32>
    %b = stablehlo.add %a, %y : tensor<3x5xf32>
    return %b : tensor<3x5xf32>
  }}
}}"#
    )
}

fn buffer(v: &mut [f32]) -> HostBuffer {
    HostBuffer {
        data: v.as_mut_ptr() as *mut c_void,
        element: Element::F32,
        dims: vec![3, 5],
    }
}

fn run(config: &str) -> Result<Vec<f32>, String> {
    let xla = runtime::xla::backend().map_err(String::from)?;
    xla.custom_calls().map_err(String::from)?;
    let (exe, _) = xla.compile(&module(config))?;
    let mut x: Vec<f32> = (0..15).map(|i| i as f32).collect();
    let mut y: Vec<f32> = (0..15).map(|i| 0.5 * i as f32).collect();
    let mut out = vec![f32::NAN; 15];
    let (bx, by, bo) = (buffer(&mut x), buffer(&mut y), buffer(&mut out));
    // SAFETY: every buffer holds 15 f32s and outlives the call.
    unsafe { xla.run_host(&exe, &[bx, by], &[bo]) }?;
    Ok(out)
}

#[test]
fn custom_calls_run_the_installed_runner_inside_xla_programs() {
    if runtime::xla::backend().is_err() && std::env::var_os("TESSERA_REQUIRE_XLA").is_none() {
        eprintln!("skipping: XLA is unavailable");
        return;
    }
    set_op_runner(Box::new(runner));
    let got = run(r#"factor = "3""#).expect("runs");
    let want: Vec<f32> = (0..15).map(|i| i as f32 * 3.0 + 1.0 * i as f32).collect();
    assert_eq!(got, want);

    let err = run(r#"factor = "2", fail = "yes""#).unwrap_err();
    assert!(err.contains("@tessera_op: asked to fail"), "{err}");
    let err = run(r#"other = "1""#).unwrap_err();
    assert!(err.contains("has no string attribute `factor`"), "{err}");
    // The process survives every failure and keeps running programs.
    assert_eq!(run(r#"factor = "0""#).unwrap()[3], 3.0);
}
