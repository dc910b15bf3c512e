//! FlashAttention forward: one program per (batch, head, query block); the online
//! softmax state `m, l, acc` is carried through a loop over key blocks.

use kernel_ir::dsl::prelude::*;
use kernel_macros::{kernel, kernel_fn};

use super::{masked, windowed, AttentionConfig};
use crate::common::load_tile;

/// Scores of masked-out (future) keys. `-inf`, not a large finite value: a row whose
/// visible scores are all `-inf` (infinite inputs) must not spread its weight over
/// masked keys. [`attend`] keeps `exp(s - m)` free of `inf - inf` for rows that have
/// seen no finite score, and such rows come out 0, as in PyTorch's SDPA.
pub(crate) const MASK_VALUE: f64 = f64::NEG_INFINITY;

/// Masks the scores of a block (first query `q0`, first key `k0`) that its queries may
/// not see: keys after the query (causal) and keys more than `window` before it.
pub(crate) fn mask_scores(
    s: Tensor,
    rows: u64,
    cols: u64,
    q0: Tensor,
    k0: Tensor,
    c: AttentionConfig,
) -> Tensor {
    let query = iota([rows, cols], 0) + q0;
    let key = iota([rows, cols], 1) + k0;
    let visible = match (c.causal, c.window) {
        (false, None) => return s,
        (true, None) => key.le(query),
        (false, Some(w)) => (key + w).ge(query),
        (true, Some(w)) => key.le(query) & (key + w).ge(query),
    };
    select(visible, s, MASK_VALUE)
}

/// A `[rows, cols]` tile of the score mask's block (`None` without a mask) whose first
/// row and column in the block are `r0`, `c0`; lanes where `valid` is false (past the
/// mask's edge) read 0.
pub(crate) fn mask_tile(
    mask: Option<Ref>,
    r0: Tensor,
    c0: Tensor,
    rows: u64,
    cols: u64,
    valid: Option<Tensor>,
) -> Option<Tensor> {
    let slices = s![ds(r0, rows), ds(c0, cols)];
    Some(match valid {
        Some(lanes) => mask?.load_masked(slices, lanes, 0.0),
        None => mask?.load(slices),
    })
}

/// The mask of a query block's scores against keys `[k0, k0 + size)`: columns of the
/// block's `[block_q, kv_len]` mask; rows past `q_len` read 0 (forward and dq kernels).
pub(crate) fn query_block_mask(
    mask: Option<Ref>,
    q0: Tensor,
    k0: Tensor,
    size: u64,
    c: AttentionConfig,
) -> Option<Tensor> {
    let rows = c.block_q;
    let valid = (!c.q_len.is_multiple_of(rows)).then(|| (iota([rows, size], 0) + q0).lt(c.q_len));
    mask_tile(mask, index(0), k0, rows, size, valid)
}

/// `s + bias`, or `s` without a mask.
pub(crate) fn add_bias(s: Tensor, bias: Option<Tensor>) -> Tensor {
    match bias {
        Some(b) => s + b,
        None => s,
    }
}

/// Soft-capped scores `softcap * tanh(s / softcap)` and `tanh(s / softcap)` (the
/// backward's derivative needs it), or `s` unchanged without a cap.
pub(crate) fn soft_cap(s: Tensor, c: AttentionConfig) -> (Tensor, Option<Tensor>) {
    match c.softcap {
        Some(cap) => {
            let t = (s * (1.0 / cap)).tanh();
            (t * cap, Some(t))
        }
        None => (s, None),
    }
}

/// `x` in the dtype the matmul units take: unchanged for f32, else rounded to `dtype`.
#[kernel_fn]
pub(crate) fn mxu_input(x: Tensor, dtype: DType) -> Tensor {
    if dtype == DType::F32 {
        x
    } else {
        x.cast(dtype)
    }
}

/// The full key blocks `[first, upper)` that queries `[q0, q0 + block_q)` may see, and
/// the blocks `[from, to)` among them that need no mask (`first <= from <= to <= upper`).
pub(crate) struct KeyBlocks {
    pub first: Tensor,
    pub from: Tensor,
    pub to: Tensor,
    pub upper: Tensor,
}

/// Which of the `full_blocks` key blocks queries `[q0, q0 + block_q)` see: under the
/// causal mask those starting at or before the last query (and wholly unmasked those
/// ending at or before the first), in a window of left size `w` those ending at or after
/// `q0 - w` (wholly unmasked those starting at or after `q0 + block_q - 1 - w`).
pub(crate) fn key_blocks(q0: Tensor, full_blocks: u64, c: AttentionConfig) -> KeyBlocks {
    let (bq, bk) = (c.block_q, c.block_k);
    let upper = if c.causal {
        ((q0 + (bq + bk - 1)) / bk).minimum(full_blocks)
    } else {
        index(full_blocks as i64)
    };
    let (first, from) = match c.window {
        Some(w) => (
            ((q0 - w).maximum(0) / bk).minimum(upper),
            (((q0 + (bq - 1) - w).maximum(0) + (bk - 1)) / bk).minimum(upper),
        ),
        None => (index(0), index(0)),
    };
    let to = if c.causal {
        ((q0 + 1) / bk).minimum(upper).maximum(from)
    } else {
        upper
    };
    KeyBlocks {
        first,
        from,
        to,
        upper,
    }
}

