//! FlashAttention forward and backward, with causal masking, sliding windows, logit
//! soft-capping, GQA/MQA, ragged sequence lengths and f32 or bf16 inputs (f32
//! accumulation).

pub(crate) mod bwd;
pub(crate) mod fwd;

mod ops;

use kernel_ir::dsl::prelude::*;
use kernel_ir::dsl::{KernelBody, PallasCall};
use kernel_ir::{AllocError, Array, DimSemantics};

use crate::common::{block, built, pid, random_array, tolerance_for, zero, zeros_f64};
use crate::{BoxError, Chain, Exec, Kind, Op, ParamDef, Params, Source, Step, Tolerance, Tunable};
pub(crate) use ops::{FLASH_ATTENTION, FLASH_ATTENTION_BWD, FLASH_ATTENTION_FWD};

/// Shapes and options of an attention call. q/o are `[batch, heads, q_len, head_dim]`,
/// k/v `[batch, kv_heads, kv_len, head_dim]`; query head `h` reads kv head
/// `h / (heads / kv_heads)`. Causal masking is top-left aligned, as in PyTorch's
/// `scaled_dot_product_attention(is_causal=True)`: query `i` sees keys `j <= i`. A
/// sliding window of left size `w` (FlashAttention's `window_size=(w, ..)`) hides keys
/// `j < i - w`, so with `causal` query `i` sees `w + 1` keys (Mistral's `sliding_window`
/// is `w + 1`). Soft-capping (Gemma 2) replaces each scaled score `s` by
/// `softcap * tanh(s / softcap)` before masking and softmax. An additive score mask
/// ([`ScoreMask`]) is one more input, added to the (capped) scores before the softmax.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionConfig {
    /// Batch.
    pub batch: u64,
    /// Query heads.
    pub heads: u64,
    /// Key/value heads (divides `heads`).
    pub kv_heads: u64,
    /// Query length.
    pub q_len: u64,
    /// Key/value length.
    pub kv_len: u64,
    /// Head dim.
    pub head_dim: u64,
    /// Queries per block (clamped to `q_len`).
    pub block_q: u64,
    /// Keys per block (clamped to `kv_len`).
    pub block_k: u64,
    /// Mask keys after the query position.
    pub causal: bool,
    /// Score scale (default `1 / sqrt(head_dim)`).
    pub scale: f64,
    /// Sliding window: query `i` sees no key before `i - window`.
    pub window: Option<u64>,
    /// Logit soft-cap: scores become `softcap * tanh(score / softcap)`.
    pub softcap: Option<f64>,
    /// Input and output dtype (f32 or bf16).
    pub dtype: DType,
    /// An additive score mask input, and whether each batch entry has its own.
    pub mask: Option<ScoreMask>,
}

/// An additive score mask: an f32 `[batch, 1, q_len, kv_len]` (or `[1, 1, q_len,
/// kv_len]`) input added to every head's scaled, capped scores; `-inf` hides a key (a
/// query that sees no key gives 0, as in PyTorch's SDPA). Padding and cache masks,
/// which depend on the inputs, come this way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreMask {
    /// One mask per batch entry: `[batch, 1, q_len, kv_len]`.
    PerBatch,
    /// One mask for the whole batch: `[1, 1, q_len, kv_len]`.
    Shared,
}

impl ScoreMask {
    /// The `mask` parameter's words.
    pub const WORDS: &'static [&'static str] = &["none", "batch", "shared"];

    /// The mask a word of [`ScoreMask::WORDS`] names (`none`: no mask).
    pub fn from_word(word: &str) -> Option<ScoreMask> {
        match word {
            "batch" => Some(ScoreMask::PerBatch),
            "shared" => Some(ScoreMask::Shared),
            _ => None,
        }
    }

    /// The word of [`ScoreMask::WORDS`] that names `mask`.
    pub fn word(mask: Option<ScoreMask>) -> &'static str {
        match mask {
            None => "none",
            Some(ScoreMask::PerBatch) => "batch",
            Some(ScoreMask::Shared) => "shared",
        }
    }
}

