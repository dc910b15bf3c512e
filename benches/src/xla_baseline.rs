//! The XLA baseline: each library kernel's math written plainly as one StableHLO
//! function over whole arrays (no blocking, no grid), for XLA CPU to compile its own
//! way. Benches and `tessera bench --vs xla` time it in the same process as the kernel.

use kernel_ir::{DType, TensorType};
use kernels::{
    AttentionConfig, MatmulConfig, NormConfig, Params, RopeConfig, SoftmaxConfig, SwigluConfig,
};
use lowering::hlo::{i64_array as dims, tensor_type as ty, HloBuilder};

/// Reduces f32 `x` of shape `shape` over `axes` with `add` or `maximum`.
fn reduce(m: &mut HloBuilder, kind: &str, x: &str, shape: &[u64], axes: &[u64]) -> String {
    let init = if kind == "maximum" {
        f64::NEG_INFINITY
    } else {
        0.0
    };
    m.reduce(
        kind,
        x,
        &TensorType::new(DType::F32, shape.to_vec()),
        init,
        axes,
    )
}

/// Row-wise softmax of `x` (f32, `[rows, cols]`).
fn softmax_rows(m: &mut HloBuilder, x: &str, rows: u64, cols: u64) -> String {
    let t = ty(DType::F32, &[rows, cols]);
    let tr = ty(DType::F32, &[rows]);
    let mx = reduce(m, "maximum", x, &[rows, cols], &[1]);
    let mxb = m.broadcast(&mx, &tr, &[0], &t);
    let sh = m.binary("subtract", x, &mxb, &t);
    let e = m.unary("exponential", &sh, &t);
    let s = reduce(m, "add", &e, &[rows, cols], &[1]);
    let sb = m.broadcast(&s, &tr, &[0], &t);
    m.binary("divide", &e, &sb, &t)
}

