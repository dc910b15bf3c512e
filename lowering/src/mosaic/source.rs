//! Source ops (`program_id` is a grid argument, `num_programs` a constant, `const`,
//! `tpu.iota`) and the index maps of the `@transform_i` functions.

use kernel_ir::{DType, IndexExpr, IndexNode, Op, OpKind, TensorType};

use super::{memref_type, tty, vty, Emitter};

impl Emitter<'_> {
    pub(super) fn source(&mut self, op: &Op) -> String {
        let t = self.ty(op.results[0]);
        match &op.kind {
            OpKind::ProgramId { axis } => format!("%arg{axis}"),
            OpKind::NumPrograms { axis } => self.i32_const(self.k.grid[*axis] as i64),
            OpKind::Constant { value } => self.constant(t.dtype, &t.shape, value.as_f64()),
            OpKind::Iota { dim } if t.rank() == 1 => {
                // Mosaic's iota is at least 2-D: count along lanes, then drop the row.
                let row = [1, t.shape[0]];
                let i = self.def(&format!(
                    "tpu.iota {{dimensions = array<i32: 1>}} : {}",
                    vty(DType::I32, &row)
                ));
                self.shape_cast(&i, DType::I32, &row, &t.shape)
            }
            OpKind::Iota { dim } => self.def(&format!(
                "tpu.iota {{dimensions = array<i32: {dim}>}} : {}",
                tty(&t)
            )),
            _ => unreachable!("not a source op"),
        }
    }

    /// An index-map expression over the grid arguments, through the i32 element-wise
    /// rules.
    pub(super) fn index_expr(&mut self, e: &IndexExpr) -> String {
        let scalar = TensorType::scalar(DType::I32);
        e.fold(&mut |node: IndexNode<String>| match node {
            IndexNode::ProgramId(axis) => format!("%arg{axis}"),
            IndexNode::Const(c) => self.i32_const(c),
            IndexNode::Bin(op, a, b) => self.binary(op.as_binary(), &a, &b, &scalar),
            IndexNode::Scalar(r, index) => {
                // The operand's SMEM memref is an argument after the grid indices, in the
                // kernel and in every `@transform_i`.
                let r = r.0 as usize;
                let index: Vec<String> = index.iter().map(|i| self.index(i)).collect();
                self.def(&format!(
                    "memref.load %arg{}[{}] : {}",
                    self.k.grid.len() + r,
                    index.join(", "),
                    memref_type(self.k, r)
                ))
            }
        })
    }
}
