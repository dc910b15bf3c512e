//! Property tests: every kernel over many random shapes (odd sizes, ragged last blocks,
//! single rows, one block) and dtypes, against its reference, through the interpreter
//! with uninitialised memory poisoned.

use kernel_ir::{interpret, Array, InterpretOptions, Kernel};
use kernels::{check, find, BoxError, Params};
use proptest::prelude::*;

fn interp(k: &Kernel, inputs: &[Array]) -> Result<Vec<Array>, BoxError> {
    Ok(interpret(
        k,
        inputs,
        &InterpretOptions {
            poison_uninitialized: true,
            threads: 0,
        },
    )?)
}

fn check_params(name: &str, pairs: &[(&str, String)], seed: u64) -> Result<(), TestCaseError> {
    let k = find(name).unwrap();
    let pairs: Vec<(&str, &str)> = pairs.iter().map(|(a, b)| (*a, b.as_str())).collect();
    let p = Params::with(k.params(), &pairs).unwrap();
    let c = check(k, &p, seed, &mut interp)
        .map_err(|e| TestCaseError::fail(format!("{name} {p}: {e}")))?;
    prop_assert!(c.ok(), "{} {}: {:?}", name, p, c);
    Ok(())
}

fn dims() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..=3, 4u64..=40, Just(64u64), Just(128u64)]
}

fn float_dtype() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("f32"), Just("bf16"), Just("f16")]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn matmul(m in dims(), k in dims(), n in dims(), bm in 1u64..=48, bk in 1u64..=48, bn in 1u64..=48,
              dtype in float_dtype(), seed in 0u64..1000) {
        check_params("matmul", &[("m", m.to_string()), ("k", k.to_string()), ("n", n.to_string()),
            ("bm", bm.to_string()), ("bk", bk.to_string()), ("bn", bn.to_string()), ("dtype", dtype.into())], seed)?;
    }

    #[test]
    fn softmax(rows in dims(), cols in dims(), block_rows in 1u64..=16, dtype in float_dtype(), seed in 0u64..1000) {
        check_params("softmax", &[("rows", rows.to_string()), ("cols", cols.to_string()),
            ("block_rows", block_rows.to_string()), ("dtype", dtype.into())], seed)?;
    }

    #[test]
    fn rms_norm(rows in dims(), cols in dims(), block_rows in 1u64..=16, dtype in float_dtype(), seed in 0u64..1000) {
        check_params("rms_norm", &[("rows", rows.to_string()), ("cols", cols.to_string()),
            ("block_rows", block_rows.to_string()), ("dtype", dtype.into())], seed)?;
    }

    #[test]
    fn layer_norm(rows in dims(), cols in 2u64..=130, block_rows in 1u64..=16, dtype in float_dtype(), seed in 0u64..1000) {
        check_params("layer_norm", &[("rows", rows.to_string()), ("cols", cols.to_string()),
            ("block_rows", block_rows.to_string()), ("dtype", dtype.into())], seed)?;
    }

    #[test]
    fn swiglu(rows in dims(), cols in dims(), br in 1u64..=16, bc in 1u64..=64, dtype in float_dtype(), seed in 0u64..1000) {
        check_params("swiglu", &[("rows", rows.to_string()), ("cols", cols.to_string()),
            ("block_rows", br.to_string()), ("block_cols", bc.to_string()), ("dtype", dtype.into())], seed)?;
    }

    #[test]
    fn rope(batch in 1u64..=2, heads in 1u64..=3, seq in dims(), half in 1u64..=32, bs in 1u64..=64,
            dtype in float_dtype(), seed in 0u64..1000) {
        check_params("rope", &[("batch", batch.to_string()), ("heads", heads.to_string()), ("seq", seq.to_string()),
            ("head_dim", (2 * half).to_string()), ("block_seq", bs.to_string()), ("dtype", dtype.into())], seed)?;
    }
}

