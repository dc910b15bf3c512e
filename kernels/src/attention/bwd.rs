//! FlashAttention-2 backward: `delta = rowsum(do * o)`, then one kernel for dq (a loop
//! over key blocks per query block) and one for dk/dv (a loop over the query blocks of
//! every query head that shares the kv head).

use kernel_ir::dsl::prelude::*;
use kernel_macros::{kernel, kernel_fn};

use super::fwd::{
    add_bias, key_blocks, mask_scores, mask_tile, mxu_input, query_block_mask, soft_cap,
};
use super::AttentionConfig;
use crate::common::load_tile;

/// Stores rows `[r0, r0 + rows)` of a block, skipping rows at or past `limit`.
#[kernel_fn]
pub(crate) fn store_rows(r: Ref, value: Tensor, rows: u64, cols: u64, r0: Tensor, limit: u64) {
    if limit % rows != 0 {
        r.store_masked(s![.., ..], value, (iota([rows, cols], 0) + r0).lt(limit));
    } else {
        r.write(value);
    }
}

/// Loads a `[rows, 1]` block as a `[rows]` vector, masking rows at or past `limit`.
#[kernel_fn]
pub(crate) fn load_vector(r: Ref, rows: u64, r0: Tensor, limit: u64) -> Tensor {
    if limit % rows != 0 {
        r.load_masked(s![.., 0], (iota([rows], 0) + r0).lt(limit), 0.0)
    } else {
        r.load(s![.., 0])
    }
}

/// `delta = rowsum(do * o)` for one query block.
#[kernel]
pub(crate) fn flash_attention_bwd_delta(
    o: Ref,
    d_o: Ref,
    delta: Ref,
    #[comptime] c: AttentionConfig,
) {
    let (bq, d) = (c.block_q, c.head_dim);
    let q0 = program_id(2) * bq;
    let ob = load_tile(o, bq, d, q0, index(0), c.q_len, d).cast(DType::F32);
    let dob = load_tile(d_o, bq, d, q0, index(0), c.q_len, d).cast(DType::F32);
    let rows = (ob * dob).sum(1);
    if c.q_len % bq != 0 {
        delta.store_masked(s![.., 0], rows, (iota([bq], 0) + q0).lt(c.q_len));
    } else {
        delta.store(s![.., 0], rows);
    }
}

/// `p` and `ds` (the gradient of the scaled scores) of one (query block, key block)
/// tile; `bias` is the tile of the score mask, if any.
#[allow(clippy::too_many_arguments)]
fn probs_and_grad(
    qb: Tensor,
    kb: Tensor,
    vb: Tensor,
    dob: Tensor,
    lse_b: Tensor,
    delta_b: Tensor,
    q0: Tensor,
    k0: Tensor,
    rows: u64,
    cols: u64,
    bias: Option<Tensor>,
    c: AttentionConfig,
) -> (Tensor, Tensor) {
    let (scores, tanh) = soft_cap(dot_general(qb, kb, false, true) * c.scale, c);
    let scores = mask_scores(add_bias(scores, bias), rows, cols, q0, k0, c);
    // A query that a window or the mask leaves without keys has lse = -inf: its p must
    // be 0.
    let lse_b = if c.window.is_some() || c.mask.is_some() {
        select(lse_b.eq(f64::NEG_INFINITY), 0.0, lse_b)
    } else {
        lse_b
    };
    let p = (scores - lse_b.expand_dims(1)).exp();
    let dp = dot_general(dob, vb, false, true);
    let ds = p * (dp - delta_b.expand_dims(1));
    match tanh {
        Some(t) => (p, ds * (1.0 - t * t)),
        None => (p, ds),
    }
}

