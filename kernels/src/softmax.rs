//! Row softmax: one block of rows per program, the whole row in the block.

use kernel_ir::dsl::prelude::*;
use kernel_ir::Array;
use kernel_macros::kernel;

use crate::common::{block, pid, random_array, room_f64, tolerance_for, zero};
use crate::torch_op::{row_plan, Args, OpSpec, Out, ROWS};
use crate::{BoxError, Kind, Op, ParamDef, Params, Tolerance, Tunable};

/// Shape and blocking of a row-wise kernel (softmax, norms).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SoftmaxConfig {
    /// Rows.
    pub rows: u64,
    /// Columns (reduced over).
    pub cols: u64,
    /// Rows per block (clamped to `rows`).
    pub block_rows: u64,
    /// Element type; math is f32.
    pub dtype: DType,
}

/// `o = softmax(x)` over the last axis, numerically stable.
#[kernel]
fn softmax(x: Ref, o: Ref, #[comptime] c: SoftmaxConfig) {
    // Rows are independent: an edge block's overhang needs no mask.
    let v = x.read().cast(DType::F32);
    let e = (v - v.max_keepdims(1)).exp();
    // One division per row, then a multiply per element (a vector divide costs ~10x).
    let inv = full([c.block_rows, 1], 1.0, DType::F32) / e.sum_keepdims(1);
    o.write((e * inv).cast(c.dtype));
}

impl SoftmaxConfig {
    /// Reads `rows, cols, block_rows, dtype`.
    pub fn from_params(p: &Params) -> Result<Self, BoxError> {
        let rows = p.dim("rows")?;
        Ok(SoftmaxConfig {
            rows,
            cols: p.dim("cols")?,
            block_rows: block(rows, p.dim("block_rows")?),
            dtype: p.dtype("dtype", &[DType::F32, DType::BF16, DType::F16])?,
        })
    }

    /// The kernel for this configuration.
    pub fn kernel(self) -> Result<Kernel, BoxError> {
        let c = self;
        let ty = TensorType::new(c.dtype, [c.rows, c.cols]);
        Ok(pallas_call(move |x, o| softmax(x, o, c))
            .grid([c.rows.div_ceil(c.block_rows)])
            .input(
                ty.clone(),
                block_spec([c.block_rows, c.cols], |i| vec![pid(i, 0), zero()]),
            )
            .output(
                ty,
                block_spec([c.block_rows, c.cols], |i| vec![pid(i, 0), zero()]),
            )
            .build()?)
    }
}

/// Row-wise parameters shared by softmax and the norms.
pub(crate) const ROW_PARAMS: &[ParamDef] = &[
    ParamDef {
        name: "rows",
        kind: Kind::Dim,
        default: "512",
        help: "rows",
    },
    ParamDef {
        name: "cols",
        kind: Kind::Dim,
        default: "1024",
        help: "columns (the reduced axis)",
    },
    ParamDef {
        name: "block_rows",
        kind: Kind::Dim,
        default: "8",
        help: "rows per block",
    },
    ParamDef {
        name: "dtype",
        kind: Kind::DType,
        default: "f32",
        help: "f32, bf16 or f16 (f32 math)",
    },
];

/// Row blocks the tuner tries (softmax and the norms).
pub(crate) const ROW_TUNABLE: &[Tunable] = &[Tunable {
    name: "block_rows",
    values: &[1, 2, 4, 8, 16, 32, 64],
    tiles: &["rows"],
}];

/// `softmax(x)` along the last axis.
pub struct Softmax;

impl Op for Softmax {
    type Config = SoftmaxConfig;
    const NAME: &'static str = "softmax";
    const SUMMARY: &'static str = "softmax over the last axis of a [rows, cols] array";
    const PARAMS: &'static [ParamDef] = ROW_PARAMS;
    const CASES: &'static [&'static str] = &["rows=13,cols=70"];
    const TUNABLE: &'static [Tunable] = ROW_TUNABLE;

    fn config(p: &Params) -> Result<SoftmaxConfig, BoxError> {
        SoftmaxConfig::from_params(p)
    }

    fn build(c: &Self::Config) -> Result<Vec<Kernel>, BoxError> {
        Ok(vec![c.kernel()?])
    }

    fn inputs(c: &Self::Config, seed: u64) -> Result<Vec<Array>, BoxError> {
        Ok(vec![random_array(c.dtype, &[c.rows, c.cols], seed, 4.0)?])
    }

    fn reference(c: &Self::Config, inputs: &[Array]) -> Result<Vec<Vec<f64>>, BoxError> {
        let x = inputs[0].try_to_f64("x")?;
        let mut out = room_f64("output", x.len())?;
        for row in x.chunks(c.cols as usize) {
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
            out.extend(row.iter().map(|v| (v - m).exp() / s));
        }
        Ok(vec![out])
    }

    fn tolerance(c: &Self::Config) -> Tolerance {
        tolerance_for(c.dtype, 1)
    }

    fn flops(c: &Self::Config) -> f64 {
        5.0 * (c.rows * c.cols) as f64
    }
}

/// `torch.ops.tessera.softmax`.
pub(crate) const TORCH_OP: OpSpec = OpSpec {
    schema: "softmax(Tensor x) -> Tensor",
    doc: "Softmax of `x` over its last dimension (float32, bfloat16 or float16; any \
          leading dims), computed in float32.",
    outputs: &[Out::like(0)],
    returns: 1,
    splits: ROWS,
    plan: |values| {
        let x = Args::new(values).tensor("x")?.min_rank(1)?;
        Ok(row_plan("softmax", &[x], &[], None))
    },
};
