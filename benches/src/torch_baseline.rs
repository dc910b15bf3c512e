//! PyTorch baselines (through tch, in this process): the ATen op a PyTorch user would
//! call for each library kernel's math, on the same inputs.

use kernel_ir::Array;
use kernels::{BoxError, Params};
use tch::{Kind, Tensor};

/// A PyTorch call ready to run: its input tensors and the op.
pub struct TorchBaseline {
    inputs: Vec<Tensor>,
    op: fn(&[Tensor], &Params) -> Tensor,
    params: Params,
}

impl TorchBaseline {
    /// The baseline of library kernel `name`, or `None` when PyTorch has no single op
    /// for it (the attention backward).
    pub fn new(name: &str, params: &Params, inputs: &[Array]) -> Option<TorchBaseline> {
        let op: fn(&[Tensor], &Params) -> Tensor = match name {
            "matmul" => |t, _| t[0].matmul(&t[1]),
            "softmax" => |t, _| t[0].softmax(-1, None::<Kind>),
            "rms_norm" => |t, p| {
                let cols = *t[0].size().last().unwrap_or(&1);
                t[0].rms_norm([cols], Some(&t[1]), eps(p))
            },
            "layer_norm" => |t, p| {
                let cols = *t[0].size().last().unwrap_or(&1);
                t[0].layer_norm([cols], Some(&t[1]), Some(&t[2]), eps(p), false)
            },
            "swiglu" => |t, _| t[0].silu() * &t[1],
            "rope" => |t, _| {
                let (x, cos, sin) = (&t[0], &t[1], &t[2]);
                let half = x.size()[3] / 2;
                let rotated = Tensor::cat(&[-x.narrow(3, half, half), x.narrow(3, 0, half)], 3);
                x * cos + rotated * sin
            },
            "flash_attention" => |t, p| {
                let causal = p.flag("causal").unwrap_or(false);
                let scale = p.float_opt("scale").unwrap_or(None);
                let gqa = t[0].size()[1] != t[1].size()[1];
                Tensor::scaled_dot_product_attention(
                    &t[0],
                    &t[1],
                    &t[2],
                    None::<Tensor>,
                    0.0,
                    causal,
                    scale,
                    gqa,
                )
            },
            _ => return None,
        };
        Some(TorchBaseline {
            inputs: inputs.iter().map(aten_bindings::tensor).collect(),
            op,
            params: params.clone(),
        })
    }

    /// Runs the op once.
    pub fn run(&self) -> Tensor {
        tch::no_grad(|| (self.op)(&self.inputs, &self.params))
    }

    /// Runs the op once and returns its result as f64s (row-major).
    pub fn run_f64(&self) -> Result<Vec<f64>, BoxError> {
        let out = self.run().to_kind(Kind::Double).contiguous().view(-1);
        Ok(Vec::<f64>::try_from(&out)?)
    }
}

fn eps(p: &Params) -> f64 {
    p.float_opt("eps").ok().flatten().unwrap_or(1e-5)
}
