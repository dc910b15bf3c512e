//! Layout ops: `vector.broadcast`, `vector.shape_cast`, `vector.transpose`, and
//! `tpu.dynamic_gather` for `gather` (indices clamped first: it wraps them).

use kernel_ir::{DType, Op, OpKind};

use super::{tty, vty, Emitter};
use crate::text::element_type as elem;

impl Emitter<'_> {
    pub(super) fn layout(&mut self, op: &Op) -> String {
        let t = self.ty(op.results[0]);
        match &op.kind {
            OpKind::Broadcast { x, dims } => {
                let xt = self.ty(*x);
                let x = self.v(*x);
                if xt.is_scalar() {
                    return self.def(&format!(
                        "vector.broadcast {x} : {} to {}",
                        elem(t.dtype),
                        tty(&t)
                    ));
                }
                let mut aligned = vec![1u64; t.rank()];
                for (i, &d) in dims.iter().enumerate() {
                    aligned[d] = xt.shape[i];
                }
                let a = self.shape_cast(&x, t.dtype, &xt.shape, &aligned);
                if aligned == t.shape {
                    a
                } else {
                    self.def(&format!(
                        "vector.broadcast {a} : {} to {}",
                        vty(t.dtype, &aligned),
                        tty(&t)
                    ))
                }
            }
            OpKind::Reshape { x } => {
                let xt = self.ty(*x);
                let x = self.v(*x);
                self.shape_cast(&x, t.dtype, &xt.shape, &t.shape)
            }
            OpKind::Transpose { x, perm } => {
                let xt = self.ty(*x);
                let p: Vec<String> = perm.iter().map(|d| d.to_string()).collect();
                let x = self.v(*x);
                self.def(&format!(
                    "vector.transpose {x}, [{}] : {} to {}",
                    p.join(", "),
                    tty(&xt),
                    tty(&t)
                ))
            }
            OpKind::Gather { x, indices, axis } => {
                let (xt, it) = (self.ty(*x), self.ty(*indices));
                let (x, i) = (self.v(*x), self.v(*indices));
                let zero = self.constant(DType::I32, &it.shape, 0.0);
                let top = self.constant(DType::I32, &it.shape, (xt.shape[*axis] - 1) as f64);
                let i = self.def(&format!("arith.maxsi {i}, {zero} : {}", tty(&it)));
                let i = self.def(&format!("arith.minsi {i}, {top} : {}", tty(&it)));
                self.def(&format!(
                    "tpu.dynamic_gather {x}[{i}] in [{axis}] : {}, {} -> {}",
                    tty(&xt),
                    tty(&it),
                    tty(&t)
                ))
            }
            _ => unreachable!("not a layout op"),
        }
    }
}