const PARAMS: &[ParamDef] = &[
    ParamDef {
        name: "batch",
        kind: Kind::Dim,
        default: "1",
        help: "batch",
    },
    ParamDef {
        name: "heads",
        kind: Kind::Dim,
        default: "4",
        help: "query heads",
    },
    ParamDef {
        name: "kv_heads",
        kind: Kind::Dim,
        default: "4",
        help: "key/value heads (GQA when fewer)",
    },
    ParamDef {
        name: "q_len",
        kind: Kind::Dim,
        default: "512",
        help: "query length",
    },
    ParamDef {
        name: "kv_len",
        kind: Kind::Dim,
        default: "512",
        help: "key/value length",
    },
    ParamDef {
        name: "head_dim",
        kind: Kind::Dim,
        default: "64",
        help: "head dim (32..256)",
    },
    ParamDef {
        name: "block_q",
        kind: Kind::Dim,
        default: "128",
        help: "queries per block",
    },
    ParamDef {
        name: "block_k",
        kind: Kind::Dim,
        default: "128",
        help: "keys per block",
    },
    ParamDef {
        name: "causal",
        kind: Kind::Flag,
        default: "false",
        help: "top-left causal mask",
    },
    ParamDef {
        name: "scale",
        kind: Kind::FloatOpt,
        default: "none",
        help: "score scale (none: 1/sqrt(head_dim))",
    },
    ParamDef {
        name: "window",
        kind: Kind::CountOpt,
        default: "none",
        help: "sliding window: query i sees no key before i - window",
    },
    ParamDef {
        name: "softcap",
        kind: Kind::FloatOpt,
        default: "none",
        help: "logit soft-cap: scores become softcap * tanh(score / softcap)",
    },
    ParamDef {
        name: "dtype",
        kind: Kind::DType,
        default: "f32",
        help: "f32 or bf16 (f32 accumulation)",
    },
    ParamDef {
        name: "mask",
        kind: Kind::OneOf(ScoreMask::WORDS),
        default: "none",
        help: "additive f32 score mask input: none, batch ([batch,1,q_len,kv_len]) or shared ([1,1,q_len,kv_len])",
    },
];

/// Blocks the tuner tries (forward and backward).
const TUNABLE: &[Tunable] = &[
    Tunable {
        name: "block_q",
        values: &[32, 64, 128, 256],
        tiles: &["q_len"],
    },
    Tunable {
        name: "block_k",
        values: &[32, 64, 128, 256, 512],
        tiles: &["kv_len"],
    },
];

impl AttentionConfig {
    /// Reads and validates the parameters.
    pub fn from_params(p: &Params) -> Result<Self, BoxError> {
        let (heads, kv_heads) = p.heads()?;
        let head_dim = p.dim("head_dim")?;
        if !(1..=256).contains(&head_dim) {
            return Err(format!("`head_dim` must be in 1..=256, got {head_dim}").into());
        }
        let (q_len, kv_len) = (p.dim("q_len")?, p.dim("kv_len")?);
        let softcap = p.float_opt("softcap")?;
        if let Some(cap) = softcap.filter(|cap| *cap <= 0.0) {
            return Err(format!("`softcap` must be positive, got {cap}").into());
        }
        Ok(AttentionConfig {
            batch: p.dim("batch")?,
            heads,
            kv_heads,
            q_len,
            kv_len,
            head_dim,
            block_q: block(q_len, p.dim("block_q")?),
            block_k: block(kv_len, p.dim("block_k")?),
            causal: p.flag("causal")?,
            scale: p
                .float_opt("scale")?
                .unwrap_or(1.0 / (head_dim as f64).sqrt()),
            window: p.count_opt("window")?,
            softcap,
            dtype: p.dtype("dtype", &[DType::F32, DType::BF16])?,
            mask: ScoreMask::from_word(p.word("mask")?),
        })
    }

    fn group(&self) -> u64 {
        self.heads / self.kv_heads
    }

    /// Whether query `i` may see key `j`.
    fn visible(&self, i: usize, j: usize) -> bool {
        !(self.causal && j > i) && self.window.is_none_or(|w| j as u64 + w >= i as u64)
    }

    /// How many (query, key) pairs of one head the masks leave visible.
    fn visible_pairs(&self) -> u64 {
        (0..self.q_len)
            .map(|i| {
                let end = if self.causal {
                    (i + 1).min(self.kv_len)
                } else {
                    self.kv_len
                };
                let start = self.window.map_or(0, |w| i.saturating_sub(w));
                end.saturating_sub(start)
            })
            .sum()
    }

    /// A scaled score after soft-capping, and its derivative with respect to the
    /// scaled score.
    fn capped(&self, s: f64) -> (f64, f64) {
        match self.softcap {
            Some(cap) => {
                let t = (s / cap).tanh();
                (cap * t, 1.0 - t * t)
            }
            None => (s, 1.0),
        }
    }

    fn q_type(&self) -> TensorType {
        TensorType::new(
            self.dtype,
            [self.batch, self.heads, self.q_len, self.head_dim],
        )
    }

    fn kv_type(&self) -> TensorType {
        TensorType::new(
            self.dtype,
            [self.batch, self.kv_heads, self.kv_len, self.head_dim],
        )
    }

    /// lse and delta: `[batch, heads, q_len, 1]`, so their blocks satisfy the TPU rule
    /// on the last two block dims (a squeezed head dim may not be among them).
    fn rows_type(&self) -> TensorType {
        TensorType::new(DType::F32, [self.batch, self.heads, self.q_len, 1])
    }

