//! FlashAttention forward: one program per (batch, head, query block); the online
//! softmax state `m, l, acc` is carried through a loop over key blocks.

use kernel_ir::dsl::prelude::*;
use kernel_macros::{kernel, kernel_fn};

use super::AttentionConfig;
use crate::common::load_tile;

/// Scores of masked-out (future) keys. `-inf`, not a large finite value: a row whose
/// visible scores are all `-inf` (infinite inputs) must not spread its weight over
/// masked keys. [`attend`] keeps `exp(s - m)` free of `inf - inf` for rows that have
/// seen no finite score, and such rows come out 0, as in PyTorch's SDPA.
pub(crate) const MASK_VALUE: f64 = f64::NEG_INFINITY;

/// Applies the causal mask (key position <= query position) to a score block whose
/// first query is `q0` and first key `k0`.
#[kernel_fn]
pub(crate) fn causal_mask(s: Tensor, rows: u64, cols: u64, q0: Tensor, k0: Tensor) -> Tensor {
    let query = iota([rows, cols], 0) + q0;
    let key = iota([rows, cols], 1) + k0;
    select(key.le(query), s, MASK_VALUE)
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

/// How many of the `full_blocks` key blocks the queries `[q0, q0 + block_q)` may see:
/// all of them, or under the causal mask those starting at or before the last query.
#[kernel_fn]
pub(crate) fn visible_key_blocks(q0: Tensor, full_blocks: u64, c: AttentionConfig) -> Tensor {
    if c.causal {
        ((q0 + (c.block_q + c.block_k - 1)) / c.block_k).minimum(full_blocks)
    } else {
        index(full_blocks as i64)
    }
}

/// One step of the online softmax over keys `[k0, k0 + size)`; `masked` applies the
/// causal mask (blocks wholly below the diagonal need none). `q` is pre-scaled for f32.
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
    c: AttentionConfig,
) -> (Tensor, Tensor, Tensor) {
    let (m, l, acc) = state;
    let kb = k.load(s![ds(k0, size), ..]);
    let vb = v.load(s![ds(k0, size), ..]);
    let mut scores = dot_general(q, kb, false, true);
    if c.dtype != DType::F32 {
        scores *= c.scale;
    }
    if masked {
        scores = causal_mask(scores, c.block_q, size, q0, k0);
    }
    let m_new = m.maximum(scores.max(1));
    // Rows with no finite score yet subtract 0, so masked keys get exp(-inf) = 0.
    let m_shift = select(m_new.eq(f64::NEG_INFINITY), 0.0, m_new);
    let p = (scores - m_shift.expand_dims(1)).exp();
    let alpha = (m - m_shift).exp();
    let l_new = l * alpha + p.sum(1);
    let acc_new = acc * alpha.expand_dims(1) + mxu_input(p, c.dtype).dot(vb);
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
    #[comptime] c: AttentionConfig,
) {
    let (bq, bk) = (c.block_q, c.block_k);
    let q0 = program_id(2) * bq;
    let mut qb = load_tile(q, bq, c.head_dim, q0, index(0), c.q_len, c.head_dim);
    // f32: scale the queries once instead of every score block (bf16 scales the scores,
    // so the matmul inputs stay exactly the stored values).
    if c.dtype == DType::F32 {
        qb *= c.scale;
    }
    let full_blocks = c.kv_len / bk;
    let tail = c.kv_len % bk;
    // Causal: key blocks wholly after the last query of this block are skipped, and
    // those wholly before its first query need no mask.
    let upper = visible_key_blocks(q0, full_blocks, c);
    let mut m = full([bq], f64::NEG_INFINITY, DType::F32);
    let mut l = zeros([bq], DType::F32);
    let mut acc = zeros([bq, c.head_dim], DType::F32);
    if c.causal {
        let unmasked = ((q0 + 1) / bk).minimum(upper);
        for j in 0..unmasked {
            (m, l, acc) = attend(qb, k, v, j * bk, bk, q0, (m, l, acc), false, c);
        }
        for j in unmasked..upper {
            (m, l, acc) = attend(qb, k, v, j * bk, bk, q0, (m, l, acc), true, c);
        }
    } else {
        for j in 0..upper {
            (m, l, acc) = attend(qb, k, v, j * bk, bk, q0, (m, l, acc), false, c);
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
            c.causal,
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
