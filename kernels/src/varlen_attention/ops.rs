//! Varlen attention as PyTorch ops: `varlen_attention`, and the forward and backward
//! autograd runs (`varlen_attention_fwd`, `varlen_attention_bwd`).

use crate::torch_op::{
    attention_tensors, check_heads, f32_or_bf16, grad_out, py_shape, saved_forward, Args, Axis,
    Dim, OpSpec, Operand, Out, Placement, Plan, Split, Tensor,
};
use crate::ParamValue;

use super::check_cu_seqlens;

/// Heads: the query-shaped tensors and k/v on dim 0, when the kv heads divide over the
/// devices (each keeps whole GQA groups; the offsets whole on each).
const SPLITS: &[Split] = &[Split {
    name: "heads",
    args: &attention_tensors(Axis::Dim(0)),
    outputs: &[Placement::Dim(0), Placement::Dim(0), Placement::Dim(0)],
    divides: &["heads", "kv_heads"],
    even: true,
}];

/// The log-sum-exp `[heads, total_q, 1]`.
const LSE: Out = Out::lse(&[Dim::Of(0, 0), Dim::Of(0, 1), Dim::One]);

/// `torch.ops.tessera.varlen_attention`.
pub(crate) const VARLEN_ATTENTION: OpSpec = OpSpec {
    schema: "varlen_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, \
             Tensor cu_seqlens_k, bool is_causal=False, float? scale=None) -> Tensor",
    doc: "Attention over packed sequences of different lengths: q `[heads, total_q, \
          head_dim]`, k/v `[kv_heads, total_k, head_dim]` and int32 or int64 offsets \
          `cu_seqlens_q`/`cu_seqlens_k` of `(batch + 1,)` (checked before anything runs); \
          each sequence attends only to its own keys (`is_causal` aligns their ends). \
          float32 or bfloat16; `scale` defaults to 1/sqrt(head_dim). Differentiable in q, \
          k and v.",
    outputs: &[Out::like(0), LSE],
    returns: 1,
    splits: SPLITS,
    plan: |values| forward(&mut Args::new(values)),
};

/// `torch.ops.tessera.varlen_attention_fwd`.
pub(crate) const VARLEN_ATTENTION_FWD: OpSpec = VARLEN_ATTENTION.variant(
    "varlen_attention_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, \
             Tensor cu_seqlens_k, bool is_causal, float scale) -> (Tensor, Tensor)",
    "varlen_attention's forward for autograd: the output and its float32 log-sum-exp \
          `[heads, total_q, 1]`.",
    2,
);

/// `torch.ops.tessera.varlen_attention_bwd`.
pub(crate) const VARLEN_ATTENTION_BWD: OpSpec = OpSpec {
    schema: "varlen_attention_bwd(Tensor q, Tensor k, Tensor v, Tensor grad_out, \
             Tensor cu_seqlens_q, Tensor cu_seqlens_k, bool is_causal, float scale, \
             Tensor? out=None, Tensor? lse=None) -> (Tensor, Tensor, Tensor)",
    doc: "varlen_attention's backward: the gradients of q, k and v for `grad_out`; given \
          the forward's `out` and `lse` it does not run the forward again.",
    outputs: &[Out::like(0), Out::like(1), Out::like(2)],
    returns: 3,
    splits: SPLITS,
    plan: |values| {
        let mut a = Args::new(values);
        let mut grad = None;
        let att = Varlen::read(&mut a, |a, q| {
            grad = Some(grad_out(a, q)?);
            Ok(())
        })?;
        let saved = saved_forward(&mut a, &att.q)?;
        let grad: Vec<Operand> = grad.iter().map(Tensor::operand).collect();
        let outputs = [&att.q, &att.k, &att.v].map(|t| t.shape.clone()).to_vec();
        Ok(att.plan("varlen_attention_bwd", grad, saved, outputs))
    },
};