    fn q_grid(&self) -> [u64; 3] {
        [self.batch, self.heads, self.q_len.div_ceil(self.block_q)]
    }

    /// A query-block spec of q, o, do: `[None, None, block_q, head_dim]`.
    fn q_block(&self) -> BlockSpecFn {
        block_spec([None, None, Some(self.block_q), Some(self.head_dim)], |i| {
            vec![pid(i, 0), pid(i, 1), pid(i, 2), zero()]
        })
    }

    /// A per-query-row spec of lse and delta: `[None, None, block_q, 1]`.
    fn rows_block(&self) -> BlockSpecFn {
        block_spec([None, None, Some(self.block_q), Some(1)], |i| {
            vec![pid(i, 0), pid(i, 1), pid(i, 2), zero()]
        })
    }

    /// The whole key/value sequence of the kv head that query head `i[1]` reads.
    fn kv_whole(&self) -> BlockSpecFn {
        let group = self.group() as i64;
        block_spec(
            [None, None, Some(self.kv_len), Some(self.head_dim)],
            move |i| vec![pid(i, 0), pid(i, 1) / group, zero(), zero()],
        )
    }

    /// The mask input's type, `[batch or 1, 1, q_len, kv_len]` f32, if there is one.
    fn mask_type(&self) -> Option<TensorType> {
        let batch = match self.mask? {
            ScoreMask::PerBatch => self.batch,
            ScoreMask::Shared => 1,
        };
        Some(TensorType::new(
            DType::F32,
            [batch, 1, self.q_len, self.kv_len],
        ))
    }

    /// The mask input, blocked `[rows, cols]` (both squeezed dims leading): the grid's
    /// first axis is the batch, `at` maps the program ids to the (row, col) block index.
    fn mask_input(
        &self,
        rows: u64,
        cols: u64,
        at: impl Fn(&[IndexExpr]) -> [IndexExpr; 2] + 'static,
    ) -> Option<(TensorType, BlockSpecFn)> {
        let per_batch = self.mask? == ScoreMask::PerBatch;
        let spec = block_spec([None, None, Some(rows), Some(cols)], move |i| {
            let [row, col] = at(i);
            let batch = if per_batch { pid(i, 0) } else { zero() };
            vec![batch, zero(), row, col]
        });
        Some((self.mask_type()?, spec))
    }

    /// The mask of one query block, `[block_q, kv_len]` (forward and dq kernels).
    fn mask_of_query_block(&self) -> Option<(TensorType, BlockSpecFn)> {
        self.mask_input(self.block_q, self.kv_len, |i| [pid(i, 2), zero()])
    }

    /// The forward kernel: `(q, k, v[, mask]) -> (o, lse)`.
    pub fn forward(self) -> Result<Kernel, BoxError> {
        let c = self;
        let launch = Launch {
            grid: c.q_grid().to_vec(),
            inputs: vec![
                (c.q_type(), c.q_block()),
                (c.kv_type(), c.kv_whole()),
                (c.kv_type(), c.kv_whole()),
            ],
            mask: c.mask_of_query_block(),
            outputs: vec![(c.q_type(), c.q_block()), (c.rows_type(), c.rows_block())],
            scratch: vec![],
        };
        match c.mask {
            None => launch.build(pallas_call(move |q, k, v, o, lse| {
                fwd::flash_attention_fwd(q, k, v, o, lse, None, c)
            })),
            Some(_) => launch.build(pallas_call(move |q, k, v, mask, o, lse| {
                fwd::flash_attention_fwd(q, k, v, o, lse, Some(mask), c)
            })),
        }
    }

    /// `(o, do) -> delta = rowsum(do * o)`.
    pub fn backward_delta(self) -> Result<Kernel, BoxError> {
        let c = self;
        Ok(
            pallas_call(move |o, d_o, delta| bwd::flash_attention_bwd_delta(o, d_o, delta, c))
                .grid(c.q_grid())
                .input(c.q_type(), c.q_block())
                .input(c.q_type(), c.q_block())
                .output(c.rows_type(), c.rows_block())
                .build()?,
        )
    }

    /// The backward kernels' inputs `(q, k, v, do, lse, delta)`: q, do, lse and delta
    /// blocked by `q_rows` (query rows of a block: `[block_q, d]`, or the group's heads),
    /// k and v by `kv_rows`.
    fn grads_inputs(
        &self,
        q_rows: impl Fn(u64) -> BlockSpecFn,
        kv_rows: impl Fn() -> BlockSpecFn,
    ) -> Vec<(TensorType, BlockSpecFn)> {
        let d = self.head_dim;
        vec![
            (self.q_type(), q_rows(d)),
            (self.kv_type(), kv_rows()),
            (self.kv_type(), kv_rows()),
            (self.q_type(), q_rows(d)),
            (self.rows_type(), q_rows(1)),
            (self.rows_type(), q_rows(1)),
        ]
    }

