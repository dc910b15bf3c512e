//! The kernels: the forward (online softmax over a query tile's key tiles), the dq
//! kernel (which also writes `delta = rowsum(do * o)`) and the dk/dv kernel (a key
//! tile's query tiles, over every query head of its kv head's group). Scores outside a
//! row's key span are masked, except in tiles the plan says every row sees whole.

use kernel_ir::dsl::prelude::*;
use kernel_macros::{kernel, kernel_fn};

use super::VarlenConfig;
use crate::attention::bwd::{fused_grads, load_vector, store_rows};
use crate::attention::fwd::{mxu_input, online_softmax_step, scale_split, MASK_VALUE};
use crate::common::load_tile;

/// Scores of one (query tile, key tile) pair with each row's keys outside its span
/// masked (unless `masked` is false: a tile every row sees whole): `[rows, size]`,
/// scaled by `scale` (1 for queries scaled beforehand).
#[allow(clippy::too_many_arguments)]
fn masked_scores(
    qb: Tensor,
    kb: Tensor,
    first: Tensor,
    end: Tensor,
    k0: Tensor,
    size: u64,
    scale: f64,
    masked: bool,
) -> Tensor {
    let mut s = dot_general(qb, kb, false, true);
    if scale != 1.0 {
        s *= scale;
    }
    if !masked {
        return s;
    }
    let key = iota([first.shape()[0], size], 1) + k0;
    let visible = key.ge(first.expand_dims(1)) & key.lt(end.expand_dims(1));
    select(visible, s, MASK_VALUE)
}

/// One step of the online softmax over the key tile at `k0` (`size` rows); the queries
/// come with their share of the scale ([`scale_split`]).
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn attend(
    qb: Tensor,
    k: Ref,
    v: Ref,
    first: Tensor,
    end: Tensor,
    k0: Tensor,
    size: u64,
    state: (Tensor, Tensor, Tensor),
    masked: bool,
    c: VarlenConfig,
) -> (Tensor, Tensor, Tensor) {
    let kb = k.load(s![ds(k0, size), ..]);
    let vb = v.load(s![ds(k0, size), ..]);
    let (_, score_factor) = scale_split(c.dtype, c.scale);
    let scores = masked_scores(qb, kb, first, end, k0, size, score_factor, masked);
    online_softmax_step(scores, vb, state, c.dtype)
}

/// `o = softmax(q k^T * scale) v` and its log-sum-exp for one query tile, over the key
/// tiles its rows see.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub(super) fn varlen_fwd(
    q: Ref,
    k: Ref,
    v: Ref,
    q_first: Ref,
    q_end: Ref,
    q_tiles: Ref,
    o: Ref,
    lse: Ref,
    #[comptime] c: VarlenConfig,
) {
    let (bq, bk, d) = (c.block_q, c.block_k, c.head_dim);
    let tile = program_id(1);
    let q0 = tile * bq;
    let mut qb = load_tile(q, bq, d, q0, index(0), c.total_q, d);
    let (query_factor, _) = scale_split(c.dtype, c.scale);
    if query_factor != 1.0 {
        qb *= query_factor;
    }
    let first = load_vector(q_first, bq, q0, c.total_q);
    let end = load_vector(q_end, bq, q0, c.total_q);
    let (lo, from, to, hi) = tile_range(q_tiles, tile);
    let (full_tiles, tail) = (c.total_k / bk, c.total_k % bk);
    let mut m = full([bq], f64::NEG_INFINITY, DType::F32);
    let mut l = zeros([bq], DType::F32);
    let mut acc = zeros([bq, d], DType::F32);
    for j in lo..from {
        (m, l, acc) = attend(qb, k, v, first, end, j * bk, bk, (m, l, acc), true, c);
    }
    for j in from..to {
        (m, l, acc) = attend(qb, k, v, first, end, j * bk, bk, (m, l, acc), false, c);
    }
    for j in to..hi.minimum(full_tiles) {
        (m, l, acc) = attend(qb, k, v, first, end, j * bk, bk, (m, l, acc), true, c);
    }
    if tail > 0 {
        // The ragged last key tile, when the range reaches it (0 or 1 steps).
        for _last in lo.maximum(full_tiles)..hi {
            let k0 = index((full_tiles * bk) as i64);
            (m, l, acc) = attend(qb, k, v, first, end, k0, tail, (m, l, acc), true, c);
        }
    }
    // Rows that see no key have l = 0: output 0 (PyTorch's SDPA), not 0/0.
    let out = select(l.eq(0.0).expand_dims(1), 0.0, acc / l.expand_dims(1)).cast(c.dtype);
    store_rows(o, out, bq, d, q0, c.total_q);
    store_vector(lse, m + l.log(), bq, q0, c.total_q);
}