/// The baseline module for a library kernel, or `None` when there is none.
pub fn module(name: &str, p: &Params) -> Result<Option<String>, kernels::BoxError> {
    let mut m = HloBuilder::default();
    Ok(Some(match name {
        "matmul" => {
            let c = MatmulConfig::from_params(p)?;
            let (a, b, o) = (
                ty(c.dtype, &[c.m, c.k]),
                ty(c.dtype, &[c.k, c.n]),
                ty(c.dtype, &[c.m, c.n]),
            );
            let (af, bf, of) = (
                ty(DType::F32, &[c.m, c.k]),
                ty(DType::F32, &[c.k, c.n]),
                ty(DType::F32, &[c.m, c.n]),
            );
            let x = m.convert("%arg0", &a, &af);
            let y = m.convert("%arg1", &b, &bf);
            let attrs = "dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>";
            let d = m.op("dot_general", &[(&x, &af), (&y, &bf)], attrs, &of);
            let r = m.convert(&d, &of, &o);
            m.module(
                name,
                &[format!("%arg0: {a}"), format!("%arg1: {b}")],
                &[(r, o)],
            )
        }
        "softmax" => {
            let c = SoftmaxConfig::from_params(p)?;
            let (t, tf) = (
                ty(c.dtype, &[c.rows, c.cols]),
                ty(DType::F32, &[c.rows, c.cols]),
            );
            let x = m.convert("%arg0", &t, &tf);
            let s = softmax_rows(&mut m, &x, c.rows, c.cols);
            let r = m.convert(&s, &tf, &t);
            m.module(
                &format!("{name}_baseline"),
                &[format!("%arg0: {t}")],
                &[(r, t)],
            )
        }
        "rms_norm" | "layer_norm" => {
            let c = NormConfig::from_params(p)?;
            let (t, tf) = (
                ty(c.dtype, &[c.rows, c.cols]),
                ty(DType::F32, &[c.rows, c.cols]),
            );
            let (v, vf, tr) = (
                ty(c.dtype, &[c.cols]),
                ty(DType::F32, &[c.cols]),
                ty(DType::F32, &[c.rows]),
            );
            let mut x = m.convert("%arg0", &t, &tf);
            let inv_n = m.constant(DType::F32, &[c.rows], 1.0 / c.cols as f64);
            if name == "layer_norm" {
                let s = reduce(&mut m, "add", &x, &[c.rows, c.cols], &[1]);
                let mean = m.binary("multiply", &s, &inv_n, &tr);
                let mb = m.broadcast(&mean, &tr, &[0], &tf);
                x = m.binary("subtract", &x, &mb, &tf);
            }
            let sq = m.binary("multiply", &x, &x, &tf);
            let ss = reduce(&mut m, "add", &sq, &[c.rows, c.cols], &[1]);
            let var = m.binary("multiply", &ss, &inv_n, &tr);
            let eps = m.constant(DType::F32, &[c.rows], c.eps);
            let ve = m.binary("add", &var, &eps, &tr);
            let inv = m.unary("rsqrt", &ve, &tr);
            let ib = m.broadcast(&inv, &tr, &[0], &tf);
            let y = m.binary("multiply", &x, &ib, &tf);
            let w = m.convert("%arg1", &v, &vf);
            let wb = m.broadcast(&w, &vf, &[1], &tf);
            let mut y = m.binary("multiply", &y, &wb, &tf);
            let mut params = vec![format!("%arg0: {t}"), format!("%arg1: {v}")];
            if name == "layer_norm" {
                let b = m.convert("%arg2", &v, &vf);
                let bb = m.broadcast(&b, &vf, &[1], &tf);
                y = m.binary("add", &y, &bb, &tf);
                params.push(format!("%arg2: {v}"));
            }
            let r = m.convert(&y, &tf, &t);
            m.module(&format!("{name}_baseline"), &params, &[(r, t)])
        }
        "swiglu" => {
            let c = SwigluConfig::from_params(p)?;
            let (t, tf) = (
                ty(c.dtype, &[c.rows, c.cols]),
                ty(DType::F32, &[c.rows, c.cols]),
            );
            let a = m.convert("%arg0", &t, &tf);
            let b = m.convert("%arg1", &t, &tf);
            let s = m.unary("logistic", &a, &tf);
            let y = m.binary("multiply", &a, &s, &tf);
            let y = m.binary("multiply", &y, &b, &tf);
            let r = m.convert(&y, &tf, &t);
            m.module(
                name,
                &[format!("%arg0: {t}"), format!("%arg1: {t}")],
                &[(r, t)],
            )
        }
        "rope" => {
            let c = RopeConfig::from_params(p)?;
            let shape = [c.batch, c.heads, c.seq, c.head_dim];
            let (t, tf) = (ty(c.dtype, &shape), ty(DType::F32, &shape));
            let (tab, tabf) = (
                ty(c.dtype, &[c.seq, c.head_dim]),
                ty(DType::F32, &[c.seq, c.head_dim]),
            );
            let x = m.convert("%arg0", &t, &tf);
            let half = c.head_dim / 2;
            let halves: Vec<String> = [0, half]
                .iter()
                .map(|&lo| {
                    let hshape = [c.batch, c.heads, c.seq, half];
                    let attrs = format!(
                        "start_indices = {}, limit_indices = {}, strides = {}",
                        dims([0, 0, 0, lo]),
                        dims([c.batch, c.heads, c.seq, lo + half]),
                        dims([1, 1, 1, 1])
                    );
                    m.op("slice", &[(&x, &tf)], &attrs, &ty(DType::F32, &hshape))
                })
                .collect();
            let ht = ty(DType::F32, &[c.batch, c.heads, c.seq, half]);
            let neg = m.unary("negate", &halves[1], &ht);
            let rotated = m.op(
                "concatenate",
                &[(&neg, &ht), (&halves[0], &ht)],
                "dimension = 3 : i64",
                &tf,
            );
            let cos = m.convert("%arg1", &tab, &tabf);
            let sin = m.convert("%arg2", &tab, &tabf);
            let cb = m.broadcast(&cos, &tabf, &[2, 3], &tf);
            let sb = m.broadcast(&sin, &tabf, &[2, 3], &tf);
            let a = m.binary("multiply", &x, &cb, &tf);
            let b = m.binary("multiply", &rotated, &sb, &tf);
            let y = m.binary("add", &a, &b, &tf);
            let r = m.convert(&y, &tf, &t);
            m.module(
                name,
                &[
                    format!("%arg0: {t}"),
                    format!("%arg1: {tab}"),
                    format!("%arg2: {tab}"),
                ],
                &[(r, t)],
            )
        }
        "flash_attention" => {
            let c = AttentionConfig::from_params(p)?;
            if c.mask.is_some() {
                // A score mask is an input the plain twin does not declare: no baseline.
                return Ok(None);
            }
            let group = c.heads / c.kv_heads;
            let qs = [c.batch, c.heads, c.q_len, c.head_dim];
            let ks = [c.batch, c.kv_heads, c.kv_len, c.head_dim];
            let (qt, kt) = (ty(c.dtype, &qs), ty(c.dtype, &ks));
            let (qf, kf) = (ty(DType::F32, &qs), ty(DType::F32, &ks));
            let q = m.convert("%arg0", &qt, &qf);
            // Repeat each kv head `group` times: [B, Hkv, S, D] -> [B, Hkv, G, S, D] -> [B, H, S, D].
            let expanded = ty(
                DType::F32,
                &[c.batch, c.kv_heads, group, c.kv_len, c.head_dim],
            );
            let full_kv = ty(DType::F32, &[c.batch, c.heads, c.kv_len, c.head_dim]);
            let mut kv = Vec::new();
            for arg in ["%arg1", "%arg2"] {
                let x = m.convert(arg, &kt, &kf);
                let e = m.broadcast(&x, &kf, &[0, 1, 3, 4], &expanded);
                kv.push(m.op("reshape", &[(&e, &expanded)], "", &full_kv));
            }
            let scores = [c.batch, c.heads, c.q_len, c.kv_len];
            let st = ty(DType::F32, &scores);
            let attrs = "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [3]>";
            let s = m.op("dot_general", &[(&q, &qf), (&kv[0], &full_kv)], attrs, &st);
            let scale = m.constant(DType::F32, &scores, c.scale);
            let mut s = m.binary("multiply", &s, &scale, &st);
            if let Some(cap) = c.softcap {
                let inv = m.constant(DType::F32, &scores, 1.0 / cap);
                let t = m.binary("multiply", &s, &inv, &st);
                let t = m.unary("tanh", &t, &st);
                let cap = m.constant(DType::F32, &scores, cap);
                s = m.binary("multiply", &t, &cap, &st);
            }
            let it = ty(DType::I32, &scores);
            let bt = ty(DType::Bool, &scores);
            let (qi, ki) = (
                m.op("iota", &[], "iota_dimension = 2 : i64", &it),
                m.op("iota", &[], "iota_dimension = 3 : i64", &it),
            );
            let mut rules = Vec::new();
            if c.causal {
                rules.push(m.compare("LE", &ki, &qi, DType::I32, &scores));
            }
            if let Some(w) = c.window {
                let w = m.constant(DType::I32, &scores, w as f64);
                let lowest = m.binary("subtract", &qi, &w, &it);
                rules.push(m.compare("GE", &ki, &lowest, DType::I32, &scores));
            }
            if let Some(first) = rules.first().cloned() {
                let visible = rules[1..]
                    .iter()
                    .fold(first, |a, b| m.binary("and", &a, b, &bt));
                let masked = m.constant(DType::F32, &scores, -1e30);
                s = m.op(
                    "select",
                    &[(&visible, &bt), (&s, &st), (&masked, &st)],
                    "",
                    &st,
                );
            }
            let rows = ty(DType::F32, &[c.batch, c.heads, c.q_len]);
            let mx = reduce(&mut m, "maximum", &s, &scores, &[3]);
            let mxb = m.broadcast(&mx, &rows, &[0, 1, 2], &st);
            let sh = m.binary("subtract", &s, &mxb, &st);
            let e = m.unary("exponential", &sh, &st);
            let l = reduce(&mut m, "add", &e, &scores, &[3]);
            let lb = m.broadcast(&l, &rows, &[0, 1, 2], &st);
            let pr = m.binary("divide", &e, &lb, &st);
            let attrs = "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [2]>";
            let o = m.op("dot_general", &[(&pr, &st), (&kv[1], &full_kv)], attrs, &qf);
            let o = m.convert(&o, &qf, &qt);
            let logl = m.unary("log", &l, &rows);
            let lse = m.binary("add", &mx, &logl, &rows);
            let lse_t = ty(DType::F32, &[c.batch, c.heads, c.q_len, 1]);
            let lse = m.op("reshape", &[(&lse, &rows)], "", &lse_t);
            m.module(
                name,
                &[
                    format!("%arg0: {qt}"),
                    format!("%arg1: {kt}"),
                    format!("%arg2: {kt}"),
                ],
                &[(o, qt), (lse, lse_t)],
            )
        }
        _ => return Ok(None),
    }))
}
