//! `auto` moves past the native backend when its JIT cannot compile a kernel, and says
//! why. The test breaks the JIT with `TESSERA_NATIVE_PIPELINE`, which holds for a whole
//! process, so it runs in a child process of this test binary.

use std::process::Command;

use kernel_ir::dsl::prelude::*;
use kernel_ir::Array;
use runtime::{Backend, Error};

/// A pass pipeline the JIT cannot parse.
const BROKEN_PIPELINE: &str = "builtin.module(no-such-pass)";

#[test]
fn auto_falls_back_when_the_jit_fails() {
    if std::env::var("TESSERA_NATIVE_PIPELINE").as_deref() != Ok(BROKEN_PIPELINE) {
        let name = "native_fallback::auto_falls_back_when_the_jit_fails";
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--test-threads=1"])
            .env("TESSERA_NATIVE_PIPELINE", BROKEN_PIPELINE)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&child.stdout);
        assert!(
            child.status.success() && stdout.contains("1 passed"),
            "{stdout}\n{}",
            String::from_utf8_lossy(&child.stderr)
        );
        return;
    }
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
