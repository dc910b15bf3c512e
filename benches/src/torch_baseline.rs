//! PyTorch baselines (through tch, in this process): the ATen op a PyTorch user would
//! call for each library kernel's math, on the same inputs.

use kernel_ir::{Array, DType};
use kernels::{compare, BoxError, Comparison, Params, Tolerance};
use tch::{Kind, Tensor};

/// A PyTorch computation of a library kernel's outputs.
type TorchOp = fn(&[Tensor], &Params) -> Vec<Tensor>;

/// A PyTorch call ready to run: its input tensors and the op.
pub struct TorchBaseline {
    inputs: Vec<Tensor>,
    op: TorchOp,
    params: Params,
}

impl TorchBaseline {
    /// The baseline of library kernel `name` (all its outputs), or `None` when there
    /// is none.
    pub fn new(name: &str, params: &Params, inputs: &[Array]) -> Option<TorchBaseline> {
        let op: TorchOp = match name {
            "matmul" => |t, _| vec![t[0].matmul(&t[1])],
            "softmax" => |t, _| vec![t[0].softmax(-1, None::<Kind>)],
            "rms_norm" => |t, p| {
                let cols = *t[0].size().last().unwrap_or(&1);
                vec![t[0].rms_norm([cols], Some(&t[1]), eps(p))]
            },
            "layer_norm" => |t, p| {
                let cols = *t[0].size().last().unwrap_or(&1);
                vec![t[0].layer_norm([cols], Some(&t[1]), Some(&t[2]), eps(p), false)]
            },
            "swiglu" => |t, _| vec![t[0].silu() * &t[1]],
            "rope" => |t, _| {
                let (x, cos, sin) = (&t[0], &t[1], &t[2]);
                let half = x.size()[3] / 2;
                let rotated = Tensor::cat(&[-x.narrow(3, half, half), x.narrow(3, 0, half)], 3);
                vec![x * cos + rotated * sin]
            },
            "flash_attention" if masked_or_capped(params) => {
                |t, p| vec![attention_math(&t[0], &t[1], &t[2], t.get(3), p)]
            }
            "flash_attention_bwd" if masked_or_capped(params) => math_backward,
            "flash_attention" => |t, p| {
                let gqa = t[0].size()[1] != t[1].size()[1];
                vec![Tensor::scaled_dot_product_attention(
                    &t[0],
                    &t[1],
                    &t[2],
                    None::<Tensor>,
                    0.0,
                    causal(p),
                    scale(p),
                    gqa,
                )]
            },
            "flash_attention_bwd" => sdpa_backward,
            "paged_attention" => gathered_sdpa,
            "varlen_attention" => per_sequence_sdpa,
            "varlen_attention_bwd" => per_sequence_sdpa_backward,
            _ => return None,
        };
        Some(TorchBaseline {
            inputs: inputs.iter().map(aten_bindings::tensor).collect(),
            op,
            params: params.clone(),
        })
    }

    /// Runs the op once.
    pub fn run(&self) -> Vec<Tensor> {
        tch::no_grad(|| (self.op)(&self.inputs, &self.params))
    }

    /// Runs the op once and compares its outputs with the kernel's first reference
    /// outputs `want` (the attention forward's log-sum-exp has no PyTorch twin).
    pub fn check(&self, want: &[Vec<f64>], tol: Tolerance) -> Result<Comparison, BoxError> {
        let got = self
            .run()
            .iter()
            .map(|t| {
                let flat = t.to_kind(Kind::Float).contiguous().view(-1);
                let v = Vec::<f32>::try_from(&flat)?;
                Ok(Array::from_f32(DType::F32, [v.len() as u64], v)?)
            })
            .collect::<Result<Vec<_>, BoxError>>()?;
        if got.len() > want.len() {
            return Err(format!(
                "torch gives {} outputs, the reference {}",
                got.len(),
                want.len()
            )
            .into());
        }
        Ok(compare(&got, &want[..got.len()], tol))
    }
}

/// The attention backward as PyTorch runs it for `F.scaled_dot_product_attention`
/// (`q, k, v, do` -> `dq, dk, dv`): the CPU flash forward (for the output and
/// log-sum-exp the backward needs, as Tessera's backward recomputes them too), then
/// `_scaled_dot_product_flash_attention_for_cpu_backward`; GQA repeats k/v per query
/// head and sums their gradients over each group, as SDPA's `enable_gqa` does.
fn sdpa_backward(t: &[Tensor], p: &Params) -> Vec<Tensor> {
    let (q, k, v, d_o) = (&t[0], &t[1], &t[2], &t[3]);
    let groups = q.size()[1] / k.size()[1];
    let expand = |x: &Tensor| {
        if groups > 1 {
            x.repeat_interleave_self_int(groups, 1, None)
        } else {
            x.shallow_clone()
        }
    };
    let (ke, ve) = (expand(k), expand(v));
    let (o, lse) = Tensor::internal_scaled_dot_product_flash_attention_for_cpu(
        q,
        &ke,
        &ve,
        0.0,
        causal(p),
        None::<Tensor>,
        scale(p),
    );
    let (dq, dk, dv) = Tensor::internal_scaled_dot_product_flash_attention_for_cpu_backward(
        d_o,
        q,
        &ke,
        &ve,
        &o,
        &lse,
        0.0,
        causal(p),
        None::<Tensor>,
        scale(p),
    );
    let fold = |g: Tensor| {
        if groups == 1 {
            return g;
        }
        let s = k.size();
        g.view([s[0], s[1], groups, s[2], s[3]])
            .sum_dim_intlist(2, false, None::<Kind>)
    };
    vec![dq, fold(dk), fold(dv)]
}

