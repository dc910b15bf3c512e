//! RMSNorm and LayerNorm over the last axis, one block of rows per program.

use kernel_ir::dsl::prelude::*;
use kernel_ir::Array;
use kernel_macros::kernel;

use crate::common::{block, pid, random_array, room_f64, tolerance_for, zero};
use crate::softmax::{ROW_PARAMS, ROW_TUNABLE};
use crate::torch_op::{row_plan, Args, OpSpec, Out, Plan, Value, ROWS};
use crate::{BoxError, Kind, Op, ParamDef, Params, Tolerance, Tunable};

/// Shape, blocking and epsilon of a norm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NormConfig {
    /// Rows.
    pub rows: u64,
    /// Columns (normalised over).
    pub cols: u64,
    /// Rows per block (clamped to `rows`).
    pub block_rows: u64,
    /// Element type; math is f32.
    pub dtype: DType,
    /// Added to the variance.
    pub eps: f64,
}

/// `o = x / sqrt(mean(x^2) + eps) * w`.
#[kernel]
fn rms_norm(x: Ref, w: Ref, o: Ref, #[comptime] c: NormConfig) {
    // Rows are independent: an edge block's rows past the array are computed on
    // unspecified values and their writes dropped.
    let v = x.read().cast(DType::F32);
    let inv = ((v * v).sum_keepdims(1) / c.cols as f64 + c.eps).rsqrt();
    o.write((v * inv * w.read().cast(DType::F32)).cast(c.dtype));
}

/// `o = (x - mean) / sqrt(var + eps) * w + b`.
#[kernel]
fn layer_norm(x: Ref, w: Ref, b: Ref, o: Ref, #[comptime] c: NormConfig) {
    let v = x.read().cast(DType::F32);
    let centered = v - v.sum_keepdims(1) / c.cols as f64;
    let var = (centered * centered).sum_keepdims(1) / c.cols as f64;
    let y =
        centered * (var + c.eps).rsqrt() * w.read().cast(DType::F32) + b.read().cast(DType::F32);
    o.write(y.cast(c.dtype));
}

const NORM_PARAMS: &[ParamDef] = &[
    ROW_PARAMS[0],
    ROW_PARAMS[1],
    ROW_PARAMS[2],
    ROW_PARAMS[3],
    ParamDef {
        name: "eps",
        kind: Kind::FloatOpt,
        default: "1e-5",
        help: "added to the variance",
    },
];

impl NormConfig {
    /// Reads `rows, cols, block_rows, dtype, eps`.
    pub fn from_params(p: &Params) -> Result<Self, BoxError> {
        let rows = p.dim("rows")?;
        Ok(NormConfig {
            rows,
            cols: p.dim("cols")?,
            block_rows: block(rows, p.dim("block_rows")?),
            dtype: p.dtype("dtype", &[DType::F32, DType::BF16, DType::F16])?,
            eps: p.float_opt("eps")?.unwrap_or(1e-5),
        })
    }

    fn call<A, F: kernel_ir::dsl::KernelBody<A>>(
        self,
        body: F,
        vectors: usize,
    ) -> Result<Kernel, BoxError> {
        let c = self;
        let ty = TensorType::new(c.dtype, [c.rows, c.cols]);
        let mut call = pallas_call(body)
            .grid([c.rows.div_ceil(c.block_rows)])
            .input(
                ty.clone(),
                block_spec([c.block_rows, c.cols], |i| vec![pid(i, 0), zero()]),
            );
        for _ in 0..vectors {
            call = call.input(
                TensorType::new(c.dtype, [c.cols]),
                block_spec([c.cols], |_| vec![zero()]),
            );
        }
        Ok(call
            .output(
                ty,
                block_spec([c.block_rows, c.cols], |i| vec![pid(i, 0), zero()]),
            )
            .build()?)
    }

    fn inputs(self, vectors: usize, seed: u64) -> Result<Vec<Array>, BoxError> {
        let mut out = vec![random_array(
            self.dtype,
            &[self.rows, self.cols],
            seed,
            2.0,
        )?];
        for v in 0..vectors {
            out.push(random_array(
                self.dtype,
                &[self.cols],
                seed + 1 + v as u64,
                1.0,
            )?);
        }
        Ok(out)
    }
}

/// Reference norm: `scale_shift(row, normalised row) -> output row`.
fn reference_norm(inputs: &[Array], c: &NormConfig, center: bool) -> Result<Vec<f64>, BoxError> {
    let x = inputs[0].try_to_f64("x")?;
    let w = inputs[1].try_to_f64("weight")?;
    let b = inputs.get(2).map(|b| b.try_to_f64("bias")).transpose()?;
    let n = c.cols as f64;
    let mut out = room_f64("output", x.len())?;
    for row in x.chunks(c.cols as usize) {
        let mean = if center {
            row.iter().sum::<f64>() / n
        } else {
            0.0
        };
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        let inv = 1.0 / (var + c.eps).sqrt();
        for (j, v) in row.iter().enumerate() {
            out.push((v - mean) * inv * w[j] + b.as_ref().map_or(0.0, |b| b[j]));
        }
    }
    Ok(out)
}

