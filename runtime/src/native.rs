//! The native CPU backend: kernels lowered by `lowering::cpu` to upstream MLIR, taken to
//! the LLVM dialect by MLIR's passes and JIT-compiled by its ExecutionEngine (through
//! melior), cached in memory, and run with the parallel programs split across cores.
//!
//! Executables stay in memory only: the ExecutionEngine has no way to load compiled code
//! back from disk, and a JIT of a library kernel takes 40-500 ms.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::Instant;

use kernel_ir::ops::{format_debug_print, CheckFailure};
use kernel_ir::{Array, ArrayData, DType, Kernel, RefKind, RunError, TensorType};
use lowering::cpu::{CpuModule, DebugSite, Registers};
use lowering::Lowering;
use melior::dialect::DialectRegistry;
use melior::ir::Module;
use melior::pass::PassManager;
use melior::utility::{
    parse_pass_pipeline, register_all_dialects, register_all_llvm_translations, register_all_passes,
};
use melior::Context;
use mlir_sys::{
    mlirExecutionEngineCreate, mlirExecutionEngineDestroy, mlirExecutionEngineLookupPacked,
    mlirExecutionEngineRegisterSymbol, MlirExecutionEngine, MlirStringRef,
};

use crate::cache::{Cache, Compiler, Source};
use crate::debug;

/// Upstream MLIR (func/scf/vector/arith/math/memref) down to the LLVM dialect.
const PIPELINE: &str = "builtin.module(arith-expand,convert-scf-to-cf,\
    convert-vector-to-llvm{enable-x86vector},convert-math-to-llvm,convert-math-to-libm,\
    expand-strided-metadata,lower-affine,finalize-memref-to-llvm,convert-arith-to-llvm,\
    convert-index-to-llvm,convert-cf-to-llvm,convert-func-to-llvm,convert-ub-to-llvm,\
    reconcile-unrealized-casts)";

