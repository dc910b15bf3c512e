//! The native CPU backend: kernels lowered by `lowering::cpu` to upstream MLIR, taken to
//! the LLVM dialect by MLIR's passes and JIT-compiled by its ExecutionEngine (through
//! melior), cached in memory, and run with the parallel programs split across cores.
//!
//! Executables stay in memory only: the ExecutionEngine has no way to load compiled code
//! back from disk, and a JIT of a library kernel takes 40-300 ms.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::Instant;

use kernel_ir::{Array, ArrayData, DType, Kernel, RefKind};
use lowering::cpu::CpuModule;
use melior::dialect::DialectRegistry;
use melior::ir::Module;
use melior::pass::PassManager;
use melior::utility::{
    parse_pass_pipeline, register_all_dialects, register_all_llvm_translations, register_all_passes,
};
use melior::Context;
use mlir_sys::{
    mlirExecutionEngineCreate, mlirExecutionEngineDestroy, mlirExecutionEngineLookupPacked,
    MlirExecutionEngine, MlirStringRef,
};

use crate::cache::{Cache, Compiler, Source};

/// Upstream MLIR (func/scf/vector/arith/math/memref) down to the LLVM dialect.
const PIPELINE: &str = "builtin.module(arith-expand,convert-scf-to-cf,\
    convert-vector-to-llvm,convert-math-to-llvm,convert-math-to-libm,\
    expand-strided-metadata,lower-affine,finalize-memref-to-llvm,convert-arith-to-llvm,\
    convert-index-to-llvm,convert-cf-to-llvm,convert-func-to-llvm,convert-ub-to-llvm,\
    reconcile-unrealized-casts)";

/// LLVM optimisation level of the JIT.
const OPT_LEVEL: i32 = 3;

/// The packed entry point MLIR generates: one pointer per LLVM-level argument.
type PackedFn = unsafe extern "C" fn(*mut *mut c_void);

/// JIT-compiled code and its entry point.
pub struct Jitted {
    engine: MlirExecutionEngine,
    entry: PackedFn,
}

// SAFETY: the engine owns finished machine code that reads only its arguments; it is
// never mutated after creation, so calls from several threads at once are fine, and it is
// destroyed once, when the last `Arc` goes.
unsafe impl Send for Jitted {}
unsafe impl Sync for Jitted {}

impl Drop for Jitted {
    fn drop(&mut self) {
        unsafe { mlirExecutionEngineDestroy(self.engine) }
    }
}

/// MLIR's JIT as a [`Compiler`] for the cache; a module's entry is its only function.
pub struct JitCompiler;

fn string_ref(s: &str) -> MlirStringRef {
    MlirStringRef {
        data: s.as_ptr() as *const _,
        length: s.len(),
    }
}

/// The symbol of the module's function: `func.func @NAME(`.
fn entry_symbol(module: &str) -> Option<&str> {
    let rest = &module[module.find("func.func @")? + "func.func @".len()..];
    Some(&rest[..rest.find('(')?])
}

impl Compiler for JitCompiler {
    type Executable = Jitted;

    fn fingerprint(&self) -> String {
        format!("native|mlir-sys 220|O{OPT_LEVEL}|{PIPELINE}")
    }

    fn compile(&self, text: &str) -> Result<Jitted, String> {
        static PASSES: Once = Once::new();
        PASSES.call_once(register_all_passes);
        let symbol = entry_symbol(text).ok_or("the module has no func.func")?;
        let registry = DialectRegistry::new();
        register_all_dialects(&registry);
        let context = Context::new_with_registry(&registry, false);
        context.load_all_available_dialects();
        register_all_llvm_translations(&context);
        let diagnostics = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = diagnostics.clone();
        context.attach_diagnostic_handler(move |d| {
            sink.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(d.to_string());
            true
        });
        let messages = || {
            diagnostics
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .join("; ")
        };
        let mut module = Module::parse(&context, text)
            .ok_or_else(|| format!("MLIR could not parse the module: {}", messages()))?;
        let passes = PassManager::new(&context);
        parse_pass_pipeline(passes.as_operation_pass_manager(), PIPELINE)
            .map_err(|e| format!("bad pass pipeline: {e}"))?;
        passes
            .run(&mut module)
            .map_err(|_| format!("lowering to the LLVM dialect failed: {}", messages()))?;
        // melior's ExecutionEngine::new cannot report failure; the C API returns null.
        let engine = unsafe {
            mlirExecutionEngineCreate(
                module.to_raw(),
                OPT_LEVEL,
                0,
                std::ptr::null(),
                false,
                false,
            )
        };
        if engine.ptr.is_null() {
            return Err(format!(
                "LLVM could not JIT-compile the module: {}",
                messages()
            ));
        }
        let entry = unsafe { mlirExecutionEngineLookupPacked(engine, string_ref(symbol)) };
        if entry.is_null() {
            unsafe { mlirExecutionEngineDestroy(engine) };
            return Err(format!("the JIT-compiled module has no function @{symbol}"));
        }
        Ok(Jitted {
            engine,
            // SAFETY: MLIR's packed wrappers have exactly this signature.
            entry: unsafe { std::mem::transmute::<*mut c_void, PackedFn>(entry) },
        })
    }

