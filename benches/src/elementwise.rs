//! The element-wise op sweep (`tessera bench elementwise`): each math op of the kernel
//! language as a one-op kernel `o = f(x)` over an f32 `[rows, cols]` array, beside the
//! copy kernel `o = x` (the bandwidth bound such a kernel can reach), PyTorch's ATen op
//! and a plain f64 reference.

use kernel_ir::dsl::prelude::*;
use kernel_ir::{Array, Kernel};
use tch::Tensor as TorchTensor;

/// One element-wise op: its kernel body, PyTorch's op and the f64 reference.
pub struct ElementwiseOp {
    /// The name printed.
    pub name: &'static str,
    /// The op in the kernel language.
    pub kernel: fn(Tensor) -> Tensor,
    /// The op in PyTorch.
    pub torch: fn(&TorchTensor) -> TorchTensor,
    /// The exact result.
    pub reference: fn(f64) -> f64,
}

/// The ops swept, the copy first.
pub const OPS: &[ElementwiseOp] = &[
    ElementwiseOp {
        name: "copy",
        kernel: |x| x,
        torch: |x| x.copy(),
        reference: |x| x,
    },
    ElementwiseOp {
        name: "exp",
        kernel: |x| x.exp(),
        torch: |x| x.exp(),
        reference: f64::exp,
    },
    ElementwiseOp {
        name: "log",
        kernel: |x| x.log(),
        torch: |x| x.log(),
        reference: f64::ln,
    },
    ElementwiseOp {
        name: "tanh",
        kernel: |x| x.tanh(),
        torch: |x| x.tanh(),
        reference: f64::tanh,
    },
    ElementwiseOp {
        name: "erf",
        kernel: |x| x.erf(),
        torch: |x| x.erf(),
        reference: libm::erf,
    },
    ElementwiseOp {
        name: "sin",
        kernel: |x| x.sin(),
        torch: |x| x.sin(),
        reference: f64::sin,
    },
    ElementwiseOp {
        name: "cos",
        kernel: |x| x.cos(),
        torch: |x| x.cos(),
        reference: f64::cos,
    },
    ElementwiseOp {
        name: "sqrt",
        kernel: |x| x.sqrt(),
        torch: |x| x.sqrt(),
        reference: f64::sqrt,
    },
    ElementwiseOp {
        name: "rsqrt",
        kernel: |x| x.rsqrt(),
        torch: |x| x.rsqrt(),
        reference: |x| 1.0 / x.sqrt(),
    },
    ElementwiseOp {
        name: "recip",
        kernel: |x| x.recip(),
        torch: |x| x.reciprocal(),
        reference: |x| 1.0 / x,
    },
    ElementwiseOp {
        name: "sigmoid",
        kernel: |x| x.sigmoid(),
        torch: |x| x.sigmoid(),
        reference: |x| 1.0 / (1.0 + (-x).exp()),
    },
    ElementwiseOp {
        name: "pow 1.5",
        kernel: |x| x.pow(1.5),
        torch: |x| x.pow_tensor_scalar(1.5),
        reference: |x| x.powf(1.5),
    },
    ElementwiseOp {
        name: "gelu (erf)",
        kernel: |x| x * ((x * std::f64::consts::FRAC_1_SQRT_2).erf() + 1.0) * 0.5,
        torch: |x| x.gelu("none"),
        reference: |x| x * (libm::erf(x * std::f64::consts::FRAC_1_SQRT_2) + 1.0) * 0.5,
    },
];

impl ElementwiseOp {
    /// The kernel `o = f(x)` over `[rows, cols]` in blocks of 8 rows.
    pub fn build(&self, rows: u64, cols: u64) -> Result<Kernel, kernel_ir::VerifyError> {
        let f = self.kernel;
        let ty = TensorType::new(DType::F32, [rows, cols]);
        let rows_block = || block_spec([rows.min(8), cols], |i| vec![i[0].clone(), 0.into()]);
        pallas_call(move |x: Ref, o: Ref| o.write(f(x.read())))
            .name("elementwise")
            .grid([rows.div_ceil(8)])
            .input(ty.clone(), rows_block())
            .output(ty, rows_block())
            .build()
    }

    /// Runs PyTorch's op once on `x` (made by [`torch_input`]).
    pub fn run_torch(&self, x: &TorchTensor) {
        drop(tch::no_grad(|| (self.torch)(x)));
    }

    /// The largest error of `got` (computed from `x`) in f32 ulps of the exact result.
    pub fn max_ulp_error(&self, x: &Array, got: &Array) -> f64 {
        x.to_f64()
            .iter()
            .zip(got.to_f64())
            .map(|(&x, got)| {
                let want = (self.reference)(x);
                // f32's ulp at |want|: 2^(exponent - 23).
                let exponent = want.abs().max(f64::from(f32::MIN_POSITIVE)).log2().floor();
                (got - want).abs() / (exponent - 23.0).exp2()
            })
            .fold(0.0, f64::max)
    }
}

/// Deterministic inputs in `[0.25, 4)`, inside every op's domain.
pub fn inputs(rows: u64, cols: u64) -> Array {
    let n = rows * cols;
    let values = (0..n)
        .map(|i| 0.25 + 3.75 * ((i.wrapping_mul(2_654_435_761) % 1_000_003) as f32 / 1_000_003.0))
        .collect();
    Array::from_f32(DType::F32, [rows, cols], values).expect("rows * cols values")
}

/// `x` as a PyTorch tensor, for [`ElementwiseOp::run_torch`].
pub fn torch_input(x: &Array) -> TorchTensor {
    aten_bindings::tensor(x)
}
