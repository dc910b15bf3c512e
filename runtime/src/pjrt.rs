//! A small safe layer over the PJRT C API: load a plugin, create a CPU client, compile
//! StableHLO, move arrays, execute. Every PJRT error comes back with XLA's message.
//! Modeled on the `pjrt` crate's flow (plugin -> client -> program -> executable ->
//! buffers -> execute), over bindings generated from the plugin's own header.

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::fmt;
use std::path::Path;
use std::ptr;

use kernel_ir::{Array, ArrayData, DType, TensorType};

#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    clippy::all
)]
mod ffi {
    include!(concat!(env!("OUT_DIR"), "/pjrt_c_api.rs"));
}

/// A failure reported by PJRT or by this layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PjrtError(pub String);

impl fmt::Display for PjrtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PjrtError {}

type Result<T> = std::result::Result<T, PjrtError>;

/// Fills `struct_size` the way the C API's `PJRT_DEFINE_STRUCT_TRAITS` does: the size of
/// the struct as this header defines it.
macro_rules! args {
    ($ty:ident { $($field:ident: $value:expr),* $(,)? }) => {{
        let mut a = ffi::$ty::default();
        a.struct_size = std::mem::size_of::<ffi::$ty>();
        $(a.$field = $value;)*
        a
    }};
}

/// A loaded plugin. It is never unloaded: PJRT plugins do not support it.
pub struct Plugin {
    api: &'static ffi::PJRT_Api,
}

// SAFETY: the PJRT C API is thread-safe; the table of function pointers is immutable.
unsafe impl Send for Plugin {}
unsafe impl Sync for Plugin {}

impl Plugin {
    /// Loads the plugin at `path` and initialises it.
    pub fn load(path: &Path) -> Result<Plugin> {
        // SAFETY: loading a PJRT plugin runs its initialisers, which is what it is for.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| PjrtError(format!("cannot load PJRT plugin {}: {e}", path.display())))?;
        // SAFETY: `GetPjrtApi` is the plugin's documented entry point with this signature.
        let api = unsafe {
            let get: libloading::Symbol<unsafe extern "C" fn() -> *const ffi::PJRT_Api> = lib
                .get(b"GetPjrtApi\0")
                .map_err(|e| PjrtError(format!("{} exports no GetPjrtApi: {e}", path.display())))?;
            get()
        };
        // The library must outlive every pointer into it.
        std::mem::forget(lib);
        // SAFETY: a non-null pointer from GetPjrtApi points at a static table.
        let api = unsafe { api.as_ref() }
            .ok_or_else(|| PjrtError(format!("{}: GetPjrtApi returned null", path.display())))?;
        let v = api.pjrt_api_version;
        if v.major_version != ffi::PJRT_API_MAJOR as i32 {
            return Err(PjrtError(format!(
                "{} implements PJRT C API {}.{}, these bindings are {}.{}",
                path.display(),
                v.major_version,
                v.minor_version,
                ffi::PJRT_API_MAJOR,
                ffi::PJRT_API_MINOR
            )));
        }
        let plugin = Plugin { api };
        if let Some(init) = api.PJRT_Plugin_Initialize {
            let mut a = args!(PJRT_Plugin_Initialize_Args {});
            // SAFETY: valid args struct for this entry point.
            plugin.check(unsafe { init(&mut a) })?;
        }
        Ok(plugin)
    }

    /// The plugin's PJRT C API version `(major, minor)`.
    pub fn api_version(&self) -> (i32, i32) {
        let v = self.api.pjrt_api_version;
        (v.major_version, v.minor_version)
    }

