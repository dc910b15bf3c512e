//! Shared setup of the benches: each library kernel at a small and a large size, and
//! the baselines of its math: plain StableHLO on XLA, and PyTorch's ATen op.

pub mod elementwise;
pub mod torch_baseline;
pub mod xla_baseline;

use kernel_ir::{interpret, Array, InterpretOptions, Kernel};
use kernels::{BoxError, LibraryKernel, Params};

/// Parameter overrides of the two bench sizes of a library kernel.
pub fn sizes(name: &str) -> [(&'static str, Vec<String>); 2] {
    let s = |v: &str| vec![v.to_string()];
    match name {
        "matmul" => [
            ("256", s("m=256,k=256,n=256")),
            ("512", s("m=512,k=512,n=512")),
        ],
        "flash_attention" | "flash_attention_bwd" => [
            ("s256", s("heads=4,q_len=256,kv_len=256,head_dim=64")),
            ("s512", s("heads=4,q_len=512,kv_len=512,head_dim=64")),
        ],
        "rope" => [("s256", s("seq=256")), ("s1024", s("seq=1024"))],
        _ => [
            ("256x1024", s("rows=256,cols=1024")),
            ("1024x1024", s("rows=1024,cols=1024")),
        ],
    }
}

/// Small cases (kernel, parameter overrides) on which the tests check each baseline
/// against the kernel's reference: every kernel's `Op::CASES`.
pub fn baseline_checks() -> Vec<(&'static str, &'static str)> {
    kernels::all()
        .into_iter()
        .flat_map(|k| k.cases().iter().map(move |case| (k.name(), *case)))
        .collect()
}

/// The library ops whose only baseline is PyTorch's (no plain StableHLO twin).
pub const NO_XLA_BASELINE: &[&str] = &[
    "flash_attention_bwd",
    "paged_attention",
    "varlen_attention",
    "varlen_attention_bwd",
];

/// A library kernel ready to run: its parameters and inputs.
pub struct Case {
    /// The kernel.
    pub kernel: &'static dyn LibraryKernel,
    /// Its parameters.
    pub params: Params,
    /// Its inputs.
    pub inputs: Vec<Array>,
}

impl Case {
    /// Builds the case for `kernel` with `overrides`.
    pub fn new(kernel: &'static dyn LibraryKernel, overrides: &[String]) -> Result<Case, BoxError> {
        let params = Params::parse(kernel.params(), overrides)?;
        let inputs = kernel.inputs(&params, 0)?;
        Ok(Case {
            kernel,
            params,
            inputs,
        })
    }

    /// Runs the op once on the interpreter.
    pub fn run_interpreter(&self) -> Result<Vec<Array>, BoxError> {
        let mut exec = |k: &Kernel, ins: &[Array]| -> Result<Vec<Array>, BoxError> {
            Ok(interpret(k, ins, &InterpretOptions::default())?)
        };
        self.kernel.run(&self.params, &self.inputs, &mut exec)
    }
}

impl Case {
    /// The output types of the op's last kernel (the op's outputs for every op that has
    /// a baseline).
    fn output_types(&self) -> Result<Vec<kernel_ir::TensorType>, BoxError> {
        let kernels = self.kernel.build(&self.params)?;
        Ok(kernels.last().map(Kernel::output_types).unwrap_or_default())
    }

    /// Runs the op's XLA baseline once; `Ok(None)` when the op has no baseline.
    pub fn run_xla_baseline(&self) -> Result<Option<Vec<Array>>, BoxError> {
        let Some(module) = xla_baseline::module(self.kernel.name(), &self.params)? else {
            return Ok(None);
        };
        let outputs = self.output_types()?;
        let name = format!("{}_baseline", self.kernel.name());
        Ok(Some(runtime::run_stablehlo(
            &name,
            &module,
            &self.inputs,
            &outputs,
        )?))
    }

    /// The op's PyTorch baseline on this case's inputs; `None` when it has none.
    pub fn torch_baseline(&self) -> Option<torch_baseline::TorchBaseline> {
        torch_baseline::TorchBaseline::new(self.kernel.name(), &self.params, &self.inputs)
    }

    /// Runs the op once on `backend`.
    pub fn run_on(&self, backend: runtime::Backend) -> Result<Vec<Array>, BoxError> {
        let mut exec = |k: &Kernel, ins: &[Array]| -> Result<Vec<Array>, BoxError> {
            Ok(runtime::run(k, ins, backend)?.0)
        };
        self.kernel.run(&self.params, &self.inputs, &mut exec)
    }
}
