//! The backward kernels against central finite differences of the f64 forward
//! reference: independent of the analytic reference gradients.

use kernel_ir::{interpret, Array, DType, InterpretOptions, Kernel};
use kernels::{find, AttentionConfig, BoxError, Params};

fn interp(k: &Kernel, inputs: &[Array]) -> Result<Vec<Array>, BoxError> {
    Ok(interpret(
        k,
        inputs,
        &InterpretOptions {
            poison_uninitialized: true,
            threads: 1,
        },
    )?)
}

/// `sum(o * do)` with o from the f64 reference forward.
fn loss(c: &AttentionConfig, q: &[f64], k: &[f64], v: &[f64], d_o: &[f64]) -> f64 {
    let (o, _, _) = kernels::reference_forward(c, q, k, v, None).unwrap();
    o.iter().zip(d_o).map(|(a, b)| a * b).sum()
}

fn finite_difference_check(pairs: &[(&str, &str)]) {
    let bwd = find("flash_attention_bwd").unwrap();
    let p = Params::with(bwd.params(), pairs).unwrap();
    let c = AttentionConfig::from_params(&p).unwrap();
    assert_eq!(c.dtype, DType::F32);
    let inputs = bwd.inputs(&p, 5).unwrap();
    let grads = bwd.run(&p, &inputs, &mut interp).unwrap();
    let mut x: Vec<Vec<f64>> = inputs.iter().map(Array::to_f64).collect();
    let h = 1e-4;
    for (which, grad) in grads.iter().enumerate() {
        let g = grad.to_f64();
        for idx in (0..x[which].len()).step_by(3) {
            let orig = x[which][idx];
            x[which][idx] = orig + h;
            let up = loss(&c, &x[0], &x[1], &x[2], &x[3]);
            x[which][idx] = orig - h;
            let down = loss(&c, &x[0], &x[1], &x[2], &x[3]);
            x[which][idx] = orig;
            let numeric = (up - down) / (2.0 * h);
            assert!(
                (numeric - g[idx]).abs() < 2e-3 * (1.0 + numeric.abs()),
                "{pairs:?}: d{} [{idx}]: kernel {} vs finite difference {numeric}",
                ["q", "k", "v"][which],
                g[idx]
            );
        }
    }
}

#[test]
fn gradients_match_finite_differences() {
    finite_difference_check(&[
        ("heads", "2"),
        ("kv_heads", "1"),
        ("q_len", "5"),
        ("kv_len", "7"),
        ("head_dim", "8"),
        ("block_q", "2"),
        ("block_k", "3"),
    ]);
    finite_difference_check(&[
        ("heads", "2"),
        ("kv_heads", "2"),
        ("q_len", "6"),
        ("kv_len", "4"),
        ("head_dim", "4"),
        ("block_q", "4"),
        ("block_k", "2"),
        ("causal", "true"),
    ]);
    finite_difference_check(&[
        ("heads", "1"),
        ("kv_heads", "1"),
        ("q_len", "3"),
        ("kv_len", "9"),
        ("head_dim", "6"),
        ("block_q", "2"),
        ("block_k", "4"),
        ("causal", "true"),
        ("scale", "0.7"),
    ]);
    // Soft-capping (scores near the cap, so tanh bends) with a sliding window that leaves
    // the last queries without keys.
    finite_difference_check(&[
        ("heads", "2"),
        ("kv_heads", "1"),
        ("q_len", "9"),
        ("kv_len", "5"),
        ("head_dim", "4"),
        ("block_q", "4"),
        ("block_k", "2"),
        ("window", "2"),
        ("softcap", "0.5"),
        ("scale", "2.0"),
    ]);
    finite_difference_check(&[
        ("heads", "1"),
        ("kv_heads", "1"),
        ("q_len", "8"),
        ("kv_len", "8"),
        ("head_dim", "4"),
        ("block_q", "2"),
        ("block_k", "4"),
        ("causal", "true"),
        ("window", "3"),
        ("softcap", "1.0"),
    ]);
}

/// The backward with the forward's `(o, lse)` passed in gives the gradients of the one
/// that recomputes them, and a wrong input count is an error naming both forms.
#[test]
fn saved_forward_results_give_the_same_gradients() {
    let bwd = find("flash_attention_bwd").unwrap();
    let fwd = find("flash_attention").unwrap();
    let pairs = [
        ("heads", "4"),
        ("kv_heads", "2"),
        ("q_len", "9"),
        ("kv_len", "13"),
        ("head_dim", "8"),
        ("causal", "true"),
    ];
    let p = Params::with(bwd.params(), &pairs).unwrap();
    let inputs = bwd.inputs(&p, 3).unwrap();
    let recomputed = bwd.run(&p, &inputs, &mut interp).unwrap();
    let saved = fwd.run(&p, &inputs[..3], &mut interp).unwrap();
    let mut with_saved = inputs.clone();
    with_saved.extend(saved);
    let given = bwd.run(&p, &with_saved, &mut interp).unwrap();
    assert_eq!(recomputed, given);
    let err = bwd
        .run(&p, &inputs[..3], &mut interp)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("(q, k, v, do) or (q, k, v, do, o, lse), got 3 inputs"),
        "{err}"
    );
}
