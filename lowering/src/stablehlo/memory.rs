//! `load`/`store` as `dynamic_slice`/`dynamic_update_slice` of the ref's padded array at
//! the window the shared plan (`kernel_ir::ops::window_plan`) gives; masks are a
//! `select` after the read (load) or against the old contents (store).

use kernel_ir::ops::{window_plan, WindowStart};
use kernel_ir::{DType, Index, Op, OpKind, TensorType};

use super::Emitter;
use crate::hlo::{i64_array, tensor as tty, tensor_type as ty_of};

/// Where one array dimension of a load/store window starts and how long it is.
pub(super) struct DimWindow {
    start: String,
    count: u64,
}

impl Emitter<'_> {
    /// A load's value, or `None` for a store (which updates the ref's array).
    pub(super) fn memory(&mut self, op: &Op) -> Option<String> {
        let k = self.k;
        match &op.kind {
            OpKind::Load {
                src,
                index,
                mask,
                other,
            } => {
                let r = src.0 as usize;
                let t = k.type_of(op.results[0]).clone();
                let dims = self.window(r, index);
                let dtype = k.refs[r].ty.dtype;
                let full: Vec<u64> = dims.iter().map(|d| d.count).collect();
                let sliced = self.read_window(r, &dims);
                let loaded = self.reshape(&sliced, dtype, &full, &t.shape);
                let Some(m) = mask else {
                    return Some(loaded);
                };
                let fill = match other {
                    Some(o) => {
                        let o = self.v(*o);
                        self.b.broadcast(&o, &ty_of(dtype, &[]), &[], &tty(&t))
                    }
                    None => self.constant(dtype, &t.shape, 0.0),
                };
                let m = self.v(*m);
                Some(self.select(&m, &loaded, &fill, &t))
            }
            OpKind::Store {
                dst,
                index,
                value,
                mask,
            } => {
                let r = dst.0 as usize;
                let dims = self.window(r, index);
                let vt = k.type_of(*value).clone();
                let window =
                    TensorType::new(vt.dtype, dims.iter().map(|d| d.count).collect::<Vec<_>>());
                let mut new = self.reshape(&self.v(*value), vt.dtype, &vt.shape, &window.shape);
                if let Some(m) = mask {
                    let old = self.read_window(r, &dims);
                    let m = self.reshape(&self.v(*m), DType::Bool, &vt.shape, &window.shape);
                    new = self.select(&m, &new, &old, &window);
                }
                let array_t = ty_of(vt.dtype, &self.padded[r]);
                let update = [(new, tty(&window))];
                self.arrays[r] =
                    self.sliced_op(r, &update, &dims, "dynamic_update_slice", "", &array_t);
                None
            }
            _ => unreachable!("not a memory op"),
        }
    }

    /// The array-dim windows of a load/store of ref `r`: block start plus the plan's
    /// offset.
    fn window(&mut self, r: usize, index: &[Index]) -> Vec<DimWindow> {
        let plan = window_plan(&self.k.refs[r], index);
        let i32t = ty_of(DType::I32, &[]);
        plan.iter()
            .enumerate()
            .map(|(dim, w)| {
                let base = match self.starts[r].get(dim) {
                    Some(s) => s.clone(),
                    None => self.index_const(0),
                };
                let start = match w.start {
                    WindowStart::Block => base,
                    WindowStart::Static(s) => {
                        let s = self.index_const(s as i64);
                        self.binary_raw("add", &base, &s, &i32t)
                    }
                    WindowStart::Dynamic(v) => {
                        let v = self.v(v);
                        self.binary_raw("add", &base, &v, &i32t)
                    }
                };
                DimWindow {
                    start,
                    count: w.count,
                }
            })
            .collect()
    }

    /// Element `index` (i32 values) of ref `r`'s array, as an i32 scalar: a read of a
    /// scalar-prefetch operand by an index map.
    pub(super) fn read_element(&mut self, r: usize, index: Vec<String>) -> String {
        let dims: Vec<DimWindow> = index
            .into_iter()
            .map(|start| DimWindow { start, count: 1 })
            .collect();
        let ones = vec![1; dims.len()];
        let element = self.read_window(r, &dims);
        self.reshape(&element, DType::I32, &ones, &[])
    }

    /// The current contents of a window of ref `r`'s (padded) array.
    fn read_window(&mut self, r: usize, dims: &[DimWindow]) -> String {
        let dtype = self.k.refs[r].ty.dtype;
        let full: Vec<u64> = dims.iter().map(|d| d.count).collect();
        let attrs = format!("slice_sizes = {}", i64_array(full.iter().copied()));
        self.sliced_op(r, &[], dims, "dynamic_slice", &attrs, &ty_of(dtype, &full))
    }

    /// `name(array of ref r, extra..., window starts...)`: a dynamic slice or update.
    fn sliced_op(
        &mut self,
        r: usize,
        extra: &[(String, String)],
        dims: &[DimWindow],
        name: &str,
        attrs: &str,
        result: &str,
    ) -> String {
        let array = (
            self.arrays[r].clone(),
            ty_of(self.k.refs[r].ty.dtype, &self.padded[r]),
        );
        let i32t = ty_of(DType::I32, &[]);
        let starts: Vec<(String, String)> = dims
            .iter()
            .map(|d| (d.start.clone(), i32t.clone()))
            .collect();
        let operands: Vec<(&str, &str)> = std::iter::once(&array)
            .chain(extra)
            .chain(&starts)
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        self.op(name, &operands, attrs, result)
    }
}
