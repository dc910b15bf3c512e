//! Fused kernels that are not in Tessera's library, exported as torch ops:
//! `torch.ops.user_ops.add_rms_norm` (residual add + RMSNorm, returning the normalized
//! rows and the new residual), `torch.ops.user_ops.bias_gelu_tanh` (bias add + GELU
//! with the tanh approximation), `torch.ops.user_ops.bias_gelu_residual` (bias add +
//! exact GELU + residual add) and `torch.ops.user_ops.cross_entropy` (per-row loss of
//! `[N, V]` logits against int targets, as `F.cross_entropy(..., reduction="none")`,
//! with PyTorch's `IndexError` for a target out of range). Load with
//! `tessera.load_library(path_to_this_cdylib)`.

use tessera::kernel_ir::op_library::{Built, OpArgs};
use tessera::prelude::*;

/// Rows per block (a partial last block is fine: Pallas's edge-block semantics; a
/// block may not be larger than its array).
fn block_rows(rows: u64) -> u64 {
    rows.min(8)
}

#[kernel]
fn add_rms_norm(
    x: Ref,
    r: Ref,
    w: Ref,
    o: Ref,
    h: Ref,
    #[comptime] cols: u64,
    #[comptime] eps: f64,
) {
    let sum = x.read() + r.read();
    h.write(sum);
    let inv = ((sum * sum).sum_keepdims(1) / cols as f64 + eps).rsqrt();
    o.write(sum * inv * w.read());
}

#[kernel]
fn bias_gelu_tanh(x: Ref, b: Ref, o: Ref) {
    let h = x.read() + b.read();
    let inner = (h + h * h * h * 0.044715) * 0.797_884_560_802_865_4; // sqrt(2 / pi)
    o.write(h * (inner.tanh() + 1.0) * 0.5);
}

#[kernel]
fn bias_gelu_residual(x: Ref, b: Ref, r: Ref, o: Ref) {
    let h = x.read() + b.read();
    o.write(h * ((h * std::f64::consts::FRAC_1_SQRT_2).erf() + 1.0) * 0.5 + r.read());
}

/// The target PyTorch's cross-entropy ignores (its default `ignore_index`).
const IGNORE_INDEX: i32 = -100;

#[kernel]
fn cross_entropy(x: Ref, t: Ref, o: Ref, #[comptime] rows: u64, #[comptime] classes: u64) {
    let block = block_rows(rows);
    let (v, t) = (x.read(), t.read());
    // Rows past the end of the last block hold padding: their targets are not checked.
    let row = iota([block], 0) + program_id(0) * block as i64;
    let in_range = t.ge(0) & t.lt(classes as i64);
    check_index!(
        row.ge(rows as i64) | t.eq(IGNORE_INDEX as i64) | in_range,
        "target out of bounds:",
        t
    );
    let m = v.max_keepdims(1);
    let lse = (v - m).exp().sum(1).log() + m.sum(1);
    let picked = v.take_along_axis(t.expand_dims(1), 1).reshape([block]);
    o.write(select(t.eq(IGNORE_INDEX as i64), 0.0, lse - picked));
}

/// The `[rows, cols]` shape of 2-D argument `name` (no rows is an empty batch; no
/// columns is an error).
fn rows_cols(args: &OpArgs, name: &str) -> Result<(TensorType, u64, u64), String> {
    let t = args.tensor(name)?.clone();
    match t.shape[..] {
        [rows, cols] if cols > 0 => Ok((t, rows, cols)),
        _ => Err(format!(
            "{name} must be a 2-D [rows, cols] tensor with cols > 0, got {t}"
        )),
    }
}

/// Checks that argument `name` has type `want`.
fn expect(args: &OpArgs, name: &str, want: &TensorType) -> Result<(), String> {
    let got = args.tensor(name)?;
    if got != want {
        return Err(format!("{name} must be {want}, got {got}"));
    }
    Ok(())
}

fn row_block(rows: u64, cols: u64) -> BlockSpecFn {
    block_spec([block_rows(rows), cols], |i| vec![i[0].clone(), 0.into()])
}

