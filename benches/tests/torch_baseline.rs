//! The PyTorch baselines compute the same math as the library kernels: each is checked
//! against the kernel's f64 reference (so a bench never compares against wrong work).

use benches::{Case, BASELINE_CHECKS};
use kernels::{compare, find};

#[test]
fn torch_baselines_match_the_references() {
    for (name, shape) in BASELINE_CHECKS {
        let overrides: Vec<String> = shape.split(',').map(String::from).collect();
        let case = Case::new(find(name).unwrap(), &overrides).unwrap();
        let torch = case.torch_baseline().expect("every forward kernel has one");
        let got = torch.run_f64().unwrap();
        let want = case.kernel.reference(&case.params, &case.inputs).unwrap();
        let tol = case.kernel.tolerance(&case.params);
        let c = compare(
            &[kernel_ir::Array::new(
                kernel_ir::TensorType::new(kernel_ir::DType::F32, [got.len() as u64]),
                kernel_ir::ArrayData::Float(got.iter().map(|&v| v as f32).collect()),
            )
            .unwrap()],
            &want[..1],
            tol,
        );
        assert!(c.ok(), "{name} {shape}: torch vs reference {c:?}");
    }
    assert!(Case::new(find("flash_attention_bwd").unwrap(), &[])
        .unwrap()
        .torch_baseline()
        .is_none());
}
