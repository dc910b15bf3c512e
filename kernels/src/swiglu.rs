//! SwiGLU: `silu(a) * b`, fused, over 2-D tiles.

use kernel_ir::dsl::prelude::*;
use kernel_ir::Array;
use kernel_macros::kernel;

use crate::common::{block, pid, random_array, tolerance_for};
use crate::torch_op::{row_plan, Args, Axis, OpSpec, Out, Placement, Split};
use crate::{BoxError, Kind, Op, ParamDef, Params, Tolerance, Tunable};

/// Shape and tiling of a SwiGLU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SwigluConfig {
    /// Rows.
    pub rows: u64,
    /// Columns.
    pub cols: u64,
    /// Tile rows (clamped).
    pub block_rows: u64,
    /// Tile columns (clamped).
    pub block_cols: u64,
    /// Element type; math is f32.
    pub dtype: DType,
}

/// `o = a * sigmoid(a) * b`.
#[kernel]
fn swiglu(a: Ref, b: Ref, o: Ref, #[comptime] c: SwigluConfig) {
    // Element-wise: edge blocks need no mask.
    let (x, g) = (a.read().cast(DType::F32), b.read().cast(DType::F32));
    o.write((x * x.sigmoid() * g).cast(c.dtype));
}

impl SwigluConfig {
    /// Reads `rows, cols, block_rows, block_cols, dtype`.
    pub fn from_params(p: &Params) -> Result<Self, BoxError> {
        let (rows, cols) = (p.dim("rows")?, p.dim("cols")?);
        Ok(SwigluConfig {
            rows,
            cols,
            block_rows: block(rows, p.dim("block_rows")?),
            block_cols: block(cols, p.dim("block_cols")?),
            dtype: p.dtype("dtype", &[DType::F32, DType::BF16, DType::F16])?,
        })
    }

    /// The kernel for this configuration.
    pub fn kernel(self) -> Result<Kernel, BoxError> {
        let c = self;
        let ty = TensorType::new(c.dtype, [c.rows, c.cols]);
        let spec = || block_spec([c.block_rows, c.block_cols], |i| vec![pid(i, 0), pid(i, 1)]);
        Ok(pallas_call(move |a, b, o| swiglu(a, b, o, c))
            .grid([c.rows.div_ceil(c.block_rows), c.cols.div_ceil(c.block_cols)])
            .input(ty.clone(), spec())
            .input(ty.clone(), spec())
            .output(ty, spec())
            .build()?)
    }
}

const PARAMS: &[ParamDef] = &[
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
        help: "columns",
    },
    ParamDef {
        name: "block_rows",
        kind: Kind::Dim,
        default: "8",
        help: "tile rows",
    },
    ParamDef {
        name: "block_cols",
        kind: Kind::Dim,
        // Wide tiles stream: at 4096x4096, 8x512 tiles (24 short runs per program) moved
        // 65% of the copy bandwidth natively, 8x2048 ones 98%.
        default: "2048",
        help: "tile columns",
    },
    ParamDef {
        name: "dtype",
        kind: Kind::DType,
        default: "f32",
        help: "f32, bf16 or f16 (f32 math)",
    },
];

/// Tiles the tuner tries.
const TUNABLE: &[Tunable] = &[
    Tunable {
        name: "block_rows",
        values: &[4, 8, 16, 32],
        tiles: &["rows"],
    },
    Tunable {
        name: "block_cols",
        values: &[128, 256, 512, 1024, 2048, 4096],
        tiles: &["cols"],
    },
];

/// Fused `silu(a) * b`.
pub struct Swiglu;

impl Op for Swiglu {
    type Config = SwigluConfig;
    const NAME: &'static str = "swiglu";
    const SUMMARY: &'static str = "silu(a) * b, element-wise";
    const PARAMS: &'static [ParamDef] = PARAMS;
    const CASES: &'static [&'static str] = &["rows=5,cols=17"];
    const TUNABLE: &'static [Tunable] = TUNABLE;

    fn config(p: &Params) -> Result<SwigluConfig, BoxError> {
        SwigluConfig::from_params(p)
    }

    fn build(c: &Self::Config) -> Result<Vec<Kernel>, BoxError> {
        Ok(vec![c.kernel()?])
    }

    fn inputs(c: &Self::Config, seed: u64) -> Result<Vec<Array>, BoxError> {
        Ok(vec![
            random_array(c.dtype, &[c.rows, c.cols], seed, 4.0)?,
            random_array(c.dtype, &[c.rows, c.cols], seed + 1, 2.0)?,
        ])
    }

    fn reference(_: &Self::Config, inputs: &[Array]) -> Result<Vec<Vec<f64>>, BoxError> {
        let (a, b) = (inputs[0].try_to_f64("a")?, inputs[1].try_to_f64("b")?);
        Ok(vec![a
            .iter()
            .zip(&b)
            .map(|(x, g)| x / (1.0 + (-x).exp()) * g)
            .collect()])
    }

    fn tolerance(c: &Self::Config) -> Tolerance {
        tolerance_for(c.dtype, 1)
    }

    fn flops(c: &Self::Config) -> f64 {
        5.0 * (c.rows * c.cols) as f64
    }
}

/// `torch.ops.tessera.swiglu`.
pub(crate) const TORCH_OP: OpSpec = OpSpec {
    schema: "swiglu(Tensor gate, Tensor up) -> Tensor",
    doc: "SwiGLU: `silu(gate) * up`, element-wise over two tensors of one shape and dtype.",
    outputs: &[Out::like(0)],
    returns: 1,
    splits: &[Split {
        name: "rows",
        args: &[("gate", Axis::Any), ("up", Axis::Any)],
        outputs: &[Placement::Same],
        divides: &["rows"],
        even: false,
    }],
    plan: |values| {
        let mut a = Args::new(values);
        let gate = a.tensor("gate")?.min_rank(1)?;
        let up = a.tensor("up")?.same_dtype(&gate)?.same_shape(&gate)?;
        Ok(row_plan("swiglu", &[gate, up], &[], None))
    },
};
