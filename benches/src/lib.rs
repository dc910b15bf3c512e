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
/// against the kernel's reference: odd sizes, bf16, GQA, causal.
pub const BASELINE_CHECKS: &[(&str, &str)] = &[
    ("matmul", "m=40,k=33,n=20"),
    ("matmul", "m=64,k=64,n=64,dtype=bf16"),
    ("softmax", "rows=13,cols=70"),
    ("rms_norm", "rows=9,cols=33"),
    ("layer_norm", "rows=9,cols=33,dtype=bf16"),
    ("swiglu", "rows=5,cols=17"),
    ("rope", "batch=2,heads=3,seq=11,head_dim=8"),
    ("flash_attention", "heads=4,kv_heads=2,q_len=33,kv_len=47"),
    (
        "flash_attention",
        "heads=2,kv_heads=1,q_len=20,kv_len=20,causal=true,dtype=bf16",
    ),
    (
        "flash_attention_bwd",
        "heads=4,kv_heads=2,q_len=33,kv_len=47",
    ),
    (
        "flash_attention_bwd",
        "heads=2,kv_heads=2,q_len=40,kv_len=40,causal=true",
    ),
    (
        "flash_attention",
        "heads=2,kv_heads=1,q_len=30,kv_len=30,causal=true,window=7,softcap=5",
    ),
    (
        "flash_attention",
        "batch=2,heads=2,kv_heads=1,q_len=20,kv_len=27,causal=true,mask=batch",
    ),
    (
        "flash_attention_bwd",
        "batch=2,heads=2,kv_heads=2,q_len=19,kv_len=24,softcap=3,mask=shared",
    ),
    (
        "paged_attention",
        "batch=3,heads=4,kv_heads=2,head_dim=16,page_size=4,num_pages=9,max_pages=5",
    ),
    (
        "varlen_attention",
        "batch=4,heads=4,kv_heads=2,total_q=70,total_k=55,head_dim=16",
    ),
    (
        "varlen_attention",
        "batch=3,heads=2,kv_heads=2,total_q=50,causal=true,dtype=bf16",
    ),
    (
        "varlen_attention_bwd",
        "batch=4,heads=4,kv_heads=2,total_q=60,causal=true,head_dim=16",
    ),
];

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
