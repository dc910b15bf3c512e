//! Flash attention as PyTorch ops: `flash_attention`, and the forward and backward
//! autograd runs (`flash_attention_fwd`, `flash_attention_bwd`).

use kernel_ir::DType;

use super::ScoreMask;
use crate::torch_op::{
    attention_tensors, check_heads, f32_or_bf16, grad_out, py_shape, saved_forward, Args, Axis,
    Dim, Form, OpSpec, Operand, Out, Placement, Plan, Split, Tensor,
};
use crate::ParamValue;

/// Heads: the query-shaped tensors and k/v on their heads dim, when the kv heads divide
/// over the devices (each keeps whole GQA groups; a score mask, one for every head, is
/// whole on each). Batch: every tensor on dim 0, a score mask with a batch dim too.
/// `outputs` is how many outputs the op has (all split like the query).
const fn splits(outputs: usize) -> [Split; 2] {
    const HEADS: &[(&str, Axis)] = &attention_tensors(Axis::Dim(1));
    const BATCH: &[(&str, Axis)] = &{
        let [q, k, v, g, o, l] = attention_tensors(Axis::Dim(0));
        [q, k, v, g, o, l, ("mask", Axis::MaskBatch)]
    };
    const DIM: [&[Placement]; 2] = [
        &[Placement::Dim(1), Placement::Dim(1), Placement::Dim(1)],
        &[Placement::Dim(0), Placement::Dim(0), Placement::Dim(0)],
    ];
    [
        Split {
            name: "heads",
            args: HEADS,
            outputs: DIM[0].split_at(outputs).0,
            divides: &["heads", "kv_heads"],
            even: true,
        },
        Split {
            name: "batch",
            args: BATCH,
            outputs: DIM[1].split_at(outputs).0,
            divides: &[],
            even: false,
        },
    ]
}

const FORWARD_SPLITS: &[Split] = &splits(2);
const BACKWARD_SPLITS: &[Split] = &splits(3);

/// The log-sum-exp `[batch, heads, q_len, 1]`.
const LSE: Out = Out::lse(&[Dim::Of(0, 0), Dim::Of(0, 1), Dim::Of(0, 2), Dim::One]);

/// `torch.ops.tessera.flash_attention`.
pub(crate) const FLASH_ATTENTION: OpSpec = OpSpec {
    schema: "flash_attention(Tensor q, Tensor k, Tensor v, bool is_causal=False, \
             float? scale=None, int? window=None, float? softcap=None, Tensor? mask=None) \
             -> Tensor",
    doc: "FlashAttention: `softmax(q @ k^T * scale + mask) @ v` for q `[batch, heads, q_len, \
          head_dim]` and k/v `[batch, kv_heads, kv_len, head_dim]` (GQA when kv_heads divides \
          heads; float32 or bfloat16; head_dim up to 256). `scale` defaults to \
          1/sqrt(head_dim); `is_causal` aligns the last query with the last key; `window` \
          keeps the keys at most that far behind each query; `softcap` caps scores with \
          `softcap * tanh(s / softcap)`; `mask` (boolean: true where the query sees the key, \
          or additive float) broadcasts to `[batch, 1, q_len, kv_len]`, one for every head. \
          Differentiable in q, k and v.",
    outputs: &[Out::like(0), LSE],
    returns: 1,
    splits: FORWARD_SPLITS,
    plan: |values| forward(&mut Args::new(values)),
};

/// `torch.ops.tessera.flash_attention_fwd`.
pub(crate) const FLASH_ATTENTION_FWD: OpSpec = FLASH_ATTENTION.variant(
    "flash_attention_fwd(Tensor q, Tensor k, Tensor v, bool is_causal, float scale, \
             int? window=None, float? softcap=None, Tensor? mask=None) -> (Tensor, Tensor)",
    "flash_attention's forward for autograd: the output and its float32 log-sum-exp \
          `[batch, heads, q_len, 1]`.",
    2,
);

/// `torch.ops.tessera.flash_attention_bwd`.
pub(crate) const FLASH_ATTENTION_BWD: OpSpec = OpSpec {
    schema: "flash_attention_bwd(Tensor q, Tensor k, Tensor v, Tensor grad_out, bool is_causal, \
             float scale, Tensor? out=None, Tensor? lse=None, int? window=None, \
             float? softcap=None, Tensor? mask=None) -> (Tensor, Tensor, Tensor)",
    doc: "flash_attention's backward: the gradients of q, k and v for `grad_out`; given \
          the forward's `out` and `lse` it does not run the forward again.",
    outputs: &[Out::like(0), Out::like(1), Out::like(2)],
    returns: 3,
    splits: BACKWARD_SPLITS,
    plan: |values| {
        let mut a = Args::new(values);
        let mut att = Attention::read(&mut a)?;
        let grad = grad_out(&mut a, &att.q)?;
        att.options(&mut a)?;
        let saved = saved_forward(&mut a, &att.q)?;
        att.window_and_softcap(&mut a)?;
        att.score_mask(&mut a)?;
        let mut inputs = vec![att.q.operand(), att.k.operand(), att.v.operand()];
        inputs.push(grad.operand());
        inputs.extend(saved);
        inputs.extend(att.mask.clone());
        let outputs = [&att.q, &att.k, &att.v].map(|t| t.shape.clone()).to_vec();
        Ok(att.plan("flash_attention_bwd", inputs, outputs))
    },
};