    /// `(q, k, v, do, lse, delta[, mask]) -> dq`.
    pub fn backward_dq(self) -> Result<Kernel, BoxError> {
        let c = self;
        let q_rows = |cols: u64| {
            block_spec([None, None, Some(c.block_q), Some(cols)], |i| {
                vec![pid(i, 0), pid(i, 1), pid(i, 2), zero()]
            })
        };
        let launch = Launch {
            grid: c.q_grid().to_vec(),
            inputs: c.grads_inputs(q_rows, || c.kv_whole()),
            mask: c.mask_of_query_block(),
            outputs: vec![(c.q_type(), c.q_block())],
            scratch: vec![],
        };
        match c.mask {
            None => launch.build(pallas_call(move |q, k, v, d_o, lse, delta, dq| {
                bwd::flash_attention_bwd_dq(q, k, v, d_o, lse, delta, dq, None, c)
            })),
            Some(_) => launch.build(pallas_call(move |q, k, v, d_o, lse, delta, mask, dq| {
                bwd::flash_attention_bwd_dq(q, k, v, d_o, lse, delta, dq, Some(mask), c)
            })),
        }
    }

    /// `(q, k, v, do, lse, delta[, mask]) -> (dk, dv)`, one program per (batch, kv head,
    /// key block).
    pub fn backward_dkdv(self) -> Result<Kernel, BoxError> {
        let c = self;
        let group = c.group();
        let q_group = |cols: u64| {
            block_spec([None, Some(group), Some(c.q_len), Some(cols)], |i| {
                vec![pid(i, 0), pid(i, 1), zero(), zero()]
            })
        };
        let kv_block = || {
            block_spec([None, None, Some(c.block_k), Some(c.head_dim)], |i| {
                vec![pid(i, 0), pid(i, 1), pid(i, 2), zero()]
            })
        };
        let launch = Launch {
            grid: vec![c.batch, c.kv_heads, c.kv_len.div_ceil(c.block_k)],
            inputs: c.grads_inputs(q_group, kv_block),
            mask: c.mask_input(c.q_len, c.block_k, |i| [zero(), pid(i, 2)]),
            outputs: vec![(c.kv_type(), kv_block()), (c.kv_type(), kv_block())],
            scratch: vec![],
        };
        match c.mask {
            None => launch.build(pallas_call(move |q, k, v, d_o, lse, delta, dk, dv| {
                bwd::flash_attention_bwd_dkdv(q, k, v, d_o, lse, delta, dk, dv, None, c)
            })),
            Some(_) => launch.build(pallas_call(
                move |q, k, v, d_o, lse, delta, mask, dk, dv| {
                    bwd::flash_attention_bwd_dkdv(q, k, v, d_o, lse, delta, dk, dv, Some(mask), c)
                },
            )),
        }
    }

    /// Whether the backward runs as one fused kernel ([`Self::backward_fused`]): the
    /// blocks tile both sequences, and there are at least two (batch, kv head) programs
    /// to share the cores (else the dq and dk/dv kernels, whose grids are finer).
    pub fn fuses_backward(&self) -> bool {
        self.q_len.is_multiple_of(self.block_q)
            && self.kv_len.is_multiple_of(self.block_k)
            && self.batch * self.kv_heads >= 2
    }

    /// `(q, k, v, do, lse, delta[, mask]) -> (dq, dk, dv)` in one pass, one program per
    /// (batch, kv head).
    pub fn backward_fused(self) -> Result<Kernel, BoxError> {
        let c = self;
        let group = c.group();
        let per_kv_head = |cols: u64| {
            block_spec([None, Some(group), Some(c.q_len), Some(cols)], |i| {
                vec![pid(i, 0), pid(i, 1), zero(), zero()]
            })
        };
        let kv_whole = || {
            block_spec([None, None, Some(c.kv_len), Some(c.head_dim)], |i| {
                vec![pid(i, 0), pid(i, 1), zero(), zero()]
            })
        };
        let acc = TensorType::new(DType::F32, [c.kv_len, c.head_dim]);
        let launch = Launch {
            grid: vec![c.batch, c.kv_heads],
            inputs: c.grads_inputs(per_kv_head, kv_whole),
            mask: c.mask_input(c.q_len, c.kv_len, |_| [zero(), zero()]),
            outputs: vec![
                (c.q_type(), per_kv_head(c.head_dim)),
                (c.kv_type(), kv_whole()),
                (c.kv_type(), kv_whole()),
            ],
            scratch: vec![acc.clone(), acc],
        };
        match c.mask {
            None => launch.build(pallas_call(
                move |q, k, v, d_o, lse, delta, dq, dk, dv, dk_acc, dv_acc| {
                    bwd::flash_attention_bwd_fused(
                        q, k, v, d_o, lse, delta, dq, dk, dv, dk_acc, dv_acc, None, c,
                    )
                },
            )),
            Some(_) => launch.build(pallas_call(
                move |q, k, v, d_o, lse, delta, mask, dq, dk, dv, dk_acc, dv_acc| {
                    bwd::flash_attention_bwd_fused(
                        q,
                        k,
                        v,
                        d_o,
                        lse,
                        delta,
                        dq,
                        dk,
                        dv,
                        dk_acc,
                        dv_acc,
                        Some(mask),
                        c,
                    )
                },
            )),
        }
    }