/// RMSNorm with a learned scale.
pub struct RmsNorm;

impl Op for RmsNorm {
    type Config = NormConfig;
    const NAME: &'static str = "rms_norm";
    const SUMMARY: &'static str = "x / sqrt(mean(x^2) + eps) * w over the last axis";
    const PARAMS: &'static [ParamDef] = NORM_PARAMS;
    const CASES: &'static [&'static str] = &["rows=9,cols=33"];
    const TUNABLE: &'static [Tunable] = ROW_TUNABLE;

    fn config(p: &Params) -> Result<NormConfig, BoxError> {
        NormConfig::from_params(p)
    }

    fn build(c: &Self::Config) -> Result<Vec<Kernel>, BoxError> {
        let c = *c;
        Ok(vec![c.call(move |x, w, o| rms_norm(x, w, o, c), 1)?])
    }

    fn inputs(c: &Self::Config, seed: u64) -> Result<Vec<Array>, BoxError> {
        c.inputs(1, seed)
    }

    fn reference(c: &Self::Config, inputs: &[Array]) -> Result<Vec<Vec<f64>>, BoxError> {
        Ok(vec![reference_norm(inputs, c, false)?])
    }

    fn tolerance(c: &Self::Config) -> Tolerance {
        tolerance_for(c.dtype, 4)
    }

    fn flops(c: &Self::Config) -> f64 {
        4.0 * (c.rows * c.cols) as f64
    }
}

/// LayerNorm with a learned scale and shift.
pub struct LayerNorm;

impl Op for LayerNorm {
    type Config = NormConfig;
    const NAME: &'static str = "layer_norm";
    const SUMMARY: &'static str = "(x - mean) / sqrt(var + eps) * w + b over the last axis";
    const PARAMS: &'static [ParamDef] = NORM_PARAMS;
    const CASES: &'static [&'static str] = &["rows=9,cols=33,dtype=bf16"];
    const TUNABLE: &'static [Tunable] = ROW_TUNABLE;

    fn config(p: &Params) -> Result<NormConfig, BoxError> {
        NormConfig::from_params(p)
    }

    fn build(c: &Self::Config) -> Result<Vec<Kernel>, BoxError> {
        let c = *c;
        Ok(vec![c.call(move |x, w, b, o| layer_norm(x, w, b, o, c), 2)?])
    }

    fn inputs(c: &Self::Config, seed: u64) -> Result<Vec<Array>, BoxError> {
        c.inputs(2, seed)
    }

    fn reference(c: &Self::Config, inputs: &[Array]) -> Result<Vec<Vec<f64>>, BoxError> {
        Ok(vec![reference_norm(inputs, c, true)?])
    }

    fn tolerance(c: &Self::Config) -> Tolerance {
        tolerance_for(c.dtype, 4)
    }

    fn flops(c: &Self::Config) -> f64 {
        7.0 * (c.rows * c.cols) as f64
    }
}

/// `torch.ops.tessera.rms_norm`.
pub(crate) const RMS_NORM_OP: OpSpec = OpSpec {
    schema: "rms_norm(Tensor x, Tensor weight, float eps=1e-05) -> Tensor",
    doc: "RMSNorm of `x` over its last dimension: `x / sqrt(mean(x^2) + eps) * weight`, \
          with `weight` of `[x.shape[-1]]` in `x`'s dtype; computed in float32.",
    outputs: &[Out::like(0)],
    returns: 1,
    splits: ROWS,
    plan: |values| norm_plan("rms_norm", values, &["weight"]),
};

/// `torch.ops.tessera.layer_norm`.
pub(crate) const LAYER_NORM_OP: OpSpec = OpSpec {
    schema: "layer_norm(Tensor x, Tensor weight, Tensor bias, float eps=1e-05) -> Tensor",
    doc: "LayerNorm of `x` over its last dimension with `weight` and `bias` of \
          `[x.shape[-1]]` in `x`'s dtype; computed in float32.",
    outputs: &[Out::like(0)],
    returns: 1,
    splits: ROWS,
    plan: |values| norm_plan("layer_norm", values, &["weight", "bias"]),
};

/// A norm's plan: `x`, then the `[cols]` parameter vectors named `vectors` (in `x`'s
/// dtype), then `eps`.
fn norm_plan(
    kernel: &'static str,
    values: &[Value],
    vectors: &[&'static str],
) -> Result<Plan, String> {
    let mut a = Args::new(values);
    let x = a.tensor("x")?.min_rank(1)?;
    let cols = *x.shape.last().unwrap_or(&0);
    let vectors = vectors
        .iter()
        .map(|name| a.tensor(name)?.vector(&x, cols))
        .collect::<Result<Vec<_>, _>>()?;
    let eps = a.float("eps")?;
    Ok(row_plan(kernel, &[x], &vectors, eps))
}
