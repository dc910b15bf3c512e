//! The native and XLA backends against the interpreter and the references, for every
//! library kernel over random shapes (ragged blocks, GQA, causal, bf16...). XLA needs the
//! PJRT plugin that `make setup` installs; `make test` sets TESSERA_REQUIRE_XLA=1 so a
//! missing plugin fails instead of skipping.

use std::sync::Once;

use kernel_ir::{interpret, Array, InterpretOptions, Kernel};
use kernels::{compare, find, BoxError, FlashAttentionBwd, Op, Params};
use proptest::prelude::*;
use runtime::Backend;

fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Keep the user's cache out of the tests.
        let dir =
            std::env::temp_dir().join(format!("tessera-xla-test-cache-{}", std::process::id()));
        std::env::set_var("TESSERA_CACHE_DIR", dir);
    });
}

#[cfg(tessera_pjrt)]
#[test]
fn the_xla_backend_is_available() {
    setup();
    let k = find("softmax")
        .unwrap()
        .build(&Params::parse(find("softmax").unwrap().params(), &[]).unwrap())
        .unwrap();
    match Backend::Xla.unavailable_because(&k[0]) {
        None => {}
        Some(reason) if std::env::var_os("TESSERA_REQUIRE_XLA").is_some() => {
            panic!("XLA is unavailable: {reason}")
        }
        Some(reason) => eprintln!("skipping: {reason}"),
    }
}

/// The backends under test: native, and XLA when this build has it.
fn backends() -> Vec<Backend> {
    let mut b = vec![Backend::Native];
    if cfg!(tessera_pjrt) {
        b.push(Backend::Xla);
    }
    b
}

/// Runs a library kernel on every backend under test and compares each with the
/// interpreter and the reference.
fn all_match(name: &str, pairs: &[(&str, String)], seed: u64) -> Result<(), TestCaseError> {
    for backend in backends() {
        matches_on(backend, name, pairs, seed)?;
    }
    Ok(())
}

fn matches_on(
    backend: Backend,
    name: &str,
    pairs: &[(&str, String)],
    seed: u64,
) -> Result<(), TestCaseError> {
    setup();
    let lib = find(name).unwrap();
    let pairs: Vec<(&str, &str)> = pairs.iter().map(|(a, b)| (*a, b.as_str())).collect();
    let p = Params::with(lib.params(), &pairs).unwrap();
    let inputs = lib.inputs(&p, seed).unwrap();
    let on = |backend: Backend| {
        lib.run(&p, &inputs, &mut |k: &Kernel,
                                   ins: &[Array]|
         -> Result<Vec<Array>, BoxError> {
            match backend {
                Backend::Interp => Ok(interpret(k, ins, &InterpretOptions::default())?),
                b => Ok(runtime::run(k, ins, b)?.0),
            }
        })
    };
    let got =
        on(backend).map_err(|e| TestCaseError::fail(format!("{name} {p} on {backend}: {e}")))?;
    let interp =
        on(Backend::Interp).map_err(|e| TestCaseError::fail(format!("{name} {p}: {e}")))?;
    let tol = lib.tolerance(&p);
    let vs_reference = compare(&got, &lib.reference(&p, &inputs).unwrap(), tol);
    prop_assert!(
        vs_reference.ok(),
        "{} {} on {} vs reference: {:?}",
        name,
        p,
        backend,
        vs_reference
    );
    let interp_f64: Vec<Vec<f64>> = interp.iter().map(Array::to_f64).collect();
    let vs_interp = compare(&got, &interp_f64, tol);
    prop_assert!(
        vs_interp.ok(),
        "{} {} on {} vs interpreter: {:?}",
        name,
        p,
        backend,
        vs_interp
    );
    Ok(())
}

fn dim() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..=3, 4u64..=40, Just(64u64)]
}

