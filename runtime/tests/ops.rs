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
