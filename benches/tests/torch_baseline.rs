//! The PyTorch baselines compute the same math as the library kernels: each is checked
//! against the kernel's f64 reference (so a bench never compares against wrong work).

use benches::{Case, BASELINE_CHECKS};
use kernels::find;

#[test]
fn torch_baselines_match_the_references() {
    for (name, shape) in BASELINE_CHECKS {
        let overrides: Vec<String> = shape.split(',').map(String::from).collect();
        let case = Case::new(find(name).unwrap(), &overrides).unwrap();
        let torch = case.torch_baseline().expect("every library kernel has one");
        let want = case.kernel.reference(&case.params, &case.inputs).unwrap();
        let tol = case.kernel.tolerance(&case.params);
        let c = torch.check(&want, tol).unwrap();
        assert!(c.ok(), "{name} {shape}: torch vs reference {c:?}");
    }
}

#[test]
fn every_library_kernel_has_a_checked_baseline() {
    for k in kernels::all() {
        assert!(
            BASELINE_CHECKS.iter().any(|(name, _)| *name == k.name()),
            "{}: no case in BASELINE_CHECKS (benches/src/lib.rs) checks its PyTorch baseline",
            k.name()
        );
    }
}
