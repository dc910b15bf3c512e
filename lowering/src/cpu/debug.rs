//! `debug_print` and `check` in native code: each reported value is written to an f32
//! buffer, and a call to `@tessera_debug(context, site, slots)` hands the runtime the
//! program ids and the buffers (`slots`: the program ids, then one pointer per value, as
//! i64s). A `debug_print` calls every time; a `check` only when an element of its
//! condition is false. The runtime formats the line with the interpreter's formatter and
//! the module's [`DebugSite`] table (its run's context holds it), printing it or
//! recording the check's failure.

use kernel_ir::CheckKind;

use super::*;

/// The external function the calls go to (the runtime registers it).
pub const DEBUG_SYMBOL: &str = "tessera_debug";

/// What the runtime needs to format one `debug_print` or failed `check` of a module.
#[derive(Clone, Debug, PartialEq)]
pub struct DebugSite {
    /// The message.
    pub message: String,
    /// The reported values' types (their buffers hold f32 of these shapes).
    pub values: Vec<TensorType>,
    /// How many program ids precede the value pointers in the slots.
    pub programs: usize,
    /// `None` for a `debug_print`; the kind of a `check` (the call means it failed).
    pub check: Option<CheckKind>,
}

impl Emitter<'_> {
    /// Emits a `check`: a pass over `cond` sets a flag where a lane is false, and the
    /// call reports the failure when the flag is set.
    pub(super) fn check(&mut self, kind: CheckKind, cond: Value, message: &str, values: &[Value]) {
        let ty = self.ty(cond).clone();
        let c = self.val(cond);
        let flag = self.alloc_elements(&[1], "i1");
        let zero = self.index(0);
        let (yes, no) = (self.constant("true", "i1"), self.constant("false", "i1"));
        let store_flag = |e: &mut Self, bit: &str| {
            e.line(&format!(
                "memref.store {bit}, {}[{zero}] : {}",
                flag.mem, flag.mem_type
            ))
        };
        store_flag(self, &no);
        self.lanes(&ty.shape, &mut |e, lane| {
            let x = e.read(&c, DType::Bool, lane);
            let all = if lane.width == 1 {
                x
            } else {
                e.assign(&format!(
                    "vector.reduction <and>, {x} : vector<{}xi1> into i1",
                    lane.width
                ))
            };
            let failed = e.assign(&format!("arith.xori {all}, {yes} : i1"));
            e.line(&format!("scf.if {failed} {{"));
            e.w.indent += 1;
            store_flag(e, &yes);
            e.close();
        });
        let failed = self.assign(&format!(
            "memref.load {}[{zero}] : {}",
            flag.mem, flag.mem_type
        ));
        self.line(&format!("scf.if {failed} {{"));
        self.w.indent += 1;
        self.debug_call(message, values, Some(kind));
        self.close();
    }

    /// Emits the buffers, the slots and the call of one `debug_print` (`check` None) or
    /// failed `check`.
    pub(super) fn debug_call(&mut self, message: &str, values: &[Value], check: Option<CheckKind>) {
        let site = self.debug_sites.len();
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
            "func.call @{DEBUG_SYMBOL}({context}, {site_word}, {slots_address}) : \
             (i64, i64, i64) -> ()"
        ));
        self.debug_sites.push(DebugSite {
            message: message.to_string(),
            values: types,
            programs,
            check,
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