/// Row `tile` of a `[tiles, 4]` table: `(first, from, to, end)` (see [`VarlenPlan`]).
#[kernel_fn]
fn tile_range(table: Ref, tile: Tensor) -> (Tensor, Tensor, Tensor, Tensor) {
    (
        table.load(s![tile, 0]),
        table.load(s![tile, 1]),
        table.load(s![tile, 2]),
        table.load(s![tile, 3]),
    )
}

/// Stores a `[rows]` vector into a `[rows, 1]` block, skipping rows at or past `limit`.
#[kernel_fn]
fn store_vector(r: Ref, value: Tensor, rows: u64, r0: Tensor, limit: u64) {
    if limit % rows != 0 {
        r.store_masked(s![.., 0], value, (iota([rows], 0) + r0).lt(limit));
    } else {
        r.store(s![.., 0], value);
    }
}

/// `p` and `ds` (the gradient of the scaled scores) of one tile pair; rows that see no
/// key (lse = -inf) get p = 0.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn probs_and_grad(
    qb: Tensor,
    kb: Tensor,
    vb: Tensor,
    dob: Tensor,
    lse_b: Tensor,
    delta_b: Tensor,
    first: Tensor,
    end: Tensor,
    k0: Tensor,
    cols: u64,
    masked: bool,
    c: VarlenConfig,
) -> (Tensor, Tensor) {
    let scores = masked_scores(qb, kb, first, end, k0, cols, c.scale, masked);
    let lse_b = select(lse_b.eq(f64::NEG_INFINITY), 0.0, lse_b);
    let p = (scores - lse_b.expand_dims(1)).exp();
    let dp = dot_general(dob, vb, false, true);
    (p, p * (dp - delta_b.expand_dims(1)))
}

/// dq accumulation over the key tile at `k0`.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn dq_step(
    rows: (Tensor, Tensor, Tensor, Tensor),
    first: Tensor,
    end: Tensor,
    k: Ref,
    v: Ref,
    k0: Tensor,
    size: u64,
    dq: Tensor,
    masked: bool,
    c: VarlenConfig,
) -> Tensor {
    let (qb, dob, lse_b, delta_b) = rows;
    let kb = k.load(s![ds(k0, size), ..]);
    let vb = v.load(s![ds(k0, size), ..]);
    let (_p, ds) = probs_and_grad(
        qb, kb, vb, dob, lse_b, delta_b, first, end, k0, size, masked, c,
    );
    dq + mxu_input(ds, c.dtype).dot(kb)
}

/// `dq = scale * sum_j ds_j k_j` and `delta = rowsum(do * o)` for one query tile.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub(super) fn varlen_bwd_dq(
    q: Ref,
    k: Ref,
    v: Ref,
    o: Ref,
    d_o: Ref,
    lse: Ref,
    q_first: Ref,
    q_end: Ref,
    q_tiles: Ref,
    dq: Ref,
    delta: Ref,
    #[comptime] c: VarlenConfig,
) {
    let (bq, bk, d) = (c.block_q, c.block_k, c.head_dim);
    let tile = program_id(1);
    let q0 = tile * bq;
    let qb = load_tile(q, bq, d, q0, index(0), c.total_q, d);
    let dob = load_tile(d_o, bq, d, q0, index(0), c.total_q, d);
    let ob = load_tile(o, bq, d, q0, index(0), c.total_q, d);
    let delta_b = (ob.cast(DType::F32) * dob.cast(DType::F32)).sum(1);
    let lse_b = load_vector(lse, bq, q0, c.total_q);
    let rows = (qb, dob, lse_b, delta_b);
    let first = load_vector(q_first, bq, q0, c.total_q);
    let end = load_vector(q_end, bq, q0, c.total_q);
    let (lo, from, to, hi) = tile_range(q_tiles, tile);
    let (full_tiles, tail) = (c.total_k / bk, c.total_k % bk);
    let mut acc = zeros([bq, d], DType::F32);
    for j in lo..from {
        acc = dq_step(rows, first, end, k, v, j * bk, bk, acc, true, c);
    }
    for j in from..to {
        acc = dq_step(rows, first, end, k, v, j * bk, bk, acc, false, c);
    }
    for j in to..hi.minimum(full_tiles) {
        acc = dq_step(rows, first, end, k, v, j * bk, bk, acc, true, c);
    }
    if tail > 0 {
        for _last in lo.maximum(full_tiles)..hi {
            let k0 = index((full_tiles * bk) as i64);
            acc = dq_step(rows, first, end, k, v, k0, tail, acc, true, c);
        }
    }
    store_rows(dq, (acc * c.scale).cast(c.dtype), bq, d, q0, c.total_q);
    store_vector(delta, delta_b, bq, q0, c.total_q);
}

