//! Source ops (`program_id`, `num_programs`, `const`, `iota`) and index maps.

use kernel_ir::{DType, IndexExpr, IndexNode, Op, OpKind, TensorType};

use super::Emitter;
use crate::hlo::tensor as tty;

impl Emitter<'_> {
    pub(super) fn source(&mut self, op: &Op) -> String {
        let t = self.k.type_of(op.results[0]).clone();
        match &op.kind {
            OpKind::ProgramId { axis } => self.pids[*axis].clone(),
            OpKind::NumPrograms { axis } => self.index_const(self.k.grid[*axis] as i64),
            OpKind::Constant { value } => self.constant(t.dtype, &t.shape, value.as_f64()),
            OpKind::Iota { dim } => self.op(
                "iota",
                &[],
                &format!("iota_dimension = {dim} : i64"),
                &tty(&t),
            ),
            _ => unreachable!("not a source op"),
        }
    }

    /// An index-map expression of the current program, through the i32 element-wise rules.
    pub(super) fn index_expr(&mut self, e: &IndexExpr) -> String {
        let scalar = TensorType::scalar(DType::I32);
        e.fold(&mut |node: IndexNode<String>| match node {
            IndexNode::ProgramId(axis) => self.pids[axis].clone(),
            IndexNode::Const(c) => self.index_const(c),
            IndexNode::Bin(op, a, b) => self.binary(op.as_binary(), &a, &b, &scalar),
            IndexNode::Scalar(r, index) => self.read_element(r.0 as usize, index),
        })
    }
}
