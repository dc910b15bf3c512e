//! Reductions: `vector.multi_reduction` in the accumulator dtype (f32 for floats).

use kernel_ir::ops::accumulator_dtype;
use kernel_ir::{DType, Op, OpKind, ReduceOp};

use super::{vty, Emitter};

impl Emitter<'_> {
    pub(super) fn reduce(&mut self, op: &Op) -> String {
        let OpKind::Reduce { op: r, x, axes } = &op.kind else {
            unreachable!("not a reduction")
        };
        let (xt, t) = (self.ty(*x), self.ty(op.results[0]));
        let acc = accumulator_dtype(xt.dtype);
        let x = self.v(*x);
        let input = self.cast(&x, &xt, acc);
        let kind = match (r, acc) {
            (ReduceOp::Sum, _) => "add",
            (ReduceOp::Max, DType::I32) => "maxsi",
            (ReduceOp::Min, DType::I32) => "minsi",
            (ReduceOp::Max, _) => "maximumf",
            (ReduceOp::Min, _) => "minimumf",
        };
        let init = self.constant(acc, &t.shape, r.identity(acc));
        let a: Vec<String> = axes.iter().map(|d| d.to_string()).collect();
        let reduced = self.def(&format!(
            "vector.multi_reduction <{kind}>, {input}, {init} [{}] : {} to {}",
            a.join(", "),
            vty(acc, &xt.shape),
            vty(acc, &t.shape)
        ));
        self.cast(&reduced, &t.with_dtype(acc), t.dtype)
    }
}