    /// Turns a PJRT error into a `PjrtError` (and frees it).
    fn check(&self, err: *mut ffi::PJRT_Error) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        let mut msg = args!(PJRT_Error_Message_Args { error: err });
        let mut destroy = args!(PJRT_Error_Destroy_Args { error: err });
        // SAFETY: `err` is a live error owned by us; both calls take valid args.
        unsafe {
            if let Some(f) = self.api.PJRT_Error_Message {
                f(&mut msg);
            }
            let text = if msg.message.is_null() {
                "unknown PJRT error".to_string()
            } else {
                let bytes = std::slice::from_raw_parts(msg.message as *const u8, msg.message_size);
                String::from_utf8_lossy(bytes).into_owned()
            };
            if let Some(f) = self.api.PJRT_Error_Destroy {
                f(&mut destroy);
            }
            Err(PjrtError(text))
        }
    }

    /// Calls a C API entry point and converts its error; a plugin without the entry
    /// point is an error, not a crash.
    ///
    /// # Safety
    /// `args` must be valid for `f` (pointers live for the call, `struct_size` set).
    unsafe fn invoke<A>(
        &self,
        f: Option<unsafe extern "C" fn(*mut A) -> *mut ffi::PJRT_Error>,
        args: &mut A,
        name: &str,
    ) -> Result<()> {
        match f {
            Some(f) => self.check(f(args)),
            None => Err(PjrtError(format!(
                "the PJRT plugin does not implement {name}"
            ))),
        }
    }

    fn await_event(&self, event: *mut ffi::PJRT_Event) -> Result<()> {
        if event.is_null() {
            return Ok(());
        }
        let mut a = args!(PJRT_Event_Await_Args { event: event });
        let mut d = args!(PJRT_Event_Destroy_Args { event: event });
        // SAFETY: `event` is a live event we own; destroyed exactly once.
        unsafe {
            let r = self.invoke(self.api.PJRT_Event_Await, &mut a, "PJRT_Event_Await");
            let _ = self.invoke(self.api.PJRT_Event_Destroy, &mut d, "PJRT_Event_Destroy");
            r
        }
    }

    /// Creates a client with default options.
    pub fn client(&'static self) -> Result<Client> {
        let mut a = args!(PJRT_Client_Create_Args {});
        // SAFETY: valid args; the out-pointer is filled on success.
        unsafe { self.invoke(self.api.PJRT_Client_Create, &mut a, "PJRT_Client_Create") }?;
        let client = a.client;
        let mut d = args!(PJRT_Client_AddressableDevices_Args { client: client });
        // SAFETY: `client` is live.
        unsafe {
            self.invoke(
                self.api.PJRT_Client_AddressableDevices,
                &mut d,
                "PJRT_Client_AddressableDevices",
            )
        }?;
        if d.num_addressable_devices == 0 {
            return Err(PjrtError(
                "the PJRT client has no addressable device".into(),
            ));
        }
        // SAFETY: the array has `num_addressable_devices` entries, owned by the client.
        let device = unsafe { *d.addressable_devices };
        Ok(Client {
            plugin: self,
            client,
            device,
        })
    }
}

/// `PJRT_FFI_Register_Handler_Args` of `pjrt_c_api_ffi_extension.h` (not in the header
/// the plugin ships; this is its layout in these plugins: no `api_version` field).
#[repr(C)]
struct FfiRegisterHandlerArgs {
    struct_size: usize,
    target_name: *const std::ffi::c_char,
    target_name_size: usize,
    handler: *mut c_void,
    platform_name: *const std::ffi::c_char,
    platform_name_size: usize,
    traits: u32,
}

/// `PJRT_FFI_Extension`: the extension base, then three entry points.
#[repr(C)]
struct FfiExtension {
    base: ffi::PJRT_Extension_Base,
    type_id_register: *const c_void,
    user_data_add: *const c_void,
    register_handler:
        Option<unsafe extern "C" fn(*mut FfiRegisterHandlerArgs) -> *mut ffi::PJRT_Error>,
}