    fn qkv(&self, seed: u64) -> Result<Vec<Array>, BoxError> {
        Ok(vec![
            random_array(self.dtype, &self.q_type().shape, seed, 1.0)?,
            random_array(self.dtype, &self.kv_type().shape, seed + 1, 1.0)?,
            random_array(self.dtype, &self.kv_type().shape, seed + 2, 1.0)?,
        ])
    }

    /// A random score mask, if the config has one: about a quarter of the keys hidden
    /// (`-inf`), a tenth biased by -1, the rest 0, and the first query of the first entry
    /// seeing no key.
    fn random_mask(&self, seed: u64) -> Result<Option<Array>, BoxError> {
        let Some(ty) = self.mask_type() else {
            return Ok(None);
        };
        let noise = random_array(DType::F32, &ty.shape, seed, 1.0)?.try_to_f64("mask")?;
        let kv_len = self.kv_len as usize;
        let values = noise
            .iter()
            .enumerate()
            .map(|(at, &u)| match u {
                _ if at < kv_len => f32::NEG_INFINITY,
                u if u < -0.5 => f32::NEG_INFINITY,
                u if u < -0.3 => -1.0,
                _ => 0.0,
            })
            .collect();
        Ok(Some(Array::from_f32(DType::F32, ty.shape, values)?))
    }

    /// The inputs' score mask (the last input, when the config has one) as f64.
    fn mask_values(&self, inputs: &[Array]) -> Result<Option<Vec<f64>>, BoxError> {
        match (self.mask, inputs.last()) {
            (Some(_), Some(mask)) => Ok(Some(mask.try_to_f64("mask")?)),
            _ => Ok(None),
        }
    }
}

/// What a kernel launch declares, in order: grid, inputs, the mask input (if any, after
/// the inputs), outputs and scratch. As data, so one declaration serves the two bodies
/// of a kernel (with and without the mask ref), whose closure types differ.
struct Launch {
    grid: Vec<u64>,
    inputs: Vec<(TensorType, BlockSpecFn)>,
    mask: Option<(TensorType, BlockSpecFn)>,
    outputs: Vec<(TensorType, BlockSpecFn)>,
    scratch: Vec<TensorType>,
}

impl Launch {
    /// Declares everything on `call` (every grid axis parallel) and builds it.
    fn build<A, F: KernelBody<A>>(self, call: PallasCall<A, F>) -> Result<Kernel, BoxError> {
        let semantics = vec![DimSemantics::Parallel; self.grid.len()];
        let mut call = call.grid(self.grid).dimension_semantics(semantics);
        for (ty, spec) in self.inputs.into_iter().chain(self.mask) {
            call = call.input(ty, spec);
        }
        for (ty, spec) in self.outputs {
            call = call.output(ty, spec);
        }
        for ty in self.scratch {
            call = call.scratch(ty);
        }
        Ok(call.build()?)
    }
}

/// Whether some scores are masked (causal or sliding window). A function, not a method:
/// kernel code calls no methods on its compile-time parameters.
fn masked(c: AttentionConfig) -> bool {
    c.causal || c.window.is_some()
}

/// Whether a sliding window masks scores.
fn windowed(c: AttentionConfig) -> bool {
    c.window.is_some()
}

/// The f64 reference's forward results: `(o, lse, p)` with `p[b * heads + h]` the
/// `[q_len, kv_len]` probabilities.
pub type ReferenceForward = (Vec<f64>, Vec<f64>, Vec<Vec<f64>>);