fn build_add_rms_norm(args: &OpArgs) -> Result<Built, String> {
    let (x, rows, cols) = rows_cols(args, "x")?;
    expect(args, "residual", &x)?;
    let w = TensorType::new(x.dtype, [cols]);
    expect(args, "weight", &w)?;
    let eps = args.scalar("eps")?;
    if rows == 0 {
        // An empty batch: no kernel (a grid of size 0 is not one), empty results.
        return Ok(Built::Outputs(vec![x.clone(), x]));
    }
    pallas_call(move |x, r, w, o, h| add_rms_norm(x, r, w, o, h, cols, eps))
        .name("add_rms_norm")
        .grid([rows.div_ceil(block_rows(rows))])
        .input(x.clone(), row_block(rows, cols))
        .input(x.clone(), row_block(rows, cols))
        .input(w, block_spec([cols], |_| vec![0.into()]))
        .output(x.clone(), row_block(rows, cols))
        .output(x, row_block(rows, cols))
        .build()
        .map(Built::Kernel)
        .map_err(|e| e.to_string())
}

fn build_bias_gelu_tanh(args: &OpArgs) -> Result<Built, String> {
    let (x, rows, cols) = rows_cols(args, "x")?;
    expect(args, "bias", &TensorType::new(x.dtype, [cols]))?;
    if rows == 0 {
        return Ok(Built::Outputs(vec![x]));
    }
    pallas_call(bias_gelu_tanh)
        .name("bias_gelu_tanh")
        .grid([rows.div_ceil(block_rows(rows))])
        .input(x.clone(), row_block(rows, cols))
        .input(
            TensorType::new(x.dtype, [cols]),
            block_spec([cols], |_| vec![0.into()]),
        )
        .output(x, row_block(rows, cols))
        .build()
        .map(Built::Kernel)
        .map_err(|e| e.to_string())
}

fn build_bias_gelu_residual(args: &OpArgs) -> Result<Built, String> {
    let (x, rows, cols) = rows_cols(args, "x")?;
    let b = TensorType::new(x.dtype, [cols]);
    expect(args, "bias", &b)?;
    expect(args, "residual", &x)?;
    if rows == 0 {
        return Ok(Built::Outputs(vec![x]));
    }
    pallas_call(bias_gelu_residual)
        .name("bias_gelu_residual")
        .grid([rows.div_ceil(block_rows(rows))])
        .input(x.clone(), row_block(rows, cols))
        .input(b, block_spec([cols], |_| vec![0.into()]))
        .input(x.clone(), row_block(rows, cols))
        .output(x, row_block(rows, cols))
        .build()
        .map(Built::Kernel)
        .map_err(|e| e.to_string())
}

fn build_cross_entropy(args: &OpArgs) -> Result<Built, String> {
    let (x, rows, classes) = rows_cols(args, "logits")?;
    if x.dtype != DType::F32 {
        return Err(format!("logits must be f32, got {x}"));
    }
    // int64 targets (PyTorch's) arrive as i32: Tessera converts them with a range check.
    expect(args, "target", &TensorType::new(DType::I32, [rows]))?;
    if rows == 0 {
        return Ok(Built::Outputs(vec![TensorType::new(DType::F32, [0])]));
    }
    let rows_block = || block_spec([block_rows(rows)], |i| vec![i[0].clone()]);
    pallas_call(move |x, t, o| cross_entropy(x, t, o, rows, classes))
        .name("cross_entropy")
        .grid([rows.div_ceil(block_rows(rows))])
        .input(x, row_block(rows, classes))
        .input(TensorType::new(DType::I32, [rows]), rows_block())
        .output(TensorType::new(DType::F32, [rows]), rows_block())
        .build()
        .map(Built::Kernel)
        .map_err(|e| e.to_string())
}

tessera::export_ops! {
    namespace: "user_ops",
    "add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps=1e-06) -> (Tensor, Tensor)"
        => build_add_rms_norm,
    "bias_gelu_tanh(Tensor x, Tensor bias) -> Tensor" => build_bias_gelu_tanh,
    "bias_gelu_residual(Tensor x, Tensor bias, Tensor residual) -> Tensor"
        => build_bias_gelu_residual,
    "cross_entropy(Tensor logits, Tensor target) -> Tensor" => build_cross_entropy,
}