impl Plugin {
    /// Registers a typed XLA FFI handler for custom calls to `target` on the host.
    pub fn register_ffi_handler(&self, target: &str, handler: *mut c_void) -> Result<()> {
        let mut ext = self.api.extension_start;
        // SAFETY: the extension chain is a static linked list owned by the plugin.
        while let Some(e) = unsafe { ext.as_ref() } {
            if e.type_ == ffi::PJRT_Extension_Type_PJRT_Extension_Type_FFI {
                break;
            }
            ext = e.next;
        }
        if ext.is_null() {
            return Err(PjrtError("the PJRT plugin has no FFI extension".into()));
        }
        // SAFETY: an extension of type FFI is a `PJRT_FFI_Extension`.
        let ffi_ext = unsafe { &*(ext as *const FfiExtension) };
        let platform = "Host";
        let mut a = FfiRegisterHandlerArgs {
            struct_size: std::mem::size_of::<FfiRegisterHandlerArgs>(),
            target_name: target.as_ptr() as *const _,
            target_name_size: target.len(),
            handler,
            platform_name: platform.as_ptr() as *const _,
            platform_name_size: platform.len(),
            traits: 0,
        };
        match ffi_ext.register_handler {
            // SAFETY: valid args; the names are copied by the plugin.
            Some(f) => self.check(unsafe { f(&mut a) }),
            None => Err(PjrtError(
                "the PJRT plugin's FFI extension cannot register handlers".into(),
            )),
        }
    }
}

/// A host buffer handed to [`Client::execute_host`]: address, element type, dims.
#[derive(Clone, Debug)]
pub struct HostBuffer {
    /// The first element (dense, row-major).
    pub data: *mut c_void,
    /// The element type.
    pub element: Element,
    /// The dimensions.
    pub dims: Vec<i64>,
}

// SAFETY: a description of memory; whoever dereferences it (`execute_host`, unsafe)
// answers for its validity, on any thread.
unsafe impl Send for HostBuffer {}

/// Element types of whole-model programs (a superset of the kernel dtypes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// bfloat16.
    BF16,
    /// IEEE half.
    F16,
    /// 64-bit integer.
    I64,
    /// 32-bit integer.
    I32,
    /// 16-bit integer.
    I16,
    /// 8-bit integer.
    I8,
    /// 8-bit unsigned integer.
    U8,
    /// Boolean (one byte).
    Bool,
}