/// dq accumulation over keys `[k0, k0 + size)`.
#[kernel_fn]
fn dq_step(
    qb: Tensor,
    dob: Tensor,
    lse_b: Tensor,
    delta_b: Tensor,
    k: Ref,
    v: Ref,
    q0: Tensor,
    k0: Tensor,
    size: u64,
    dq: Tensor,
    mask: Option<Ref>,
    c: AttentionConfig,
) -> Tensor {
    let kb = k.load(s![ds(k0, size), ..]);
    let vb = v.load(s![ds(k0, size), ..]);
    let bias = query_block_mask(mask, q0, k0, size, c);
    let (_p, ds) = probs_and_grad(
        qb, kb, vb, dob, lse_b, delta_b, q0, k0, c.block_q, size, bias, c,
    );
    dq + mxu_input(ds, c.dtype).dot(kb)
}

/// `dq = scale * sum_j ds_j k_j` for one query block.
#[kernel]
pub(crate) fn flash_attention_bwd_dq(
    q: Ref,
    k: Ref,
    v: Ref,
    d_o: Ref,
    lse: Ref,
    delta: Ref,
    dq: Ref,
    #[comptime] mask: Option<Ref>,
    #[comptime] c: AttentionConfig,
) {
    let (bq, bk, d) = (c.block_q, c.block_k, c.head_dim);
    let q0 = program_id(2) * bq;
    let qb = load_tile(q, bq, d, q0, index(0), c.q_len, d);
    let dob = load_tile(d_o, bq, d, q0, index(0), c.q_len, d);
    let lse_b = load_vector(lse, bq, q0, c.q_len);
    let delta_b = load_vector(delta, bq, q0, c.q_len);
    let full_blocks = c.kv_len / bk;
    let tail = c.kv_len % bk;
    let blocks = key_blocks(q0, full_blocks, c);
    let mut acc = zeros([bq, d], DType::F32);
    for j in blocks.first..blocks.upper {
        acc = dq_step(qb, dob, lse_b, delta_b, k, v, q0, j * bk, bk, acc, mask, c);
    }
    if tail > 0 {
        acc = dq_step(
            qb,
            dob,
            lse_b,
            delta_b,
            k,
            v,
            q0,
            index((full_blocks * bk) as i64),
            tail,
            acc,
            mask,
            c,
        );
    }
    store_rows(dq, (acc * c.scale).cast(c.dtype), bq, d, q0, c.q_len);
}

/// How many of the `full_blocks` query blocks may see the key block at `k0`: all of
/// them, or in a window of left size `w` those starting at or before `k0 + block_k - 1 + w`.
fn query_blocks_upper(k0: Tensor, full_blocks: u64, c: AttentionConfig) -> Tensor {
    match c.window {
        Some(w) => ((k0 + (c.block_k - 1 + w)) / c.block_q + 1).minimum(full_blocks),
        None => index(full_blocks as i64),
    }
}

/// The mask of queries `[q0, q0 + size)` against a key block: rows of the block's
/// `[q_len, block_k]` mask; keys past `kv_len` read 0 (dk/dv kernel).
fn key_block_mask(
    mask: Option<Ref>,
    q0: Tensor,
    size: u64,
    k0: Tensor,
    c: AttentionConfig,
) -> Option<Tensor> {
    let cols = c.block_k;
    let valid = (!c.kv_len.is_multiple_of(cols)).then(|| (iota([size, cols], 1) + k0).lt(c.kv_len));
    mask_tile(mask, q0, index(0), size, cols, valid)
}

/// dk/dv accumulation over queries `[q0, q0 + size)` of query head `g` of the group.
#[kernel_fn]
fn dkdv_step(
    q: Ref,
    d_o: Ref,
    lse: Ref,
    delta: Ref,
    g: u64,
    q0: Tensor,
    size: u64,
    kb: Tensor,
    vb: Tensor,
    k0: Tensor,
    state: (Tensor, Tensor),
    mask: Option<Ref>,
    c: AttentionConfig,
) -> (Tensor, Tensor) {
    let (dk, dv) = state;
    let qb = q.load(s![g, ds(q0, size), ..]);
    let dob = d_o.load(s![g, ds(q0, size), ..]);
    let lse_b = lse.load(s![g, ds(q0, size), 0]);
    let delta_b = delta.load(s![g, ds(q0, size), 0]);
    let bias = key_block_mask(mask, q0, size, k0, c);
    let (p, ds) = probs_and_grad(
        qb, kb, vb, dob, lse_b, delta_b, q0, k0, size, c.block_k, bias, c,
    );
    let dv_new = dv + dot_general(mxu_input(p, c.dtype), dob, true, false);
    let dk_new = dk + dot_general(mxu_input(ds, c.dtype), qb, true, false);
    (dk_new, dv_new)
}

