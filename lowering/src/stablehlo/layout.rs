//! Layout ops: `broadcast_in_dim`, `reshape`, `transpose`.

use kernel_ir::{Op, OpKind};

use super::Emitter;
use crate::hlo::{i64_array, tensor as tty};

impl Emitter<'_> {
    pub(super) fn layout(&mut self, op: &Op) -> String {
        let t = tty(self.k.type_of(op.results[0]));
        match &op.kind {
            OpKind::Broadcast { x, dims } => {
                let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
                let (xv, xt) = (self.v(*x), self.vt(*x));
                self.b.broadcast(&xv, &xt, &dims, &t)
            }
            OpKind::Reshape { x } => self.op("reshape", &[(&self.v(*x), &self.vt(*x))], "", &t),
            OpKind::Transpose { x, perm } => {
                let attrs = format!(
                    "permutation = {}",
                    i64_array(perm.iter().map(|&d| d as u64))
                );
                self.op("transpose", &[(&self.v(*x), &self.vt(*x))], &attrs, &t)
            }
            _ => unreachable!("not a layout op"),
        }
    }
}
