//! Tessera's kernel library. Every kernel is written with `#[kernel]`; each comes with
//! a plain reference implementation, an input generator and tolerances, so every
//! backend can be checked the same way ([`check`]).

mod attention;
mod common;
mod matmul;
mod norms;
mod paged_attention;
mod params;
mod rope;
mod softmax;
mod swiglu;
pub mod torch_op;
pub mod tuning;
mod varlen_attention;

use kernel_ir::{Array, Kernel};

pub use attention::{
    reference_backward, reference_forward, AttentionConfig, FlashAttention, FlashAttentionBwd,
};
pub use kernel_ir::chain::{self, Chain, Source, Step};
pub use matmul::{Matmul, MatmulConfig};
pub use norms::{LayerNorm, NormConfig, RmsNorm};
pub use paged_attention::{check_block_tables, PagedAttention, PagedAttentionConfig};
pub use params::{Kind, ParamDef, ParamError, ParamValue, Params};
pub use rope::{Rope, RopeConfig};
pub use softmax::{Softmax, SoftmaxConfig};
pub use swiglu::{Swiglu, SwigluConfig};
pub use torch_op::OpSpec;
pub use tuning::Tunable;
pub use varlen_attention::{
    check_cu_seqlens, VarlenAttention, VarlenAttentionBwd, VarlenConfig, VarlenPlan,
};

/// Runs one kernel on one backend (the interpreter, XLA, native code...).
pub type Exec<'a> = dyn FnMut(&Kernel, &[Array]) -> Result<Vec<Array>, BoxError> + 'a;

/// Any error raised while building or running a kernel.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Allowed error: `|got - want| <= abs + rel * |want|` for every element.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Absolute part.
    pub abs: f64,
    /// Relative part.
    pub rel: f64,
}

/// A library kernel: how to build it for some parameters, make inputs, run it and
/// compute the expected result.
pub trait LibraryKernel: Sync {
    /// The name used by the CLI and the Python ops.
    fn name(&self) -> &'static str;
    /// One line on what it computes.
    fn summary(&self) -> &'static str;
    /// The parameters it takes, with defaults.
    fn params(&self) -> &'static [ParamDef];
    /// The parameters the autotuner may choose (block sizes), with the values it tries.
    fn tunables(&self) -> &'static [Tunable];
    /// Small parameter sets (odd sizes, bf16, GQA, masks...) on which the tests check
    /// the op's baselines against its reference.
    fn cases(&self) -> &'static [&'static str];
    /// The kernels this op runs, in order (most ops have one).
    fn build(&self, p: &Params) -> Result<Vec<Kernel>, BoxError>;
    /// Deterministic random inputs.
    fn inputs(&self, p: &Params, seed: u64) -> Result<Vec<Array>, BoxError>;
    /// Runs the op's kernels with `exec` and returns its outputs.
    fn run(&self, p: &Params, inputs: &[Array], exec: &mut Exec) -> Result<Vec<Array>, BoxError>;
    /// How [`Self::run`] chains the kernels for `inputs` op inputs, when it only passes
    /// arrays between them (none for ops that compute on the host between kernels).
    fn chain(&self, p: &Params, inputs: usize) -> Option<Chain>;
    /// The arrays a chain's [`Source::Derived`] inputs name, computed on the host from the
    /// op inputs its [`Chain::reads`] lists (`read`, in that order).
    fn derive(&self, p: &Params, read: &[Array]) -> Result<Vec<Array>, BoxError>;
    /// The expected outputs, computed plainly in f64.
    fn reference(&self, p: &Params, inputs: &[Array]) -> Result<Vec<Vec<f64>>, BoxError>;
    /// Allowed error, justified by the dtype.
    fn tolerance(&self, p: &Params) -> Tolerance;
    /// Floating-point operations of one call (for GFLOP/s), 0 if not meaningful.
    fn flops(&self, p: &Params) -> f64;
}

