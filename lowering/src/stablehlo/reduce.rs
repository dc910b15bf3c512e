//! Reductions: `stablehlo.reduce` in the accumulator dtype (f32 for floats).

use kernel_ir::ops::accumulator_dtype;
use kernel_ir::{Op, OpKind, ReduceOp, TensorType};

use super::Emitter;

impl Emitter<'_> {
    pub(super) fn reduce(&mut self, op: &Op) -> String {
        let OpKind::Reduce { op: r, x, axes } = &op.kind else {
            unreachable!("not a reduction")
        };
        let xt = self.k.type_of(*x).clone();
        let out_t = self.k.type_of(op.results[0]).clone();
        let acc = accumulator_dtype(xt.dtype);
        let input = self.convert(&self.v(*x), &xt, acc);
        let combine = match r {
            ReduceOp::Sum => "add",
            ReduceOp::Max => "maximum",
            ReduceOp::Min => "minimum",
        };
        let res = self.b.reduce(
            combine,
            &input,
            &TensorType::new(acc, xt.shape.clone()),
            r.identity(acc),
            &axes.iter().map(|&a| a as u64).collect::<Vec<_>>(),
        );
        self.convert(&res, &out_t.with_dtype(acc), out_t.dtype)
    }
}