/// The forward ops' plan: `(q, k, v, cu_q, cu_k) -> (out, lse)`.
fn forward(a: &mut Args) -> Result<Plan, String> {
    let att = Varlen::read(a, |_, _| Ok(()))?;
    let q = &att.q.shape;
    let outputs = vec![q.clone(), vec![q[0], q[1], 1]];
    Ok(att.plan("varlen_attention", vec![], vec![], outputs))
}

/// Checked varlen attention arguments and the kernel parameters.
struct Varlen {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_q: Tensor,
    cu_k: Tensor,
    params: Vec<(&'static str, ParamValue)>,
}

impl Varlen {
    /// Reads `q, k, v`, then (after `grad_out` for the backward, read through
    /// `between`) the offsets, `is_causal` and `scale`.
    fn read(
        a: &mut Args,
        between: impl FnOnce(&mut Args, &Tensor) -> Result<(), String>,
    ) -> Result<Varlen, String> {
        let q = a.tensor("query")?.rank(3)?;
        let k = a.tensor("key")?.rank(3)?.same_dtype(&q)?;
        let v = a.tensor("value")?.rank(3)?.same_dtype(&q)?;
        f32_or_bf16("varlen_attention", &q)?;
        let (h, tq, d) = (q.shape[0], q.shape[1], q.shape[2]);
        if k.shape != v.shape || k.shape[2] != d {
            return Err(format!(
                "key/value: shapes {}/{} must be equal [kv_heads, total_k, {d}]",
                py_shape(&k.shape),
                py_shape(&v.shape)
            ));
        }
        let (hkv, tk) = (k.shape[0], k.shape[1]);
        check_heads(h, hkv, d)?;
        between(a, &q)?;
        let cu_q = a.index("cu_seqlens_q")?.rank(1)?;
        let cu_k = a.index("cu_seqlens_k")?.rank(1)?;
        if cu_q.shape != cu_k.shape || cu_q.shape[0] == 0 {
            return Err(format!(
                "cu_seqlens_q/cu_seqlens_k: shapes {}/{} must be equal (batch + 1,)",
                py_shape(&cu_q.shape),
                py_shape(&cu_k.shape)
            ));
        }
        let mut params = vec![
            ("batch", ParamValue::Int(cu_q.shape[0] - 1)),
            ("heads", ParamValue::Int(h)),
            ("kv_heads", ParamValue::Int(hkv)),
            ("total_q", ParamValue::Int(tq)),
            ("total_k", ParamValue::Int(tk)),
            ("head_dim", ParamValue::Int(d)),
            ("causal", ParamValue::Flag(a.flag())),
            ("dtype", ParamValue::DType(q.dtype)),
        ];
        // The kernel's default scale is 1/sqrt(head_dim): given only when the caller set
        // one, so the problem is the one `tessera tune` stores.
        if let Some(scale) = a.float("scale")? {
            params.push(("scale", ParamValue::Float(scale)));
        }
        Ok(Varlen {
            q,
            k,
            v,
            cu_q,
            cu_k,
            params,
        })
    }

    /// The plan of `kernel`: q, k, v, then `before` (the gradient), the offsets, then
    /// `after` (the saved forward); the offsets' values are checked before a launch.
    fn plan(
        self,
        kernel: &'static str,
        before: Vec<Operand>,
        after: Vec<Operand>,
        outputs: Vec<Vec<u64>>,
    ) -> Plan {
        let mut inputs = vec![self.q.operand(), self.k.operand(), self.v.operand()];
        inputs.extend(before);
        inputs.extend([self.cu_q.operand(), self.cu_k.operand()]);
        inputs.extend(after);
        let (batch, tq, tk) = (self.cu_q.shape[0] - 1, self.q.shape[1], self.k.shape[1]);
        Plan {
            kernel,
            params: self.params,
            inputs,
            outputs,
            launch: self.q.numel() > 0 && self.k.numel() > 0,
            check_indices: Some(Box::new(move |ints| {
                check_cu_seqlens("cu_seqlens_q", ints[0], batch, tq)?;
                check_cu_seqlens("cu_seqlens_k", ints[1], batch, tk)
            })),
        }
    }
}
