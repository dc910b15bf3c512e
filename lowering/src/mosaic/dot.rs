//! `dot` as `tpu.matmul` into a zero accumulator of the result type.

use kernel_ir::{Op, OpKind};

use super::{tty, Emitter};

impl Emitter<'_> {
    pub(super) fn dot(&mut self, op: &Op) -> String {
        let OpKind::Dot {
            lhs,
            rhs,
            transpose_lhs,
            transpose_rhs,
        } = &op.kind
        else {
            unreachable!("not a dot")
        };
        let (lt, rt, t) = (self.ty(*lhs), self.ty(*rhs), self.ty(op.results[0]));
        let zero = self.constant(t.dtype, &t.shape, 0.0);
        let (lc, ln) = if *transpose_lhs { (0, 1) } else { (1, 0) };
        let (rc, rn) = if *transpose_rhs { (1, 0) } else { (0, 1) };
        let (a, b) = (self.v(*lhs), self.v(*rhs));
        self.def(&format!(
            "tpu.matmul {a}, {b}, {zero} {{dimension_numbers = #tpu.dot_dimension_numbers<[{lc}], [{rc}], [{ln}], [{rn}], [0, {ln}, 1, {rn}], [], []>, transpose_lhs_hint = false}} : {}, {}, {} -> {}",
            tty(&lt),
            tty(&rt),
            tty(&t),
            tty(&t)
        ))
    }
}
