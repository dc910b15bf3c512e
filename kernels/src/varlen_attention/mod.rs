//! Variable-length ("varlen") attention for prefill over packed sequences, forward and
//! backward: the sequences of a batch are concatenated along the token axis with no
//! padding, and `cu_seqlens_q`/`cu_seqlens_k` (`[batch + 1]` int32 offsets, as in
//! FlashAttention's `flash_attn_varlen_func`) say where each one starts. Causal (top-left
//! within each sequence, as PyTorch's SDPA), GQA/MQA, f32 or bf16 (f32 accumulation).
//!
//! Layout: q/o `[heads, total_q, head_dim]`, k/v `[kv_heads, total_k, head_dim]`:
//! head-major, so one head's packed tokens are dense rows (the CPU dot reads them in
//! place) and on a TPU the last two block dims are whole `(tokens, head_dim)` tiles.
//!
//! The grid tiles the *packed* token axis, not each sequence: one program per (head,
//! query tile), whose rows may belong to several sequences. Before running, the host
//! turns the offsets into a plan ([`VarlenPlan`]): for each query row the span of packed
//! keys it may see, `[first, end)` (its sequence's keys, cut at the diagonal when
//! causal), and for each query tile the key tiles any of its rows sees (for each key
//! tile the query tiles that see it, for the backward). A program loops over its key
//! tiles only and masks each score by its row's span, so no work goes to tiles of other
//! sequences, and no memory to padding: the cost is a few masked scores where a tile
//! straddles a sequence boundary. The tile tables sit in SMEM (scalars read by the body).

mod kernels;
mod ops;
mod plan;

use kernel_ir::dsl::prelude::*;
use kernel_ir::{try_vec, Array, ArrayData, DimSemantics, MemorySpace};
use rand::{Rng, SeedableRng};

use crate::common::{block, built, pid, random_array, tolerance_for, zero, zeros_f64};
use crate::{BoxError, Chain, Exec, Kind, Op, ParamDef, Params, Source, Step, Tolerance, Tunable};
use kernels::{varlen_bwd_dkdv, varlen_bwd_dq, varlen_bwd_fused, varlen_fwd};
pub(crate) use ops::{VARLEN_ATTENTION, VARLEN_ATTENTION_BWD, VARLEN_ATTENTION_FWD};
pub use plan::{check_cu_seqlens, VarlenPlan};

/// Shapes and options of a varlen attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VarlenConfig {
    /// Sequences (`cu_seqlens_*` hold `batch + 1` offsets).
    pub batch: u64,
    /// Query heads.
    pub heads: u64,
    /// Key/value heads (divides `heads`).
    pub kv_heads: u64,
    /// Packed query tokens of all sequences.
    pub total_q: u64,
    /// Packed key/value tokens of all sequences.
    pub total_k: u64,
    /// Head dim.
    pub head_dim: u64,
    /// Query rows per tile (clamped to `total_q`).
    pub block_q: u64,
    /// Key rows per tile (clamped to `total_k`).
    pub block_k: u64,
    /// Query `i` of a sequence sees its keys `j <= i` only.
    pub causal: bool,
    /// Score scale (default `1 / sqrt(head_dim)`).
    pub scale: f64,
    /// Input and output dtype (f32 or bf16).
    pub dtype: DType,
}

const PARAMS: &[ParamDef] = &[
    ParamDef {
        name: "batch",
        kind: Kind::Dim,
        default: "4",
        help: "sequences packed together",
    },
    ParamDef {
        name: "heads",
        kind: Kind::Dim,
        default: "8",
        help: "query heads",
    },
    ParamDef {
        name: "kv_heads",
        kind: Kind::Dim,
        default: "2",
        help: "key/value heads (GQA when fewer)",
    },
    ParamDef {
        name: "total_q",
        kind: Kind::Dim,
        default: "1000",
        help: "packed query tokens (the inputs split them randomly into `batch` sequences)",
    },
    ParamDef {
        name: "total_k",
        kind: Kind::CountOpt,
        default: "none",
        help: "packed key tokens (none: total_q, with the queries' sequence lengths)",
    },
    ParamDef {
        name: "head_dim",
        kind: Kind::Dim,
        default: "64",
        help: "head dim (1..=256)",
    },
    ParamDef {
        name: "block_q",
        kind: Kind::Dim,
        // Packed sequences are often short: at 4 sequences of ~250 tokens, 64-row tiles
        // waste fewer masked scores where tiles straddle them (forward 10.5 -> 9.2 ms,
        // backward 28.9 -> 23.8 ms natively against 128).
        default: "64",
        help: "query rows per tile",
    },
    ParamDef {
        name: "block_k",
        kind: Kind::Dim,
        default: "64",
        help: "key rows per tile",
    },
    ParamDef {
        name: "causal",
        kind: Kind::Flag,
        default: "false",
        help: "top-left causal mask within each sequence",
    },
    ParamDef {
        name: "scale",
        kind: Kind::FloatOpt,
        default: "none",
        help: "score scale (none: 1/sqrt(head_dim))",
    },
    ParamDef {
        name: "dtype",
        kind: Kind::DType,
        default: "f32",
        help: "f32 or bf16 (f32 accumulation)",
    },
];

