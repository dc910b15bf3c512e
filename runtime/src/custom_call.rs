//! Custom calls: XLA programs that call Tessera ops.
//!
//! A StableHLO module calls an op as `stablehlo.custom_call @tessera_op(...)` with
//! `api_version = 4` and a `backend_config` dictionary of string attributes (`op`,
//! `params`). [`TARGET`] is registered with the PJRT plugin as a typed XLA FFI handler on
//! the `Host` platform when the XLA backend loads; it decodes XLA's call frame into an
//! [`OpCall`] and hands it to the runner the embedding program installed with
//! [`set_op_runner`] (the Python extension runs library ops there). Errors and panics
//! come back to XLA as FFI errors, so a failing op fails the execution, never the process.

#![allow(unsafe_code)]

use std::ffi::{c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    clippy::all
)]
mod ffi {
    include!(concat!(env!("OUT_DIR"), "/xla_ffi_api.rs"));
}

/// The custom-call target name every Tessera op call uses.
pub const TARGET: &str = "tessera_op";

/// One operand or result of a custom call: XLA's buffer, dense and row-major.
#[derive(Clone, Debug)]
pub struct CallBuffer {
    /// The first element.
    pub data: *mut c_void,
    /// The element type's short name (`f32`, `bf16`, `f16`, `i32`, `i64`, `bool`, ...).
    pub dtype: &'static str,
    /// The dimensions.
    pub dims: Vec<u64>,
}

/// A decoded custom call: its string attributes, operands and results.
#[derive(Debug)]
pub struct OpCall {
    /// `(name, value)` of every string attribute.
    pub attrs: Vec<(String, String)>,
    /// The operands, read-only.
    pub inputs: Vec<CallBuffer>,
    /// The results, to be written.
    pub outputs: Vec<CallBuffer>,
}

impl OpCall {
    /// The string attribute `name`, or an error naming it.
    pub fn attr(&self, name: &str) -> Result<&str, String> {
        self.attrs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .ok_or_else(|| format!("custom call @{TARGET} has no string attribute `{name}`"))
    }
}

/// What runs a decoded call.
pub type OpRunner = dyn Fn(&OpCall) -> Result<(), String> + Send + Sync;

static RUNNER: OnceLock<Box<OpRunner>> = OnceLock::new();

/// Installs the runner of [`TARGET`] calls; `false` if one was installed already.
pub fn set_op_runner(runner: Box<OpRunner>) -> bool {
    RUNNER.set(runner).is_ok()
}

fn dtype_name(t: ffi::XLA_FFI_DataType) -> Option<&'static str> {
    Some(match t {
        ffi::XLA_FFI_DataType_XLA_FFI_DataType_F32 => "f32",
        ffi::XLA_FFI_DataType_XLA_FFI_DataType_BF16 => "bf16",
        ffi::XLA_FFI_DataType_XLA_FFI_DataType_F16 => "f16",
        ffi::XLA_FFI_DataType_XLA_FFI_DataType_F64 => "f64",
        ffi::XLA_FFI_DataType_XLA_FFI_DataType_S32 => "i32",
        ffi::XLA_FFI_DataType_XLA_FFI_DataType_S64 => "i64",
        ffi::XLA_FFI_DataType_XLA_FFI_DataType_PRED => "bool",
        _ => return None,
    })
}

/// Reads `n` buffer pointers of a call frame.
///
/// # Safety
/// `ptrs` must hold `n` pointers to live `XLA_FFI_Buffer`s (XLA's call frame).
unsafe fn buffers(ptrs: *mut *mut c_void, n: i64, what: &str) -> Result<Vec<CallBuffer>, String> {
    (0..n.max(0) as usize)
        .map(|i| {
            let b = &*(*ptrs.add(i) as *const ffi::XLA_FFI_Buffer);
            let dtype = dtype_name(b.dtype)
                .ok_or_else(|| format!("{what} {i}: element type {} is not supported", b.dtype))?;
            let dims = (0..b.rank.max(0) as usize)
                .map(|d| *b.dims.add(d) as u64)
                .collect();
            Ok(CallBuffer {
                data: b.data,
                dtype,
                dims,
            })
        })
        .collect()
}