/// The pass pipeline: [`PIPELINE`], or `$TESSERA_NATIVE_PIPELINE` to experiment with
/// (part of the cache key).
fn pipeline() -> String {
    crate::config::Var::NativePipeline
        .get()
        .unwrap_or_else(|| PIPELINE.to_string())
}

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
        format!("native|mlir-sys 220|O{OPT_LEVEL}|{}", pipeline())
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
        parse_pass_pipeline(passes.as_operation_pass_manager(), &pipeline())
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
        let runtime_symbols = [
            (lowering::cpu::DEBUG_SYMBOL, debug_call as *mut c_void),
            ("malloc", buffers::malloc as *mut c_void),
            ("aligned_alloc", buffers::aligned_alloc as *mut c_void),
            ("free", buffers::free as *mut c_void),
        ];
        for (name, address) in float_conversions().into_iter().chain(runtime_symbols) {
            // SAFETY: a live engine; the address is a function with the runtime
            // library's signature for `name`.
            unsafe { mlirExecutionEngineRegisterSymbol(engine, string_ref(name), address) };
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

mod chain;
mod crew;
mod layout;
mod pool;
mod schedule;

pub use chain::ChainRun;
pub use layout::NativeArray;
pub use pool::{name as thread_pool, use_openmp, OpenMp, OPENMP_SYMBOLS};

/// The buffers JIT'd code allocates (`memref.alloc`: blocks, scratch; the engine binds
/// its `malloc`/`aligned_alloc`/`free` here): each thread keeps the `malloc` blocks its
/// calls freed, by size, for its next call, so a kernel's buffers are not allocated (and,
/// after the C heap trims them, faulted in) afresh on every call.
pub mod buffers {
    use std::alloc::{alloc, dealloc, Layout};
    use std::cell::RefCell;
    use std::ffi::c_void;

    /// Bytes before each block: its size and its offset from the allocation's start, so
    /// `free` can rebuild the layout. Also the alignment of `malloc`'s blocks.
    const HEADER: usize = 16;
    /// Bytes of freed blocks a thread keeps at most.
    const POOL_BYTES: usize = 64 << 20;

    /// One thread's freed `malloc` blocks, by requested size.
    #[derive(Default)]
    struct Pool {
        blocks: Vec<(usize, *mut u8)>,
        bytes: usize,
    }

    impl Drop for Pool {
        fn drop(&mut self) {
            for (_, block) in self.blocks.drain(..) {
                // SAFETY: every pooled block came from `allocate`.
                unsafe { release(block) };
            }
        }
    }

    thread_local! {
        static POOL: RefCell<Pool> = RefCell::default();
    }

    /// A fresh block of `size` bytes aligned to `align` (a power of two, at least
    /// [`HEADER`]), its header just before it; null when it cannot be had.
    fn allocate(size: usize, align: usize) -> *mut u8 {
        let Some(layout) = size
            .checked_add(align)
            .and_then(|total| Layout::from_size_align(total, align).ok())
        else {
            return std::ptr::null_mut();
        };
        // SAFETY: the layout has a nonzero size (at least the header).
        let base = unsafe { alloc(layout) };
        if base.is_null() {
            return base;
        }
        // SAFETY: the block starts `align >= HEADER` bytes in, after its header.
        unsafe {
            let block = base.add(align);
            let header = block.sub(HEADER) as *mut usize;
            header.write(size);
            header.add(1).write(align);
            block
        }
    }

    /// The requested size and alignment of a block from [`allocate`].
    ///
    /// # Safety
    /// `block` came from `allocate`.
    unsafe fn header(block: *mut u8) -> (usize, usize) {
        let header = unsafe { block.sub(HEADER) } as *const usize;
        unsafe { (header.read(), header.add(1).read()) }
    }

    /// Returns a block to the system.
    ///
    /// # Safety
    /// `block` came from `allocate` and is not used again.
    unsafe fn release(block: *mut u8) {
        let (size, align) = unsafe { header(block) };
        let layout = Layout::from_size_align(size + align, align).expect("allocated so");
        unsafe { dealloc(block.sub(align), layout) };
    }

    /// `malloc` for JIT'd code: a block this thread freed with the same size, else a new one.
    pub extern "C" fn malloc(size: usize) -> *mut c_void {
        let reused = POOL
            .try_with(|pool| {
                let mut pool = pool.try_borrow_mut().ok()?;
                let at = pool.blocks.iter().rposition(|&(s, _)| s == size)?;
                let (_, block) = pool.blocks.swap_remove(at);
                pool.bytes -= size;
                Some(block)
            })
            .ok()
            .flatten();
        reused.unwrap_or_else(|| allocate(size, HEADER)) as *mut c_void
    }

    /// `aligned_alloc` for JIT'd code (a pass pipeline may ask for it instead of
    /// `malloc`): not pooled, but freed by the same `free`.
    pub extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
        if !align.is_power_of_two() {
            return std::ptr::null_mut();
        }
        allocate(size, align.max(HEADER)) as *mut c_void
    }

    /// `free` for JIT'd code: keeps a `malloc` block for this thread's next `malloc` of
    /// its size (past the pool's limit, the blocks at the front of the pool go back to the
    /// system).
    pub extern "C" fn free(ptr: *mut c_void) {
        if ptr.is_null() {
            return;
        }
        let block = ptr as *mut u8;
        // SAFETY: JIT'd code frees only what its `malloc`/`aligned_alloc` returned.
        let (size, align) = unsafe { header(block) };
        let kept = align == HEADER
            && POOL.try_with(|pool| {
                let Ok(mut pool) = pool.try_borrow_mut() else {
                    return false;
                };
                pool.blocks.push((size, block));
                pool.bytes += size;
                while pool.bytes > POOL_BYTES {
                    let (old, oldest) = pool.blocks.remove(0);
                    pool.bytes -= old;
                    // SAFETY: pooled blocks came from `allocate`.
                    unsafe { release(oldest) };
                }
                true
            }) == Ok(true);
        if !kept {
            // SAFETY: as above.
            unsafe { release(block) };
        }
    }

    /// Bytes of freed buffers this thread keeps for its next kernel calls.
    pub fn pooled_bytes() -> usize {
        POOL.try_with(|p| p.borrow().bytes).unwrap_or(0)
    }

    /// A zeroed block of this thread's pool for Rust code (a run's padded copies), back
    /// in the pool when dropped: its pages are not faulted in afresh on every call. Drop
    /// it on the thread that made it.
    pub(super) struct Block {
        ptr: *mut u8,
        len: usize,
    }

    impl Block {
        /// `len` bytes of whatever the pool held last, 16-byte aligned (the caller writes
        /// them all before they are read); `None` when they cannot be had.
        pub(super) fn uninit(len: usize) -> Option<Block> {
            let ptr = malloc(len) as *mut u8;
            (!ptr.is_null()).then_some(Block { ptr, len })
        }

        /// `len` zeroed bytes, 16-byte aligned; `None` when they cannot be had.
        pub(super) fn zeroed(len: usize) -> Option<Block> {
            let block = Block::uninit(len)?;
            // SAFETY: a live block of `len` bytes.
            unsafe { std::ptr::write_bytes(block.ptr, 0, len) };
            Some(block)
        }

        /// The bytes.
        pub(super) fn bytes(&mut self) -> &mut [u8] {
            // SAFETY: a live block of `len` bytes, borrowed mutably with `self`.
            unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
        }

        /// The first byte's address.
        pub(super) fn as_ptr(&self) -> *mut c_void {
            self.ptr as *mut c_void
        }
    }

    impl Drop for Block {
        fn drop(&mut self) {
            free(self.ptr as *mut c_void);
        }
    }
}