/// The forward ops' plan: `(q, k, v[, mask]) -> (out, lse)`.
fn forward(a: &mut Args) -> Result<Plan, String> {
    let mut att = Attention::read(a)?;
    att.options(a)?;
    att.window_and_softcap(a)?;
    att.score_mask(a)?;
    let mut inputs = vec![att.q.operand(), att.k.operand(), att.v.operand()];
    inputs.extend(att.mask.clone());
    let q = &att.q.shape;
    let outputs = vec![q.clone(), vec![q[0], q[1], q[2], 1]];
    Ok(att.plan("flash_attention", inputs, outputs))
}

/// Checked attention arguments and the kernel parameters read so far.
struct Attention {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    params: Vec<(&'static str, ParamValue)>,
    /// The score mask operand: additive float32 `[batch or 1, 1, q_len, kv_len]`.
    mask: Option<Operand>,
}

impl Attention {
    /// Reads and checks q, k and v.
    fn read(a: &mut Args) -> Result<Attention, String> {
        let q = a.tensor("query")?.rank(4)?;
        let k = a.tensor("key")?.rank(4)?.same_dtype(&q)?;
        let v = a.tensor("value")?.rank(4)?.same_dtype(&q)?;
        f32_or_bf16("flash_attention", &q)?;
        let (b, h, sq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
        if k.shape[0] != b || k.shape[3] != d || k.shape != v.shape {
            return Err(format!(
                "key/value: shapes {}/{} do not match query {}",
                py_shape(&k.shape),
                py_shape(&v.shape),
                py_shape(&q.shape)
            ));
        }
        let (hkv, sk) = (k.shape[1], k.shape[2]);
        check_heads(h, hkv, d)?;
        let params = vec![
            ("batch", ParamValue::Int(b)),
            ("heads", ParamValue::Int(h)),
            ("kv_heads", ParamValue::Int(hkv)),
            ("q_len", ParamValue::Int(sq)),
            ("kv_len", ParamValue::Int(sk)),
            ("head_dim", ParamValue::Int(d)),
            ("dtype", ParamValue::DType(q.dtype)),
        ];
        Ok(Attention {
            q,
            k,
            v,
            params,
            mask: None,
        })
    }

    /// Reads `is_causal` and `scale` (given only when set: the kernel's default is
    /// 1/sqrt(head_dim), and leaving it out keeps the problem the one `tessera tune`
    /// stores).
    fn options(&mut self, a: &mut Args) -> Result<(), String> {
        self.params.push(("causal", ParamValue::Flag(a.flag())));
        if let Some(scale) = a.float("scale")? {
            self.params.push(("scale", ParamValue::Float(scale)));
        }
        Ok(())
    }

    /// Reads the sliding `window` and the `softcap` (both optional).
    fn window_and_softcap(&mut self, a: &mut Args) -> Result<(), String> {
        if let Some(w) = a.count("window")? {
            self.params.push(("window", ParamValue::Int(w)));
        }
        match a.float("softcap")? {
            Some(cap) if cap <= 0.0 => {
                return Err(format!("softcap: expected a positive number, got {cap:?}"))
            }
            Some(cap) => self.params.push(("softcap", ParamValue::Float(cap))),
            None => {}
        }
        Ok(())
    }

    /// Reads the optional score mask: boolean or float, broadcastable to `[batch, heads,
    /// q_len, kv_len]` as SDPA's `attn_mask`, the same for every head.
    fn score_mask(&mut self, a: &mut Args) -> Result<(), String> {
        let Some((mask, dtype)) = a.optional("mask")? else {
            return Ok(());
        };
        if !matches!(
            dtype,
            Some(DType::Bool | DType::F32 | DType::BF16 | DType::F16)
        ) {
            return Err(format!(
                "mask: expected a boolean or floating mask, got {}",
                mask.torch_dtype
            ));
        }
        let (b, h, sq, sk) = (
            self.q.shape[0],
            self.q.shape[1],
            self.q.shape[2],
            self.k.shape[2],
        );
        let full = [b, h, sq, sk];
        let shape = &mask.shape;
        // Right-aligned as broadcasting aligns: [.., heads, q_len, kv_len].
        let lead = 4usize.saturating_sub(shape.len());
        let broadcasts = shape.len() <= 4
            && shape
                .iter()
                .zip(&full[lead..])
                .all(|(&m, &f)| m == f || m == 1);
        if !broadcasts {
            return Err(format!(
                "mask: shape {} does not broadcast to {}",
                py_shape(shape),
                py_shape(&full)
            ));
        }
        if shape.len() >= 3 && shape[shape.len() - 3] != 1 {
            return Err(format!(
                "mask: shape {} has a mask per head; the kernel takes one for every head \
                 ([batch or 1, 1, q_len, kv_len])",
                py_shape(shape)
            ));
        }
        let per_batch = shape.len() == 4 && shape[0] == b && b > 1;
        let kind = if per_batch {
            ScoreMask::PerBatch
        } else {
            ScoreMask::Shared
        };
        self.params
            .push(("mask", ParamValue::Word(ScoreMask::word(Some(kind)))));
        self.mask = Some(Operand {
            arg: mask.arg,
            shape: vec![if per_batch { b } else { 1 }, 1, sq, sk],
            dtype: DType::F32,
            form: Form::ScoreMask,
        });
        Ok(())
    }

    /// The plan of `kernel` on these operands (nothing to compute without queries or
    /// keys).
    fn plan(self, kernel: &'static str, inputs: Vec<Operand>, outputs: Vec<Vec<u64>>) -> Plan {
        Plan {
            kernel,
            params: self.params,
            inputs,
            outputs,
            launch: self.q.numel() > 0 && self.k.numel() > 0,
            check_indices: None,
        }
    }
}