/// `dk = scale * sum_i ds_i^T q_i`, `dv = sum_i p_i^T do_i` for one key block, summed
/// over the query heads that share this kv head.
#[kernel]
pub(crate) fn flash_attention_bwd_dkdv(
    q: Ref,
    k: Ref,
    v: Ref,
    d_o: Ref,
    lse: Ref,
    delta: Ref,
    dk: Ref,
    dv: Ref,
    #[comptime] mask: Option<Ref>,
    #[comptime] c: AttentionConfig,
) {
    let (bq, bk, d) = (c.block_q, c.block_k, c.head_dim);
    let k0 = program_id(2) * bk;
    let kb = load_tile(k, bk, d, k0, index(0), c.kv_len, d);
    let vb = load_tile(v, bk, d, k0, index(0), c.kv_len, d);
    let full_blocks = c.q_len / bq;
    let tail = c.q_len % bq;
    // Query blocks wholly before this key block (causal) or wholly after its window see
    // none of it.
    let lower = if c.causal { k0 / bq } else { index(0) };
    let upper = query_blocks_upper(k0, full_blocks, c);
    let mut dk_acc = zeros([bk, d], DType::F32);
    let mut dv_acc = zeros([bk, d], DType::F32);
    let group = c.heads / c.kv_heads;
    #[unroll]
    for g in 0..group {
        for i in lower..upper {
            (dk_acc, dv_acc) = dkdv_step(
                q,
                d_o,
                lse,
                delta,
                g,
                i * bq,
                bq,
                kb,
                vb,
                k0,
                (dk_acc, dv_acc),
                mask,
                c,
            );
        }
        if tail > 0 {
            let q0 = index((full_blocks * bq) as i64);
            (dk_acc, dv_acc) = dkdv_step(
                q,
                d_o,
                lse,
                delta,
                g,
                q0,
                tail,
                kb,
                vb,
                k0,
                (dk_acc, dv_acc),
                mask,
                c,
            );
        }
    }
    store_rows(dk, (dk_acc * c.scale).cast(c.dtype), bk, d, k0, c.kv_len);
    store_rows(dv, dv_acc.cast(c.dtype), bk, d, k0, c.kv_len);
}

/// One (query block, key block) tile of the fused backward: adds its `ds^T q` and
/// `p^T do` into the dk/dv accumulators at the key block and returns `dq + ds k`.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn fused_step(
    qb: Tensor,
    dob: Tensor,
    lse_b: Tensor,
    delta_b: Tensor,
    k: Ref,
    v: Ref,
    dk_acc: Ref,
    dv_acc: Ref,
    q0: Tensor,
    k0: Tensor,
    dq: Tensor,
    mask: Option<Ref>,
    c: AttentionConfig,
) -> Tensor {
    let bk = c.block_k;
    let kb = k.load(s![ds(k0, bk), ..]);
    let vb = v.load(s![ds(k0, bk), ..]);
    let bias = mask_tile(mask, q0, k0, c.block_q, bk, None);
    let (p, grad) = probs_and_grad(
        qb, kb, vb, dob, lse_b, delta_b, q0, k0, c.block_q, bk, bias, c,
    );
    fused_grads(
        (p, grad),
        (qb, dob, kb),
        (dk_acc, dv_acc),
        k0,
        bk,
        dq,
        c.dtype,
    )
}