/// dk/dv accumulation over the query rows `[q0, q0 + size)` of query head `g` of the
/// group.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn dkdv_step(
    q: Ref,
    d_o: Ref,
    lse: Ref,
    delta: Ref,
    spans: (Ref, Ref),
    g: u64,
    q0: Tensor,
    size: u64,
    kv: (Tensor, Tensor, Tensor),
    state: (Tensor, Tensor),
    c: VarlenConfig,
) -> (Tensor, Tensor) {
    let (dk, dv) = state;
    let (kb, vb, k0) = kv;
    let qb = q.load(s![g, ds(q0, size), ..]);
    let dob = d_o.load(s![g, ds(q0, size), ..]);
    let lse_b = lse.load(s![g, ds(q0, size), 0]);
    let delta_b = delta.load(s![g, ds(q0, size), 0]);
    let first = spans.0.load(s![ds(q0, size), 0]);
    let end = spans.1.load(s![ds(q0, size), 0]);
    let (p, ds) = probs_and_grad(
        qb, kb, vb, dob, lse_b, delta_b, first, end, k0, c.block_k, true, c,
    );
    let dv_new = dv + dot_general(mxu_input(p, c.dtype), dob, true, false);
    let dk_new = dk + dot_general(mxu_input(ds, c.dtype), qb, true, false);
    (dk_new, dv_new)
}

/// `dk = scale * sum_i ds_i^T q_i`, `dv = sum_i p_i^T do_i` for one key tile, over the
/// query tiles that see it in every query head of the kv head's group.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub(super) fn varlen_bwd_dkdv(
    q: Ref,
    k: Ref,
    v: Ref,
    d_o: Ref,
    lse: Ref,
    delta: Ref,
    q_first: Ref,
    q_end: Ref,
    k_tiles: Ref,
    dk: Ref,
    dv: Ref,
    #[comptime] c: VarlenConfig,
) {
    let (bq, bk, d) = (c.block_q, c.block_k, c.head_dim);
    let tile = program_id(1);
    let k0 = tile * bk;
    let kv = (
        load_tile(k, bk, d, k0, index(0), c.total_k, d),
        load_tile(v, bk, d, k0, index(0), c.total_k, d),
        k0,
    );
    let spans = (q_first, q_end);
    let lo = k_tiles.load(s![tile, 0]);
    let hi = k_tiles.load(s![tile, 1]);
    let (full_tiles, tail) = (c.total_q / bq, c.total_q % bq);
    let mut dk_acc = zeros([bk, d], DType::F32);
    let mut dv_acc = zeros([bk, d], DType::F32);
    let group = c.heads / c.kv_heads;
    #[unroll]
    for g in 0..group {
        for i in lo..hi.minimum(full_tiles) {
            (dk_acc, dv_acc) = dkdv_step(
                q,
                d_o,
                lse,
                delta,
                spans,
                g,
                i * bq,
                bq,
                kv,
                (dk_acc, dv_acc),
                c,
            );
        }
        if tail > 0 {
            for _last in lo.maximum(full_tiles)..hi {
                let q0 = index((full_tiles * bq) as i64);
                (dk_acc, dv_acc) = dkdv_step(
                    q,
                    d_o,
                    lse,
                    delta,
                    spans,
                    g,
                    q0,
                    tail,
                    kv,
                    (dk_acc, dv_acc),
                    c,
                );
            }
        }
    }
    store_rows(dk, (dk_acc * c.scale).cast(c.dtype), bk, d, k0, c.total_k);
    store_rows(dv, dv_acc.cast(c.dtype), bk, d, k0, c.total_k);
}

/// One (query tile, key tile) pair of the fused backward, its scores masked by the rows'
/// spans: adds its `ds^T q` and `p^T do` into the dk/dv accumulators at the key tile
/// (`size` keys at `k0`) and returns `dq + ds k`.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn fused_step(
    rows: (Tensor, Tensor, Tensor, Tensor),
    spans: (Tensor, Tensor),
    k: Ref,
    v: Ref,
    acc: (Ref, Ref),
    k0: Tensor,
    size: u64,
    dq: Tensor,
    c: VarlenConfig,
) -> Tensor {
    let (qb, dob, lse_b, delta_b) = rows;
    let kb = k.load(s![ds(k0, size), ..]);
    let vb = v.load(s![ds(k0, size), ..]);
    let pd = probs_and_grad(
        qb, kb, vb, dob, lse_b, delta_b, spans.0, spans.1, k0, size, true, c,
    );
    fused_grads(pd, (qb, dob, kb), acc, k0, size, dq, c.dtype)
}

