//! Every library kernel against its plain reference, through the interpreter.

use kernel_ir::{interpret, parse_kernel, print_kernel, InterpretOptions};
use kernel_ir::{Array, Kernel};
use kernels::{all, check, compare, find, BoxError, Params, Tolerance};

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
    let e = Params::parse(k.params(), &["q_len=0".into()]).unwrap();
    assert!(k
        .build(&e)
        .unwrap_err()
        .to_string()
        .contains("`q_len` must be a positive integer"));
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
fn run_chain(kernels: &[Kernel], chain: &kernels::Chain, inputs: &[Array]) -> Vec<Array> {
    let mut outputs: Vec<Vec<Array>> = Vec::new();
    let pick = |outputs: &[Vec<Array>], s: &kernels::Source| match *s {
        kernels::Source::Input(i) => inputs[i].clone(),
        kernels::Source::Output { step, index } => outputs[step][index].clone(),
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
    ] {
        let p = Params::with(k.params(), pairs).unwrap();
        let kernels = k.build(&p).unwrap();
        let mut inputs = k.inputs(&p, 3).unwrap();
        assert!(
            k.chain(&p, inputs.len()).is_none(),
            "without o and lse the op runs the forward"
        );
        let forward = interp(&kernels[0], &inputs[..3]).unwrap();
        inputs.extend(forward);
        let want = k.run(&p, &inputs, &mut interp).unwrap();
        let chain = k
            .chain(&p, inputs.len())
            .expect("the fused backward chains");
        assert_eq!(run_chain(&kernels, &chain, &inputs), want, "{p}");
    }
    let ragged = Params::with(k.params(), &[("q_len", "70"), ("block_q", "32")]).unwrap();
    assert!(k.chain(&ragged, 6).is_none(), "unfused backward: no chain");
}