    fn serialize(&self, _: &Jitted) -> Result<Vec<u8>, String> {
        Err("JIT-compiled code cannot be stored".into())
    }

    fn deserialize(&self, _: &[u8]) -> Result<Jitted, String> {
        Err("JIT-compiled code cannot be loaded".into())
    }
}

/// The process-wide native backend.
pub struct Native {
    cache: Cache<JitCompiler>,
}

/// The backend.
pub fn backend() -> &'static Native {
    static NATIVE: OnceLock<Native> = OnceLock::new();
    NATIVE.get_or_init(|| Native {
        cache: Cache::new(JitCompiler, None),
    })
}

/// A host buffer laid out as one of the module's memrefs.
enum Buffer<'a> {
    /// An input used in place.
    Borrowed(&'a ArrayData),
    /// A padded copy, or an output.
    Owned(ArrayData),
}

impl Buffer<'_> {
    fn data(&self) -> &ArrayData {
        match self {
            Buffer::Borrowed(d) => d,
            Buffer::Owned(d) => d,
        }
    }

    /// The data pointer the kernel reads and (for outputs) writes through.
    fn ptr(&self) -> *mut c_void {
        match self.data() {
            ArrayData::Float(v) => v.as_ptr() as *mut c_void,
            ArrayData::Int(v) => v.as_ptr() as *mut c_void,
            // `bool` is one byte holding 0 or 1: the kernel's i8 storage.
            ArrayData::Bool(v) => v.as_ptr() as *mut c_void,
        }
    }
}

/// Zeros of `dtype`, `n` elements. Large buffers ask for transparent huge pages, so the
/// kernel's first writes fault once per 2 MiB instead of once per 4 KiB.
fn zeros(dtype: DType, n: usize) -> ArrayData {
    fn huge<T: Clone>(zero: T, n: usize) -> Vec<T> {
        let v = vec![zero; n];
        let bytes = n * std::mem::size_of::<T>();
        if bytes >= 4 << 20 {
            // SAFETY: advice only, on memory this Vec owns; failure changes nothing.
            unsafe { libc::madvise(v.as_ptr() as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE) };
        }
        v
    }
    match dtype {
        DType::I32 => ArrayData::Int(huge(0, n)),
        DType::Bool => ArrayData::Bool(huge(false, n)),
        _ => ArrayData::Float(huge(0.0, n)),
    }
}