/// A library kernel written against its own parsed configuration. Every `Op` is a
/// [`LibraryKernel`]; the parameters are parsed once per call into `Config`.
pub trait Op: Sync {
    /// The parsed parameters.
    type Config;
    /// The name used by the CLI and the Python ops.
    const NAME: &'static str;
    /// One line on what it computes.
    const SUMMARY: &'static str;
    /// The parameters it takes, with defaults.
    const PARAMS: &'static [ParamDef];
    /// The parameters the autotuner may choose (none by default).
    const TUNABLE: &'static [Tunable] = &[];
    /// Small parameter sets (`name=value,...`: odd sizes, bf16, GQA, masks...) on which
    /// the tests check the op's baselines against its reference.
    const CASES: &'static [&'static str] = &[];
    /// Parses and validates the parameters.
    fn config(p: &Params) -> Result<Self::Config, BoxError>;
    /// The kernels this op runs, in order.
    fn build(c: &Self::Config) -> Result<Vec<Kernel>, BoxError>;
    /// Deterministic random inputs.
    fn inputs(c: &Self::Config, seed: u64) -> Result<Vec<Array>, BoxError>;
    /// Runs the op's kernels with `exec` (by default each on the op's inputs, returning
    /// the last kernel's outputs).
    fn run(c: &Self::Config, inputs: &[Array], exec: &mut Exec) -> Result<Vec<Array>, BoxError> {
        let mut outputs = Vec::new();
        for k in &Self::build(c)? {
            outputs = exec(k, inputs)?;
        }
        Ok(outputs)
    }
    /// How `run` chains the kernels for `inputs` op inputs, for ops whose `run` only
    /// passes arrays between kernels (none by default: single-kernel ops need no chain).
    fn chain(_c: &Self::Config, _inputs: usize) -> Option<Chain> {
        None
    }
    /// The arrays the chain's [`Source::Derived`] inputs name, from the op inputs
    /// [`Chain::reads`] lists (none by default).
    fn derive(_c: &Self::Config, _read: &[Array]) -> Result<Vec<Array>, BoxError> {
        Ok(Vec::new())
    }
    /// The expected outputs, computed plainly in f64.
    fn reference(c: &Self::Config, inputs: &[Array]) -> Result<Vec<Vec<f64>>, BoxError>;
    /// Allowed error, justified by the dtype.
    fn tolerance(c: &Self::Config) -> Tolerance;
    /// Floating-point operations of one call.
    fn flops(c: &Self::Config) -> f64;
}

impl<T: Op> LibraryKernel for T {
    fn name(&self) -> &'static str {
        T::NAME
    }
    fn summary(&self) -> &'static str {
        T::SUMMARY
    }
    fn params(&self) -> &'static [ParamDef] {
        T::PARAMS
    }
    fn cases(&self) -> &'static [&'static str] {
        T::CASES
    }
    fn tunables(&self) -> &'static [Tunable] {
        T::TUNABLE
    }
    fn build(&self, p: &Params) -> Result<Vec<Kernel>, BoxError> {
        T::build(&T::config(p)?)
    }
    fn inputs(&self, p: &Params, seed: u64) -> Result<Vec<Array>, BoxError> {
        T::inputs(&T::config(p)?, seed)
    }
    fn run(&self, p: &Params, inputs: &[Array], exec: &mut Exec) -> Result<Vec<Array>, BoxError> {
        T::run(&T::config(p)?, inputs, exec)
    }
    fn chain(&self, p: &Params, inputs: usize) -> Option<Chain> {
        T::chain(&T::config(p).ok()?, inputs)
    }
    fn derive(&self, p: &Params, read: &[Array]) -> Result<Vec<Array>, BoxError> {
        T::derive(&T::config(p)?, read)
    }
    fn reference(&self, p: &Params, inputs: &[Array]) -> Result<Vec<Vec<f64>>, BoxError> {
        T::reference(&T::config(p)?, inputs)
    }
    fn tolerance(&self, p: &Params) -> Tolerance {
        T::config(p).map_or(common::tolerance_for(kernel_ir::DType::F32, 1), |c| {
            T::tolerance(&c)
        })
    }
    fn flops(&self, p: &Params) -> f64 {
        T::config(p).map_or(0.0, |c| T::flops(&c))
    }
}