/// Tiles the tuner tries (forward and backward).
const TUNABLE: &[Tunable] = &[
    Tunable {
        name: "block_q",
        values: &[32, 64, 128, 256],
        tiles: &["total_q"],
    },
    Tunable {
        name: "block_k",
        values: &[32, 64, 128, 256],
        tiles: &["total_k", "total_q"],
    },
];

impl VarlenConfig {
    /// Reads and validates the parameters.
    pub fn from_params(p: &Params) -> Result<Self, BoxError> {
        let (heads, kv_heads) = p.heads()?;
        let head_dim = p.dim("head_dim")?;
        if head_dim > 256 {
            return Err(format!("`head_dim` must be in 1..=256, got {head_dim}").into());
        }
        let total_q = p.dim("total_q")?;
        let total_k = p.count_opt("total_k")?.unwrap_or(total_q);
        if total_k == 0 {
            return Err("`total_k` must be a positive integer, got 0".into());
        }
        let limit = i32::MAX as u64;
        if total_q > limit || total_k > limit {
            return Err(format!("token counts must fit int32 offsets (at most {limit})").into());
        }
        Ok(VarlenConfig {
            batch: p.dim("batch")?,
            heads,
            kv_heads,
            total_q,
            total_k,
            head_dim,
            block_q: block(total_q, p.dim("block_q")?),
            block_k: block(total_k, p.dim("block_k")?),
            causal: p.flag("causal")?,
            scale: p
                .float_opt("scale")?
                .unwrap_or(1.0 / (head_dim as f64).sqrt()),
            dtype: p.dtype("dtype", &[DType::F32, DType::BF16])?,
        })
    }

    fn group(&self) -> u64 {
        self.heads / self.kv_heads
    }

    fn q_tiles(&self) -> u64 {
        self.total_q.div_ceil(self.block_q)
    }

    fn k_tiles(&self) -> u64 {
        self.total_k.div_ceil(self.block_k)
    }

    fn q_type(&self) -> TensorType {
        TensorType::new(self.dtype, [self.heads, self.total_q, self.head_dim])
    }

    fn kv_type(&self) -> TensorType {
        TensorType::new(self.dtype, [self.kv_heads, self.total_k, self.head_dim])
    }

    /// lse and delta: `[heads, total_q, 1]` (a trailing 1, like flash_attention's, keeps
    /// the TPU rule on the last two block dims).
    fn rows_type(&self) -> TensorType {
        TensorType::new(DType::F32, [self.heads, self.total_q, 1])
    }

    /// The per-row key spans of the plan: `[total_q, 1]` int32.
    fn span_type(&self) -> TensorType {
        TensorType::new(DType::I32, [self.total_q, 1])
    }

    /// A tile table of the plan: `[tiles, cols]` int32.
    fn table_type(tiles: u64, cols: u64) -> TensorType {
        TensorType::new(DType::I32, [tiles, cols])
    }

    /// A query tile of q, o, do, dq: `[None, block_q, head_dim]` at (head, tile).
    fn q_tile(&self) -> BlockSpecFn {
        block_spec([None, Some(self.block_q), Some(self.head_dim)], |i| {
            vec![pid(i, 0), pid(i, 1), zero()]
        })
    }

    /// One value per query row of a query tile (lse, delta): `[None, block_q, 1]`.
    fn rows_tile(&self) -> BlockSpecFn {
        block_spec([None, Some(self.block_q), Some(1)], |i| {
            vec![pid(i, 0), pid(i, 1), zero()]
        })
    }