/// The refs of the fused backward that one query tile reads and writes.
type FusedRefs = (Ref, Ref, Ref, Ref, Ref, Ref, Ref, Ref, Ref, Ref, Ref, Ref);

/// dq of `rows` query rows at tile `tile` of query head `g` of the group, over the key
/// tiles its rows see; adds each pair's share into the dk/dv accumulators. One masked
/// loop over the key tiles (not the forward's three, which skip masks where they can):
/// each copy of the five-dot step costs seconds of JIT time.
#[kernel_fn]
fn fused_query_tile(refs: FusedRefs, g: Tensor, tile: Tensor, rows: u64, c: VarlenConfig) {
    let (q, k, v, o, d_o, lse, q_first, q_end, q_tiles, dq, dk_acc, dv_acc) = refs;
    let bk = c.block_k;
    let q0 = tile * c.block_q;
    let qb = q.load(s![g, ds(q0, rows), ..]);
    let dob = d_o.load(s![g, ds(q0, rows), ..]);
    let ob = o.load(s![g, ds(q0, rows), ..]);
    let delta_b = (ob.cast(DType::F32) * dob.cast(DType::F32)).sum(1);
    let lse_b = lse.load(s![g, ds(q0, rows), 0]);
    let spans = (
        q_first.load(s![ds(q0, rows), 0]),
        q_end.load(s![ds(q0, rows), 0]),
    );
    let tile_rows = (qb, dob, lse_b, delta_b);
    let acc_refs = (dk_acc, dv_acc);
    let (lo, _, _, hi) = tile_range(q_tiles, tile);
    let (full_tiles, tail) = (c.total_k / bk, c.total_k % bk);
    let mut acc = zeros([rows, c.head_dim], DType::F32);
    for j in lo..hi.minimum(full_tiles) {
        acc = fused_step(tile_rows, spans, k, v, acc_refs, j * bk, bk, acc, c);
    }
    if tail > 0 {
        for _last in lo.maximum(full_tiles)..hi {
            let k0 = index((full_tiles * bk) as i64);
            acc = fused_step(tile_rows, spans, k, v, acc_refs, k0, tail, acc, c);
        }
    }
    dq.store(s![g, ds(q0, rows), ..], (acc * c.scale).cast(c.dtype));
}

/// dq, dk and dv in one pass for one kv head: every query tile of every query head of
/// the group meets the key tiles its rows see once, and each pair's `p` and `ds` feed
/// all three gradients (five dots per pair instead of the seven of the dq and dk/dv
/// kernels, which both recompute them; `delta` is computed per query tile). dk/dv
/// accumulate in f32 scratch over the packed keys. Ragged last tiles run at their own
/// static sizes, so every window stays inside its array.
#[kernel]
// The loops carry nothing (they store dq): the macro's loops yield `()`.
#[allow(clippy::too_many_arguments, clippy::unused_unit)]
pub(super) fn varlen_bwd_fused(
    q: Ref,
    k: Ref,
    v: Ref,
    o: Ref,
    d_o: Ref,
    lse: Ref,
    q_first: Ref,
    q_end: Ref,
    q_tiles: Ref,
    dq: Ref,
    dk: Ref,
    dv: Ref,
    dk_acc: Ref,
    dv_acc: Ref,
    #[comptime] c: VarlenConfig,
) {
    dk_acc.write(zeros([c.total_k, c.head_dim], DType::F32));
    dv_acc.write(zeros([c.total_k, c.head_dim], DType::F32));
    let refs = (
        q, k, v, o, d_o, lse, q_first, q_end, q_tiles, dq, dk_acc, dv_acc,
    );
    let (full_tiles, tail) = (c.total_q / c.block_q, c.total_q % c.block_q);
    for g in index(0)..index((c.heads / c.kv_heads) as i64) {
        for i in index(0)..index(full_tiles as i64) {
            fused_query_tile(refs, g, i, c.block_q, c);
        }
        if tail > 0 {
            fused_query_tile(refs, g, index(full_tiles as i64), tail, c);
        }
    }
    dk.write((dk_acc.read() * c.scale).cast(c.dtype));
    dv.write(dv_acc.read().cast(c.dtype));
}
