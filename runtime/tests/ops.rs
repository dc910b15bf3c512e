//! Every op of the IR (`kernel_ir::testing::op_zoo`), including those no library kernel
//! uses, on the XLA backend against the interpreter.
#![cfg(tessera_pjrt)]

use kernel_ir::testing::op_zoo;
use kernel_ir::{interpret, InterpretOptions};
use runtime::Backend;

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
    let inputs = kernel_ir::testing::op_zoo_inputs();
    let want = interpret(&k, &inputs, &InterpretOptions::default()).unwrap();
    let (got, _) = runtime::run(&k, &inputs, Backend::Xla).unwrap();
    let (wf, gf) = (want[0].to_f64(), got[0].to_f64());
    for (i, (a, b)) in wf.iter().zip(&gf).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
            "float output {i}: interp {a} xla {b}"
        );
    }
    assert_eq!(want[1], got[1], "integer outputs differ");
}