/// The compiler-rt half-precision conversions LLVM may call for scalar code. A binary
/// that embeds the JIT (a Python extension, say) does not export them, so the engine is
/// given these. x86-64 passes and returns `__bf16`/`_Float16` in the low half of `xmm0`,
/// which a Rust `f32` argument or result occupies: the bits travel in its low 16 bits.
fn float_conversions() -> [(&'static str, *mut c_void); 3] {
    extern "C" fn truncsfbf2(x: f32) -> f32 {
        f32::from_bits(u32::from(half::bf16::from_f32(x).to_bits()))
    }
    extern "C" fn truncsfhf2(x: f32) -> f32 {
        f32::from_bits(u32::from(half::f16::from_f32(x).to_bits()))
    }
    extern "C" fn extendhfsf2(h: f32) -> f32 {
        half::f16::from_bits(h.to_bits() as u16).to_f32()
    }
    [
        ("__truncsfbf2", truncsfbf2 as *mut c_void),
        ("__truncsfhf2", truncsfhf2 as *mut c_void),
        ("__extendhfsf2", extendhfsf2 as *mut c_void),
    ]
}

/// What a run's `debug_print` and `check` calls see: the module's sites, and the failed
/// check of the first program (in grid order) whose check failed.
struct DebugContext<'m> {
    sites: &'m [DebugSite],
    failure: Mutex<Option<CheckFailure>>,
}

/// One `debug_print` or failed `check` of a running kernel (the call the CPU lowering
/// emits): `context` is the address of the run's [`DebugContext`] (see
/// [`execute_raw`]), `slots` the program ids and one f32 buffer address per value.
/// Formats like the interpreter; prints, or records the failure when it is the first
/// program's so far; never unwinds into the JIT'd code.
extern "C" fn debug_call(context: u64, site: u64, slots: *const u64) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: `execute_raw` passes the address of a context that outlives the run.
        let context = unsafe { &*(context as *const DebugContext) };
        let Some(site) = context.sites.get(site as usize) else {
            return;
        };
        // SAFETY: the emitted code stores this many words in `slots`.
        let slots = unsafe { std::slice::from_raw_parts(slots, site.programs + site.values.len()) };
        let arrays: Vec<Array> = site
            .values
            .iter()
            .zip(&slots[site.programs..])
            .filter_map(|(ty, &address)| {
                let n = ty.num_elements() as usize;
                // SAFETY: the emitted code wrote the value's elements there as f32.
                let data = unsafe { std::slice::from_raw_parts(address as *const f32, n) };
                let data = match ty.dtype {
                    DType::I32 => ArrayData::Int(data.iter().map(|&x| x as i32).collect()),
                    DType::Bool => ArrayData::Bool(data.iter().map(|&x| x != 0.0).collect()),
                    _ => ArrayData::Float(data.to_vec()),
                };
                Array::new(ty.clone(), data).ok()
            })
            .collect();
        let arrays: Vec<&Array> = arrays.iter().collect();
        let program = &slots[..site.programs];
        let line = format_debug_print(&site.message, program, &arrays);
        let Some(kind) = site.check else {
            eprintln!("{line}");
            return;
        };
        let mut failure = context.failure.lock().unwrap_or_else(|p| p.into_inner());
        if failure
            .as_ref()
            .is_none_or(|f| program < f.program.as_slice())
        {
            *failure = Some(CheckFailure {
                kind,
                program: program.to_vec(),
                line,
            });
        }
    });
}

/// The process-wide native backend.
pub struct Native {
    /// The registers kernels are compiled for, or why none can be.
    registers: Result<Registers, String>,
    cache: Cache<JitCompiler>,
    /// Lowered and compiled kernels by structure, so a repeated call skips lowering
    /// and hashing the module text (bounded: cleared when it reaches [`MEMO_LIMIT`]).
    compiled: Mutex<HashMap<Kernel, Compiled>>,
}

/// A lowered kernel and its code.
type Compiled = Arc<(CpuModule, Arc<Jitted>)>;

/// Kernels remembered by [`Native`] before it starts afresh.
const MEMO_LIMIT: usize = 1024;

/// The backend, compiling for [`crate::native_registers`].
pub fn backend() -> &'static Native {
    static NATIVE: OnceLock<Native> = OnceLock::new();
    NATIVE.get_or_init(|| Native::with(crate::native_registers()))
}

