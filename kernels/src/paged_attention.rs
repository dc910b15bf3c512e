//! Paged attention for decoding: one query token per sequence attends over its KV cache,
//! which lives in fixed-size pages that a block table lists per sequence (vLLM's
//! PagedAttention). GQA/MQA, f32 or bf16 (f32 accumulation).
//!
//! Layout: `k_cache`/`v_cache` are `[kv_heads, num_pages, page_size, head_dim]` (as in
//! JAX's Pallas paged attention): one kv head's page is a contiguous
//! `[page_size, head_dim]` tile (one contiguous read per page, and on TPU the squeezed
//! head dim leads, so the last two block dims are whole tiles). `block_table` is
//! `[batch, max_pages]` i32 page numbers, `context_lens` `[batch]` i32; slots past a
//! sequence's `ceil(len / page_size)` pages are never read (they may hold anything).
//!
//! The grid is (sequence, kv head, page slot), the slot axis sequential: each step
//! computes the `heads / kv_heads` query heads that share the kv head as one
//! `[group, head_dim]` block against one page, folded into an online softmax kept in
//! scratch. The block table and lengths are scalar-prefetch operands: the cache's index
//! map reads the page of each step from the table, so a TPU copies only the pages a
//! sequence uses into VMEM (one page per step, whatever the cache's size), and steps
//! past a sequence's length neither copy nor compute. Inputs are `(block_table,
//! context_lens, q, k_cache, v_cache)`, the scalar-prefetch operands first.

use kernel_ir::dsl::prelude::*;
use kernel_ir::IndexBinOp::{Max, Min};
use kernel_ir::{Array, ArrayData, DimSemantics};
use kernel_macros::kernel;
use rand::{Rng, SeedableRng};

use crate::common::{built, pid, random_array, tolerance_for, zero, zeros_f64};
use crate::torch_op::{f32_or_bf16, py_shape, Args, Axis, OpSpec, Out, Placement, Plan, Split};
use crate::{BoxError, Exec, Kind, Op, ParamDef, ParamValue, Params, Tolerance};

/// Shapes of a paged-attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PagedAttentionConfig {
    /// Sequences.
    pub batch: u64,
    /// Query heads.
    pub heads: u64,
    /// Key/value heads (divides `heads`).
    pub kv_heads: u64,
    /// Head dim.
    pub head_dim: u64,
    /// Tokens per page.
    pub page_size: u64,
    /// Pages in the cache.
    pub num_pages: u64,
    /// Block-table slots per sequence.
    pub max_pages: u64,
    /// Score scale (default `1 / sqrt(head_dim)`).
    pub scale: f64,
    /// Query, cache and output dtype (f32 or bf16).
    pub dtype: DType,
}