fn attention_case() -> impl Strategy<Value = Vec<(&'static str, String)>> {
    (
        1u64..=2,
        prop_oneof![
            Just((1u64, 1u64)),
            Just((2, 1)),
            Just((4, 2)),
            Just((3, 3)),
            Just((4, 1))
        ],
        prop_oneof![Just(1u64), 2u64..=9, 10u64..=70, Just(64u64)],
        prop_oneof![Just(1u64), 2u64..=9, 10u64..=70, Just(64u64)],
        prop_oneof![Just(32u64), Just(40), Just(64), Just(8)],
        prop_oneof![Just(8u64), Just(16), Just(32), Just(64)],
        prop_oneof![Just(8u64), Just(16), Just(32), Just(64)],
        any::<bool>(),
        prop_oneof![Just("f32"), Just("bf16")],
        prop_oneof![Just("none".to_string()), Just("0.3".to_string())],
        (
            prop_oneof![
                2 => Just("none".to_string()),
                1 => Just("0".to_string()),
                1 => (1u64..=40).prop_map(|w| w.to_string())
            ],
            prop_oneof![
                2 => Just("none".to_string()),
                1 => Just("2.5".to_string())
            ],
            prop_oneof![Just("none"), Just("batch"), Just("shared")],
        ),
    )
        .prop_map(
            |(
                batch,
                (heads, kv_heads),
                q_len,
                kv_len,
                head_dim,
                bq,
                bk,
                causal,
                dtype,
                scale,
                (window, softcap, mask),
            )| {
                vec![
                    ("window", window),
                    ("softcap", softcap),
                    ("mask", mask.to_string()),
                    ("batch", batch.to_string()),
                    ("heads", heads.to_string()),
                    ("kv_heads", kv_heads.to_string()),
                    ("q_len", q_len.to_string()),
                    ("kv_len", kv_len.to_string()),
                    ("head_dim", head_dim.to_string()),
                    ("block_q", bq.to_string()),
                    ("block_k", bk.to_string()),
                    ("causal", causal.to_string()),
                    ("dtype", dtype.to_string()),
                    ("scale", scale),
                ]
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn flash_attention_forward(case in attention_case(), seed in 0u64..1000) {
        check_params("flash_attention", &case, seed)?;
    }

    #[test]
    fn flash_attention_backward(case in attention_case(), seed in 0u64..1000) {
        check_params("flash_attention_bwd", &case, seed)?;
    }
}

/// Edge cases named in the spec, checked explicitly on both passes.
#[test]
fn attention_edge_cases() {
    let cases: &[&[(&str, &str)]] = &[
        &[("q_len", "1"), ("kv_len", "1")],
        &[("q_len", "1"), ("kv_len", "77"), ("causal", "true")],
        &[
            ("q_len", "64"),
            ("kv_len", "64"),
            ("block_q", "64"),
            ("block_k", "64"),
        ],
        &[
            ("q_len", "100"),
            ("kv_len", "37"),
            ("causal", "true"),
            ("block_q", "32"),
            ("block_k", "16"),
        ],
        &[
            ("q_len", "37"),
            ("kv_len", "100"),
            ("causal", "true"),
            ("block_q", "16"),
            ("block_k", "32"),
        ],
        &[
            ("heads", "8"),
            ("kv_heads", "1"),
            ("q_len", "33"),
            ("kv_len", "65"),
            ("block_q", "16"),
            ("block_k", "32"),
        ],
        &[
            ("head_dim", "256"),
            ("q_len", "40"),
            ("kv_len", "48"),
            ("block_q", "16"),
            ("block_k", "16"),
            ("heads", "2"),
            ("kv_heads", "2"),
        ],
        // Sliding windows: blocks wholly left of the window skipped, partly inside masked,
        // queries past kv_len + window seeing no key at all (output 0, finite gradients).
        &[
            ("q_len", "100"),
            ("kv_len", "100"),
            ("causal", "true"),
            ("window", "20"),
            ("block_q", "16"),
            ("block_k", "8"),
        ],
        &[
            ("q_len", "70"),
            ("kv_len", "30"),
            ("window", "9"),
            ("block_q", "16"),
            ("block_k", "16"),
        ],
        &[
            ("q_len", "33"),
            ("kv_len", "33"),
            ("causal", "true"),
            ("window", "0"),
            ("softcap", "1.5"),
            ("block_q", "8"),
            ("block_k", "16"),
            ("dtype", "bf16"),
        ],
        // Score masks: ragged blocks on both sequences with a per-entry mask and the
        // causal mask on top; a shared mask on the fused backward's tiling.
        &[
            ("batch", "2"),
            ("q_len", "37"),
            ("kv_len", "45"),
            ("causal", "true"),
            ("mask", "batch"),
            ("block_q", "16"),
            ("block_k", "16"),
        ],
        &[
            ("batch", "2"),
            ("heads", "4"),
            ("kv_heads", "2"),
            ("q_len", "32"),
            ("kv_len", "64"),
            ("mask", "shared"),
            ("block_q", "16"),
            ("block_k", "32"),
        ],
        &[
            ("head_dim", "128"),
            ("q_len", "50"),
            ("kv_len", "50"),
            ("dtype", "bf16"),
            ("causal", "true"),
            ("block_q", "32"),
            ("block_k", "32"),
        ],
    ];
    for case in cases {
        let owned: Vec<(&str, String)> = case.iter().map(|(a, b)| (*a, b.to_string())).collect();
        for name in ["flash_attention", "flash_attention_bwd"] {
            check_params(name, &owned, 11).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Ragged lengths (one sequence always fills its table; others from one token up),
    /// pages of one token, a table of one slot, GQA/MQA, f32 and bf16.
    #[test]
    fn paged_attention(batch in 1u64..=3,
                       heads in prop_oneof![Just((1u64, 1u64)), Just((4, 2)), Just((4, 1)), Just((3, 3))],
                       head_dim in prop_oneof![Just(8u64), Just(16), Just(40)],
                       page_size in prop_oneof![Just(1u64), 2u64..=9, Just(16)],
                       num_pages in 1u64..=12, max_pages in 1u64..=6,
                       dtype in prop_oneof![Just("f32"), Just("bf16")], seed in 0u64..1000) {
        check_params("paged_attention", &[("batch", batch.to_string()), ("heads", heads.0.to_string()),
            ("kv_heads", heads.1.to_string()), ("head_dim", head_dim.to_string()),
            ("page_size", page_size.to_string()), ("num_pages", num_pages.to_string()),
            ("max_pages", max_pages.to_string()), ("dtype", dtype.into())], seed)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Packed sequences of random lengths (one of a single token, some empty), tiles that
    /// straddle sequence boundaries and ragged last tiles, other key lengths than query
    /// lengths, causal, GQA/MQA, f32 and bf16; forward and backward.
    #[test]
    fn varlen_attention(batch in 1u64..=5,
                        heads in prop_oneof![Just((1u64, 1u64)), Just((4, 2)), Just((3, 1))],
                        total_q in prop_oneof![Just(1u64), 2u64..=90],
                        total_k in prop_oneof![Just("none".to_string()), (1u64..=90).prop_map(|t| t.to_string())],
                        head_dim in prop_oneof![Just(8u64), Just(24)],
                        block_q in 1u64..=40, block_k in 1u64..=40, causal in any::<bool>(),
                        dtype in prop_oneof![Just("f32"), Just("bf16")], seed in 0u64..1000) {
        let case = [("batch", batch.to_string()), ("heads", heads.0.to_string()),
            ("kv_heads", heads.1.to_string()), ("total_q", total_q.to_string()), ("total_k", total_k),
            ("head_dim", head_dim.to_string()), ("block_q", block_q.to_string()),
            ("block_k", block_k.to_string()), ("causal", causal.to_string()), ("dtype", dtype.into())];
        check_params("varlen_attention", &case, seed)?;
        check_params("varlen_attention_bwd", &case, seed)?;
    }
}

/// Bad offsets are refused before anything runs, naming the entry; an empty sequence
/// (of queries, or of keys) gives zeros and no gradient.
#[test]
fn varlen_attention_checks_its_offsets_and_takes_empty_sequences() {
    let k = find("varlen_attention").unwrap();
    let pairs = [
        ("batch", "3"),
        ("heads", "2"),
        ("kv_heads", "1"),
        ("total_q", "10"),
        ("total_k", "12"),
        ("head_dim", "8"),
        ("block_q", "4"),
        ("block_k", "4"),
    ];
    let p = Params::with(k.params(), &pairs).unwrap();
    let inputs = k.inputs(&p, 1).unwrap();
    let with = |cu_q: Vec<i32>, cu_k: Vec<i32>| {
        let mut v = inputs.clone();
        v[3] = Array::from_i32([cu_q.len() as u64], cu_q).unwrap();
        v[4] = Array::from_i32([cu_k.len() as u64], cu_k).unwrap();
        v
    };
    let err = |cu_q, cu_k| {
        k.run(&p, &with(cu_q, cu_k), &mut interp)
            .unwrap_err()
            .to_string()
    };
    let e = err(vec![0, 6, 4, 10], vec![0, 4, 8, 12]);
    assert!(
        e.contains("cu_seqlens_q[2] = 4 is below cu_seqlens_q[1] = 6"),
        "{e}"
    );
    let e = err(vec![0, 4, 8, 10], vec![0, 4, 8, 11]);
    assert!(
        e.contains("cu_seqlens_k[3] = 11: the last offset must be the 12"),
        "{e}"
    );
    let e = err(vec![1, 4, 8, 10], vec![0, 4, 8, 12]);
    assert!(
        e.contains("cu_seqlens_q[0] = 1: the offsets must start at 0"),
        "{e}"
    );
    let e = err(vec![0, 4, 10], vec![0, 4, 8, 12]);
    assert!(
        e.contains("cu_seqlens_q has 3 entries: expected batch + 1 = 4"),
        "{e}"
    );
    let e = err(vec![0, -4, 8, 10], vec![0, 4, 8, 12]);
    assert!(e.contains("cu_seqlens_q[1] = -4 is below"), "{e}");
    // Sequence 1 has no keys: its queries (rows 3..7) come out 0; sequence 2 no queries.
    let empty = with(vec![0, 3, 10, 10], vec![0, 5, 5, 12]);
    let out = k.run(&p, &empty, &mut interp).unwrap();
    let c = kernels::compare(&out, &k.reference(&p, &empty).unwrap(), k.tolerance(&p));
    assert!(c.ok(), "{c:?}");
    let rows: Vec<f64> = out[0].iter_f64().collect();
    assert!(rows[3 * 8..10 * 8].iter().all(|&x| x == 0.0));
    assert!(rows[..3 * 8].iter().any(|&x| x != 0.0));
    let bwd = find("varlen_attention_bwd").unwrap();
    let pb = Params::with(bwd.params(), &pairs).unwrap();
    let mut bwd_inputs = bwd.inputs(&pb, 1).unwrap();
    bwd_inputs[4] = empty[3].clone();
    bwd_inputs[5] = empty[4].clone();
    let grads = bwd.run(&pb, &bwd_inputs, &mut interp).unwrap();
    let c = kernels::compare(
        &grads,
        &bwd.reference(&pb, &bwd_inputs).unwrap(),
        bwd.tolerance(&pb),
    );
    assert!(c.ok(), "{c:?}");
    // Keys 5..12 belong to sequence 2, which has no queries: no gradient reaches them.
    assert!(grads[1].iter_f64().skip(5 * 8).all(|x| x == 0.0));
}

/// Bad block tables and lengths are refused before anything runs, naming the slot;
/// an empty context gives zeros.
#[test]
fn paged_attention_checks_its_tables_and_takes_empty_contexts() {
    let k = find("paged_attention").unwrap();
    let p = Params::with(
        k.params(),
        &[
            ("batch", "2"),
            ("heads", "2"),
            ("kv_heads", "1"),
            ("head_dim", "8"),
            ("page_size", "4"),
            ("num_pages", "5"),
            ("max_pages", "3"),
        ],
    )
    .unwrap();
    let inputs = k.inputs(&p, 1).unwrap();
    let with = |table: Vec<i32>, lens: Vec<i32>| {
        let mut v = inputs.clone();
        v[0] = Array::from_i32([2, 3], table).unwrap();
        v[1] = Array::from_i32([2], lens).unwrap();
        v
    };
    let err = |table, lens| {
        k.run(&p, &with(table, lens), &mut interp)
            .unwrap_err()
            .to_string()
    };
    let e = err(vec![0, 1, 2, 3, 5, -1], vec![12, 6]);
    assert!(
        e.contains("block_table[1, 1] = 5 is outside the cache's 5 pages"),
        "{e}"
    );
    let e = err(vec![0, 1, 2, 3, 4, -1], vec![13, 6]);
    assert!(e.contains("context_lens[0] = 13: expected 0..=12"), "{e}");
    let e = err(vec![0, 1, 2, 3, 4, -1], vec![12, -1]);
    assert!(e.contains("context_lens[1] = -1"), "{e}");
    // Slots past a length are never read, whatever they hold; length 0 gives zeros.
    let out = k
        .run(&p, &with(vec![4, -7, 99, 0, 0, 0], vec![3, 0]), &mut interp)
        .unwrap();
    let want = k
        .reference(&p, &with(vec![4, -7, 99, 0, 0, 0], vec![3, 0]))
        .unwrap();
    let c = kernels::compare(&out, &want, k.tolerance(&p));
    assert!(c.ok(), "{c:?}");
    assert!(out[0].iter_f64().skip(16).all(|x| x == 0.0));
}