impl Native {
    /// A backend of its own that compiles for `registers` (tests compare the two widths
    /// on one host; [`backend`] is the one to use): unavailable where they do not run
    /// ([`Registers::runs_here`]).
    pub fn for_registers(registers: Registers) -> Native {
        Native::with(if registers.runs_here() {
            Ok(registers)
        } else {
            Err(format!("this CPU has no {} registers", registers.name()))
        })
    }

    fn with(registers: Result<Registers, String>) -> Native {
        Native {
            registers,
            cache: Cache::new(JitCompiler, None),
            compiled: Mutex::new(HashMap::new()),
        }
    }
}

/// Bytes per element of a dtype in the native code's memory (bf16/f16 two, bools one).
fn element_bytes(d: DType) -> usize {
    match d {
        DType::Bool => 1,
        DType::BF16 | DType::F16 => 2,
        _ => 4,
    }
}

/// For each row (last-dim run) of a `small`-shaped row-major array, in order: its offset
/// there, its offset in a `big`-shaped array that holds it in its top-left corner, and its
/// length. Offsets in both only grow.
fn rows_within<'s>(small: &'s [u64], big: &[u64]) -> impl Iterator<Item = [usize; 3]> + 's {
    let (row, outer) = small.split_last().map_or((1, &[][..]), |(r, o)| (*r, o));
    let big_strides = kernel_ir::row_major_strides(big);
    let rows: u64 = outer.iter().product();
    let mut idx = vec![0u64; outer.len()];
    (0..rows).map(move |r| {
        let big_off: u64 = idx.iter().zip(&big_strides).map(|(i, s)| i * s).sum();
        for k in (0..idx.len()).rev() {
            idx[k] += 1;
            if idx[k] < outer[k] {
                break;
            }
            idx[k] = 0;
        }
        [(r * row) as usize, big_off as usize, row as usize]
    })
}

/// Writes a `small`-shaped array into the top-left corner of a `big`-shaped one and zeroes
/// the rest of it: every element of `dst` once.
fn pad_rows<T: Copy + Default>(src: &[T], dst: &mut [T], small: &[u64], big: &[u64]) {
    let mut written = 0;
    for [s, d, n] in rows_within(small, big) {
        dst[written..d].fill(T::default());
        dst[d..d + n].copy_from_slice(&src[s..s + n]);
        written = d + n;
    }
    dst[written..].fill(T::default());
}

/// Copies the top-left `small`-shaped corner of a `big`-shaped array out.
fn unpad_rows<T: Copy>(src: &[T], dst: &mut [T], big: &[u64], small: &[u64]) {
    for [s, d, n] in rows_within(small, big) {
        dst[s..s + n].copy_from_slice(&src[d..d + n]);
    }
}

/// Cuts a `big`-shaped array down to its top-left `small`-shaped corner, in place: rows
/// only move towards the start, so none is overwritten before it has moved.
fn unpad_in_place<T: Copy>(v: &mut Vec<T>, big: &[u64], small: &[u64]) {
    if big.get(1..) != small.get(1..) {
        for [s, d, n] in rows_within(small, big) {
            v.copy_within(d..d + n, s);
        }
    }
    v.truncate(small.iter().product::<u64>() as usize);
}

/// A shape with its last dim counted in bytes (for byte-wise row copies).
fn byte_shape(shape: &[u64], dtype: DType) -> Vec<u64> {
    let mut s = shape.to_vec();
    match s.last_mut() {
        Some(last) => *last *= element_bytes(dtype) as u64,
        None => s.push(element_bytes(dtype) as u64),
    }
    s
}

/// Appends the words of a memref descriptor: allocated and aligned pointer, offset, sizes,
/// row-major strides.
fn push_descriptor(words: &mut Vec<u64>, ptr: *mut c_void, shape: &[u64]) {
    words.extend([ptr as u64, ptr as u64, 0]);
    words.extend(shape.iter().copied());
    let strides_at = words.len();
    let mut stride = 1;
    for &d in shape.iter().rev() {
        words.push(stride);
        stride *= d;
    }
    words[strides_at..].reverse();
}

/// A kernel compiled for in-place runs ([`Native::prepare`]), with its I/O types.
pub struct Prepared {
    kernel: Kernel,
    compiled: Compiled,
    input_types: Vec<TensorType>,
    output_types: Vec<TensorType>,
}

