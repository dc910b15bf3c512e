//! `auto` moves past the native backend when its JIT cannot compile a kernel, and says
//! why. (Its own test binary: it sets `TESSERA_NATIVE_PIPELINE` for the process.)

use kernel_ir::dsl::prelude::*;
use kernel_ir::Array;
use runtime::{Backend, Error};

#[test]
fn auto_falls_back_when_the_jit_fails() {
    std::env::set_var("TESSERA_NATIVE_PIPELINE", "builtin.module(no-such-pass)");
    let ty = TensorType::new(DType::F32, [8]);
    let k = pallas_call(|x: Ref, o: Ref| o.write(x.read() * 2.0))
        .grid([1])
        .input(ty.clone(), block_spec([8], |_| vec![0.into()]))
        .output(ty, block_spec([8], |_| vec![0.into()]))
        .build()
        .unwrap();
    let x = Array::from_f32(DType::F32, [8], (0..8).map(|i| i as f32).collect()).unwrap();
    match runtime::run(&k, std::slice::from_ref(&x), Backend::Native) {
        Err(Error::Native(e)) => assert!(e.contains("bad pass pipeline"), "{e}"),
        other => panic!("expected a compile error, got {other:?}"),
    }
    let (out, r) = runtime::run(&k, &[x], Backend::Auto).unwrap();
    assert_ne!(r.backend, Backend::Native);
    assert!(r.fallbacks[0].starts_with("native: "), "{:?}", r.fallbacks);
    assert_eq!(out[0].as_f32().unwrap()[3], 6.0);
}
