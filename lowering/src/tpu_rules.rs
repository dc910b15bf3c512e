//! The TPU rules a kernel must satisfy before it is lowered to Mosaic, each failure
//! naming the operand, the dimension, the rule and a block shape that would work.
//!
//! * Block tiling (Pallas `_check_block_mappings`): the last two block dims must be
//!   divisible by 8 and 128 respectively, or equal the array's dims (squeezed dims
//!   count as 1); a rank-1 block must equal the array, be a multiple of 1024, or be a
//!   power of two of at least 128 lanes' worth of elements.
//! * Dtypes: f32, bf16, i32 and bool; f16 is not supported by Mosaic, and the matrix
//!   unit (`tpu.matmul`) takes f32 or bf16 operands only.
//! * `gather` (`tpu.dynamic_gather`, as Pallas lowers `take_along_axis`): along one of
//!   the two minor-most dims, with indices shaped like the operand.
//! * VMEM: every input and output block is double-buffered; blocks plus scratch must fit
//!   the scoped VMEM limit.

use std::fmt;

use kernel_ir::{BlockDim, DType, Kernel, MemorySpace, Op, OpKind, Region};

/// Limits of the target TPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpuLimits {
    /// Bytes of VMEM a kernel may use (Mosaic's scoped VMEM limit).
    pub vmem_bytes: u64,
}

impl Default for TpuLimits {
    /// 16 MiB: the default scoped VMEM limit on v5e.
    fn default() -> Self {
        TpuLimits {
            vmem_bytes: 16 << 20,
        }
    }
}

/// A broken TPU rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TpuRuleError {
    /// The operand (`in %x`) or `kernel @name`.
    pub operand: String,
    /// What is wrong, which rule, and what would work.
    pub message: String,
}

impl fmt::Display for TpuRuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TPU rule broken by `{}`: {}", self.operand, self.message)
    }
}

impl std::error::Error for TpuRuleError {}

/// Rounds `n` to a multiple of `m` (up, or down when up passes `limit`), or `limit`.
fn fitting(n: u64, m: u64, limit: u64) -> u64 {
    let up = n.div_ceil(m) * m;
    if up < limit {
        up
    } else if n >= m && n / m * m < limit {
        n / m * m
    } else {
        limit
    }
}

/// The first op whose operand dtypes the TPU cannot take, with the reason.
fn unsupported_op(kernel: &Kernel, region: &Region) -> Option<(String, String)> {
    region.ops.iter().find_map(|op: &Op| match &op.kind {
        OpKind::Dot { lhs, .. }
            if !matches!(kernel.type_of(*lhs).dtype, DType::F32 | DType::BF16) =>
        {
            Some((
                format!("dot of {}", kernel.type_of(*lhs)),
                "tpu.matmul takes f32 or bf16 operands: cast them first".to_string(),
            ))
        }
        OpKind::Gather { x, indices, axis } => {
            let (xt, it) = (kernel.type_of(*x), kernel.type_of(*indices));
            let minor = xt.rank() >= 2 && *axis + 2 >= xt.rank();
            (!minor || xt.shape != it.shape).then(|| {
                (
                    format!("gather of {xt} at {it} along axis {axis}"),
                    "tpu.dynamic_gather gathers along one of the two minor-most dims of a \
                     rank >= 2 block, with indices shaped like it: pad or broadcast the \
                     indices to the operand's shape and slice the result, or compare an \
                     iota with the indices and sum the selected elements"
                        .to_string(),
                )
            })
        }
        OpKind::For { body, .. } => unsupported_op(kernel, body),
        OpKind::If {
            then_region,
            else_region,
            ..
        } => unsupported_op(kernel, then_region).or_else(|| unsupported_op(kernel, else_region)),
        _ => None,
    })
}

/// Checks every rule; the first broken one is returned.
pub fn check(kernel: &Kernel, limits: &TpuLimits) -> Result<(), TpuRuleError> {
    if let Some((operand, message)) = unsupported_op(kernel, &kernel.body) {
        return Err(TpuRuleError { operand, message });
    }
    let mut vmem = 0u64;
    for r in &kernel.refs {
        let operand = format!("{} %{}", r.kind.keyword(), r.name);
        let err = |message: String| {
            Err(TpuRuleError {
                operand: operand.clone(),
                message,
            })
        };
        if r.ty.dtype == DType::F16 {
            return err("f16 is not supported by Mosaic TPU kernels: use bf16 (or f32)".into());
        }
        let bytes = r.kernel_type().num_elements() * r.ty.dtype.size_bytes().max(4) as u64;
        let Some(spec) = &r.block else {
            vmem += bytes;
            continue;
        };
        if spec.memory_space != MemorySpace::Vmem {
            continue;
        }
        vmem += 2 * bytes;
        let block: Vec<u64> = spec.block_shape.iter().map(|d| d.extent()).collect();
        let array = &r.ty.shape;
        let rank = block.len();
        if rank >= 2 {
            for (dim, multiple) in [(rank - 1, 128u64), (rank - 2, 8)] {
                let (b, a) = (block[dim], array[dim]);
                if b != a && b % multiple != 0 {
                    let shown: Vec<String> = spec
                        .block_shape
                        .iter()
                        .enumerate()
                        .map(|(i, d)| match d {
                            _ if i == dim => fitting(b, multiple, a).to_string(),
                            BlockDim::Squeezed => "None".into(),
                            BlockDim::Size(s) => s.to_string(),
                        })
                        .collect();
                    let what = if dim == rank - 1 {
                        "last"
                    } else {
                        "second-to-last"
                    };
                    return err(format!(
                        "block dim {dim} (the {what}) is {b}{}: it must be divisible by \
                         {multiple} or equal the array dim {a}; try block shape [{}]",
                        if matches!(spec.block_shape[dim], BlockDim::Squeezed) {
                            " (squeezed)"
                        } else {
                            ""
                        },
                        shown.join(", ")
                    ));
                }
            }
        } else if rank == 1 {
            let (b, a) = (block[0], array[0]);
            let min_tiling = 128 * (4 / r.ty.dtype.size_bytes().clamp(1, 4)) as u64;
            if !(b == a || b % 1024 == 0 || (b >= min_tiling && b.is_power_of_two())) {
                return err(format!(
                    "a rank-1 block of {b} must equal the array dim {a}, be a multiple of 1024, \
                     or be a power of two of at least {min_tiling}; try block shape [{a}]"
                ));
            }
        }
    }
    if vmem > limits.vmem_bytes {
        return Err(TpuRuleError {
            operand: format!("kernel @{}", kernel.name),
            message: format!(
                "double-buffered blocks and scratch need {vmem} bytes of VMEM, over the limit of \
                 {} bytes: use smaller blocks or raise the limit",
                limits.vmem_bytes
            ),
        });
    }
    Ok(())
}
