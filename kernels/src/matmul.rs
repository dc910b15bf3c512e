//! Tiled matmul: a `(M/bm, N/bn, K/bk)` grid whose K axis is `arbitrary` and accumulates
//! into an f32 scratch tile; ragged edges are masked.

use kernel_ir::dsl::prelude::*;
use kernel_ir::{AllocError, Array, DimSemantics};
use kernel_macros::kernel;

use crate::common::{block, load_tile, pid, random_array, store_tile, tolerance_for, zeros_f64};
use crate::torch_op::{
    py_shape, Args, Axis, Dim, OpSpec, Out, Placement, Plan, ResultDtype, Shape, Split,
};
use crate::{BoxError, Kind, Op, ParamDef, ParamValue, Params, Tolerance, Tunable};

/// Shapes and block sizes of a matmul (block sizes already clamped to the shapes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatmulConfig {
    /// Rows of x and o.
    pub m: u64,
    /// Columns of x, rows of y.
    pub k: u64,
    /// Columns of y and o.
    pub n: u64,
    /// Block rows.
    pub bm: u64,
    /// Block depth.
    pub bk: u64,
    /// Block columns.
    pub bn: u64,
    /// Input and output dtype (accumulation is f32).
    pub dtype: DType,
}

/// `o = x @ y` for one `(i, j, k)` program.
#[kernel]
fn matmul(x: Ref, y: Ref, o: Ref, acc: Ref, #[comptime] c: MatmulConfig) {
    let (i, j, k) = (program_id(0), program_id(1), program_id(2));
    if k == 0 {
        acc.write(zeros([c.bm, c.bn], DType::F32));
    }
    let a = load_tile(x, c.bm, c.bk, i * c.bm, k * c.bk, c.m, c.k);
    let b = load_tile(y, c.bk, c.bn, k * c.bk, j * c.bn, c.k, c.n);
    acc.write(acc.read() + a.dot(b));
    if k == num_programs(2) - 1 {
        let out = acc.read().cast(c.dtype);
        store_tile(o, out, c.bm, c.bn, i * c.bm, j * c.bn, c.m, c.n);
    }
}

impl MatmulConfig {
    /// Reads `m, k, n, bm, bk, bn, dtype`.
    pub fn from_params(p: &Params) -> Result<Self, BoxError> {
        let (m, k, n) = (p.dim("m")?, p.dim("k")?, p.dim("n")?);
        Ok(MatmulConfig {
            m,
            k,
            n,
            bm: block(m, p.dim("bm")?),
            bk: block(k, p.dim("bk")?),
            bn: block(n, p.dim("bn")?),
            dtype: p.dtype("dtype", &[DType::F32, DType::BF16, DType::F16])?,
        })
    }

    /// The kernel for this configuration.
    pub fn kernel(self) -> Result<Kernel, BoxError> {
        let c = self;
        Ok(pallas_call(move |x, y, o, acc| matmul(x, y, o, acc, c))
            .grid([c.m.div_ceil(c.bm), c.n.div_ceil(c.bn), c.k.div_ceil(c.bk)])
            .dimension_semantics([
                DimSemantics::Parallel,
                DimSemantics::Parallel,
                DimSemantics::Arbitrary,
            ])
            .input(
                TensorType::new(c.dtype, [c.m, c.k]),
                block_spec([c.bm, c.bk], |i| vec![pid(i, 0), pid(i, 2)]),
            )
            .input(
                TensorType::new(c.dtype, [c.k, c.n]),
                block_spec([c.bk, c.bn], |i| vec![pid(i, 2), pid(i, 1)]),
            )
            .output(
                TensorType::new(c.dtype, [c.m, c.n]),
                block_spec([c.bm, c.bn], |i| vec![pid(i, 0), pid(i, 1)]),
            )
            .scratch(TensorType::new(DType::F32, [c.bm, c.bn]))
            .build()?)
    }
}

/// `o[m, n] = x[m, k] @ y[k, n]`.
pub struct Matmul;

const PARAMS: &[ParamDef] = &[
    ParamDef {
        name: "m",
        kind: Kind::Dim,
        default: "256",
        help: "rows of x",
    },
    ParamDef {
        name: "k",
        kind: Kind::Dim,
        default: "256",
        help: "columns of x / rows of y",
    },
    ParamDef {
        name: "n",
        kind: Kind::Dim,
        default: "256",
        help: "columns of y",
    },
    ParamDef {
        name: "bm",
        kind: Kind::Dim,
        default: "128",
        help: "block rows",
    },
    ParamDef {
        name: "bk",
        kind: Kind::Dim,
        default: "256",
        help: "block depth",
    },
    ParamDef {
        name: "bn",
        kind: Kind::Dim,
        default: "256",
        help: "block columns",
    },
    ParamDef {
        name: "dtype",
        kind: Kind::DType,
        default: "f32",
        help: "f32, bf16 or f16 (f32 accumulation)",
    },
];