impl Prepared {
    /// Runs the kernel on `inputs`, writing into `outputs`: arrays of the kernel's input
    /// and output types, the outputs reused across calls as the torch ops reuse
    /// PyTorch's memory (what `tessera bench` times for native runs).
    pub fn run_on(
        &self,
        inputs: &[NativeArray],
        outputs: &mut [NativeArray],
    ) -> Result<(), crate::Error> {
        let same = |arrays: &[NativeArray], types: &[TensorType]| {
            arrays.len() == types.len() && arrays.iter().zip(types).all(|(a, t)| a.ty() == t)
        };
        if !same(inputs, &self.input_types) || !same(outputs, &self.output_types) {
            return Err(crate::Error::Native(format!(
                "@{}: the arrays are not of the kernel's input and output types",
                self.kernel.name
            )));
        }
        let ins: Vec<*const c_void> = inputs.iter().map(NativeArray::as_ptr).collect();
        let outs: Vec<*mut c_void> = outputs.iter_mut().map(NativeArray::as_mut_ptr).collect();
        // SAFETY: each array owns a whole buffer of its (checked) type in the native
        // layout; the outputs are borrowed mutably, so they overlap nothing.
        unsafe { self.run_in_place(&ins, &outs) }
    }

    /// The kernel's input types.
    pub fn input_types(&self) -> &[TensorType] {
        &self.input_types
    }

    /// The kernel's output types.
    pub fn output_types(&self) -> &[TensorType] {
        &self.output_types
    }

    /// Runs the kernel on caller-owned storage, as [`Native::run_in_place`].
    ///
    /// # Safety
    /// As [`Native::run_in_place`].
    pub unsafe fn run_in_place(
        &self,
        inputs: &[*const c_void],
        outputs: &[*mut c_void],
    ) -> Result<(), crate::Error> {
        let kernel = &self.kernel;
        if inputs.len() != self.input_types.len() || outputs.len() != self.output_types.len() {
            return Err(crate::Error::Native(format!(
                "@{} takes {} inputs and {} outputs, got {} and {} buffers",
                kernel.name,
                self.input_types.len(),
                self.output_types.len(),
                inputs.len(),
                outputs.len()
            )));
        }
        // The JIT'd code mallocs scratch and block buffers, which cannot fail cleanly.
        kernel_ir::check_allocatable(kernel)?;
        let (module, exe) = &*self.compiled;
        // SAFETY: the caller vouches for the buffers; counts and dtypes are checked.
        unsafe {
            execute_raw(
                kernel,
                module,
                exe,
                "running in place on the caller's buffers, ",
                inputs,
                outputs,
                false,
            )
        }
    }
}

/// Argument words shared by the worker threads.
struct Args(Vec<u64>);
// SAFETY: the words hold pointers into buffers that outlive the scoped threads; workers
// write disjoint blocks of the outputs (parallel programs never share an output block).
unsafe impl Sync for Args {}

impl Native {
    /// The compilation cache (memory only).
    pub fn cache(&self) -> &Cache<JitCompiler> {
        &self.cache
    }

    /// Lowers, compiles (or finds in the cache) and runs `kernel` on `inputs`.
    pub fn run(&self, kernel: &Kernel, inputs: &[Array]) -> Result<Vec<Array>, crate::Error> {
        kernel_ir::check_inputs(kernel, inputs)?;
        let compiled = self.compile(kernel)?;
        // The JIT'd code mallocs scratch and block buffers, which cannot fail cleanly.
        kernel_ir::check_allocatable(kernel)?;
        execute(kernel, &compiled.0, &compiled.1, inputs)
    }

    /// Runs `kernel` on caller-owned storage without copying it (only arrays that are
    /// not a whole number of blocks go through padded copies): `inputs[i]` and
    /// `outputs[i]` point to row-major arrays of the kernel's input and output types.
    /// Elements are laid out as PyTorch's tensors hold them: f32 and i32 in 4 bytes,
    /// bf16 and f16 in 2, bool in one.
    ///
    /// # Safety
    /// Each pointer must address a whole array of its type, valid for the call; outputs
    /// must not overlap inputs or each other.
    pub unsafe fn run_in_place(
        &self,
        kernel: &Kernel,
        inputs: &[*const c_void],
        outputs: &[*mut c_void],
    ) -> Result<(), crate::Error> {
        // SAFETY: the caller's guarantee, passed on.
        unsafe { self.prepare(kernel)?.run_in_place(inputs, outputs) }
    }

    /// Compiles `kernel` (or finds it in the cache) for [`Prepared::run_in_place`], which
    /// callers that run one kernel many times keep to skip the lookups.
    pub fn prepare(&self, kernel: &Kernel) -> Result<Prepared, crate::Error> {
        let (input_types, output_types) = (kernel.input_types(), kernel.output_types());
        Ok(Prepared {
            compiled: self.compile(kernel)?,
            kernel: kernel.clone(),
            input_types,
            output_types,
        })
    }