/// Copies the rows (last-dim runs) of a `from`-shaped row-major array into the top-left
/// corner of a `to`-shaped one (`pad`), or back (`!pad`).
fn copy_rows<T: Copy>(src: &[T], dst: &mut [T], from: &[u64], to: &[u64], pad: bool) {
    let (small, big) = if pad { (from, to) } else { (to, from) };
    let Some((&row, outer)) = small.split_last() else {
        dst[0] = src[0];
        return;
    };
    let big_strides = kernel_ir::row_major_strides(big);
    let rows: u64 = outer.iter().product();
    let mut idx = vec![0u64; outer.len()];
    for r in 0..rows {
        let big_off: u64 = idx.iter().zip(&big_strides).map(|(i, s)| i * s).sum();
        let (s, d) = (r * row, big_off);
        let (s, d) = if pad { (s, d) } else { (d, s) };
        let (s, d, n) = (s as usize, d as usize, row as usize);
        dst[d..d + n].copy_from_slice(&src[s..s + n]);
        for k in (0..idx.len()).rev() {
            idx[k] += 1;
            if idx[k] < outer[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}

fn copy_data(src: &ArrayData, dst: &mut ArrayData, from: &[u64], to: &[u64], pad: bool) {
    match (src, dst) {
        (ArrayData::Float(s), ArrayData::Float(d)) => copy_rows(s, d, from, to, pad),
        (ArrayData::Int(s), ArrayData::Int(d)) => copy_rows(s, d, from, to, pad),
        (ArrayData::Bool(s), ArrayData::Bool(d)) => copy_rows(s, d, from, to, pad),
        _ => unreachable!("buffers are allocated with their array's dtype"),
    }
}

/// The words of a memref descriptor: allocated and aligned pointer, offset, sizes, strides.
fn descriptor(ptr: *mut c_void, shape: &[u64]) -> Vec<u64> {
    let mut d = vec![ptr as u64, ptr as u64, 0];
    d.extend(shape.iter().copied());
    d.extend(kernel_ir::row_major_strides(shape));
    d
}

/// Argument words shared by the worker threads.
struct Args(Vec<Vec<u64>>);
// SAFETY: the words hold pointers into buffers that outlive the scoped threads; workers
// write disjoint blocks of the outputs (parallel programs never share an output block).
unsafe impl Sync for Args {}

fn debug(message: impl FnOnce() -> String) {
    if std::env::var("TESSERA_LOG").is_ok_and(|v| v == "debug") {
        eprintln!("debug: {}", message());
    }
}

impl Native {
    /// The compilation cache (memory only).
    pub fn cache(&self) -> &Cache<JitCompiler> {
        &self.cache
    }

    /// Lowers, compiles (or finds in the cache) and runs `kernel` on `inputs`.
    pub fn run(&self, kernel: &Kernel, inputs: &[Array]) -> Result<Vec<Array>, crate::Error> {
        kernel_ir::check_inputs(kernel, inputs)?;
        if let Some(reason) = lowering::cpu::unsupported(kernel) {
            return Err(crate::Error::Unavailable {
                backend: crate::Backend::Native,
                reason,
            });
        }
        let module = lowering::cpu::lower(kernel);
        let t = Instant::now();
        let (exe, source) = self
            .cache
            .get(&module.text)
            .map_err(|e| crate::Error::Native(format!("compiling @{}: {e}", kernel.name)))?;
        debug(|| {
            let how = if source == Source::Memory {
                "memory hit"
            } else {
                "JIT-compiled"
            };
            format!(
                "native @{}: {how} in {:.1} ms",
                kernel.name,
                t.elapsed().as_secs_f64() * 1e3
            )
        });
        Ok(execute(kernel, &module, &exe, inputs))
    }
}

/// Pads the arrays, runs the programs on all cores and unpads the outputs.
fn execute(kernel: &Kernel, module: &CpuModule, exe: &Jitted, inputs: &[Array]) -> Vec<Array> {
    let io: Vec<_> = kernel
        .refs
        .iter()
        .filter(|r| r.kind != RefKind::Scratch)
        .collect();
    let mut buffers = Vec::with_capacity(io.len());
    let mut inputs = inputs.iter();
    for (decl, padded) in io.iter().zip(&module.padded_shapes) {
        let n = padded.iter().product::<u64>() as usize;
        buffers.push(match decl.kind {
            RefKind::Input => {
                let a = inputs.next().expect("check_inputs counted the inputs");
                if *padded == decl.ty.shape {
                    Buffer::Borrowed(a.data())
                } else {
                    let mut d = zeros(decl.ty.dtype, n);
                    copy_data(a.data(), &mut d, &decl.ty.shape, padded, true);
                    Buffer::Owned(d)
                }
            }
            _ => Buffer::Owned(zeros(decl.ty.dtype, n)),
        });
    }
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(module.parallel_programs.max(1) as usize);
    let descriptors: Vec<Vec<u64>> = buffers
        .iter()
        .zip(&module.padded_shapes)
        .map(|(b, shape)| descriptor(b.ptr(), shape))
        .collect();
    let args = Args(descriptors);
    let run = |worker: usize| {
        let mut words = [worker as u64, module.parallel_programs, workers as u64];
        let mut ptrs: Vec<*mut c_void> = words
            .iter_mut()
            .map(|w| w as *mut u64 as *mut c_void)
            .collect();
        let mut descriptors = args.0.clone();
        for d in &mut descriptors {
            ptrs.extend(d.iter_mut().map(|w| w as *mut u64 as *mut c_void));
        }
        // SAFETY: the arguments match the function's signature (three indices, then one
        // descriptor per memref of the padded shapes), and the buffers are that large.
        unsafe { (exe.entry)(ptrs.as_mut_ptr()) };
    };
    rayon::scope(|s| {
        for w in 1..workers {
            s.spawn(move |_| run(w));
        }
        run(0);
    });

    io.iter()
        .zip(buffers)
        .zip(&module.padded_shapes)
        .filter(|((decl, _), _)| decl.kind == RefKind::Output)
        .map(|((decl, buffer), padded)| {
            let Buffer::Owned(data) = buffer else {
                unreachable!("outputs are owned")
            };
            let data = if *padded == decl.ty.shape {
                data
            } else {
                let mut d = zeros(decl.ty.dtype, decl.ty.num_elements() as usize);
                copy_data(&data, &mut d, padded, &decl.ty.shape, false);
                d
            };
            Array::new(decl.ty.clone(), data).expect("the output buffer has the array's size")
        })
        .collect()
}