/// Block sizes the tuner tries.
const TUNABLE: &[Tunable] = &[
    Tunable {
        name: "bm",
        values: &[32, 64, 128, 256],
        tiles: &["m"],
    },
    Tunable {
        name: "bk",
        values: &[64, 128, 256, 512, 1024, 2048],
        tiles: &["k"],
    },
    Tunable {
        name: "bn",
        values: &[64, 128, 256],
        tiles: &["n"],
    },
];

/// Plain f64 matmul of row-major arrays.
pub fn reference_matmul(
    a: &[f64],
    b: &[f64],
    m: usize,
    k: usize,
    n: usize,
) -> Result<Vec<f64>, AllocError> {
    let mut c = zeros_f64("matmul result", m.saturating_mul(n))?;
    for i in 0..m {
        for p in 0..k {
            let aip = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += aip * b[p * n + j];
            }
        }
    }
    Ok(c)
}

impl Op for Matmul {
    type Config = MatmulConfig;
    const NAME: &'static str = "matmul";
    const SUMMARY: &'static str = "o = x @ y, tiled, f32 accumulation";
    const PARAMS: &'static [ParamDef] = PARAMS;
    const CASES: &'static [&'static str] = &["m=40,k=33,n=20", "m=64,k=64,n=64,dtype=bf16"];
    const TUNABLE: &'static [Tunable] = TUNABLE;

    fn config(p: &Params) -> Result<MatmulConfig, BoxError> {
        MatmulConfig::from_params(p)
    }

    fn build(c: &Self::Config) -> Result<Vec<Kernel>, BoxError> {
        Ok(vec![c.kernel()?])
    }

    fn inputs(c: &Self::Config, seed: u64) -> Result<Vec<Array>, BoxError> {
        Ok(vec![
            random_array(c.dtype, &[c.m, c.k], seed, 1.0)?,
            random_array(c.dtype, &[c.k, c.n], seed + 1, 1.0)?,
        ])
    }

    fn reference(c: &Self::Config, inputs: &[Array]) -> Result<Vec<Vec<f64>>, BoxError> {
        let (a, b) = (inputs[0].try_to_f64("a")?, inputs[1].try_to_f64("b")?);
        Ok(vec![reference_matmul(
            &a,
            &b,
            c.m as usize,
            c.k as usize,
            c.n as usize,
        )?])
    }

    fn tolerance(c: &Self::Config) -> Tolerance {
        tolerance_for(c.dtype, c.k)
    }

    fn flops(c: &Self::Config) -> f64 {
        2.0 * (c.m * c.k * c.n) as f64
    }
}

/// `torch.ops.tessera.matmul`.
pub(crate) const TORCH_OP: OpSpec = OpSpec {
    schema: "matmul(Tensor x, Tensor y) -> Tensor",
    doc: "`x @ y` for 2-D `x [m, k]` and `y [k, n]` of one dtype, accumulated in float32.",
    outputs: &[Out {
        shape: Shape::Dims(&[Dim::Of(0, 0), Dim::Of(1, 1)]),
        dtype: ResultDtype::Of(0),
        empty: 0.0,
    }],
    returns: 1,
    splits: &[
        Split {
            name: "rows",
            args: &[("x", Axis::Dim(0))],
            outputs: &[Placement::Dim(0)],
            divides: &[],
            even: false,
        },
        Split {
            name: "cols",
            args: &[("y", Axis::Dim(1))],
            outputs: &[Placement::Dim(1)],
            divides: &[],
            even: false,
        },
        Split {
            name: "contraction",
            args: &[("x", Axis::Dim(1)), ("y", Axis::Dim(0))],
            outputs: &[Placement::Partial],
            divides: &[],
            even: false,
        },
    ],
    plan: |values| {
        let mut a = Args::new(values);
        let x = a.tensor("x")?.rank(2)?;
        let y = a.tensor("y")?.rank(2)?.same_dtype(&x)?;
        if x.shape[1] != y.shape[0] {
            return Err(format!(
                "y: expected {} rows to match x, got shape {}",
                x.shape[1],
                py_shape(&y.shape)
            ));
        }
        let (m, k, n) = (x.shape[0], x.shape[1], y.shape[1]);
        Ok(Plan {
            kernel: "matmul",
            params: vec![
                ("m", ParamValue::Int(m)),
                ("k", ParamValue::Int(k)),
                ("n", ParamValue::Int(n)),
                ("dtype", ParamValue::DType(x.dtype)),
            ],
            inputs: vec![x.operand(), y.operand()],
            outputs: vec![vec![m, n]],
            launch: m * n * k > 0,
            check_indices: None,
        })
    },
};