const PARAMS: &[ParamDef] = &[
    ParamDef {
        name: "batch",
        kind: Kind::Dim,
        default: "4",
        help: "sequences (one query token each)",
    },
    ParamDef {
        name: "heads",
        kind: Kind::Dim,
        default: "16",
        help: "query heads",
    },
    ParamDef {
        name: "kv_heads",
        kind: Kind::Dim,
        default: "2",
        help: "key/value heads (GQA when fewer)",
    },
    ParamDef {
        name: "head_dim",
        kind: Kind::Dim,
        default: "128",
        help: "head dim",
    },
    ParamDef {
        name: "page_size",
        kind: Kind::Dim,
        default: "16",
        help: "tokens per page",
    },
    ParamDef {
        name: "num_pages",
        kind: Kind::Dim,
        default: "128",
        help: "pages in the KV cache",
    },
    ParamDef {
        name: "max_pages",
        kind: Kind::Dim,
        default: "32",
        help: "block-table slots per sequence",
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

impl PagedAttentionConfig {
    /// Reads and validates the parameters.
    pub fn from_params(p: &Params) -> Result<Self, BoxError> {
        let (heads, kv_heads) = p.heads()?;
        let head_dim = p.dim("head_dim")?;
        Ok(PagedAttentionConfig {
            batch: p.dim("batch")?,
            heads,
            kv_heads,
            head_dim,
            page_size: p.dim("page_size")?,
            num_pages: p.dim("num_pages")?,
            max_pages: p.dim("max_pages")?,
            scale: p
                .float_opt("scale")?
                .unwrap_or(1.0 / (head_dim as f64).sqrt()),
            dtype: p.dtype("dtype", &[DType::F32, DType::BF16])?,
        })
    }

    fn group(&self) -> u64 {
        self.heads / self.kv_heads
    }

    fn q_type(&self) -> TensorType {
        TensorType::new(self.dtype, [self.batch, self.heads, self.head_dim])
    }

    fn cache_type(&self) -> TensorType {
        TensorType::new(
            self.dtype,
            [self.kv_heads, self.num_pages, self.page_size, self.head_dim],
        )
    }

    /// The longest context the block table can hold.
    fn max_len(&self) -> u64 {
        self.max_pages * self.page_size
    }

    /// The decode kernel: `(block_table, context_lens, q, k_cache, v_cache) -> o`, the
    /// table and lengths as scalar-prefetch operands.
    pub fn kernel(self) -> Result<Kernel, BoxError> {
        let c = self;
        let q_block = || {
            block_spec([None, Some(c.group()), Some(c.head_dim)], |i| {
                vec![pid(i, 0), pid(i, 1), zero()]
            })
        };
        // Step `p` of sequence `b` reads the page in slot `p`, clamped to the last slot
        // its length uses (later steps compute nothing and, fetching the same block, copy
        // nothing) and into the cache (unused slots may hold anything).
        let (ps, pages) = (c.page_size as i64, c.num_pages as i64);
        let page = move |i: &[IndexExpr]| {
            let used = (prefetched(1, [pid(i, 0)]) + (ps - 1)) / ps;
            let slot = pid(i, 2).bin(Min, (used - 1).bin(Max, 0));
            prefetched(0, [pid(i, 0), slot])
                .bin(Max, 0)
                .bin(Min, pages - 1)
        };
        let cache = || {
            block_spec(
                [None, None, Some(c.page_size), Some(c.head_dim)],
                move |i| vec![pid(i, 1), page(i), zero(), zero()],
            )
        };
        let rows = |cols| TensorType::new(DType::F32, [c.group(), cols]);
        Ok(pallas_call(move |table, lens, q, k, v, o, m, l, acc| {
            paged_attention_decode(table, lens, q, k, v, o, m, l, acc, c)
        })
        .grid([c.batch, c.kv_heads, c.max_pages])
        .dimension_semantics([
            DimSemantics::Parallel,
            DimSemantics::Parallel,
            DimSemantics::Arbitrary,
        ])
        .scalar_prefetch(TensorType::new(DType::I32, [c.batch, c.max_pages]))
        .scalar_prefetch(TensorType::new(DType::I32, [c.batch]))
        .input(c.q_type(), q_block())
        .input(c.cache_type(), cache())
        .input(c.cache_type(), cache())
        .output(c.q_type(), q_block())
        .scratch(rows(1))
        .scratch(rows(1))
        .scratch(rows(c.head_dim))
        .build()?)
    }

    /// Checks the block table and lengths before anything runs (see
    /// [`check_block_tables`]).
    pub fn check_tables(&self, table: &Array, lens: &Array) -> Result<(), BoxError> {
        let (ArrayData::Int(table), ArrayData::Int(lens)) = (table.data(), lens.data()) else {
            return Err("block_table and context_lens must be int32".into());
        };
        Ok(check_block_tables(
            table,
            lens,
            self.max_pages,
            self.page_size,
            self.num_pages,
        )?)
    }
}

/// Checks a row-major `[lens.len(), max_pages]` block table and its lengths: every
/// length in `0..=max_pages * page_size`, every slot a length uses a page below
/// `num_pages`. The error names the first bad entry.
pub fn check_block_tables(
    table: &[i32],
    lens: &[i32],
    max_pages: u64,
    page_size: u64,
    num_pages: u64,
) -> Result<(), String> {
    let max_len = max_pages * page_size;
    for (b, &len) in lens.iter().enumerate() {
        if len < 0 || len as u64 > max_len {
            return Err(format!(
                "context_lens[{b}] = {len}: expected 0..={max_len} ({max_pages} slots of \
                 {page_size} tokens)"
            ));
        }
        // (A positive length has a positive page size: max_len >= len > 0.)
        let used = if len == 0 {
            0
        } else {
            (len as u64).div_ceil(page_size) as usize
        };
        let row = table
            .get(b * max_pages as usize..)
            .and_then(|rest| rest.get(..used))
            .ok_or_else(|| {
                format!(
                    "block_table has {} entries: too few for {} rows of {max_pages} slots",
                    table.len(),
                    lens.len()
                )
            })?;
        if let Some((slot, page)) = row
            .iter()
            .enumerate()
            .find(|(_, &p)| p < 0 || p as u64 >= num_pages)
        {
            return Err(format!(
                "block_table[{b}, {slot}] = {page} is outside the cache's {num_pages} pages \
                 (sequence {b} has {len} tokens, so slots 0..{used} are read)"
            ));
        }
    }
    Ok(())
}

/// One page of `o = softmax(q k^T * scale) v` for the query heads that share one kv
/// head: step `p` of the grid's last axis folds page slot `p` of the sequence into the
/// online softmax state (running max `m`, sum `l`, weighted values `acc`, in scratch)
/// while the slot holds tokens; the last step writes the output.
#[kernel]
#[allow(clippy::too_many_arguments)]
fn paged_attention_decode(
    block_table: Ref,
    context_lens: Ref,
    q: Ref,
    k_cache: Ref,
    v_cache: Ref,
    o: Ref,
    m_ref: Ref,
    l_ref: Ref,
    acc_ref: Ref,
    #[comptime] c: PagedAttentionConfig,
) {
    let (group, ps) = (c.heads / c.kv_heads, c.page_size);
    let (b, p) = (program_id(0), program_id(2));
    // The table is read by the index maps; the body needs only the length.
    let _ = block_table;
    let len = context_lens.load(s![b]);
    if p == 0 {
        m_ref.write(full([group, 1], f64::NEG_INFINITY, DType::F32));
        l_ref.write(zeros([group, 1], DType::F32));
        acc_ref.write(zeros([group, c.head_dim], DType::F32));
    }
    if p * ps < len {
        let qb = q.read().cast(DType::F32) * c.scale;
        let kb = k_cache.read().cast(DType::F32);
        let vb = v_cache.read().cast(DType::F32);
        let scores = dot_general(qb, kb, false, true);
        // The last page's tokens past the length are masked.
        let token = iota([group, ps], 1) + p * ps;
        let scores = select(token.lt(len), scores, f64::NEG_INFINITY);
        let m = m_ref.read();
        let m_new = m.maximum(scores.max_keepdims(1));
        let probs = (scores - m_new).exp();
        let alpha = (m - m_new).exp();
        m_ref.write(m_new);
        l_ref.write(l_ref.read() * alpha + probs.sum_keepdims(1));
        acc_ref.write(acc_ref.read() * alpha + probs.dot(vb));
    }
    if p == c.max_pages - 1 {
        // An empty context (length 0) gives 0.
        let l = l_ref.read();
        let out = select(l.eq(0.0), 0.0, acc_ref.read() / l);
        o.write(out.cast(c.dtype));
    }
}

/// Plain f64 paged attention: gathers each sequence's keys and values through its
/// block table.
pub fn reference(c: &PagedAttentionConfig, inputs: &[Array]) -> Result<Vec<f64>, BoxError> {
    let q = inputs[2].try_to_f64("q")?;
    let k = inputs[3].try_to_f64("k_cache")?;
    let v = inputs[4].try_to_f64("v_cache")?;
    let (ArrayData::Int(table), ArrayData::Int(lens)) = (inputs[0].data(), inputs[1].data()) else {
        return Err("block_table and context_lens must be int32".into());
    };
    let (d, ps) = (c.head_dim as usize, c.page_size as usize);
    let mut o = zeros_f64("output", q.len())?;
    for b in 0..c.batch as usize {
        let len = lens[b] as usize;
        // Where token `t` of sequence `b` sits in kv head `hk`'s cache.
        let row = |hk: usize, t: usize| {
            let page = table[b * c.max_pages as usize + t / ps] as usize;
            ((hk * c.num_pages as usize + page) * ps + t % ps) * d
        };
        for h in 0..c.heads as usize {
            let hk = h / c.group() as usize;
            let qo = (b * c.heads as usize + h) * d;
            let scores: Vec<f64> = (0..len)
                .map(|t| (0..d).map(|i| q[qo + i] * k[row(hk, t) + i]).sum::<f64>() * c.scale)
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = scores.iter().map(|s| (s - m).exp()).sum();
            for (t, s) in scores.iter().enumerate() {
                let p = (s - m).exp() / sum;
                for i in 0..d {
                    o[qo + i] += p * v[row(hk, t) + i];
                }
            }
        }
    }
    Ok(o)
}

/// Paged attention for decoding.
pub struct PagedAttention;

impl Op for PagedAttention {
    type Config = PagedAttentionConfig;
    const NAME: &'static str = "paged_attention";
    const SUMMARY: &'static str =
        "decode attention of one query token per sequence over a paged KV cache (block table, GQA)";
    const PARAMS: &'static [ParamDef] = PARAMS;
    const CASES: &'static [&'static str] =
        &["batch=3,heads=4,kv_heads=2,head_dim=16,page_size=4,num_pages=9,max_pages=5"];

    fn config(p: &Params) -> Result<PagedAttentionConfig, BoxError> {
        PagedAttentionConfig::from_params(p)
    }

    fn build(c: &Self::Config) -> Result<Vec<Kernel>, BoxError> {
        Ok(vec![c.kernel()?])
    }

    /// Random queries and caches; each sequence gets a random length in
    /// `1..=max_pages * page_size` (the first one the full table) and distinct random
    /// pages; unused slots hold -1, which the kernel never reads.
    fn inputs(c: &Self::Config, seed: u64) -> Result<Vec<Array>, BoxError> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed + 7);
        let mut table = Vec::new();
        let mut lens = Vec::new();
        for b in 0..c.batch {
            let len = if b == 0 {
                c.max_len()
            } else {
                rng.gen_range(1..=c.max_len())
            };
            let used = len.div_ceil(c.page_size);
            for slot in 0..c.max_pages {
                table.push(if slot < used {
                    rng.gen_range(0..c.num_pages) as i32
                } else {
                    -1
                });
            }
            lens.push(len as i32);
        }
        Ok(vec![
            Array::from_i32([c.batch, c.max_pages], table)?,
            Array::from_i32([c.batch], lens)?,
            random_array(c.dtype, &c.q_type().shape, seed, 1.0)?,
            random_array(c.dtype, &c.cache_type().shape, seed + 1, 1.0)?,
            random_array(c.dtype, &c.cache_type().shape, seed + 2, 1.0)?,
        ])
    }

    /// Checks the block table and lengths, then runs the kernel.
    fn run(c: &Self::Config, inputs: &[Array], exec: &mut Exec) -> Result<Vec<Array>, BoxError> {
        if inputs.len() != 5 {
            return Err(format!(
                "paged_attention takes (block_table, context_lens, q, k_cache, v_cache), got \
                 {} inputs",
                inputs.len()
            )
            .into());
        }
        c.check_tables(&inputs[0], &inputs[1])?;
        exec(&*built(PagedAttentionConfig::kernel, *c)?, inputs)
    }

    fn reference(c: &Self::Config, inputs: &[Array]) -> Result<Vec<Vec<f64>>, BoxError> {
        Ok(vec![reference(c, inputs)?])
    }

    fn tolerance(c: &Self::Config) -> Tolerance {
        tolerance_for(c.dtype, c.head_dim)
    }

    /// Two dots over the longest context the block table holds (an upper bound: the
    /// lengths are in the inputs).
    fn flops(c: &Self::Config) -> f64 {
        4.0 * (c.batch * c.heads * c.head_dim) as f64 * c.max_len() as f64
    }
}

