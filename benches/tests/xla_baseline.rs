//! The XLA baselines compute the same math as the library kernels: each is checked
//! against the kernel's f64 reference (so a bench never compares against wrong work).

use benches::{baseline_checks, Case, NO_XLA_BASELINE};
use kernels::{compare, find};

fn xla_available() -> bool {
    let k = find("softmax").unwrap();
    let p = kernels::Params::parse(k.params(), &[]).unwrap();
    match runtime::Backend::Xla.unavailable_because(&k.build(&p).unwrap()[0]) {
        None => true,
        Some(reason) => {
            assert!(
                std::env::var_os("TESSERA_REQUIRE_XLA").is_none(),
                "XLA is unavailable: {reason}"
            );
            eprintln!("skipping: {reason}");
            false
        }
    }
}

#[test]
fn baselines_match_the_references() {
    if !xla_available() {
        return;
    }
    std::env::set_var(
        "TESSERA_CACHE_DIR",
        std::env::temp_dir().join("tessera-baseline-test-cache"),
    );
    for (name, overrides) in baseline_checks() {
        let k = find(name).unwrap();
        let case = Case::new(k, &[overrides.to_string()]).unwrap();
        let Some(got) = case.run_xla_baseline().unwrap() else {
            // These have a PyTorch baseline only (checked in torch_baseline.rs), as has
            // attention with a score mask.
            assert!(
                NO_XLA_BASELINE.contains(&name) || overrides.contains("mask="),
                "{name} has no XLA baseline"
            );
            continue;
        };
        let want = k.reference(&case.params, &case.inputs).unwrap();
        let c = compare(&got, &want, k.tolerance(&case.params));
        assert!(c.ok(), "{name} {overrides}: {c:?}");
    }
    let bwd = Case::new(find("flash_attention_bwd").unwrap(), &[]).unwrap();
    assert!(bwd.run_xla_baseline().unwrap().is_none());
}
