//! Rotary position embedding in the Llama ("rotate half") layout:
//! `o = x * cos + rotate_half(x) * sin`, `rotate_half([x1, x2]) = [-x2, x1]`.

use kernel_ir::dsl::prelude::*;
use kernel_ir::{try_with_capacity, Array};
use kernel_macros::{kernel, kernel_fn};

use crate::common::{block, pid, random_array, tolerance_for, zero, zeros_f64};
use crate::torch_op::{py_shape, Args, Axis, OpSpec, Out, Placement, Plan, Split};
use crate::{BoxError, Kind, Op, ParamDef, ParamValue, Params, Tolerance, Tunable};

/// Shapes of a RoPE call: x is `[batch, heads, seq, head_dim]`, cos/sin `[seq, head_dim]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    /// Batch.
    pub batch: u64,
    /// Heads.
    pub heads: u64,
    /// Sequence length.
    pub seq: u64,
    /// Head dim (even).
    pub head_dim: u64,
    /// Positions per block (clamped).
    pub block_seq: u64,
    /// Element type; math is f32.
    pub dtype: DType,
}

/// Columns `[col0, col0 + cols)` of the block, in f32. Positions are independent, so an
/// edge block's rows past the sequence need no mask (their writes are dropped).
#[kernel_fn]
fn load_half(r: Ref, col0: u64, cols: u64) -> Tensor {
    r.load(s![.., ds(col0, cols)]).cast(DType::F32)
}

#[kernel]
fn rope(x: Ref, cos: Ref, sin: Ref, o: Ref, #[comptime] c: RopeConfig) {
    let half = c.head_dim / 2;
    let (x1, x2) = (load_half(x, 0, half), load_half(x, half, half));
    let (c1, c2) = (load_half(cos, 0, half), load_half(cos, half, half));
    let (s1, s2) = (load_half(sin, 0, half), load_half(sin, half, half));
    o.store(s![.., ds(0, half)], (x1 * c1 - x2 * s1).cast(c.dtype));
    o.store(s![.., ds(half, half)], (x2 * c2 + x1 * s2).cast(c.dtype));
}

impl RopeConfig {
    /// Reads `batch, heads, seq, head_dim, block_seq, dtype`.
    pub fn from_params(p: &Params) -> Result<Self, BoxError> {
        let seq = p.dim("seq")?;
        let head_dim = p.dim("head_dim")?;
        if head_dim % 2 != 0 {
            return Err(format!("`head_dim` must be even for RoPE, got {head_dim}").into());
        }
        Ok(RopeConfig {
            batch: p.dim("batch")?,
            heads: p.dim("heads")?,
            seq,
            head_dim,
            block_seq: block(seq, p.dim("block_seq")?),
            dtype: p.dtype("dtype", &[DType::F32, DType::BF16, DType::F16])?,
        })
    }

    /// The kernel for this configuration.
    pub fn kernel(self) -> Result<Kernel, BoxError> {
        let c = self;
        let x_ty = TensorType::new(c.dtype, [c.batch, c.heads, c.seq, c.head_dim]);
        let table = TensorType::new(c.dtype, [c.seq, c.head_dim]);
        let x_spec = || {
            block_spec([None, None, Some(c.block_seq), Some(c.head_dim)], |i| {
                vec![pid(i, 0), pid(i, 1), pid(i, 2), zero()]
            })
        };
        let t_spec = || block_spec([c.block_seq, c.head_dim], |i| vec![pid(i, 2), zero()]);
        Ok(pallas_call(move |x, cos, sin, o| rope(x, cos, sin, o, c))
            .grid([c.batch, c.heads, c.seq.div_ceil(c.block_seq)])
            .input(x_ty.clone(), x_spec())
            .input(table.clone(), t_spec())
            .input(table, t_spec())
            .output(x_ty, x_spec())
            .build()?)
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
        default: "8",
        help: "heads",
    },
    ParamDef {
        name: "seq",
        kind: Kind::Dim,
        default: "512",
        help: "sequence length",
    },
    ParamDef {
        name: "head_dim",
        kind: Kind::Dim,
        default: "64",
        help: "head dim (even)",
    },
    ParamDef {
        name: "block_seq",
        kind: Kind::Dim,
        default: "128",
        help: "positions per block",
    },
    ParamDef {
        name: "dtype",
        kind: Kind::DType,
        default: "f32",
        help: "f32, bf16 or f16 (f32 math)",
    },
];

/// Position blocks the tuner tries.
const TUNABLE: &[Tunable] = &[Tunable {
    name: "block_seq",
    values: &[16, 32, 64, 128, 256, 512],
    tiles: &["seq"],
}];

/// Rotary embedding of `[batch, heads, seq, head_dim]` activations.
pub struct Rope;

