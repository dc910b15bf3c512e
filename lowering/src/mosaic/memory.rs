//! `load`/`store` as `vector.load`/`tpu.vector_store` on the block's memref at the window
//! the shared plan (`kernel_ir::ops::window_plan`) gives; scalar loads of SMEM refs are
//! `memref.load`s. Blocks are whole in VMEM, so a
//! masked load reads every lane and `select`s, and a masked store writes back the old
//! contents of the masked-off lanes.

use kernel_ir::ops::{window_plan, WindowStart};
use kernel_ir::{Index, MemorySpace, Op, OpKind};

use super::{memref_type, vty, Emitter};

impl Emitter<'_> {
    /// A load's value, or `None` for a store.
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
                let t = self.ty(op.results[0]);
                let (indices, counts) = self.window(r, index);
                if k.refs[r].space() == MemorySpace::Smem && t.is_scalar() && mask.is_none() {
                    // SMEM holds scalars: one `memref.load` (a vector load of SMEM cannot
                    // be compiled).
                    return Some(self.def(&format!(
                        "memref.load %arg{}[{}] : {}",
                        k.grid.len() + r,
                        indices.join(", "),
                        memref_type(k, r)
                    )));
                }
                let loaded = self.load_window(r, &indices, &counts);
                let loaded = self.shape_cast(&loaded, t.dtype, &counts, &t.shape);
                let Some(m) = mask else {
                    return Some(loaded);
                };
                let fill = match other {
                    Some(o) => {
                        let o = self.v(*o);
                        self.shape_cast(&o, t.dtype, &[], &t.shape)
                    }
                    None => self.constant(t.dtype, &t.shape, 0.0),
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
                let vt = self.ty(*value);
                let (indices, counts) = self.window(r, index);
                let mut new = self.v(*value);
                if let Some(m) = mask {
                    let old = self.load_window(r, &indices, &counts);
                    let old = self.shape_cast(&old, vt.dtype, &counts, &vt.shape);
                    let m = self.v(*m);
                    new = self.select(&m, &new, &old, &vt);
                }
                let new = self.shape_cast(&new, vt.dtype, &vt.shape, &counts);
                let m = format!("%arg{}", k.grid.len() + r);
                self.line(&format!(
                    "tpu.vector_store {m}[{}], {new} {{strides = array<i32>}} : {}, {}, ",
                    indices.join(", "),
                    memref_type(k, r),
                    vty(vt.dtype, &counts)
                ));
                None
            }
            _ => unreachable!("not a memory op"),
        }
    }

    /// Memref indices (`index` values) and the per-memref-dim window of a load/store.
    fn window(&mut self, r: usize, index: &[Index]) -> (Vec<String>, Vec<u64>) {
        window_plan(&self.k.refs[r], index)
            .iter()
            .map(|w| {
                let i = match w.start {
                    WindowStart::Block => self.def("arith.constant 0 : index"),
                    WindowStart::Static(s) => self.def(&format!("arith.constant {s} : index")),
                    WindowStart::Dynamic(v) => {
                        let v = self.v(v);
                        self.index(&v)
                    }
                };
                (i, w.count)
            })
            .unzip()
    }

    fn load_window(&mut self, r: usize, indices: &[String], counts: &[u64]) -> String {
        let dtype = self.k.refs[r].ty.dtype;
        let m = format!("%arg{}", self.k.grid.len() + r);
        self.def(&format!(
            "vector.load {m}[{}] : {}, {}",
            indices.join(", "),
            memref_type(self.k, r),
            vty(dtype, counts)
        ))
    }
}