impl Element {
    /// Parses a short name (`f32`, `f64`, `bf16`, `f16`, `i64`, `i32`, `i16`, `i8`, `u8`, `bool`).
    pub fn from_name(name: &str) -> Option<Element> {
        Some(match name {
            "f32" => Element::F32,
            "f64" => Element::F64,
            "bf16" => Element::BF16,
            "f16" => Element::F16,
            "i64" => Element::I64,
            "i32" => Element::I32,
            "i16" => Element::I16,
            "i8" => Element::I8,
            "u8" => Element::U8,
            "bool" => Element::Bool,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            Element::F64 | Element::I64 => 8,
            Element::F32 | Element::I32 => 4,
            Element::BF16 | Element::F16 | Element::I16 => 2,
            Element::I8 | Element::U8 | Element::Bool => 1,
        }
    }

    fn buffer_type(self) -> ffi::PJRT_Buffer_Type {
        match self {
            Element::F32 => ffi::PJRT_Buffer_Type_PJRT_Buffer_Type_F32,
            Element::F64 => ffi::PJRT_Buffer_Type_PJRT_Buffer_Type_F64,
            Element::BF16 => ffi::PJRT_Buffer_Type_PJRT_Buffer_Type_BF16,
            Element::F16 => ffi::PJRT_Buffer_Type_PJRT_Buffer_Type_F16,
            Element::I64 => ffi::PJRT_Buffer_Type_PJRT_Buffer_Type_S64,
            Element::I32 => ffi::PJRT_Buffer_Type_PJRT_Buffer_Type_S32,
            Element::I16 => ffi::PJRT_Buffer_Type_PJRT_Buffer_Type_S16,
            Element::I8 => ffi::PJRT_Buffer_Type_PJRT_Buffer_Type_S8,
            Element::U8 => ffi::PJRT_Buffer_Type_PJRT_Buffer_Type_U8,
            Element::Bool => ffi::PJRT_Buffer_Type_PJRT_Buffer_Type_PRED,
        }
    }
}

impl HostBuffer {
    fn byte_len(&self) -> usize {
        self.dims
            .iter()
            .map(|&d| d.max(0) as usize)
            .product::<usize>()
            * self.element.size_bytes()
    }
}

/// A PJRT client bound to its first device.
pub struct Client {
    plugin: &'static Plugin,
    client: *mut ffi::PJRT_Client,
    device: *mut ffi::PJRT_Device,
}

// SAFETY: PJRT clients are thread-safe.
unsafe impl Send for Client {}
unsafe impl Sync for Client {}

/// A compiled program, loaded on the client's device.
pub struct Executable {
    plugin: &'static Plugin,
    exe: *mut ffi::PJRT_LoadedExecutable,
}

// SAFETY: PJRT executables may be executed from any thread.
unsafe impl Send for Executable {}
unsafe impl Sync for Executable {}

impl Drop for Executable {
    fn drop(&mut self) {
        let mut a = args!(PJRT_LoadedExecutable_Destroy_Args {
            executable: self.exe
        });
        // SAFETY: we own the executable.
        let _ = unsafe {
            self.plugin.invoke(
                self.plugin.api.PJRT_LoadedExecutable_Destroy,
                &mut a,
                "PJRT_LoadedExecutable_Destroy",
            )
        };
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let mut a = args!(PJRT_Client_Destroy_Args {
            client: self.client
        });
        // SAFETY: we own the client; executables hold no borrow of it past this point.
        let _ = unsafe {
            self.plugin.invoke(
                self.plugin.api.PJRT_Client_Destroy,
                &mut a,
                "PJRT_Client_Destroy",
            )
        };
    }
}

/// A device buffer, destroyed on drop.
struct Buffer {
    plugin: &'static Plugin,
    buf: *mut ffi::PJRT_Buffer,
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut a = args!(PJRT_Buffer_Destroy_Args { buffer: self.buf });
        // SAFETY: we own the buffer.
        let _ = unsafe {
            self.plugin.invoke(
                self.plugin.api.PJRT_Buffer_Destroy,
                &mut a,
                "PJRT_Buffer_Destroy",
            )
        };
    }
}

impl From<DType> for Element {
    fn from(dtype: DType) -> Element {
        match dtype {
            DType::F32 => Element::F32,
            DType::BF16 => Element::BF16,
            DType::F16 => Element::F16,
            DType::I32 => Element::I32,
            DType::Bool => Element::Bool,
        }
    }
}