/// Paged decode attention the way a PyTorch user computes it: per sequence, gather its
/// pages through the block table (`index_select`), then SDPA with GQA on the first
/// `len` tokens (inputs `block_table, context_lens, q, k_cache, v_cache`).
fn gathered_sdpa(t: &[Tensor], p: &Params) -> Vec<Tensor> {
    let (q, k_cache, v_cache) = (&t[2], &t[3], &t[4]);
    let table = Vec::<i32>::try_from(&t[0].view(-1)).unwrap_or_default();
    let lens = Vec::<i32>::try_from(&t[1]).unwrap_or_default();
    let (page_size, max_pages) = (k_cache.size()[2], t[0].size()[1]);
    let outs: Vec<Tensor> = lens
        .iter()
        .enumerate()
        .map(|(b, &len)| {
            let len = i64::from(len);
            let used = (len + page_size - 1) / page_size;
            let row = &table[b * max_pages as usize..][..used as usize];
            let pages = Tensor::from_slice(row).to_kind(Kind::Int64);
            let gather = |cache: &Tensor| {
                cache
                    .index_select(1, &pages)
                    .flatten(1, 2)
                    .narrow(1, 0, len)
                    .unsqueeze(0)
            };
            Tensor::scaled_dot_product_attention(
                &q.get(b as i64).unsqueeze(0).unsqueeze(2),
                &gather(k_cache),
                &gather(v_cache),
                None::<Tensor>,
                0.0,
                false,
                scale(p),
                true,
            )
            .squeeze_dim(0)
            .squeeze_dim(-2)
        })
        .collect();
    vec![Tensor::stack(&outs, 0)]
}

/// The sequences `(query rows, key rows)` of packed varlen inputs: `cu_seqlens_q` and
/// `cu_seqlens_k` are `t[cu]`, `t[cu + 1]`.
fn sequences(t: &[Tensor], cu: usize) -> Vec<((i64, i64), (i64, i64))> {
    let cu_q = Vec::<i32>::try_from(&t[cu]).unwrap_or_default();
    let cu_k = Vec::<i32>::try_from(&t[cu + 1]).unwrap_or_default();
    let span = |cu: &[i32], b: usize| (i64::from(cu[b]), i64::from(cu[b + 1] - cu[b]));
    (0..cu_q.len().saturating_sub(1))
        .map(|b| (span(&cu_q, b), span(&cu_k, b)))
        .collect()
}

/// Varlen attention the way a PyTorch user computes it: SDPA (GQA, causal) on each
/// sequence's slice of the packed `[heads, tokens, head_dim]` tensors; a sequence without
/// keys gives 0, as Tessera's kernel.
fn per_sequence_sdpa(t: &[Tensor], p: &Params) -> Vec<Tensor> {
    let (q, k, v) = (&t[0], &t[1], &t[2]);
    let outs: Vec<Tensor> = sequences(t, 3)
        .into_iter()
        .filter(|((_, lq), _)| *lq > 0)
        .map(|((q0, lq), (k0, lk))| {
            let qs = q.narrow(1, q0, lq);
            if lk == 0 {
                return qs.zeros_like();
            }
            Tensor::scaled_dot_product_attention(
                &qs.unsqueeze(0),
                &k.narrow(1, k0, lk).unsqueeze(0),
                &v.narrow(1, k0, lk).unsqueeze(0),
                None::<Tensor>,
                0.0,
                causal(p),
                scale(p),
                true,
            )
            .squeeze_dim(0)
        })
        .collect();
    vec![Tensor::cat(&outs, 1)]
}