    /// The key spans of a query tile: `[block_q, 1]` at the tile.
    fn span_tile(&self) -> BlockSpecFn {
        block_spec([Some(self.block_q), Some(1)], |i| vec![pid(i, 1), zero()])
    }

    /// All packed keys of the kv head query head `i[0]` reads.
    fn kv_whole(&self) -> BlockSpecFn {
        let group = self.group() as i64;
        block_spec([None, Some(self.total_k), Some(self.head_dim)], move |i| {
            vec![pid(i, 0) / group, zero(), zero()]
        })
    }

    /// A whole tile table, in SMEM.
    fn table_whole(tiles: u64, cols: u64) -> BlockSpecFn {
        block_spec([Some(tiles), Some(cols)], |_| vec![zero(), zero()])
            .memory_space(MemorySpace::Smem)
    }

    /// The forward kernel: `(q, k, v, q_first, q_end, q_tiles) -> (o, lse)`.
    pub fn forward(self) -> Result<Kernel, BoxError> {
        let c = self;
        Ok(pallas_call(move |q, k, v, first, end, tiles, o, lse| {
            varlen_fwd(q, k, v, first, end, tiles, o, lse, c)
        })
        .grid([c.heads, c.q_tiles()])
        .dimension_semantics([DimSemantics::Parallel; 2])
        .input(c.q_type(), c.q_tile())
        .input(c.kv_type(), c.kv_whole())
        .input(c.kv_type(), c.kv_whole())
        .input(c.span_type(), c.span_tile())
        .input(c.span_type(), c.span_tile())
        .input(
            Self::table_type(c.q_tiles(), 4),
            Self::table_whole(c.q_tiles(), 4),
        )
        .output(c.q_type(), c.q_tile())
        .output(c.rows_type(), c.rows_tile())
        .build()?)
    }

    /// `(q, k, v, o, do, lse, q_first, q_end, q_tiles) -> (dq, delta)`, with
    /// `delta = rowsum(do * o)` for the dk/dv kernel.
    pub fn backward_dq(self) -> Result<Kernel, BoxError> {
        let c = self;
        Ok(
            pallas_call(move |q, k, v, o, d_o, lse, first, end, tiles, dq, delta| {
                varlen_bwd_dq(q, k, v, o, d_o, lse, first, end, tiles, dq, delta, c)
            })
            .grid([c.heads, c.q_tiles()])
            .dimension_semantics([DimSemantics::Parallel; 2])
            .input(c.q_type(), c.q_tile())
            .input(c.kv_type(), c.kv_whole())
            .input(c.kv_type(), c.kv_whole())
            .input(c.q_type(), c.q_tile())
            .input(c.q_type(), c.q_tile())
            .input(c.rows_type(), c.rows_tile())
            .input(c.span_type(), c.span_tile())
            .input(c.span_type(), c.span_tile())
            .input(
                Self::table_type(c.q_tiles(), 4),
                Self::table_whole(c.q_tiles(), 4),
            )
            .output(c.q_type(), c.q_tile())
            .output(c.rows_type(), c.rows_tile())
            .build()?,
        )
    }

    /// `(q, k, v, do, lse, delta, q_first, q_end, k_tiles) -> (dk, dv)`, one program per
    /// (kv head, key tile), summed over the query heads of its group.
    pub fn backward_dkdv(self) -> Result<Kernel, BoxError> {
        let c = self;
        let group = c.group();
        let q_group = || {
            block_spec([Some(group), Some(c.total_q), Some(c.head_dim)], |i| {
                vec![pid(i, 0), zero(), zero()]
            })
        };
        let rows_group = || {
            block_spec([Some(group), Some(c.total_q), Some(1)], |i| {
                vec![pid(i, 0), zero(), zero()]
            })
        };
        let span_whole = || block_spec([Some(c.total_q), Some(1)], |_| vec![zero(), zero()]);
        let kv_tile = || {
            block_spec([None, Some(c.block_k), Some(c.head_dim)], |i| {
                vec![pid(i, 0), pid(i, 1), zero()]
            })
        };
        Ok(
            pallas_call(move |q, k, v, d_o, lse, delta, first, end, tiles, dk, dv| {
                varlen_bwd_dkdv(q, k, v, d_o, lse, delta, first, end, tiles, dk, dv, c)
            })
            .grid([c.kv_heads, c.k_tiles()])
            .dimension_semantics([DimSemantics::Parallel; 2])
            .input(c.q_type(), q_group())
            .input(c.kv_type(), kv_tile())
            .input(c.kv_type(), kv_tile())
            .input(c.q_type(), q_group())
            .input(c.rows_type(), rows_group())
            .input(c.rows_type(), rows_group())
            .input(c.span_type(), span_whole())
            .input(c.span_type(), span_whole())
            .input(
                Self::table_type(c.k_tiles(), 2),
                Self::table_whole(c.k_tiles(), 2),
            )
            .output(c.kv_type(), kv_tile())
            .output(c.kv_type(), kv_tile())
            .build()?,
        )
    }

