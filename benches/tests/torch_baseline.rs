//! The PyTorch baselines compute the same math as the library kernels: each is checked
//! against the kernel's f64 reference (so a bench never compares against wrong work).

use benches::Case;
use kernels::{compare, find};

#[test]
fn torch_baselines_match_the_references() {
    let cases: &[(&str, &str)] = &[
        ("matmul", "m=40,k=33,n=20"),
        ("matmul", "m=64,k=64,n=64,dtype=bf16"),
        ("softmax", "rows=13,cols=70"),
        ("rms_norm", "rows=9,cols=33"),
        ("layer_norm", "rows=9,cols=33,dtype=bf16"),
        ("swiglu", "rows=5,cols=17"),
        ("rope", "batch=2,heads=3,seq=11,head_dim=8"),
        ("flash_attention", "heads=4,kv_heads=2,q_len=33,kv_len=47"),
        (
            "flash_attention",
            "heads=2,kv_heads=2,q_len=40,kv_len=40,causal=true,dtype=bf16",
        ),
    ];
    for (name, shape) in cases {
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