    /// The kernel's module and its JIT-compiled code (from the cache when it has them).
    fn compile(&self, kernel: &Kernel) -> Result<Compiled, crate::Error> {
        let memo = || self.compiled.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(hit) = memo().get(kernel) {
            return Ok(hit.clone());
        }
        let registers = self
            .registers
            .clone()
            .map_err(|reason| crate::Error::Unavailable {
                backend: crate::Backend::Native,
                reason,
            })?;
        let module =
            lowering::Cpu { registers }
                .lower(kernel)
                .map_err(|e| crate::Error::Unavailable {
                    backend: crate::Backend::Native,
                    reason: e.reason(),
                })?;
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
        let compiled = Arc::new((module, exe));
        let mut memo = memo();
        if memo.len() >= MEMO_LIMIT {
            memo.clear();
        }
        memo.insert(kernel.clone(), compiled.clone());
        Ok(compiled)
    }
}

/// Allocates the outputs at their padded shapes (so the kernel writes them in place),
/// runs the kernel on the arrays' storage, and returns the outputs cut to their shapes.
fn execute(
    kernel: &Kernel,
    module: &CpuModule,
    exe: &Jitted,
    inputs: &[Array],
) -> Result<Vec<Array>, crate::Error> {
    let io = kernel.refs.iter().filter(|r| r.kind != RefKind::Scratch);
    let outputs: Vec<(&kernel_ir::RefDecl, &Vec<u64>)> = io
        .zip(&module.padded_shapes)
        .filter(|(r, _)| r.kind == RefKind::Output)
        .collect();
    let alloc_error = |e| crate::Error::Run(RunError::Alloc(e));
    let mut padded: Vec<NativeArray> = outputs
        .iter()
        .map(|(r, shape)| {
            let ty = TensorType::new(r.ty.dtype, shape.to_vec());
            NativeArray::zeros(ty, &format!("out %{}", r.name))
        })
        .collect::<Result<_, _>>()
        .map_err(alloc_error)?;
    let inputs: Vec<NativeArray> = inputs
        .iter()
        .map(NativeArray::from_array)
        .collect::<Result<_, _>>()
        .map_err(alloc_error)?;
    let input_ptrs: Vec<*const c_void> = inputs.iter().map(NativeArray::as_ptr).collect();
    let output_ptrs: Vec<*mut c_void> = padded.iter_mut().map(NativeArray::as_mut_ptr).collect();
    // SAFETY: check_inputs matched every input to its type (in the native layout now);
    // outputs were just allocated with their padded shapes' sizes.
    unsafe { execute_raw(kernel, module, exe, "", &input_ptrs, &output_ptrs, true) }?;
    outputs
        .iter()
        .zip(padded)
        .map(|((r, shape), buffer)| {
            let array = buffer.into_array().map_err(alloc_error)?;
            if *shape == &r.ty.shape {
                return Ok(array);
            }
            let mut data = array.into_data();
            let small = &r.ty.shape;
            match &mut data {
                ArrayData::Float(v) => unpad_in_place(v, shape, small),
                ArrayData::Int(v) => unpad_in_place(v, shape, small),
                ArrayData::Bool(v) => unpad_in_place(v, shape, small),
            }
            Array::new(r.ty.clone(), data).map_err(|e| crate::Error::Native(e.to_string()))
        })
        .collect()
}

/// Kernels that move fewer bytes than this run on the calling thread: handing work to a
/// helper costs more than it saves when the helper has parked (measured on 2 cores with
/// rayon's pool: a softmax of 64x256 f32, ~10 µs of work, took ~50 µs more per call when
/// split). Kernels with dots split from [`SERIAL_DOT_BYTES`].
const SERIAL_BYTES: u64 = 256 << 10;
/// The threshold of [`SERIAL_BYTES`] for kernels that contain a dot (more work per byte).
const SERIAL_DOT_BYTES: u64 = 16 << 10;

/// How many threads run the grid: the pool's ([`pool::threads`]: the OpenMP team's, or
/// one per core), at most one per parallel program, and one for kernels too small to
/// split.
fn workers(module: &CpuModule) -> usize {
    let bytes = module.io_bytes;
    let threshold = if module.has_dot {
        SERIAL_DOT_BYTES
    } else {
        SERIAL_BYTES
    };
    if bytes < threshold {
        return 1;
    }
    pool::threads().min(module.parallel_programs.max(1) as usize)
}