    /// Whether the backward runs as one fused kernel per kv head
    /// ([`VarlenConfig::backward_fused`]): when there are two or more kv heads to spread
    /// over the cores (else the dq and dk/dv kernels, whose grids also split the tiles).
    pub fn fuses_backward(&self) -> bool {
        self.kv_heads >= 2
    }

    /// `(q, k, v, o, do, lse, q_first, q_end, q_tiles) -> (dq, dk, dv)` in one pass, one
    /// program per kv head.
    pub fn backward_fused(self) -> Result<Kernel, BoxError> {
        let c = self;
        let group = c.group();
        let per_kv_head = |cols: u64| {
            block_spec([Some(group), Some(c.total_q), Some(cols)], |i| {
                vec![pid(i, 0), zero(), zero()]
            })
        };
        let kv_head = || {
            block_spec([None, Some(c.total_k), Some(c.head_dim)], |i| {
                vec![pid(i, 0), zero(), zero()]
            })
        };
        let span_whole = || block_spec([Some(c.total_q), Some(1)], |_| vec![zero(), zero()]);
        let acc = TensorType::new(DType::F32, [c.total_k, c.head_dim]);
        Ok(pallas_call(
            move |q, k, v, o, d_o, lse, first, end, tiles, dq, dk, dv, dk_acc, dv_acc| {
                varlen_bwd_fused(
                    q, k, v, o, d_o, lse, first, end, tiles, dq, dk, dv, dk_acc, dv_acc, c,
                )
            },
        )
        .grid([c.kv_heads])
        .dimension_semantics([DimSemantics::Parallel])
        .input(c.q_type(), per_kv_head(c.head_dim))
        .input(c.kv_type(), kv_head())
        .input(c.kv_type(), kv_head())
        .input(c.q_type(), per_kv_head(c.head_dim))
        .input(c.q_type(), per_kv_head(c.head_dim))
        .input(c.rows_type(), per_kv_head(1))
        .input(c.span_type(), span_whole())
        .input(c.span_type(), span_whole())
        .input(
            Self::table_type(c.q_tiles(), 4),
            Self::table_whole(c.q_tiles(), 4),
        )
        .output(c.q_type(), per_kv_head(c.head_dim))
        .output(c.kv_type(), kv_head())
        .output(c.kv_type(), kv_head())
        .scratch(acc.clone())
        .scratch(acc)
        .build()?)
    }

    /// Checks the offsets and plans the tiles (see [`VarlenPlan`]).
    pub fn plan(&self, cu_q: &[i32], cu_k: &[i32]) -> Result<VarlenPlan, String> {
        VarlenPlan::new(self, cu_q, cu_k)
    }

    /// The plan of the offsets `read = [cu_seqlens_q, cu_seqlens_k]` as kernel inputs
    /// (see [`VarlenPlan::arrays`]).
    fn plan_arrays(&self, read: &[Array]) -> Result<[Array; 4], BoxError> {
        let [cu_q, cu_k] = read else {
            return Err(format!("the plan reads 2 offset arrays, got {}", read.len()).into());
        };
        let (ArrayData::Int(cu_q), ArrayData::Int(cu_k)) = (cu_q.data(), cu_k.data()) else {
            return Err("cu_seqlens_q and cu_seqlens_k must be int32".into());
        };
        self.plan(cu_q, cu_k)?.arrays(self)
    }