/// Every library kernel, in a stable order.
pub fn all() -> Vec<&'static dyn LibraryKernel> {
    vec![
        &Matmul,
        &Softmax,
        &RmsNorm,
        &LayerNorm,
        &Rope,
        &Swiglu,
        &FlashAttention,
        &FlashAttentionBwd,
        &PagedAttention,
        &VarlenAttention,
        &VarlenAttentionBwd,
    ]
}

/// The library's PyTorch ops, in registration order (each declared beside its kernel).
pub fn torch_ops() -> &'static [OpSpec] {
    const OPS: &[OpSpec] = &[
        softmax::TORCH_OP,
        norms::RMS_NORM_OP,
        norms::LAYER_NORM_OP,
        swiglu::TORCH_OP,
        matmul::TORCH_OP,
        rope::TORCH_OP,
        attention::FLASH_ATTENTION_FWD,
        attention::FLASH_ATTENTION_BWD,
        attention::FLASH_ATTENTION,
        paged_attention::TORCH_OP,
        varlen_attention::VARLEN_ATTENTION_FWD,
        varlen_attention::VARLEN_ATTENTION_BWD,
        varlen_attention::VARLEN_ATTENTION,
    ];
    OPS
}

/// The PyTorch op called `name`.
pub fn torch_op(name: &str) -> Option<&'static OpSpec> {
    torch_ops().iter().find(|op| op.name() == name)
}

/// The library kernel called `name`.
pub fn find(name: &str) -> Option<&'static dyn LibraryKernel> {
    all().into_iter().find(|k| k.name() == name)
}

/// How far outputs are from the reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Largest `|got - want|`.
    pub max_abs_err: f64,
    /// Largest `|got - want| / max(|want|, 1e-6)` over elements whose `|want| > 1e-3`.
    pub max_rel_err: f64,
    /// The first element outside the tolerance: (output, index, got, want).
    pub first_bad: Option<(usize, usize, f64, f64)>,
}

impl Comparison {
    /// True when every element is within the tolerance.
    pub fn ok(&self) -> bool {
        self.first_bad.is_none()
    }
}

/// Compares outputs with the reference under `tol`; NaNs always fail.
pub fn compare(got: &[Array], want: &[Vec<f64>], tol: Tolerance) -> Comparison {
    let mut c = Comparison {
        max_abs_err: 0.0,
        max_rel_err: 0.0,
        first_bad: None,
    };
    if got.len() != want.len() {
        c.first_bad = Some((got.len().min(want.len()), 0, f64::NAN, f64::NAN));
        return c;
    }
    for (o, (g, w)) in got.iter().zip(want).enumerate() {
        if g.data().len() != w.len() {
            c.first_bad.get_or_insert((o, 0, f64::NAN, f64::NAN));
            continue;
        }
        for (i, (x, &y)) in g.iter_f64().zip(w).enumerate() {
            // Equal infinities (the log-sum-exp of a query that sees no key) match.
            let err = if x == y { 0.0 } else { (x - y).abs() };
            if !err.is_nan() {
                c.max_abs_err = c.max_abs_err.max(err);
                if y.abs() > 1e-3 {
                    c.max_rel_err = c.max_rel_err.max(err / y.abs());
                }
            }
            let within = err <= tol.abs + tol.rel * y.abs();
            if !within {
                c.first_bad.get_or_insert((o, i, x, y));
            }
        }
    }
    c
}

/// Builds inputs, runs the op with `exec` and compares with the reference.
pub fn check(
    kernel: &dyn LibraryKernel,
    p: &Params,
    seed: u64,
    exec: &mut Exec,
) -> Result<Comparison, BoxError> {
    let inputs = kernel.inputs(p, seed)?;
    let got = kernel.run(p, &inputs, exec)?;
    let want = kernel.reference(p, &inputs)?;
    Ok(compare(&got, &want, kernel.tolerance(p)))
}
