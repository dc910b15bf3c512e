//! Layout ops: `broadcast_in_dim`, `reshape`, `transpose`, and `gather` (the index of
//! every dim but the gathered one from an `iota`).

use kernel_ir::{DType, Op, OpKind, Value};

use super::Emitter;
use crate::hlo::{i64_array, tensor as tty, tensor_type};

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
            OpKind::Gather { x, indices, axis } => self.gather(*x, *indices, *axis, &t),
            _ => unreachable!("not a layout op"),
        }
    }

    /// `stablehlo.gather` of single elements, one full index per result element: the
    /// indices along `axis`, positions elsewhere. Gather clamps each index so the
    /// one-element slice stays inside the operand, as the IR's `gather` clamps.
    fn gather(&mut self, x: Value, indices: Value, axis: usize, t: &str) -> String {
        let it = self.k.type_of(indices).clone();
        let rank = it.rank();
        let mut column_shape = it.shape.clone();
        column_shape.push(1);
        let column_t = tensor_type(DType::I32, &column_shape);
        let columns: Vec<String> = (0..rank)
            .map(|d| {
                if d == axis {
                    let i = self.v(indices);
                    self.reshape(&i, DType::I32, &it.shape, &column_shape)
                } else {
                    let attrs = format!("iota_dimension = {d} : i64");
                    self.op("iota", &[], &attrs, &column_t)
                }
            })
            .collect();
        let mut starts_shape = it.shape.clone();
        starts_shape.push(rank as u64);
        let starts_t = tensor_type(DType::I32, &starts_shape);
        let operands: Vec<(&str, &str)> = columns
            .iter()
            .map(|c| (c.as_str(), column_t.as_str()))
            .collect();
        let starts = self.op(
            "concatenate",
            &operands,
            &format!("dimension = {rank} : i64"),
            &starts_t,
        );
        let every_dim = (0..rank)
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let attrs = format!(
            "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [{every_dim}], start_index_map = [{every_dim}], index_vector_dim = {rank}>, indices_are_sorted = false, slice_sizes = {}",
            i64_array(std::iter::repeat_n(1, rank))
        );
        let (xv, xt) = (self.v(x), self.vt(x));
        self.op("gather", &[(&xv, &xt), (&starts, &starts_t)], &attrs, t)
    }
}