/// The bytes of an array in its device element type.
fn host_bytes(a: &Array) -> Vec<u8> {
    match a.data() {
        ArrayData::Float(v) => match a.dtype() {
            DType::BF16 => v
                .iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                .collect(),
            DType::F16 => v
                .iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect(),
            _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        },
        ArrayData::Int(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ArrayData::Bool(v) => v.iter().map(|&b| u8::from(b)).collect(),
    }
}

fn array_from_bytes(ty: &TensorType, bytes: &[u8]) -> Result<Array> {
    let data = match ty.dtype {
        DType::F32 => ArrayData::Float(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        DType::BF16 => ArrayData::Float(
            bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        ),
        DType::F16 => ArrayData::Float(
            bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        ),
        DType::I32 => ArrayData::Int(
            bytes
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        DType::Bool => ArrayData::Bool(bytes.iter().map(|&b| b != 0).collect()),
    };
    Array::new(ty.clone(), data)
        .map_err(|e| PjrtError(format!("device returned a bad buffer: {e}")))
}

impl Client {
    /// Compiles a StableHLO module given as MLIR text.
    pub fn compile(&self, mlir: &str) -> Result<Executable> {
        let format = "mlir";
        let program = args!(PJRT_Program {
            code: mlir.as_ptr() as *mut _,
            code_size: mlir.len(),
            format: format.as_ptr() as *const _,
            format_size: format.len(),
        });
        let options = COMPILE_OPTIONS;
        let mut a = args!(PJRT_Client_Compile_Args {
            client: self.client,
            program: &program,
            compile_options: options.as_ptr() as *const _,
            compile_options_size: options.len(),
        });
        // SAFETY: every pointer in `a` outlives the call.
        unsafe {
            self.plugin.invoke(
                self.plugin.api.PJRT_Client_Compile,
                &mut a,
                "PJRT_Client_Compile",
            )
        }?;
        Ok(Executable {
            plugin: self.plugin,
            exe: a.executable,
        })
    }

    fn upload(&self, a: &Array) -> Result<Buffer> {
        let bytes = host_bytes(a);
        let dims: Vec<i64> = a.shape().iter().map(|&d| d as i64).collect();
        // SAFETY: `bytes` holds the array's elements in its device type, and lives until
        // the host-buffer event below.
        let (buffer, done) = unsafe {
            self.upload_raw(
                bytes.as_ptr() as *const c_void,
                Element::from(a.dtype()).buffer_type(),
                &dims,
                ffi::PJRT_HostBufferSemantics_PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes,
            )
        }?;
        self.plugin.await_event(done)?;
        Ok(buffer)
    }

    /// Makes a device buffer of host memory; with `kImmutableZeroCopy` the CPU client
    /// may alias it instead of copying. Returns the buffer and the event that fires
    /// when PJRT is done with the host memory (for an aliased buffer: once the buffer
    /// is destroyed).
    ///
    /// # Safety
    /// `data` must hold the elements of `dims` in type `ty`, alive and unchanged until
    /// the returned event fires.
    unsafe fn upload_raw(
        &self,
        data: *const c_void,
        ty: ffi::PJRT_Buffer_Type,
        dims: &[i64],
        semantics: ffi::PJRT_HostBufferSemantics,
    ) -> Result<(Buffer, *mut ffi::PJRT_Event)> {
        let mut args = args!(PJRT_Client_BufferFromHostBuffer_Args {
            client: self.client,
            data: data,
            type_: ty,
            dims: dims.as_ptr(),
            num_dims: dims.len(),
            host_buffer_semantics: semantics,
            device: self.device,
        });
        // SAFETY: `data` and `dims` live until the transfer-complete event below.
        unsafe {
            self.plugin.invoke(
                self.plugin.api.PJRT_Client_BufferFromHostBuffer,
                &mut args,
                "PJRT_Client_BufferFromHostBuffer",
            )
        }?;
        let buffer = Buffer {
            plugin: self.plugin,
            buf: args.buffer,
        };
        Ok((buffer, args.done_with_host_buffer))
    }

    fn download(&self, b: &Buffer, ty: &TensorType) -> Result<Array> {
        let size = ty.num_elements() as usize * ty.dtype.size_bytes();
        let mut bytes = kernel_ir::try_vec(|| format!("a result ({ty})"), size as u64, 0u8)
            .map_err(|e| PjrtError(e.to_string()))?;
        // SAFETY: `bytes` has `size` bytes.
        unsafe { self.download_raw(b, bytes.as_mut_ptr() as *mut c_void, size) }?;
        array_from_bytes(ty, &bytes)
    }

    /// Copies a device buffer into `size` bytes at `dst`.
    ///
    /// # Safety
    /// `dst` must be writable for `size` bytes.
    unsafe fn download_raw(&self, b: &Buffer, dst: *mut c_void, size: usize) -> Result<()> {
        let mut a = args!(PJRT_Buffer_ToHostBuffer_Args {
            src: b.buf,
            dst: dst,
            dst_size: size,
        });
        // SAFETY: `dst` has `dst_size` bytes and lives until the event completes.
        unsafe {
            self.plugin.invoke(
                self.plugin.api.PJRT_Buffer_ToHostBuffer,
                &mut a,
                "PJRT_Buffer_ToHostBuffer",
            )
        }?;
        self.plugin.await_event(a.event)
    }

    /// Runs `exe` on `inputs`; `outputs` are the result types, in order.
    pub fn execute(
        &self,
        exe: &Executable,
        inputs: &[Array],
        outputs: &[TensorType],
    ) -> Result<Vec<Array>> {
        let buffers = inputs
            .iter()
            .map(|a| self.upload(a))
            .collect::<Result<Vec<_>>>()?;
        let results = self.launch(exe, buffers, outputs.len())?;
        results
            .iter()
            .zip(outputs)
            .map(|(b, ty)| self.download(b, ty))
            .collect()
    }

    /// Runs `exe` on host memory: inputs are aliased where the client allows it (else
    /// copied in), each result is copied into its output buffer.
    ///
    /// # Safety
    /// Every buffer must point at its elements (dense, row-major), inputs alive and
    /// unchanged for the call, outputs writable.
    pub unsafe fn execute_host(
        &self,
        exe: &Executable,
        inputs: &[HostBuffer],
        outputs: &[HostBuffer],
    ) -> Result<()> {
        let mut buffers = Vec::with_capacity(inputs.len());
        let mut host_done = Vec::with_capacity(inputs.len());
        for h in inputs {
            // SAFETY: the caller keeps `h` alive and unchanged until we return, after
            // every host-buffer event has fired.
            let uploaded = unsafe {
                self.upload_raw(
                    h.data,
                    h.element.buffer_type(),
                    &h.dims,
                    ffi::PJRT_HostBufferSemantics_PJRT_HostBufferSemantics_kImmutableZeroCopy,
                )
            };
            match uploaded {
                Ok((b, done)) => {
                    buffers.push(b);
                    host_done.push(done);
                }
                Err(e) => {
                    drop(buffers);
                    self.await_all(host_done)?;
                    return Err(e);
                }
            }
        }
        // `launch` destroys the input buffers, which releases aliased host memory.
        let launched = self.launch(exe, buffers, outputs.len());
        self.await_all(host_done)?;
        let results = launched?;
        for (i, (b, h)) in results.iter().zip(outputs).enumerate() {
            let want = h.byte_len();
            let got = self.on_device_size(b)?;
            if got != want {
                return Err(PjrtError(format!(
                    "result {i} has {got} bytes, its output buffer {want}"
                )));
            }
            // SAFETY: the caller's output buffer has `want` writable bytes.
            unsafe { self.download_raw(b, h.data, want) }?;
        }
        Ok(())
    }

    /// Waits for (and frees) every event, returning the first error.
    fn await_all(&self, events: Vec<*mut ffi::PJRT_Event>) -> Result<()> {
        let mut first = Ok(());
        for e in events {
            let r = self.plugin.await_event(e);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// The bytes a device buffer holds.
    fn on_device_size(&self, b: &Buffer) -> Result<usize> {
        let mut a = args!(PJRT_Buffer_OnDeviceSizeInBytes_Args { buffer: b.buf });
        // SAFETY: `b` is live.
        unsafe {
            self.plugin.invoke(
                self.plugin.api.PJRT_Buffer_OnDeviceSizeInBytes,
                &mut a,
                "PJRT_Buffer_OnDeviceSizeInBytes",
            )
        }?;
        Ok(a.on_device_size_in_bytes)
    }

    /// Executes on device buffers (consumed) and waits; returns the results.
    fn launch(&self, exe: &Executable, buffers: Vec<Buffer>, n_out: usize) -> Result<Vec<Buffer>> {
        let raw: Vec<*mut ffi::PJRT_Buffer> = buffers.iter().map(|b| b.buf).collect();
        let arg_list: *const *mut ffi::PJRT_Buffer = raw.as_ptr();
        let mut out: Vec<*mut ffi::PJRT_Buffer> = vec![ptr::null_mut(); n_out];
        let mut out_list: *mut *mut ffi::PJRT_Buffer = out.as_mut_ptr();
        let mut done: *mut ffi::PJRT_Event = ptr::null_mut();
        let mut options = args!(PJRT_ExecuteOptions {});
        let mut a = args!(PJRT_LoadedExecutable_Execute_Args {
            executable: exe.exe,
            options: &mut options,
            argument_lists: &arg_list,
            num_devices: 1,
            num_args: raw.len(),
            output_lists: &mut out_list,
            device_complete_events: &mut done,
        });
        // SAFETY: argument and output arrays are sized for one device and live past the call.
        unsafe {
            self.plugin.invoke(
                self.plugin.api.PJRT_LoadedExecutable_Execute,
                &mut a,
                "PJRT_LoadedExecutable_Execute",
            )
        }?;
        let results: Vec<Buffer> = out
            .into_iter()
            .map(|buf| Buffer {
                plugin: self.plugin,
                buf,
            })
            .collect();
        self.plugin.await_event(done)?;
        drop(buffers);
        Ok(results)
    }
}

impl Executable {
    /// The plugin-specific serialized form (not stable across plugin versions).
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let api = self.plugin.api;
        let mut g = args!(PJRT_LoadedExecutable_GetExecutable_Args {
            loaded_executable: self.exe
        });
        // SAFETY: `self.exe` is live; the returned executable is destroyed below.
        unsafe {
            self.plugin.invoke(
                api.PJRT_LoadedExecutable_GetExecutable,
                &mut g,
                "PJRT_LoadedExecutable_GetExecutable",
            )
        }?;
        let mut a = args!(PJRT_Executable_Serialize_Args {
            executable: g.executable
        });
        // SAFETY: valid args; the bytes live until the deleter runs.
        let result = unsafe {
            self.plugin.invoke(
                api.PJRT_Executable_Serialize,
                &mut a,
                "PJRT_Executable_Serialize",
            )
        }
        .map(|()| {
            // SAFETY: PJRT returned `serialized_bytes_size` bytes at `serialized_bytes`.
            let bytes = unsafe {
                std::slice::from_raw_parts(a.serialized_bytes as *const u8, a.serialized_bytes_size)
            }
            .to_vec();
            if let Some(deleter) = a.serialized_executable_deleter {
                // SAFETY: called once on the object PJRT handed out.
                unsafe { deleter(a.serialized_executable) };
            }
            bytes
        });
        let mut d = args!(PJRT_Executable_Destroy_Args {
            executable: g.executable
        });
        // SAFETY: destroys the executable obtained above, once.
        let _ = unsafe {
            self.plugin.invoke(
                api.PJRT_Executable_Destroy,
                &mut d,
                "PJRT_Executable_Destroy",
            )
        };
        result
    }
}

impl Client {
    /// Loads an executable serialized by [`Executable::serialize`] with the same plugin.
    pub fn deserialize(&self, bytes: &[u8]) -> Result<Executable> {
        let mut a = args!(PJRT_Executable_DeserializeAndLoad_Args {
            client: self.client,
            serialized_executable: bytes.as_ptr() as *const _,
            serialized_executable_size: bytes.len(),
        });
        // SAFETY: `bytes` outlives the call.
        unsafe {
            self.plugin.invoke(
                self.plugin.api.PJRT_Executable_DeserializeAndLoad,
                &mut a,
                "PJRT_Executable_DeserializeAndLoad",
            )
        }?;
        Ok(Executable {
            plugin: self.plugin,
            exe: a.loaded_executable,
        })
    }
}

/// The serialized `CompileOptionsProto` every compile uses: one replica, one partition
/// (`executable_build_options` (field 3) { `num_replicas` (4) = 1, `num_partitions` (5) = 1 }).
pub const COMPILE_OPTIONS: [u8; 6] = [0x1a, 0x04, 0x20, 0x01, 0x28, 0x01];

#[cfg(test)]
mod tests {
    use super::Element;

    #[test]
    fn every_torch_dtype_tessera_takes_is_an_element() {
        for d in kernels::torch_op::DTYPES {
            assert!(Element::from_name(d.element).is_some(), "{}", d.element);
        }
    }
}