    /// Random packed q, k, v and offsets: `batch` sequences of random lengths summing to
    /// `total_q`, the first of one token (when there are two or more), others possibly
    /// empty; the keys share the queries' lengths when `total_k == total_q`, else get
    /// their own.
    fn qkv_and_offsets(&self, seed: u64) -> Result<Vec<Array>, BoxError> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed + 11);
        let mut offsets = |total: u64| {
            let mut cuts: Vec<i32> = (1..self.batch)
                .map(|i| {
                    if i == 1 {
                        1
                    } else {
                        rng.gen_range(1..=total) as i32
                    }
                })
                .collect();
            cuts.sort_unstable();
            let mut cu = vec![0];
            cu.extend(cuts);
            cu.push(total as i32);
            cu
        };
        let cu_q = offsets(self.total_q);
        let cu_k = if self.total_k == self.total_q {
            cu_q.clone()
        } else {
            offsets(self.total_k)
        };
        let n = self.batch + 1;
        Ok(vec![
            random_array(self.dtype, &self.q_type().shape, seed, 1.0)?,
            random_array(self.dtype, &self.kv_type().shape, seed + 1, 1.0)?,
            random_array(self.dtype, &self.kv_type().shape, seed + 2, 1.0)?,
            Array::from_i32([n], cu_q)?,
            Array::from_i32([n], cu_k)?,
        ])
    }
}

/// `leading` followed by the plan's query spans and query tile table: the inputs of the
/// forward, dq and fused kernels in a [`Chain`].
fn query_tile_inputs(leading: &[Source]) -> Vec<Source> {
    let plan = [0, 1, 2].map(Source::Derived);
    leading.iter().chain(&plan).copied().collect()
}

/// For every (sequence, query position) the keys of the sequence it sees.
fn for_each_query(
    c: &VarlenConfig,
    cu_q: &[i32],
    cu_k: &[i32],
    mut f: impl FnMut(usize, usize, std::ops::Range<usize>),
) {
    for b in 0..c.batch as usize {
        let (q_start, k_start) = (cu_q[b] as usize, cu_k[b] as usize);
        let k_len = (cu_k[b + 1] - cu_k[b]) as usize;
        for pos in 0..(cu_q[b + 1] - cu_q[b]) as usize {
            let seen = if c.causal { k_len.min(pos + 1) } else { k_len };
            f(q_start + pos, b, k_start..k_start + seen);
        }
    }
}

/// The f64 reference's forward results `(o, lse, p)`: `p[h][i]` are the probabilities of
/// packed query `i` of head `h` over the keys it sees.
pub type VarlenForward = (Vec<f64>, Vec<f64>, Vec<Vec<Vec<f64>>>);