fn dtype() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("f32"), Just("bf16"), Just("f16")]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    #[test]
    fn matmul(m in dim(), k in dim(), n in dim(), b in 1u64..=32, dtype in dtype(), seed in 0u64..100) {
        all_match("matmul", &[("m", m.to_string()), ("k", k.to_string()), ("n", n.to_string()),
            ("bm", b.to_string()), ("bk", (b + 3).to_string()), ("bn", (b + 1).to_string()), ("dtype", dtype.into())], seed)?;
    }

    #[test]
    fn row_kernels(rows in dim(), cols in 2u64..=70, br in 1u64..=8, dtype in dtype(), seed in 0u64..100) {
        for name in ["softmax", "rms_norm", "layer_norm"] {
            all_match(name, &[("rows", rows.to_string()), ("cols", cols.to_string()),
                ("block_rows", br.to_string()), ("dtype", dtype.into())], seed)?;
        }
    }

    #[test]
    fn swiglu_and_rope(rows in dim(), cols in dim(), half in 1u64..=16, dtype in dtype(), seed in 0u64..100) {
        all_match("swiglu", &[("rows", rows.to_string()), ("cols", cols.to_string()),
            ("block_rows", "4".into()), ("block_cols", "16".into()), ("dtype", dtype.into())], seed)?;
        all_match("rope", &[("heads", "2".into()), ("seq", rows.to_string()), ("head_dim", (2 * half).to_string()),
            ("block_seq", "8".into()), ("dtype", dtype.into())], seed)?;
    }

    #[test]
    fn flash_attention(heads in prop_oneof![Just((2u64, 1u64)), Just((4, 2)), Just((2, 2))],
                       q_len in prop_oneof![Just(1u64), 2u64..=70], kv_len in prop_oneof![Just(1u64), 2u64..=70],
                       causal in any::<bool>(), bf16 in any::<bool>(),
                       window in prop_oneof![Just("none".to_string()), (0u64..=40).prop_map(|w| w.to_string())],
                       softcap in prop_oneof![Just("none"), Just("3.0")],
                       mask in prop_oneof![Just("none"), Just("batch"), Just("shared")], seed in 0u64..100) {
        let case = [("batch", "2".into()), ("heads", heads.0.to_string()), ("kv_heads", heads.1.to_string()),
            ("q_len", q_len.to_string()),
            ("kv_len", kv_len.to_string()), ("head_dim", "32".into()), ("block_q", "16".into()), ("block_k", "32".into()),
            ("causal", causal.to_string()), ("dtype", if bf16 { "bf16" } else { "f32" }.into()),
            ("window", window), ("softcap", softcap.into()), ("mask", mask.into())];
        all_match("flash_attention", &case, seed)?;
        all_match("flash_attention_bwd", &case, seed)?;
    }

    /// Blocks that tile both sequences and two (batch, kv head) programs: the backward
    /// runs as one fused kernel.
    #[test]
    fn flash_attention_fused_backward(batch in 1u64..=2, heads in prop_oneof![Just((4u64, 2u64)), Just((2, 2)), Just((4, 1))],
                                      q_blocks in 1u64..=4, kv_blocks in 1u64..=3, causal in any::<bool>(),
                                      bf16 in any::<bool>(),
                                      window in prop_oneof![Just("none".to_string()), (0u64..=40).prop_map(|w| w.to_string())],
                                      softcap in prop_oneof![Just("none"), Just("3.0")],
                                      mask in prop_oneof![Just("none"), Just("batch"), Just("shared")],
                                      seed in 0u64..100) {
        let batch = if heads.1 == 1 { 2 } else { batch };
        let case = [("batch", batch.to_string()), ("heads", heads.0.to_string()), ("kv_heads", heads.1.to_string()),
            ("q_len", (16 * q_blocks).to_string()), ("kv_len", (32 * kv_blocks).to_string()), ("head_dim", "32".into()),
            ("block_q", "16".into()), ("block_k", "32".into()), ("causal", causal.to_string()),
            ("dtype", if bf16 { "bf16" } else { "f32" }.into()), ("window", window), ("softcap", softcap.into()),
            ("mask", mask.into())];
        let pairs: Vec<(&str, &str)> = case.iter().map(|(a, b)| (*a, b.as_str())).collect();
        let p = Params::with(FlashAttentionBwd::PARAMS, &pairs).unwrap();
        prop_assert!(FlashAttentionBwd::config(&p).unwrap().fuses_backward());
        all_match("flash_attention_bwd", &case, seed)?;
    }

    #[test]
    fn paged_attention(batch in 1u64..=3, heads in prop_oneof![Just((4u64, 2u64)), Just((2, 2)), Just((4, 1))],
                       page_size in prop_oneof![Just(1u64), 2u64..=9, Just(16)], num_pages in 1u64..=10,
                       max_pages in 1u64..=5, bf16 in any::<bool>(), seed in 0u64..100) {
        let case = [("batch", batch.to_string()), ("heads", heads.0.to_string()), ("kv_heads", heads.1.to_string()),
            ("head_dim", "32".into()), ("page_size", page_size.to_string()), ("num_pages", num_pages.to_string()),
            ("max_pages", max_pages.to_string()), ("dtype", if bf16 { "bf16" } else { "f32" }.into())];
        all_match("paged_attention", &case, seed)?;
    }

    #[test]
    fn varlen_attention(batch in 1u64..=4, heads in prop_oneof![Just((4u64, 2u64)), Just((2, 2)), Just((3, 1))],
                        total_q in prop_oneof![Just(1u64), 2u64..=80], total_k in prop_oneof![Just(0u64), 1u64..=80],
                        block_q in prop_oneof![Just(8u64), 1u64..=40], block_k in prop_oneof![Just(16u64), 1u64..=40],
                        causal in any::<bool>(), bf16 in any::<bool>(), seed in 0u64..100) {
        let total_k = if total_k == 0 { "none".to_string() } else { total_k.to_string() };
        let case = [("batch", batch.to_string()), ("heads", heads.0.to_string()), ("kv_heads", heads.1.to_string()),
            ("total_q", total_q.to_string()), ("total_k", total_k), ("head_dim", "32".into()),
            ("block_q", block_q.to_string()), ("block_k", block_k.to_string()), ("causal", causal.to_string()),
            ("dtype", if bf16 { "bf16" } else { "f32" }.into())];
        all_match("varlen_attention", &case, seed)?;
        all_match("varlen_attention_bwd", &case, seed)?;
        // Two kv heads or more: the fused backward kernel is what ran above.
        let bwd = kernels::find("varlen_attention_bwd").unwrap();
        let pairs: Vec<String> = case.iter().map(|(a, b)| format!("{a}={b}")).collect();
        let names: Vec<String> = bwd.build(&Params::parse(bwd.params(), &pairs).unwrap()).unwrap()
            .iter().map(|k| k.name.clone()).collect();
        prop_assert_eq!(names.contains(&"varlen_bwd_fused".to_string()), heads.1 >= 2, "{:?}", names);
    }
}