/// Decodes an execute-stage call frame.
///
/// # Safety
/// `frame` must be XLA's live call frame.
unsafe fn decode(frame: &ffi::XLA_FFI_CallFrame) -> Result<OpCall, String> {
    let attrs = &frame.attrs;
    let mut decoded = Vec::new();
    for i in 0..attrs.size.max(0) as usize {
        if *attrs.types.add(i) != ffi::XLA_FFI_AttrType_XLA_FFI_AttrType_STRING {
            continue;
        }
        let name = &**attrs.names.add(i);
        let value = &*(*attrs.attrs.add(i) as *const ffi::XLA_FFI_ByteSpan);
        let text = |s: &ffi::XLA_FFI_ByteSpan| {
            String::from_utf8_lossy(std::slice::from_raw_parts(s.ptr as *const u8, s.len))
                .into_owned()
        };
        decoded.push((text(name), text(value)));
    }
    Ok(OpCall {
        attrs: decoded,
        inputs: buffers(frame.args.args, frame.args.size, "operand")?,
        outputs: buffers(frame.rets.rets, frame.rets.size, "result")?,
    })
}

/// Answers XLA's metadata query (API version, no traits) if this call is one.
///
/// # Safety
/// `frame` must be XLA's live call frame.
unsafe fn answer_metadata(frame: &ffi::XLA_FFI_CallFrame) -> bool {
    let ext = frame.extension_start;
    if ext.is_null() || (*ext).type_ != ffi::XLA_FFI_Extension_Type_XLA_FFI_Extension_Metadata {
        return false;
    }
    let ext = &*(ext as *const ffi::XLA_FFI_Metadata_Extension);
    if let Some(meta) = ext.metadata.as_mut() {
        meta.api_version.major_version = 0;
        meta.api_version.minor_version = 1;
        meta.traits = 0;
    }
    true
}

/// The start of `XLA_FFI_Api` up to `XLA_FFI_Error_Create` (bindgen sees the table as
/// opaque: its fields are named after their types). This prefix is the same in every
/// FFI API version.
#[repr(C)]
struct ApiPrefix {
    struct_size: usize,
    extension_start: *mut ffi::XLA_FFI_Extension_Base,
    api_version: ffi::XLA_FFI_Api_Version,
    internal_api: *const c_void,
    error_create: ffi::XLA_FFI_Error_Create,
}

/// Turns a message into an XLA FFI error through the call frame's API table.
///
/// # Safety
/// `frame` must be XLA's live call frame.
unsafe fn error(frame: &ffi::XLA_FFI_CallFrame, message: &str) -> *mut ffi::XLA_FFI_Error {
    let Some(api) = (frame.api as *const ApiPrefix).as_ref() else {
        return std::ptr::null_mut();
    };
    let Some(create) = api.error_create else {
        return std::ptr::null_mut();
    };
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    let mut args = ffi::XLA_FFI_Error_Create_Args {
        struct_size: std::mem::size_of::<ffi::XLA_FFI_Error_Create_Args>(),
        extension_start: std::ptr::null_mut(),
        message: text.as_ptr(),
        errc: ffi::XLA_FFI_Error_Code_XLA_FFI_Error_Code_INTERNAL,
    };
    create(&mut args)
}

/// The FFI handler of [`TARGET`].
unsafe extern "C" fn handle(frame: *mut ffi::XLA_FFI_CallFrame) -> *mut ffi::XLA_FFI_Error {
    let Some(frame) = frame.as_ref() else {
        return std::ptr::null_mut();
    };
    if answer_metadata(frame) {
        return std::ptr::null_mut();
    }
    if frame.stage != ffi::XLA_FFI_ExecutionStage_XLA_FFI_ExecutionStage_EXECUTE {
        return std::ptr::null_mut();
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let call = decode(frame)?;
        let runner = RUNNER
            .get()
            .ok_or("no Tessera op runner is installed in this process (import tessera)")?;
        runner(&call)
    }));
    match outcome {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(e)) => error(frame, &format!("@{TARGET}: {e}")),
        Err(_) => error(frame, &format!("@{TARGET}: internal error (panic)")),
    }
}

/// The handler as an untyped pointer: what PJRT's FFI extension registers, and what
/// jaxlib's `register_custom_call_target` takes (in a capsule) for its own CPU client.
pub fn handler_ptr() -> *mut c_void {
    handle as *const () as *mut c_void
}