/// Plain f64 varlen attention from the offsets (each sequence on its own, as SDPA per
/// sequence would): `(o, lse, p)` with `p[h][i]` the probabilities of packed query `i`
/// over its keys.
pub fn reference_forward(c: &VarlenConfig, inputs: &[Array]) -> Result<VarlenForward, BoxError> {
    let (q, k, v) = (
        inputs[0].try_to_f64("q")?,
        inputs[1].try_to_f64("k")?,
        inputs[2].try_to_f64("v")?,
    );
    let (cu_q, cu_k) = offsets(inputs)?;
    let (tq, tk, d) = (c.total_q as usize, c.total_k as usize, c.head_dim as usize);
    let mut o = zeros_f64("output", q.len())?;
    let mut lse = try_vec(
        || "the reference's lse".to_string(),
        c.heads * c.total_q,
        f64::NEG_INFINITY,
    )?;
    let mut probs = vec![vec![Vec::new(); tq]; c.heads as usize];
    for h in 0..c.heads as usize {
        let hk = h / c.group() as usize;
        for_each_query(c, cu_q, cu_k, |i, _, keys| {
            if keys.is_empty() {
                return;
            }
            let qi = (h * tq + i) * d;
            let scores: Vec<f64> = keys
                .clone()
                .map(|j| {
                    let kj = (hk * tk + j) * d;
                    (0..d).map(|t| q[qi + t] * k[kj + t]).sum::<f64>() * c.scale
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = scores.iter().map(|s| (s - m).exp()).sum();
            lse[h * tq + i] = m + sum.ln();
            let p: Vec<f64> = scores.iter().map(|s| (s - m).exp() / sum).collect();
            for (pj, j) in p.iter().zip(keys) {
                for t in 0..d {
                    o[qi + t] += pj * v[(hk * tk + j) * d + t];
                }
            }
            probs[h][i] = p;
        });
    }
    Ok((o, lse, probs))
}

/// Plain f64 gradients `(dq, dk, dv)` for output gradient `inputs[3]` (inputs `(q, k, v,
/// do, cu_q, cu_k, ..)`).
pub fn reference_backward(c: &VarlenConfig, inputs: &[Array]) -> Result<[Vec<f64>; 3], BoxError> {
    let fwd_inputs = [
        inputs[0].clone(),
        inputs[1].clone(),
        inputs[2].clone(),
        inputs[4].clone(),
        inputs[5].clone(),
    ];
    let (o, _, probs) = reference_forward(c, &fwd_inputs)?;
    let (q, k, v, d_o) = (
        inputs[0].try_to_f64("q")?,
        inputs[1].try_to_f64("k")?,
        inputs[2].try_to_f64("v")?,
        inputs[3].try_to_f64("do")?,
    );
    let (cu_q, cu_k) = offsets(&fwd_inputs)?;
    let (tq, tk, d) = (c.total_q as usize, c.total_k as usize, c.head_dim as usize);
    let mut dq = zeros_f64("dq", q.len())?;
    let mut dk = zeros_f64("dk", k.len())?;
    let mut dv = zeros_f64("dv", v.len())?;
    for (h, probs) in probs.iter().enumerate() {
        let hk = h / c.group() as usize;
        for_each_query(c, cu_q, cu_k, |i, _, keys| {
            let qi = (h * tq + i) * d;
            let delta: f64 = (0..d).map(|t| d_o[qi + t] * o[qi + t]).sum();
            for (pj, j) in probs[i].iter().zip(keys) {
                let kj = (hk * tk + j) * d;
                let dp: f64 = (0..d).map(|t| d_o[qi + t] * v[kj + t]).sum();
                let ds = pj * (dp - delta) * c.scale;
                for t in 0..d {
                    dv[kj + t] += pj * d_o[qi + t];
                    dq[qi + t] += ds * k[kj + t];
                    dk[kj + t] += ds * q[qi + t];
                }
            }
        });
    }
    Ok([dq, dk, dv])
}

/// The offsets `inputs[3]`, `inputs[4]` as int32 slices.
fn offsets(inputs: &[Array]) -> Result<(&[i32], &[i32]), BoxError> {
    match (inputs[3].data(), inputs[4].data()) {
        (ArrayData::Int(q), ArrayData::Int(k)) => Ok((q, k)),
        _ => Err("cu_seqlens_q and cu_seqlens_k must be int32".into()),
    }
}

/// How many (query, key) pairs one head computes if the `batch` sequences were of equal
/// length (the lengths are in the inputs, not the parameters).
fn nominal_pairs(c: &VarlenConfig) -> f64 {
    let (lq, lk) = (
        c.total_q as f64 / c.batch as f64,
        c.total_k as f64 / c.batch as f64,
    );
    let per_sequence = if c.causal {
        // Query i sees min(i + 1, lk) keys.
        let diagonal = lq.min(lk);
        diagonal * (diagonal + 1.0) / 2.0 + (lq - diagonal) * lk
    } else {
        lq * lk
    };
    per_sequence * c.batch as f64
}

/// Varlen attention forward: `(q, k, v, cu_seqlens_q, cu_seqlens_k) -> (o, lse)`.
pub struct VarlenAttention;

impl Op for VarlenAttention {
    type Config = VarlenConfig;
    const NAME: &'static str = "varlen_attention";
    const SUMMARY: &'static str =
        "attention over packed variable-length sequences (cu_seqlens offsets, causal, GQA); also returns lse";
    const PARAMS: &'static [ParamDef] = PARAMS;
    const CASES: &'static [&'static str] = &[
        "batch=4,heads=4,kv_heads=2,total_q=70,total_k=55,head_dim=16",
        "batch=3,heads=2,kv_heads=2,total_q=50,causal=true,dtype=bf16",
    ];
    const TUNABLE: &'static [Tunable] = TUNABLE;

    fn config(p: &Params) -> Result<VarlenConfig, BoxError> {
        VarlenConfig::from_params(p)
    }

    fn build(c: &Self::Config) -> Result<Vec<Kernel>, BoxError> {
        Ok(vec![c.forward()?])
    }

    fn inputs(c: &Self::Config, seed: u64) -> Result<Vec<Array>, BoxError> {
        c.qkv_and_offsets(seed)
    }

    /// Checks the offsets, plans the tiles and runs the kernel.
    fn run(c: &Self::Config, inputs: &[Array], exec: &mut Exec) -> Result<Vec<Array>, BoxError> {
        if inputs.len() != 5 {
            return Err(format!(
                "varlen_attention takes (q, k, v, cu_seqlens_q, cu_seqlens_k), got {} inputs",
                inputs.len()
            )
            .into());
        }
        let [first, end, q_tiles, _] = c.plan_arrays(&inputs[3..5])?;
        let mut args = inputs[..3].to_vec();
        args.extend([first, end, q_tiles]);
        exec(&*built(VarlenConfig::forward, *c)?, &args)
    }

    /// The plan from the offsets, then the kernel on `q, k, v` and the plan's query arrays.
    fn chain(_c: &Self::Config, inputs: usize) -> Option<Chain> {
        (inputs == 5).then(|| Chain {
            reads: vec![3, 4],
            steps: vec![Step {
                kernel: 0,
                inputs: query_tile_inputs(&[0, 1, 2].map(Source::Input)),
            }],
            outputs: vec![Source::output(0, 0), Source::output(0, 1)],
        })
    }

    /// The plan of the offsets (`[q_first, q_end, q_tiles, k_tiles]`).
    fn derive(c: &Self::Config, read: &[Array]) -> Result<Vec<Array>, BoxError> {
        Ok(c.plan_arrays(read)?.into())
    }

    fn reference(c: &Self::Config, inputs: &[Array]) -> Result<Vec<Vec<f64>>, BoxError> {
        let (o, lse, _) = reference_forward(c, inputs)?;
        Ok(vec![o, lse])
    }

    fn tolerance(c: &Self::Config) -> Tolerance {
        tolerance_for(c.dtype, c.head_dim)
    }

    /// Two dots over the visible pairs of `batch` equal-length sequences (nominal).
    fn flops(c: &Self::Config) -> f64 {
        4.0 * (c.heads * c.head_dim) as f64 * nominal_pairs(c)
    }
}

/// Varlen attention backward: `(q, k, v, do, cu_seqlens_q, cu_seqlens_k[, o, lse]) ->
/// (dq, dk, dv)`; runs the forward for `o` and `lse` unless the caller passes them, then
/// the fused dq/dk/dv kernel ([`VarlenConfig::fuses_backward`]) or the dq (+ delta) and
/// dk/dv kernels.
pub struct VarlenAttentionBwd;

impl Op for VarlenAttentionBwd {
    type Config = VarlenConfig;
    const NAME: &'static str = "varlen_attention_bwd";
    const SUMMARY: &'static str =
        "gradients (dq, dk, dv) of varlen_attention for an output gradient do";
    const PARAMS: &'static [ParamDef] = PARAMS;
    const CASES: &'static [&'static str] =
        &["batch=4,heads=4,kv_heads=2,total_q=60,causal=true,head_dim=16"];
    const TUNABLE: &'static [Tunable] = TUNABLE;

    fn config(p: &Params) -> Result<VarlenConfig, BoxError> {
        VarlenConfig::from_params(p)
    }

    fn build(c: &Self::Config) -> Result<Vec<Kernel>, BoxError> {
        let mut kernels = vec![c.forward()?];
        if c.fuses_backward() {
            kernels.push(c.backward_fused()?);
        } else {
            kernels.extend([c.backward_dq()?, c.backward_dkdv()?]);
        }
        Ok(kernels)
    }

    fn inputs(c: &Self::Config, seed: u64) -> Result<Vec<Array>, BoxError> {
        let mut v = c.qkv_and_offsets(seed)?;
        let d_o = random_array(c.dtype, &c.q_type().shape, seed + 3, 1.0)?;
        v.insert(3, d_o);
        Ok(v)
    }

    fn run(c: &Self::Config, inputs: &[Array], exec: &mut Exec) -> Result<Vec<Array>, BoxError> {
        if inputs.len() != 6 && inputs.len() != 8 {
            return Err(format!(
                "varlen_attention_bwd takes (q, k, v, do, cu_seqlens_q, cu_seqlens_k) or those \
                 and (o, lse), got {} inputs",
                inputs.len()
            )
            .into());
        }
        let [first, end, q_tiles, k_tiles] = c.plan_arrays(&inputs[4..6])?;
        let (q, k, v, d_o) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3]);
        let fwd = match inputs.get(6..8) {
            Some(saved) => saved.to_vec(),
            None => exec(
                &*built(VarlenConfig::forward, *c)?,
                &[
                    q.clone(),
                    k.clone(),
                    v.clone(),
                    first.clone(),
                    end.clone(),
                    q_tiles.clone(),
                ],
            )?,
        };
        let (o, lse) = (&fwd[0], &fwd[1]);
        // The fused kernel and the dq kernel take the same inputs.
        let grads_in = [
            q.clone(),
            k.clone(),
            v.clone(),
            o.clone(),
            d_o.clone(),
            lse.clone(),
            first.clone(),
            end.clone(),
            q_tiles,
        ];
        if c.fuses_backward() {
            return exec(&*built(VarlenConfig::backward_fused, *c)?, &grads_in);
        }
        let mut dq_delta = exec(&*built(VarlenConfig::backward_dq, *c)?, &grads_in)?;
        let delta = dq_delta.remove(1);
        let dq = dq_delta.remove(0);
        let dkdv_in = [
            q.clone(),
            k.clone(),
            v.clone(),
            d_o.clone(),
            lse.clone(),
            delta,
            first,
            end,
            k_tiles,
        ];
        let mut dkdv = exec(&*built(VarlenConfig::backward_dkdv, *c)?, &dkdv_in)?;
        let dv = dkdv.remove(1);
        let dk = dkdv.remove(0);
        Ok(vec![dq, dk, dv])
    }

    /// What `run` does, as a chain: the plan from the offsets; the forward unless `o` and
    /// `lse` are given; then the fused kernel, or the dq (+ delta) and dk/dv kernels.
    fn chain(c: &Self::Config, inputs: usize) -> Option<Chain> {
        if inputs != 6 && inputs != 8 {
            return None;
        }
        let qkv = [0, 1, 2].map(Source::Input);
        let mut steps = Vec::new();
        let (o, lse) = if inputs == 8 {
            (Source::Input(6), Source::Input(7))
        } else {
            steps.push(Step {
                kernel: 0,
                inputs: query_tile_inputs(&qkv),
            });
            (Source::output(0, 0), Source::output(0, 1))
        };
        let d_o = Source::Input(3);
        let grads = steps.len();
        steps.push(Step {
            kernel: 1,
            inputs: query_tile_inputs(&[qkv[0], qkv[1], qkv[2], o, d_o, lse]),
        });
        let outputs = if c.fuses_backward() {
            (0..3).map(|i| Source::output(grads, i)).collect()
        } else {
            let delta = Source::output(grads, 1);
            let [first, end, _, k_tiles] = [0, 1, 2, 3].map(Source::Derived);
            steps.push(Step {
                kernel: 2,
                inputs: vec![qkv[0], qkv[1], qkv[2], d_o, lse, delta, first, end, k_tiles],
            });
            vec![
                Source::output(grads, 0),
                Source::output(grads + 1, 0),
                Source::output(grads + 1, 1),
            ]
        };
        Some(Chain {
            reads: vec![4, 5],
            steps,
            outputs,
        })
    }

    /// The plan of the offsets (`[q_first, q_end, q_tiles, k_tiles]`).
    fn derive(c: &Self::Config, read: &[Array]) -> Result<Vec<Array>, BoxError> {
        Ok(c.plan_arrays(read)?.into())
    }

    fn reference(c: &Self::Config, inputs: &[Array]) -> Result<Vec<Vec<f64>>, BoxError> {
        Ok(reference_backward(c, inputs)?.to_vec())
    }

    fn tolerance(c: &Self::Config) -> Tolerance {
        if c.dtype == DType::BF16 {
            Tolerance {
                abs: 6e-2,
                rel: 5e-2,
            }
        } else {
            tolerance_for(DType::F32, c.total_q.max(c.total_k) * c.head_dim)
        }
    }

    fn flops(c: &Self::Config) -> f64 {
        VarlenAttention::flops(c) * 3.5
    }
}
