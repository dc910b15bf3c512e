//! `dot` as `stablehlo.dot_general` on operands converted to the accumulator dtype.

use kernel_ir::ops::accumulator_dtype;
use kernel_ir::{Op, OpKind};

use super::Emitter;
use crate::hlo::{tensor as tty, tensor_type as ty_of};

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
        let (lt, rt) = (self.k.type_of(*lhs).clone(), self.k.type_of(*rhs).clone());
        let acc = accumulator_dtype(lt.dtype);
        let a = self.convert(&self.v(*lhs), &lt, acc);
        let b = self.convert(&self.v(*rhs), &rt, acc);
        let attrs = format!(
            "dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [{}], rhs_contracting_dimensions = [{}]>",
            if *transpose_lhs { 0 } else { 1 },
            if *transpose_rhs { 1 } else { 0 }
        );
        self.op(
            "dot_general",
            &[(&a, &ty_of(acc, &lt.shape)), (&b, &ty_of(acc, &rt.shape))],
            &attrs,
            &tty(self.k.type_of(op.results[0])),
        )
    }
}