/// `torch.ops.tessera.paged_attention`.
pub(crate) const TORCH_OP: OpSpec = OpSpec {
    schema: "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, \
             Tensor context_lens, float? scale=None) -> Tensor",
    doc: "Decode attention over a paged KV cache: one query per sequence, q `[batch, heads, \
          head_dim]`, caches `[kv_heads, num_pages, page_size, head_dim]`, an int32 or int64 \
          `[batch, max_pages]` block table and `[batch]` context lengths (both checked \
          before anything runs). float32 or bfloat16; `scale` defaults to 1/sqrt(head_dim).",
    outputs: &[Out::like(0)],
    returns: 1,
    splits: &[
        Split {
            name: "heads",
            args: &[
                ("q", Axis::Dim(1)),
                ("k_cache", Axis::Dim(0)),
                ("v_cache", Axis::Dim(0)),
            ],
            outputs: &[Placement::Dim(1)],
            divides: &["heads", "kv_heads"],
            even: true,
        },
        Split {
            name: "batch",
            args: &[
                ("q", Axis::Dim(0)),
                ("block_table", Axis::Dim(0)),
                ("context_lens", Axis::Dim(0)),
            ],
            outputs: &[Placement::Dim(0)],
            divides: &[],
            even: false,
        },
    ],
    plan: |values| {
        let mut a = Args::new(values);
        let q = a.tensor("query")?.rank(3)?;
        f32_or_bf16("paged_attention", &q)?;
        let k = a.tensor("k_cache")?.rank(4)?.same_dtype(&q)?;
        let v = a.tensor("v_cache")?.rank(4)?.same_dtype(&q)?;
        let table = a.index("block_table")?.rank(2)?;
        let lens = a.index("context_lens")?.rank(1)?;
        let scale = a.float("scale")?;
        let (b, h, d) = (q.shape[0], q.shape[1], q.shape[2]);
        let (hkv, pages, ps) = (k.shape[0], k.shape[1], k.shape[2]);
        if k.shape != v.shape || k.shape[3] != d {
            return Err(format!(
                "k_cache/v_cache: shapes {}/{} must be equal [kv_heads, num_pages, page_size, {d}]",
                py_shape(&k.shape),
                py_shape(&v.shape)
            ));
        }
        if hkv == 0 || h % hkv != 0 {
            return Err(format!(
                "k_cache: {hkv} kv heads do not divide the query's {h} heads"
            ));
        }
        if table.shape[0] != b || lens.shape != [b] {
            return Err(format!(
                "block_table/context_lens: shapes {}/{} do not match the query's batch of {b}",
                py_shape(&table.shape),
                py_shape(&lens.shape)
            ));
        }
        let max_pages = table.shape[1];
        let mut params = vec![
            ("batch", ParamValue::Int(b)),
            ("heads", ParamValue::Int(h)),
            ("kv_heads", ParamValue::Int(hkv)),
            ("head_dim", ParamValue::Int(d)),
            ("page_size", ParamValue::Int(ps)),
            ("num_pages", ParamValue::Int(pages)),
            ("max_pages", ParamValue::Int(max_pages)),
            ("dtype", ParamValue::DType(q.dtype)),
        ];
        if let Some(scale) = scale {
            params.push(("scale", ParamValue::Float(scale)));
        }
        Ok(Plan {
            kernel: "paged_attention",
            params,
            // The kernel's order: the scalar-prefetch operands first.
            inputs: vec![
                table.operand(),
                lens.operand(),
                q.operand(),
                k.operand(),
                v.operand(),
            ],
            outputs: vec![q.shape.clone()],
            // No queries, or no tokens (the index check allows only empty contexts then).
            launch: q.numel() > 0 && k.numel() > 0 && max_pages > 0,
            check_indices: Some(Box::new(move |ints| {
                check_block_tables(ints[0], ints[1], max_pages, ps, pages)
            })),
        })
    },
};
