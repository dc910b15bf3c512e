//! `debug_print` in native code: each printed value is written to an f32 buffer, and a
//! call to `@tessera_debug_print(context, site, slots)` hands the runtime the program ids
//! and the buffers (`slots`: the program ids, then one pointer per value, as i64s). The
//! runtime formats the line with the interpreter's formatter and the module's
//! [`DebugPrintSite`] table, which `context` points at.

use super::*;

/// The external function the printing calls go to (the runtime registers it).
pub const DEBUG_PRINT_SYMBOL: &str = "tessera_debug_print";

/// What the runtime needs to format one `debug_print` of a module.
#[derive(Clone, Debug, PartialEq)]
pub struct DebugPrintSite {
    /// The message.
    pub message: String,
    /// The printed values' types (their buffers hold f32 of these shapes).
    pub values: Vec<TensorType>,
    /// How many program ids precede the value pointers in the slots.
    pub programs: usize,
}

impl Emitter<'_> {
    /// Emits the buffers, the slots and the call of one `debug_print`.
    pub(super) fn debug_print(&mut self, message: &str, values: &[Value]) {
        let site = self.debug_prints.len();
        let programs = self.pids.len();
        let slots = self.alloc_elements(&[(programs + values.len()) as u64], "i64");
        let slots_type = slots.mem_type.clone();
        for (i, pid) in self.pids.clone().iter().enumerate() {
            let wide = self.assign(&format!("arith.extsi {pid} : i32 to i64"));
            let at = self.index(i as u64);
            self.line(&format!(
                "memref.store {wide}, {}[{at}] : {slots_type}",
                slots.mem
            ));
        }
        let mut types = Vec::new();
        for (i, &v) in values.iter().enumerate() {
            let ty = self.ty(v).clone();
            let buffer = self.f32_copy(v, &ty);
            let address = self.address(&buffer.mem, &buffer.mem_type);
            let at = self.index((programs + i) as u64);
            self.line(&format!(
                "memref.store {address}, {}[{at}] : {slots_type}",
                slots.mem
            ));
            types.push(ty);
        }
        let context = "%debug";
        let site_word = self.constant(&site.to_string(), "i64");
        let slots_address = self.address(&slots.mem, &slots_type);
        self.line(&format!(
            "func.call @{DEBUG_PRINT_SYMBOL}({context}, {site_word}, {slots_address}) : \
             (i64, i64, i64) -> ()"
        ));
        self.debug_prints.push(DebugPrintSite {
            message: message.to_string(),
            values: types,
            programs,
        });
    }

    /// `v` converted to f32 in a fresh buffer (a scalar in a one-element buffer).
    fn f32_copy(&mut self, v: Value, ty: &TensorType) -> View {
        let val = self.val(v);
        if ty.is_scalar() {
            let buffer = self.alloc(&[1], DType::F32);
            let x = self.read(
                &val,
                ty.dtype,
                &Lane {
                    idx: vec![],
                    width: 1,
                },
            );
            let x = self.cast(&x, ty.dtype, DType::F32, 1);
            let zero = self.index(0);
            self.line(&format!(
                "memref.store {x}, {}[{zero}] : {}",
                buffer.mem, buffer.mem_type
            ));
            return buffer;
        }
        let f32_ty = TensorType::new(DType::F32, ty.shape.clone());
        let dtype = ty.dtype;
        let copied = self.materialize(&f32_ty, &mut |e, lane| {
            let x = e.read(&val, dtype, lane);
            e.cast(&x, dtype, DType::F32, lane.width)
        });
        match copied {
            Val::View(view) => view,
            other => unreachable!("materialize gives a buffer, got {other:?}"),
        }
    }

    /// The address of a buffer's first element, as an i64.
    fn address(&mut self, mem: &str, mem_type: &str) -> String {
        let p = self.assign(&format!(
            "memref.extract_aligned_pointer_as_index {mem} : {mem_type} -> index"
        ));
        self.assign(&format!("arith.index_cast {p} : index to i64"))
    }
}
