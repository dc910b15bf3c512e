//! Every library kernel against its plain reference, through the interpreter.

use kernel_ir::{interpret, parse_kernel, print_kernel, InterpretOptions};
use kernel_ir::{Array, Kernel};
use kernels::{all, check, compare, find, BoxError, LibraryKernel, Params, Tolerance};

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

fn check_ok(name: &str, pairs: &[(&str, &str)], seed: u64) {
    let k = find(name).unwrap();
    let p = Params::with(k.params(), pairs).unwrap();
    let c = check(k, &p, seed, &mut interp).unwrap_or_else(|e| panic!("{name} {p}: {e}"));
    assert!(c.ok(), "{name} {p}: {c:?}");
}

#[test]
fn defaults_match_reference() {
    for k in all() {
        let small: Vec<(&str, &str)> = match k.name() {
            "flash_attention" | "flash_attention_bwd" => vec![
                ("q_len", "70"),
                ("kv_len", "90"),
                ("block_q", "32"),
                ("block_k", "32"),
            ],
            _ => vec![],
        };
        check_ok(k.name(), &small, 7);
    }
}

#[test]
fn every_kernel_round_trips_through_text() {
    for k in all() {
        let p = Params::parse(k.params(), &[]).unwrap();
        for kernel in k.build(&p).unwrap() {
            let text = print_kernel(&kernel);
            let parsed =
                parse_kernel(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", k.name()));
            assert_eq!(print_kernel(&parsed), text);
        }
    }
}

#[test]
fn compare_catches_errors_and_nans() {
    let got = vec![Array::from_f32(kernel_ir::DType::F32, [3], vec![1.0, 2.0, f32::NAN]).unwrap()];
    let tol = Tolerance {
        abs: 1e-3,
        rel: 0.0,
    };
    assert!(compare(&got, &[vec![1.0, 2.0, 3.0]], tol)
        .first_bad
        .is_some_and(|b| b.1 == 2));
    let got = vec![Array::from_f32(kernel_ir::DType::F32, [2], vec![1.0, 2.01]).unwrap()];
    let c = compare(&got, &[vec![1.0, 2.0]], tol);
    assert!(!c.ok() && (c.max_abs_err - 0.01).abs() < 1e-6);
    assert!(compare(
        &got,
        &[vec![1.0, 2.0]],
        Tolerance {
            abs: 0.02,
            rel: 0.0
        }
    )
    .ok());
}

#[test]
fn bad_parameters_are_reported() {
    let k = find("flash_attention").unwrap();
    // A value not of its parameter's kind is refused where it is parsed.
    let e = Params::parse(k.params(), &["q_len=0".into()]).unwrap_err();
    assert!(
        e.to_string()
            .contains("`q_len` must be a positive integer, got `0`"),
        "{e}"
    );
    let e = Params::parse(k.params(), &["causal=maybe".into()]).unwrap_err();
    assert!(
        e.to_string().contains("`causal` must be true or false"),
        "{e}"
    );
    let e = Params::parse(k.params(), &["mask=per_head".into()]).unwrap_err();
    assert!(
        e.to_string()
            .contains("`mask` must be one of none, batch, shared, got `per_head`"),
        "{e}"
    );
    let e = Params::parse(k.params(), &["heads=3,kv_heads=2".into()]).unwrap();
    assert!(k
        .build(&e)
        .unwrap_err()
        .to_string()
        .contains("multiple of `kv_heads`"));
    let e = Params::parse(k.params(), &["qlen=4".into()]).unwrap_err();
    assert!(
        e.to_string()
            .contains("unknown parameter `qlen`; known: batch"),
        "{e}"
    );
    let e = Params::parse(k.params(), &["dtype=f16".into()]).unwrap();
    assert!(k
        .build(&e)
        .unwrap_err()
        .to_string()
        .contains("`dtype` must be one of f32, bf16"));
}

/// Runs `chain` with the interpreter, as an executor on callers' storage would.
fn run_chain(
    k: &dyn LibraryKernel,
    p: &Params,
    chain: &kernels::Chain,
    inputs: &[Array],
) -> Vec<Array> {
    let kernels = k.build(p).unwrap();
    let read: Vec<Array> = chain.reads.iter().map(|&i| inputs[i].clone()).collect();
    let derived = k.derive(p, &read).unwrap();
    let mut outputs: Vec<Vec<Array>> = Vec::new();
    let pick = |outputs: &[Vec<Array>], s: &kernels::Source| {
        s.resolve(inputs, &derived, |step, index| {
            outputs.get(step)?.get(index)
        })
        .expect("the chain names what exists")
        .clone()
    };
    for step in &chain.steps {
        let ins: Vec<Array> = step.inputs.iter().map(|s| pick(&outputs, s)).collect();
        outputs.push(interp(&kernels[step.kernel], &ins).unwrap());
    }
    chain.outputs.iter().map(|s| pick(&outputs, s)).collect()
}

#[test]
fn chains_compute_what_run_computes() {
    let k = find("flash_attention_bwd").unwrap();
    for pairs in [
        &[
            ("batch", "2"),
            ("kv_heads", "2"),
            ("q_len", "64"),
            ("kv_len", "96"),
            ("block_q", "32"),
            ("block_k", "32"),
            ("causal", "true"),
        ][..],
        &[
            ("heads", "4"),
            ("kv_heads", "2"),
            ("q_len", "32"),
            ("kv_len", "32"),
            ("block_q", "16"),
            ("block_k", "16"),
            ("window", "9"),
        ],
        // Ragged blocks: the dq and dk/dv kernels instead of the fused one.
        &[
            ("q_len", "70"),
            ("kv_len", "40"),
            ("block_q", "32"),
            ("block_k", "16"),
        ],
    ] {
        let p = Params::with(k.params(), pairs).unwrap();
        let kernels = k.build(&p).unwrap();
        let mut inputs = k.inputs(&p, 3).unwrap();
        // Without o and lse the chain runs the forward first.
        let want = k.run(&p, &inputs, &mut interp).unwrap();
        let chain = k.chain(&p, inputs.len()).expect("the backward chains");
        assert_eq!(run_chain(k, &p, &chain, &inputs), want, "{p}");
        let forward = interp(&kernels[0], &inputs[..3]).unwrap();
        inputs.extend(forward);
        let want = k.run(&p, &inputs, &mut interp).unwrap();
        let chain = k.chain(&p, inputs.len()).expect("the backward chains");
        assert_eq!(
            chain.steps.len(),
            kernels.len() - 1,
            "every kernel but the forward"
        );
        assert_eq!(run_chain(k, &p, &chain, &inputs), want, "{p}");
    }
}

/// Varlen's chains (its tile plan derived on the host) give what its runs give: the
/// forward, and the backward with and without the forward's results, fused (GQA) and
/// unfused (one kv head).
#[test]
fn varlen_chains_compute_what_run_computes() {
    let forward = find("varlen_attention").unwrap();
    let backward = find("varlen_attention_bwd").unwrap();
    for (kv_heads, causal) in [("2", "true"), ("1", "false")] {
        let pairs = [
            ("batch", "3"),
            ("heads", "2"),
            ("kv_heads", kv_heads),
            ("total_q", "45"),
            ("head_dim", "8"),
            ("block_q", "16"),
            ("block_k", "8"),
            ("causal", causal),
        ];
        let p = Params::with(forward.params(), &pairs).unwrap();
        let inputs = forward.inputs(&p, 1).unwrap();
        assert!(forward.chain(&p, 4).is_none(), "the offsets are missing");
        let chain = forward.chain(&p, inputs.len()).unwrap();
        let saved = forward.run(&p, &inputs, &mut interp).unwrap();
        assert_eq!(run_chain(forward, &p, &chain, &inputs), saved, "{p}");
        let mut inputs = backward.inputs(&p, 1).unwrap();
        let unfused = usize::from(kv_heads == "1");
        assert_chain_runs(backward, &p, &inputs, 2 + unfused);
        // With the forward's results given, the backward's chain skips the forward.
        inputs.extend(saved);
        assert_chain_runs(backward, &p, &inputs, 1 + unfused);
    }
}

/// `k`'s chain for `inputs` has `steps` steps and computes what its `run` computes.
fn assert_chain_runs(k: &dyn LibraryKernel, p: &Params, inputs: &[Array], steps: usize) {
    let want = k.run(p, inputs, &mut interp).unwrap();
    let chain = k.chain(p, inputs.len()).expect("the op chains");
    assert_eq!(chain.steps.len(), steps, "{p}");
    assert_eq!(run_chain(k, p, &chain, inputs), want, "{p}");
}
