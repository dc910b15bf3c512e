//! The PyTorch baselines compute the same math as the library kernels: each is checked
//! against the kernel's f64 reference (so a bench never compares against wrong work).

use benches::{baseline_checks, Case};
use kernels::find;

#[test]
fn torch_baselines_match_the_references() {
    for (name, shape) in baseline_checks() {
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
            !k.cases().is_empty(),
            "{}: no Op::CASES (its kernel's file) to check its PyTorch baseline on",
            k.name()
        );
    }
}