/// Plain f64 attention: returns `(o, lse, p)` with `p[b][h]` the `[q_len, kv_len]`
/// probabilities; `mask` is the score mask's values when `c.mask` is set.
pub fn reference_forward(
    c: &AttentionConfig,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    mask: Option<&[f64]>,
) -> Result<ReferenceForward, AllocError> {
    let (sq, sk, d) = (c.q_len as usize, c.kv_len as usize, c.head_dim as usize);
    let mut o = zeros_f64("output", q.len())?;
    let mut lse = zeros_f64("lse", (c.batch * c.heads) as usize * sq)?;
    let mut probs = Vec::new();
    for b in 0..c.batch as usize {
        for h in 0..c.heads as usize {
            let hk = h / c.group() as usize;
            let qo = (b * c.heads as usize + h) * sq * d;
            let ko = (b * c.kv_heads as usize + hk) * sk * d;
            let mut p = zeros_f64("probabilities", sq.saturating_mul(sk))?;
            for i in 0..sq {
                let mut row: Vec<f64> = (0..sk)
                    .map(|j| {
                        if c.visible(i, j) {
                            c.capped(score(c, q, k, qo + i * d, ko + j * d)).0
                                + c.bias(mask, b, i, j)
                        } else {
                            f64::NEG_INFINITY
                        }
                    })
                    .collect();
                let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    // A query that sees no key (outside every window): output 0.
                    lse[(b * c.heads as usize + h) * sq + i] = m;
                    continue;
                }
                let sum: f64 = row.iter().map(|s| (s - m).exp()).sum();
                lse[(b * c.heads as usize + h) * sq + i] = m + sum.ln();
                for (j, s) in row.iter_mut().enumerate() {
                    *s = (*s - m).exp() / sum;
                    p[i * sk + j] = *s;
                }
                for t in 0..d {
                    o[qo + i * d + t] = (0..sk).map(|j| row[j] * v[ko + j * d + t]).sum();
                }
            }
            probs.push(p);
        }
    }
    Ok((o, lse, probs))
}

impl AttentionConfig {
    /// The score mask's value for batch entry `b`, query `i`, key `j` (0 without one).
    fn bias(&self, mask: Option<&[f64]>, b: usize, i: usize, j: usize) -> f64 {
        let (Some(kind), Some(mask)) = (self.mask, mask) else {
            return 0.0;
        };
        let entry = if kind == ScoreMask::PerBatch { b } else { 0 };
        let (sq, sk) = (self.q_len as usize, self.kv_len as usize);
        mask[(entry * sq + i) * sk + j]
    }
}

/// The scaled score of the query row starting at `q[qi]` and the key row at `k[kj]`.
fn score(c: &AttentionConfig, q: &[f64], k: &[f64], qi: usize, kj: usize) -> f64 {
    let d = c.head_dim as usize;
    (0..d).map(|t| q[qi + t] * k[kj + t]).sum::<f64>() * c.scale
}

/// Plain f64 attention gradients `(dq, dk, dv)` for output gradient `d_o` (`mask` as
/// for [`reference_forward`]).
pub fn reference_backward(
    c: &AttentionConfig,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    mask: Option<&[f64]>,
) -> Result<[Vec<f64>; 3], AllocError> {
    let (sq, sk, d) = (c.q_len as usize, c.kv_len as usize, c.head_dim as usize);
    let (o, _, probs) = reference_forward(c, q, k, v, mask)?;
    let mut dq = zeros_f64("dq", q.len())?;
    let mut dk = zeros_f64("dk", k.len())?;
    let mut dv = zeros_f64("dv", v.len())?;
    for b in 0..c.batch as usize {
        for h in 0..c.heads as usize {
            let hk = h / c.group() as usize;
            let qo = (b * c.heads as usize + h) * sq * d;
            let ko = (b * c.kv_heads as usize + hk) * sk * d;
            let p = &probs[b * c.heads as usize + h];
            for i in 0..sq {
                let delta: f64 = (0..d)
                    .map(|t| d_o[qo + i * d + t] * o[qo + i * d + t])
                    .sum();
                for j in 0..sk {
                    let pij = p[i * sk + j];
                    let dp: f64 = (0..d)
                        .map(|t| d_o[qo + i * d + t] * v[ko + j * d + t])
                        .sum();
                    let dcap = c.capped(score(c, q, k, qo + i * d, ko + j * d)).1;
                    let ds = pij * (dp - delta) * dcap * c.scale;
                    for t in 0..d {
                        dv[ko + j * d + t] += pij * d_o[qo + i * d + t];
                        dq[qo + i * d + t] += ds * k[ko + j * d + t];
                        dk[ko + j * d + t] += ds * q[qo + i * d + t];
                    }
                }
            }
        }
    }
    Ok([dq, dk, dv])
}

/// FlashAttention forward: `(q, k, v) -> (o, lse)`.
pub struct FlashAttention;