/// The varlen backward the way PyTorch runs it: [`sdpa_backward`] (the CPU flash forward
/// and backward) on each sequence, gradients written back into packed tensors.
fn per_sequence_sdpa_backward(t: &[Tensor], p: &Params) -> Vec<Tensor> {
    let (q, k, v, d_o) = (&t[0], &t[1], &t[2], &t[3]);
    let (dq, dk, dv) = (q.zeros_like(), k.zeros_like(), v.zeros_like());
    for ((q0, lq), (k0, lk)) in sequences(t, 4) {
        if lq == 0 || lk == 0 {
            continue;
        }
        let slice = |x: &Tensor, start, len| x.narrow(1, start, len).unsqueeze(0);
        let grads = sdpa_backward(
            &[
                slice(q, q0, lq),
                slice(k, k0, lk),
                slice(v, k0, lk),
                slice(d_o, q0, lq),
            ],
            p,
        );
        for (into, (g, (start, len))) in
            [&dq, &dk, &dv]
                .iter()
                .zip(grads.iter().zip([(q0, lq), (k0, lk), (k0, lk)]))
        {
            into.narrow(1, start, len).copy_(&g.squeeze_dim(0));
        }
    }
    vec![dq, dk, dv]
}

/// Whether attention has a sliding window, a soft-cap or a score mask, which PyTorch's
/// flash SDPA kernels do not take.
fn masked_or_capped(p: &Params) -> bool {
    window(p).is_some() || softcap(p).is_some() || p.word("mask").is_ok_and(|m| m != "none")
}

/// Attention with a sliding window and soft-capping the way a PyTorch user computes it:
/// SDPA with a boolean mask for a window alone, else the scores in plain ops (GQA
/// repeats k/v); an additive score mask `[B or 1, 1, Sq, Sk]` is added to the scores. A
/// query that sees no key gives 0, as in Tessera's kernel.
fn attention_math(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, p: &Params) -> Tensor {
    let (sq, sk, d) = (q.size()[2], k.size()[2], q.size()[3]);
    let groups = q.size()[1] / k.size()[1];
    let (k, v) = (
        k.repeat_interleave_self_int(groups, 1, None),
        v.repeat_interleave_self_int(groups, 1, None),
    );
    let i = Tensor::arange(sq, (Kind::Int64, q.device())).unsqueeze(1);
    let j = Tensor::arange(sk, (Kind::Int64, q.device())).unsqueeze(0);
    let mut visible = Tensor::ones([sq, sk], (Kind::Bool, q.device()));
    if causal(p) {
        visible = visible.logical_and(&j.less_equal_tensor(&i));
    }
    if let Some(w) = window(p) {
        visible = visible.logical_and(&(&j + w as i64).greater_equal_tensor(&i));
    }
    let scale = scale(p).unwrap_or(1.0 / (d as f64).sqrt());
    let (None, None) = (softcap(p), mask) else {
        return scores_math(q, &k, &v, &visible, mask, scale, softcap(p));
    };
    let out = Tensor::scaled_dot_product_attention(
        q,
        &k,
        &v,
        Some(&visible),
        0.0,
        false,
        Some(scale),
        false,
    );
    out.nan_to_num(0.0, None, None)
}

/// Attention as plain ops on the scores: scaled, soft-capped, plus the additive `mask`,
/// hidden where `visible` is false; rows that see no key give 0 (and gradients 0, not
/// the NaN a softmax over `-inf` gives).
fn scores_math(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    visible: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
    cap: Option<f64>,
) -> Tensor {
    let mut scores = q.matmul(&k.transpose(-1, -2)) * scale;
    if let Some(cap) = cap {
        scores = (scores / cap).tanh() * cap;
    }
    if let Some(mask) = mask {
        scores += mask;
    }
    let scores = scores.masked_fill(&visible.logical_not(), f64::NEG_INFINITY);
    let empty = scores.amax([-1].as_slice(), true).eq(f64::NEG_INFINITY);
    let probs = scores.masked_fill(&empty, 0.0).softmax(-1, None::<Kind>);
    probs.masked_fill(&empty, 0.0).matmul(v)
}

/// The backward of [`attention_math`] by PyTorch's autograd: `q, k, v, do[, mask]` ->
/// `dq, dk, dv`.
fn math_backward(t: &[Tensor], p: &Params) -> Vec<Tensor> {
    tch::with_grad(|| {
        let leaves: Vec<Tensor> = t[..3]
            .iter()
            .map(|x| x.detach().set_requires_grad(true))
            .collect();
        let out = attention_math(&leaves[0], &leaves[1], &leaves[2], t.get(4), p);
        let loss = (out * &t[3]).sum(None::<Kind>);
        Tensor::run_backward(&[loss], &leaves, false, false)
    })
}

fn window(p: &Params) -> Option<u64> {
    p.count_opt("window").ok().flatten()
}

fn softcap(p: &Params) -> Option<f64> {
    p.float_opt("softcap").ok().flatten()
}

fn eps(p: &Params) -> f64 {
    p.float_opt("eps").ok().flatten().unwrap_or(1e-5)
}

fn causal(p: &Params) -> bool {
    p.flag("causal").unwrap_or(false)
}

fn scale(p: &Params) -> Option<f64> {
    p.float_opt("scale").unwrap_or(None)
}