/// One step of the online softmax over keys `[k0, k0 + size)`; `masked` applies the
/// causal and window masks (blocks every query sees whole need none). `q` comes with
/// its share of the scale ([`scale_split`]); the score mask, if any, applies to every
/// block.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn attend(
    q: Tensor,
    k: Ref,
    v: Ref,
    k0: Tensor,
    size: u64,
    q0: Tensor,
    state: (Tensor, Tensor, Tensor),
    masked: bool,
    mask: Option<Ref>,
    c: AttentionConfig,
) -> (Tensor, Tensor, Tensor) {
    let (m, l, acc) = state;
    let kb = k.load(s![ds(k0, size), ..]);
    let vb = v.load(s![ds(k0, size), ..]);
    let mut scores = dot_general(q, kb, false, true);
    let (_, score_factor) = scale_split(c.dtype, c.scale);
    if score_factor != 1.0 {
        scores *= score_factor;
    }
    scores = add_bias(
        soft_cap(scores, c).0,
        query_block_mask(mask, q0, k0, size, c),
    );
    if masked {
        scores = mask_scores(scores, c.block_q, size, q0, k0, c);
    }
    online_softmax_step(scores, vb, (m, l, acc), c.dtype)
}

/// Where the forward kernels apply `scale` in `softmax(q k^T * scale)`, as (factor of the
/// query block, factor of every score block): f32 scales the queries once; bf16/f16
/// scale the scores, so the matmul inputs stay exactly the stored values.
pub(crate) fn scale_split(dtype: DType, scale: f64) -> (f64, f64) {
    match dtype {
        DType::F32 => (scale, 1.0),
        _ => (1.0, scale),
    }
}

/// Folds a block of scaled, masked `scores` and its values `vb` into the online softmax
/// state (running max `m`, sum `l`, weighted values `acc`); `dtype` is the inputs'.
#[kernel_fn]
pub(crate) fn online_softmax_step(
    scores: Tensor,
    vb: Tensor,
    state: (Tensor, Tensor, Tensor),
    dtype: DType,
) -> (Tensor, Tensor, Tensor) {
    let (m, l, acc) = state;
    let m_new = m.maximum(scores.max(1));
    // Rows with no finite score yet subtract 0, so masked keys get exp(-inf) = 0.
    let m_shift = select(m_new.eq(f64::NEG_INFINITY), 0.0, m_new);
    let p = (scores - m_shift.expand_dims(1)).exp();
    let alpha = (m - m_shift).exp();
    let l_new = l * alpha + p.sum(1);
    let acc_new = acc * alpha.expand_dims(1) + mxu_input(p, dtype).dot(vb);
    (m_new, l_new, acc_new)
}

/// `o = softmax(q k^T * scale) v` and `lse = logsumexp(q k^T * scale)` for one query block.
#[kernel]
pub(crate) fn flash_attention_fwd(
    q: Ref,
    k: Ref,
    v: Ref,
    o: Ref,
    lse: Ref,
    #[comptime] mask: Option<Ref>,
    #[comptime] c: AttentionConfig,
) {
    let (bq, bk) = (c.block_q, c.block_k);
    let q0 = program_id(2) * bq;
    let mut qb = load_tile(q, bq, c.head_dim, q0, index(0), c.q_len, c.head_dim);
    let (query_factor, _) = scale_split(c.dtype, c.scale);
    if query_factor != 1.0 {
        qb *= query_factor;
    }
    let full_blocks = c.kv_len / bk;
    let tail = c.kv_len % bk;
    // Key blocks that no query of this block sees are skipped; those every query sees
    // whole need no mask.
    let blocks = key_blocks(q0, full_blocks, c);
    let mut m = full([bq], f64::NEG_INFINITY, DType::F32);
    let mut l = zeros([bq], DType::F32);
    let mut acc = zeros([bq, c.head_dim], DType::F32);
    if windowed(c) {
        for j in blocks.first..blocks.from {
            (m, l, acc) = attend(qb, k, v, j * bk, bk, q0, (m, l, acc), true, mask, c);
        }
    }
    for j in blocks.from..blocks.to {
        (m, l, acc) = attend(qb, k, v, j * bk, bk, q0, (m, l, acc), false, mask, c);
    }
    if c.causal {
        for j in blocks.to..blocks.upper {
            (m, l, acc) = attend(qb, k, v, j * bk, bk, q0, (m, l, acc), true, mask, c);
        }
    }
    if tail > 0 {
        (m, l, acc) = attend(
            qb,
            k,
            v,
            index((full_blocks * bk) as i64),
            tail,
            q0,
            (m, l, acc),
            masked(c),
            mask,
            c,
        );
    }
    // Rows without a finite score have l = 0: output 0 (PyTorch's SDPA), not 0/0.
    let out = select(l.eq(0.0).expand_dims(1), 0.0, acc / l.expand_dims(1)).cast(c.dtype);
    let log_sum_exp = m + l.log();
    if c.q_len % bq != 0 {
        let valid_rows = (iota([bq, c.head_dim], 0) + q0).lt(c.q_len);
        o.store_masked(s![.., ..], out, valid_rows);
        lse.store_masked(s![.., 0], log_sum_exp, (iota([bq], 0) + q0).lt(c.q_len));
    } else {
        o.write(out);
        lse.store(s![.., 0], log_sum_exp);
    }
}