impl Op for Rope {
    type Config = RopeConfig;
    const NAME: &'static str = "rope";
    const SUMMARY: &'static str =
        "rotary embedding, Llama rotate-half layout, x: [batch, heads, seq, head_dim]";
    const PARAMS: &'static [ParamDef] = PARAMS;
    const CASES: &'static [&'static str] = &["batch=2,heads=3,seq=11,head_dim=8"];
    const TUNABLE: &'static [Tunable] = TUNABLE;

    fn config(p: &Params) -> Result<RopeConfig, BoxError> {
        RopeConfig::from_params(p)
    }

    fn build(c: &Self::Config) -> Result<Vec<Kernel>, BoxError> {
        Ok(vec![c.kernel()?])
    }

    fn inputs(c: &Self::Config, seed: u64) -> Result<Vec<Array>, BoxError> {
        // Real rotary tables: position t, frequency 10000^(-2i/d).
        let (s, d) = (c.seq as usize, c.head_dim as usize);
        let mut cos = try_with_capacity(|| "the cos table".into(), (s * d) as u64)?;
        let mut sin = try_with_capacity(|| "the sin table".into(), (s * d) as u64)?;
        for t in 0..s {
            for j in 0..d {
                let freq = 10000f64.powf(-2.0 * (j % (d / 2)) as f64 / d as f64);
                cos.push((t as f64 * freq).cos() as f32);
                sin.push((t as f64 * freq).sin() as f32);
            }
        }
        Ok(vec![
            random_array(c.dtype, &[c.batch, c.heads, c.seq, c.head_dim], seed, 2.0)?,
            Array::from_f32(c.dtype, [c.seq, c.head_dim], cos)?,
            Array::from_f32(c.dtype, [c.seq, c.head_dim], sin)?,
        ])
    }

    fn reference(c: &Self::Config, inputs: &[Array]) -> Result<Vec<Vec<f64>>, BoxError> {
        let x = inputs[0].try_to_f64("x")?;
        let (cos, sin) = (inputs[1].try_to_f64("cos")?, inputs[2].try_to_f64("sin")?);
        let (s, d, half) = (c.seq as usize, c.head_dim as usize, c.head_dim as usize / 2);
        let mut out = zeros_f64("output", x.len())?;
        for (r, row) in x.chunks(d).enumerate() {
            let t = r % s;
            for j in 0..d {
                let rotated = if j < half {
                    -row[j + half]
                } else {
                    row[j - half]
                };
                out[r * d + j] = row[j] * cos[t * d + j] + rotated * sin[t * d + j];
            }
        }
        Ok(vec![out])
    }

    fn tolerance(c: &Self::Config) -> Tolerance {
        tolerance_for(c.dtype, 2)
    }

    fn flops(c: &Self::Config) -> f64 {
        3.0 * (c.batch * c.heads * c.seq * c.head_dim) as f64
    }
}

/// `torch.ops.tessera.rope`.
pub(crate) const TORCH_OP: OpSpec = OpSpec {
    schema: "rope(Tensor x, Tensor cos, Tensor sin) -> Tensor",
    doc: "Rotary embedding (rotate-half, as Llama): `x * cos + rotate_half(x) * sin` for \
          `x [batch, heads, seq, head_dim]` (even head_dim) and tables `[seq, head_dim]`.",
    outputs: &[Out::like(0)],
    returns: 1,
    splits: &[
        Split {
            name: "batch",
            args: &[("x", Axis::Dim(0))],
            outputs: &[Placement::Dim(0)],
            divides: &[],
            even: false,
        },
        Split {
            name: "heads",
            args: &[("x", Axis::Dim(1))],
            outputs: &[Placement::Dim(1)],
            divides: &[],
            even: false,
        },
    ],
    plan: |values| {
        let mut a = Args::new(values);
        let x = a.tensor("x")?.rank(4)?;
        let (b, h, s, d) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
        let mut tables = vec![];
        for name in ["cos", "sin"] {
            let t = a.tensor(name)?.rank(2)?.same_dtype(&x)?;
            if t.shape != [s, d] {
                return Err(format!(
                    "{name}: expected shape {}, got {}",
                    py_shape(&[s, d]),
                    py_shape(&t.shape)
                ));
            }
            tables.push(t.operand());
        }
        if d % 2 == 1 {
            return Err(format!(
                "x: rotary embedding needs an even head_dim, got {d}"
            ));
        }
        let mut inputs = vec![x.operand()];
        inputs.extend(tables);
        Ok(Plan {
            kernel: "rope",
            params: vec![
                ("batch", ParamValue::Int(b)),
                ("heads", ParamValue::Int(h)),
                ("seq", ParamValue::Int(s)),
                ("head_dim", ParamValue::Int(d)),
                ("dtype", ParamValue::DType(x.dtype)),
            ],
            inputs,
            outputs: vec![x.shape.clone()],
            launch: x.numel() > 0,
            check_indices: None,
        })
    },
};