/// What a fused backward does with one tile's `p` and `ds` (`pd`): adds `ds^T q` and
/// `p^T do` into rows `[k0, k0 + size)` of the dk/dv accumulators and returns
/// `dq + ds k`; `dtype` is the inputs' (the dots' operands are rounded to it).
#[kernel_fn]
pub(crate) fn fused_grads(
    pd: (Tensor, Tensor),
    tiles: (Tensor, Tensor, Tensor),
    acc: (Ref, Ref),
    k0: Tensor,
    size: u64,
    dq: Tensor,
    dtype: DType,
) -> Tensor {
    let ((p, grad), (qb, dob, kb), (dk_acc, dv_acc)) = (pd, tiles, acc);
    let ds_in = mxu_input(grad, dtype);
    let dk_tile = dk_acc.load(s![ds(k0, size), ..]) + dot_general(ds_in, qb, true, false);
    dk_acc.store(s![ds(k0, size), ..], dk_tile);
    let dv_tile =
        dv_acc.load(s![ds(k0, size), ..]) + dot_general(mxu_input(p, dtype), dob, true, false);
    dv_acc.store(s![ds(k0, size), ..], dv_tile);
    dq + ds_in.dot(kb)
}

/// dq, dk and dv in one pass for one (batch, kv head): every query block of every query
/// head of the group meets the key blocks it sees once, and each tile's `p` and `ds`
/// feed all three gradients (five dots per tile instead of the seven of the dq and dk/dv
/// kernels, which both recompute them). dk/dv accumulate in f32 scratch over the whole
/// key sequence. Used when the blocks tile both sequences ([`AttentionConfig::fuses_backward`]).
#[kernel]
// The loops carry nothing (they store dq): the macro's loops yield `()`, the outer one
// as a statement of its own.
#[allow(
    clippy::too_many_arguments,
    clippy::unused_unit,
    clippy::unnecessary_operation
)]
pub(crate) fn flash_attention_bwd_fused(
    q: Ref,
    k: Ref,
    v: Ref,
    d_o: Ref,
    lse: Ref,
    delta: Ref,
    dq: Ref,
    dk: Ref,
    dv: Ref,
    dk_acc: Ref,
    dv_acc: Ref,
    #[comptime] mask: Option<Ref>,
    #[comptime] c: AttentionConfig,
) {
    let (bq, d) = (c.block_q, c.head_dim);
    dk_acc.write(zeros([c.kv_len, d], DType::F32));
    dv_acc.write(zeros([c.kv_len, d], DType::F32));
    let full_blocks = c.kv_len / c.block_k;
    let q_blocks = index((c.q_len / bq) as i64);
    // A dynamic loop over the group's query heads: unrolled, the JIT time grew with the
    // group (1.5 s at 4 heads).
    for g in index(0)..index((c.heads / c.kv_heads) as i64) {
        for i in index(0)..q_blocks {
            let q0 = i * bq;
            let qb = q.load(s![g, ds(q0, bq), ..]);
            let dob = d_o.load(s![g, ds(q0, bq), ..]);
            let lse_b = lse.load(s![g, ds(q0, bq), 0]);
            let delta_b = delta.load(s![g, ds(q0, bq), 0]);
            let blocks = key_blocks(q0, full_blocks, c);
            let mut dq_acc = zeros([bq, d], DType::F32);
            for j in blocks.first..blocks.upper {
                dq_acc = fused_step(
                    qb,
                    dob,
                    lse_b,
                    delta_b,
                    k,
                    v,
                    dk_acc,
                    dv_acc,
                    q0,
                    j * c.block_k,
                    dq_acc,
                    mask,
                    c,
                );
            }
            dq.store(s![g, ds(q0, bq), ..], (dq_acc * c.scale).cast(c.dtype));
        }
    }
    dk.write((dk_acc.read() * c.scale).cast(c.dtype));
    dv.write(dv_acc.read().cast(c.dtype));
}