impl Op for FlashAttention {
    type Config = AttentionConfig;
    const NAME: &'static str = "flash_attention";
    const SUMMARY: &'static str =
        "softmax(q k^T * scale) v with causal, GQA and ragged lengths; also returns lse";
    const PARAMS: &'static [ParamDef] = PARAMS;
    const CASES: &'static [&'static str] = &[
        "heads=4,kv_heads=2,q_len=33,kv_len=47",
        "heads=2,kv_heads=1,q_len=20,kv_len=20,causal=true,dtype=bf16",
        "heads=2,kv_heads=1,q_len=30,kv_len=30,causal=true,window=7,softcap=5",
        "batch=2,heads=2,kv_heads=1,q_len=20,kv_len=27,causal=true,mask=batch",
    ];
    const TUNABLE: &'static [Tunable] = TUNABLE;

    fn config(p: &Params) -> Result<AttentionConfig, BoxError> {
        AttentionConfig::from_params(p)
    }

    fn build(c: &Self::Config) -> Result<Vec<Kernel>, BoxError> {
        Ok(vec![c.forward()?])
    }

    /// `(q, k, v[, mask])`.
    fn inputs(c: &Self::Config, seed: u64) -> Result<Vec<Array>, BoxError> {
        let mut inputs = c.qkv(seed)?;
        inputs.extend(c.random_mask(seed + 4)?);
        Ok(inputs)
    }

    fn reference(c: &Self::Config, inputs: &[Array]) -> Result<Vec<Vec<f64>>, BoxError> {
        let (o, lse, _) = reference_forward(
            c,
            &inputs[0].try_to_f64("q")?,
            &inputs[1].try_to_f64("k")?,
            &inputs[2].try_to_f64("v")?,
            c.mask_values(inputs)?.as_deref(),
        )?;
        Ok(vec![o, lse])
    }

    fn tolerance(c: &Self::Config) -> Tolerance {
        tolerance_for(c.dtype, c.head_dim)
    }

    /// Two dots over the (query, key) pairs the masks leave visible.
    fn flops(c: &Self::Config) -> f64 {
        4.0 * (c.batch * c.heads * c.head_dim) as f64 * c.visible_pairs() as f64
    }
}

/// FlashAttention backward: `(q, k, v, do) -> (dq, dk, dv)`; runs the forward for `o`
/// and `lse` (unless the caller passes them), then the delta, dq and dk/dv kernels.
pub struct FlashAttentionBwd;