/// Runs the programs on all cores on caller storage (row-major, elements of the kernel's
/// I/O types in the native layout: [`element_bytes`]), through padded copies where an array is not a whole number
/// of blocks. A dynamic index that left its block is reported as an error (the access
/// was redirected inside the block, so no memory outside the arrays was touched).
/// `how` starts the debug line that says where it ran. With `outputs_padded` the outputs
/// are already of their padded shapes (zeroed), and the kernel writes them directly.
///
/// # Safety
/// Each pointer addresses a whole array of its ref's type (of its padded shape for
/// outputs with `outputs_padded`); outputs overlap nothing.
unsafe fn execute_raw(
    kernel: &Kernel,
    module: &CpuModule,
    exe: &Jitted,
    how: &str,
    inputs: &[*const c_void],
    outputs: &[*mut c_void],
    outputs_padded: bool,
) -> Result<(), crate::Error> {
    // Blocks placed by scalar-prefetch reads are computed by the compiled code, which
    // trusts them: check every program's first.
    let prefetched = kernel.scalar_prefetch();
    if prefetched > 0 {
        let prefetch: Vec<&[i32]> = kernel.refs[..prefetched]
            .iter()
            .zip(inputs)
            // SAFETY: the scalar-prefetch operands are i32 inputs of these types.
            .map(|(r, &p)| unsafe {
                std::slice::from_raw_parts(p as *const i32, r.ty.num_elements() as usize)
            })
            .collect();
        kernel_ir::check_scalar_prefetch(kernel, &prefetch)?;
    }
    let io = kernel.refs.iter().filter(|r| r.kind != RefKind::Scratch);
    // Padded copies (pooled; aligned for f32/i32) and where outputs go back.
    let mut copies: Vec<buffers::Block> = Vec::new();
    let mut ptrs = Vec::with_capacity(module.padded_shapes.len());
    let mut unpad = Vec::new();
    let (mut ins, mut outs) = (inputs.iter(), outputs.iter());
    for (decl, padded) in io.zip(&module.padded_shapes) {
        let input = decl.kind == RefKind::Input;
        let user = match input {
            true => *ins.next().expect("one pointer per input") as *mut c_void,
            false => *outs.next().expect("one pointer per output"),
        };
        if *padded == decl.ty.shape || (!input && outputs_padded) {
            ptrs.push(user);
            continue;
        }
        let eb = element_bytes(decl.ty.dtype);
        let (small, big) = (
            byte_shape(&decl.ty.shape, decl.ty.dtype),
            byte_shape(padded, decl.ty.dtype),
        );
        let big_len = big.iter().product::<u64>() as usize;
        let small_len = decl.ty.num_elements() as usize * eb;
        // Outputs start zeroed (kernels may accumulate into them); inputs are written
        // whole by `pad_rows`.
        let block = if input {
            buffers::Block::uninit(big_len)
        } else {
            buffers::Block::zeroed(big_len)
        };
        let mut block = block.ok_or_else(|| {
            crate::Error::Run(RunError::Alloc(kernel_ir::AllocError {
                what: format!("the padded copy of %{} ({padded:?})", decl.name),
                bytes: Some(big_len as u64),
            }))
        })?;
        if input {
            // SAFETY: the caller's input of `small_len` bytes.
            let src = unsafe { std::slice::from_raw_parts(user as *const u8, small_len) };
            pad_rows(src, block.bytes(), &small, &big);
        } else {
            unpad.push((copies.len(), user, small, big, small_len));
        }
        ptrs.push(block.as_ptr());
        copies.push(block);
    }
    let workers = workers(module);
    debug(|| {
        let threads = if workers == 1 {
            "on the calling thread".to_string()
        } else {
            format!("on {workers} threads ({})", pool::name())
        };
        format!("native @{}: {how}{threads}", kernel.name)
    });
    let mut fault = [0u32; 1];
    // Every descriptor's words, one after another (the fault word's last).
    let descriptor_words: usize = module.padded_shapes.iter().map(|s| 3 + 2 * s.len()).sum();
    let mut words = Vec::with_capacity(descriptor_words + 5);
    for (&p, shape) in ptrs.iter().zip(&module.padded_shapes) {
        push_descriptor(&mut words, p, shape);
    }
    push_descriptor(&mut words, fault.as_mut_ptr() as *mut c_void, &[1]);
    let args = Args(words);
    let debug_context = DebugContext {
        sites: &module.debug_sites,
        failure: Mutex::new(None),
    };
    let programs = module.parallel_programs;
    // Runs programs `lo..hi` for each range `ranges` hands out, until it hands out none.
    let run_ranges = |ranges: &mut dyn FnMut() -> Option<(u64, u64)>| {
        let mut indices = [0u64, 0, 1];
        let mut ptrs: Vec<*mut c_void> = Vec::with_capacity(indices.len() + args.0.len() + 1);
        ptrs.extend(indices.iter_mut().map(|w| w as *mut u64 as *mut c_void));
        // The packed entry only reads through these pointers: the workers share the
        // descriptor words.
        ptrs.extend(args.0.iter().map(|w| w as *const u64 as *mut c_void));
        let mut context = &debug_context as *const DebugContext as u64;
        if !module.debug_sites.is_empty() {
            ptrs.push(&mut context as *mut u64 as *mut c_void);
        }
        while let Some((lo, hi)) = ranges() {
            // SAFETY: the first two pointers address `indices`, which outlives the loop;
            // the arguments match the function's signature (three indices, one
            // descriptor per memref of the padded shapes, the fault word, the debug
            // context's address when it prints or checks), and the buffers are that large.
            unsafe {
                *ptrs[0].cast::<u64>() = lo;
                *ptrs[1].cast::<u64>() = hi;
                (exe.entry)(ptrs.as_mut_ptr())
            };
        }
    };
    if workers == 1 {
        let mut all = Some((0, programs));
        run_ranges(&mut || all.take());
    } else {
        let schedule = schedule::Schedule::new(programs, workers as u64);
        pool::run_shares(workers, &|w| {
            run_ranges(&mut || schedule.next(w));
        });
    }
    for (i, user, small, big, small_len) in unpad {
        let dst = unsafe { std::slice::from_raw_parts_mut(user as *mut u8, small_len) };
        unpad_rows(copies[i].bytes(), dst, &big, &small);
    }
    let failure = debug_context.failure.into_inner();
    if let Some(f) = failure.unwrap_or_else(|p| p.into_inner()) {
        return Err(crate::Error::Run(RunError::CheckFailed(f)));
    }
    match fault[0] as usize {
        0 => Ok(()),
        site => Err(crate::Error::NativeFault(format!(
            "@{}: a dynamic index of the {} left its block (`--backend interp` names the \
             program and coordinates)",
            kernel.name,
            module
                .fault_sites
                .get(site - 1)
                .map_or("kernel", String::as_str)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::{buffers, pad_rows, unpad_in_place, unpad_rows};

    /// A `[2, 3]` array padded to `[4, 5]` (every element of the padded copy written,
    /// whatever it held) and cut back, through a copy and in place; and padding along
    /// the leading dim only, cut back by truncation.
    #[test]
    fn padding_writes_every_element_and_cutting_back_restores_the_array() {
        let small: Vec<u32> = (1..=6).collect();
        for (small_shape, big_shape) in [([2u64, 3], [4u64, 5]), ([2, 3], [3, 3]), ([2, 3], [2, 4])]
        {
            let big_len = big_shape.iter().product::<u64>() as usize;
            let mut big = vec![u32::MAX; big_len];
            pad_rows(&small, &mut big, &small_shape, &big_shape);
            let cols = big_shape[1] as usize;
            for (i, &x) in big.iter().enumerate() {
                let (r, c) = (i / cols, i % cols);
                let want = if r < 2 && c < 3 { small[r * 3 + c] } else { 0 };
                assert_eq!(x, want, "{big_shape:?} element ({r}, {c})");
            }
            let mut back = vec![0; 6];
            unpad_rows(&big, &mut back, &big_shape, &small_shape);
            assert_eq!(back, small);
            unpad_in_place(&mut big, &big_shape, &small_shape);
            assert_eq!(big, small, "{big_shape:?} in place");
        }
        let mut scalar = vec![7u32];
        unpad_in_place(&mut scalar, &[], &[]);
        assert_eq!(scalar, [7]);
    }

    #[test]
    fn freed_buffers_come_back_to_the_next_malloc_of_their_size() {
        let a = buffers::malloc(1000);
        assert_eq!(a as usize % 16, 0);
        // SAFETY: a live block of 1000 bytes.
        unsafe { std::ptr::write_bytes(a as *mut u8, 7, 1000) };
        let before = buffers::pooled_bytes();
        buffers::free(a);
        assert_eq!(buffers::pooled_bytes(), before + 1000);
        assert_eq!(buffers::malloc(1000), a, "the pooled block is reused");
        buffers::free(a);
        let aligned = buffers::aligned_alloc(256, 3000);
        assert_eq!(aligned as usize % 256, 0);
        // SAFETY: a live block of 3000 bytes.
        unsafe { std::ptr::write_bytes(aligned as *mut u8, 1, 3000) };
        let pooled = buffers::pooled_bytes();
        buffers::free(aligned);
        assert_eq!(
            buffers::pooled_bytes(),
            pooled,
            "aligned blocks are not pooled"
        );
        assert!(
            buffers::aligned_alloc(48, 10).is_null(),
            "not a power of two"
        );
        buffers::free(std::ptr::null_mut());
    }
}