impl Op for FlashAttentionBwd {
    type Config = AttentionConfig;
    const NAME: &'static str = "flash_attention_bwd";
    const SUMMARY: &'static str =
        "gradients (dq, dk, dv) of flash_attention for an output gradient do";
    const PARAMS: &'static [ParamDef] = PARAMS;
    const CASES: &'static [&'static str] = &[
        "heads=4,kv_heads=2,q_len=33,kv_len=47",
        "heads=2,kv_heads=2,q_len=40,kv_len=40,causal=true",
        "batch=2,heads=2,kv_heads=2,q_len=19,kv_len=24,softcap=3,mask=shared",
    ];
    const TUNABLE: &'static [Tunable] = TUNABLE;

    fn config(p: &Params) -> Result<AttentionConfig, BoxError> {
        AttentionConfig::from_params(p)
    }

    fn build(c: &Self::Config) -> Result<Vec<Kernel>, BoxError> {
        let mut kernels = vec![c.forward()?, c.backward_delta()?];
        if c.fuses_backward() {
            kernels.push(c.backward_fused()?);
        } else {
            kernels.extend([c.backward_dq()?, c.backward_dkdv()?]);
        }
        Ok(kernels)
    }

    /// `(q, k, v, do[, mask])`.
    fn inputs(c: &Self::Config, seed: u64) -> Result<Vec<Array>, BoxError> {
        let mut v = c.qkv(seed)?;
        v.push(random_array(c.dtype, &c.q_type().shape, seed + 3, 1.0)?);
        v.extend(c.random_mask(seed + 4)?);
        Ok(v)
    }

    /// What `run` does, as a chain: the forward unless `o` and `lse` are given (`q, k, v,
    /// do[, o, lse][, mask]`); `delta` from `(o, do)`; then `(q, k, v, do, lse,
    /// delta[, mask]) -> (dq, dk, dv)` by the fused kernel, or by the dq and dk/dv kernels.
    fn chain(c: &Self::Config, inputs: usize) -> Option<Chain> {
        let output = Source::output;
        let masks = usize::from(c.mask.is_some());
        let mask = (masks == 1).then(|| Source::Input(inputs - 1));
        let [q, k, v, d_o] = [0, 1, 2, 3].map(Source::Input);
        let mut steps = Vec::new();
        let (o, lse) = match inputs.checked_sub(masks)? {
            6 => (Source::Input(4), Source::Input(5)),
            4 => {
                steps.push(Step {
                    kernel: 0,
                    inputs: [q, k, v].into_iter().chain(mask).collect(),
                });
                (output(0, 0), output(0, 1))
            }
            _ => return None,
        };
        steps.push(Step {
            kernel: 1,
            inputs: vec![o, d_o],
        });
        let delta = output(steps.len() - 1, 0);
        let grads_in: Vec<Source> = [q, k, v, d_o, lse, delta].into_iter().chain(mask).collect();
        let first = steps.len();
        steps.push(Step {
            kernel: 2,
            inputs: grads_in.clone(),
        });
        let outputs = if c.fuses_backward() {
            (0..3).map(|i| output(first, i)).collect()
        } else {
            steps.push(Step {
                kernel: 3,
                inputs: grads_in,
            });
            vec![output(first, 0), output(first + 1, 0), output(first + 1, 1)]
        };
        Some(Chain {
            reads: Vec::new(),
            steps,
            outputs,
        })
    }

    /// Takes `(q, k, v, do)` and runs the forward for `o` and `lse`, or `(q, k, v, do, o,
    /// lse)` with the forward's results saved by the caller (autograd does); the score
    /// mask, when the config has one, comes last.
    fn run(c: &Self::Config, inputs: &[Array], exec: &mut Exec) -> Result<Vec<Array>, BoxError> {
        let (inputs, mask) = match (c.mask, inputs.split_last()) {
            (Some(_), Some((mask, rest))) => (rest, Some(mask.clone())),
            _ => (inputs, None),
        };
        let (q, k, v, d_o, fwd) = match inputs {
            [q, k, v, d_o] => {
                let fwd_in: Vec<Array> =
                    [q, k, v].into_iter().cloned().chain(mask.clone()).collect();
                let fwd = exec(&*built(AttentionConfig::forward, *c)?, &fwd_in)?;
                (q, k, v, d_o, fwd)
            }
            [q, k, v, d_o, o, lse] => (q, k, v, d_o, vec![o.clone(), lse.clone()]),
            _ => {
                return Err(format!(
                "flash_attention_bwd takes (q, k, v, do) or (q, k, v, do, o, lse){}, got {} inputs",
                if c.mask.is_some() {
                    " then the mask"
                } else {
                    ""
                },
                inputs.len() + usize::from(mask.is_some())
            )
                .into())
            }
        };
        let (o, lse) = (&fwd[0], &fwd[1]);
        let delta = exec(
            &*built(AttentionConfig::backward_delta, *c)?,
            &[o.clone(), d_o.clone()],
        )?
        .remove(0);
        let grads_in: Vec<Array> = [q, k, v, d_o, lse]
            .into_iter()
            .cloned()
            .chain([delta])
            .chain(mask)
            .collect();
        if c.fuses_backward() {
            return exec(&*built(AttentionConfig::backward_fused, *c)?, &grads_in);
        }
        let dq = exec(&*built(AttentionConfig::backward_dq, *c)?, &grads_in)?.remove(0);
        let mut dkdv = exec(&*built(AttentionConfig::backward_dkdv, *c)?, &grads_in)?;
        let dv = dkdv.remove(1);
        let dk = dkdv.remove(0);
        Ok(vec![dq, dk, dv])
    }

    fn reference(c: &Self::Config, inputs: &[Array]) -> Result<Vec<Vec<f64>>, BoxError> {
        let f: Vec<Vec<f64>> = ["q", "k", "v", "do"]
            .iter()
            .zip(inputs)
            .map(|(name, a)| a.try_to_f64(name))
            .collect::<Result<_, _>>()?;
        let mask = c.mask_values(inputs)?;
        Ok(reference_backward(c, &f[0], &f[1], &f[2], &f[3], mask.as_deref())?.to_vec())
    }

    fn tolerance(c: &Self::Config) -> Tolerance {
        if c.dtype == DType::BF16 {
            Tolerance {
                abs: 6e-2,
                rel: 5e-2,
            }
        } else {
            tolerance_for(DType::F32, c.q_len.max(c.kv_len) * c.head_dim)
        }
    }

    fn flops(c: &Self::Config) -> f64 {
        FlashAttention::flops(c) * 3.5
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flop count's pair count agrees with the reference's visibility rule.
    #[test]
    fn visible_pairs_count_what_the_reference_sees() {
        for (q_len, kv_len) in [(1, 1), (7, 3), (3, 7), (40, 40)] {
            for causal in [false, true] {
                for window in [None, Some(0), Some(2), Some(100)] {
                    let pairs = [
                        ("q_len", q_len.to_string()),
                        ("kv_len", kv_len.to_string()),
                        ("causal", causal.to_string()),
                        (
                            "window",
                            window.map_or("none".into(), |w: u64| w.to_string()),
                        ),
                    ];
                    let pairs: Vec<(&str, &str)> =
                        pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    let c = AttentionConfig::from_params(&Params::with(PARAMS, &pairs).unwrap())
                        .unwrap();
                    let brute = (0..q_len as usize)
                        .flat_map(|i| (0..kv_len as usize).map(move |j| (i, j)))
                        .filter(|&(i, j)| c.visible(i, j))
                        .count() as u64;
                    assert_eq!(c.visible_pairs(), brute, "{pairs:?}");
                }
            }
        }
    }
}
