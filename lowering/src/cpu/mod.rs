//! Kernel IR -> upstream MLIR (func/scf/vector/arith/math/memref) for the native CPU
//! backend: one function that runs a range of programs of the grid on the host.
//!
//! * The function is `@NAME(%lo, %hi, %step: index, refs...)`: it runs programs
//!   `lo, lo + step, ...` (`< hi`) of the leading parallel grid axes, flattened row-major,
//!   and every program of the remaining axes in order, so callers split the parallel
//!   programs across threads. Every input and output is a memref of its array padded up
//!   to whole blocks (the caller pads); scratch is allocated per call, so it persists
//!   across the sequential axes as on a TPU core. A last `%fault` argument reports a
//!   dynamic index that left its block (such an access is redirected to the block start).
//! * Tensors are buffers (`memref.alloc`, hoisted to the function entry), views (a load
//!   of an input ref, a broadcast, a transpose or a unit-dim reshape reads its operand in
//!   place) or fused expressions (a single-use element-wise result is computed where it
//!   is read); constants and `iota` are never stored. Rank-0 tensors are SSA scalars.
//! * Element-wise work runs in loops whose innermost dimension goes 16 lanes at a time,
//!   then 8 (AVX2 `vector<8xf32>`), then scalars (`memory.rs`); reductions along it keep
//!   4 accumulators of 8. `dot` runs a register-tiled
//!   FMA micro-kernel sized for the host's registers (`dot.rs`, [`Registers`]: 6x16 on
//!   AVX2, 8x32 on AVX-512). `exp` is a polynomial in `arith` (`math.rs`: the
//!   LLVM intrinsic would become a scalar `expf` per lane). `for`/`if` are in `control.rs`.
//! * Floats compute in f32; bf16/f16 results are rounded after every op as the
//!   interpreter does. Input and output refs of bf16/f16 hold 2-byte elements (the
//!   callers' tensors as they are), widened on load and narrowed on store; buffers inside
//!   the kernel hold them as f32. Bools are stored as bytes.

use std::collections::HashMap;
use std::f64::consts::LN_2;
use std::fmt::Write as _;

use kernel_ir::ops::{window_plan, WindowStart};
use kernel_ir::{
    BinaryOp, DType, Index, IndexBinOp, IndexExpr, IndexNode, Kernel, Literal, Op, OpKind,
    ReduceOp, RefKind, Region, TensorType, UnaryOp, Value,
};

use crate::text::{
    arith_binary, arith_unary_float, comparison, float_rem, literal, scf_if_header, Emit, Writer,
};

mod control;
mod debug;
mod dot;
mod math;
mod memory;

pub use debug::{DebugSite, DEBUG_SYMBOL};

/// Lanes per vector of element-wise tails and reductions, and of the 8x8 transposes:
/// 256-bit AVX2 registers of 32-bit elements.
const LANES: u64 = 8;
/// Lanes per step of element-wise loops over long rows (LLVM splits them into two AVX2
/// registers, or uses one AVX-512 register where the host has it).
const WIDE: u64 = 16;
/// Independent vector accumulators of a reduction along the last dim.
const REDUCE_ACCUMULATORS: u64 = 4;
/// Vectors per row of the dot micro-kernel's register tile.
const TILE_VECTORS: u64 = 2;

/// The vector registers the code is for: they size the dot micro-kernel's register tile,
/// and AVX-512 code may use AVX-512F instructions (`vscalefps` in `exp`), so it runs only
/// on hosts that have them ([`Registers::runs_here`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Registers {
    /// 16 registers of 8 f32 lanes.
    #[default]
    Avx2,
    /// 32 registers of 16 f32 lanes.
    Avx512,
}

impl Registers {
    /// Every kind, by name.
    pub const ALL: [Registers; 2] = [Registers::Avx2, Registers::Avx512];

    /// The name (`avx2`, `avx512`).
    pub fn name(self) -> &'static str {
        match self {
            Registers::Avx2 => "avx2",
            Registers::Avx512 => "avx512",
        }
    }

    /// This CPU's registers: AVX-512 where it has AVX-512F, else AVX2.
    pub fn host() -> Registers {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            return Registers::Avx512;
        }
        Registers::Avx2
    }

    /// Whether code for these registers runs on this CPU.
    pub fn runs_here(self) -> bool {
        self == Registers::Avx2 || Registers::host() == Registers::Avx512
    }

    /// The registers called `name` ([`Registers::name`]).
    pub fn named(name: &str) -> Option<Registers> {
        Registers::ALL.into_iter().find(|r| r.name() == name)
    }

    /// f32 lanes per register.
    pub fn lanes(self) -> u64 {
        match self {
            Registers::Avx2 => 8,
            Registers::Avx512 => 16,
        }
    }

    /// Rows of the dot micro-kernel's tile: `rows x 2` accumulators leave registers for
    /// the two loaded vectors of B and the broadcast element of A.
    fn tile_rows(self) -> u64 {
        match self {
            Registers::Avx2 => 6,
            Registers::Avx512 => 8,
        }
    }
}

/// A lowered kernel and what the caller needs to run it.
#[derive(Clone, Debug)]
pub struct CpuModule {
    /// The MLIR module (text).
    pub text: String,
    /// The function to call.
    pub symbol: String,
    /// Padded shape of each input and output array, in argument order.
    pub padded_shapes: Vec<Vec<u64>>,
    /// Number of programs of the leading parallel grid axes (the `lo..hi` range).
    pub parallel_programs: u64,
    /// Whether the body contains a dot (more work per byte moved: worth splitting
    /// across threads sooner).
    pub has_dot: bool,
    /// Bytes of all input and output arrays (unpadded; saturating), for the runtime's
    /// choice of how many threads a run is worth.
    pub io_bytes: u64,
    /// The last argument, `%fault: memref<1xi32>`, ends up holding `i + 1` when a
    /// dynamic index of access `fault_sites[i]` fell outside its block (the access then
    /// read or wrote the block's start instead); 0 when none did.
    pub fault_sites: Vec<String>,
    /// The module's `debug_print`s and failing `check`s, by the site number their calls
    /// pass. When there are any, the function takes one more argument, `%debug: i64`,
    /// after `%fault`: the context word the calls hand to [`DEBUG_SYMBOL`] (the runtime
    /// passes the address of its run's context, which holds this table).
    pub debug_sites: Vec<DebugSite>,
}

/// Why a kernel cannot be compiled to native code, if it cannot.
pub fn unsupported(kernel: &Kernel) -> Option<String> {
    /// Whether `v` is an integer constant other than zero defined in `r`.
    fn is_nonzero_const(r: &Region, v: Value) -> bool {
        r.ops.iter().any(|op| {
            op.results.first() == Some(&v)
                && matches!(op.kind, OpKind::Constant { value: Literal::Int(i) } if i != 0)
        })
    }
    let mut reason = None;
    kernel.body.walk_regions(&mut |r| {
        for op in &r.ops {
            if let OpKind::Binary {
                op: BinaryOp::Div | BinaryOp::Rem,
                lhs,
                rhs,
            } = &op.kind
            {
                if !kernel.type_of(*lhs).dtype.is_float() && !is_nonzero_const(r, *rhs) {
                    reason.get_or_insert_with(|| {
                        format!(
                            "integer {} by a computed divisor (%{}): native code cannot report \
                             division by zero",
                            op.kind.mnemonic(),
                            rhs.0
                        )
                    });
                }
            }
        }
    });
    reason
}

/// Lowers a verified kernel (one [`unsupported`] accepts) to a CPU module for hosts with
/// `registers`.
pub fn lower(kernel: &Kernel, registers: Registers) -> CpuModule {
    let mut e = Emitter::new(kernel, registers);
    let text = e.module();
    CpuModule {
        text,
        symbol: kernel.name.clone(),
        padded_shapes: e
            .padded
            .iter()
            .zip(&kernel.refs)
            .filter(|(_, r)| r.kind != RefKind::Scratch)
            .map(|(p, _)| p.clone())
            .collect(),
        parallel_programs: parallel_prefix(kernel).iter().product(),
        io_bytes: kernel
            .refs
            .iter()
            .filter(|r| r.kind != RefKind::Scratch)
            .map(|r| r.ty.byte_size().unwrap_or(u64::MAX))
            .fold(0, u64::saturating_add),
        has_dot: {
            let mut dot = false;
            kernel
                .body
                .walk(&mut |op| dot |= matches!(op.kind, OpKind::Dot { .. }));
            dot
        },
        fault_sites: std::mem::take(&mut e.fault_sites),
        debug_sites: std::mem::take(&mut e.debug_sites),
    }
}

/// The leading parallel grid axes.
fn parallel_prefix(k: &Kernel) -> &[u64] {
    let n = k
        .dimension_semantics
        .iter()
        .take_while(|s| **s == kernel_ir::DimSemantics::Parallel)
        .count();
    &k.grid[..n]
}

/// How a tensor value is held.
#[derive(Clone, Debug)]
enum Val {
    /// A rank-0 tensor: an SSA scalar.
    Scalar(String),
    /// Every element equals this SSA scalar.
    Splat(String),
    /// Element `i` along `dim` is `i` (i32).
    Iota(usize),
    /// Elements read from memory.
    View(View),
    /// An element-wise op computed where it is read (its only use is in the same region).
    Expr(std::rc::Rc<Expr>),
}

/// An element-wise op whose result is never stored.
#[derive(Debug)]
struct Expr {
    kind: OpKind,
    operands: Vec<(Val, DType)>,
    dtype: DType,
}

impl Val {
    /// The views this value reads, through its expressions.
    fn leaves<'a>(&'a self, out: &mut Vec<&'a View>) {
        match self {
            Val::View(v) => out.push(v),
            Val::Expr(e) => e.operands.iter().for_each(|(v, _)| v.leaves(out)),
            _ => {}
        }
    }
}

/// The element-wise results computed where they are read instead of being stored: those
/// read only in the region that defines them, and read once, or by element-wise ops and
/// reductions alone when they are one cheap op ([`cheap_to_recompute`]): recomputing
/// such a value at each read costs an instruction where storing it costs a buffer, a
/// store and a load per read (layer norm's `x - mean`, read by its variance and by its
/// output).
fn fusible(k: &Kernel) -> std::collections::HashSet<Value> {
    /// Where a value is read: the region and whether the reader computes lanes in place.
    struct Read {
        region: usize,
        lanewise: bool,
    }
    let (mut defs, mut reads) = (HashMap::new(), HashMap::<Value, Vec<Read>>::new());
    let mut region_id = 0;
    k.body.walk_regions(&mut |r| {
        for op in &r.ops {
            let lanewise = op.kind.is_elementwise() || matches!(op.kind, OpKind::Reduce { .. });
            for v in op.kind.operands() {
                reads.entry(v).or_default().push(Read {
                    region: region_id,
                    lanewise,
                });
            }
            if op.kind.is_elementwise() {
                defs.insert(op.results[0], (region_id, op));
            }
        }
        region_id += 1;
    });
    defs.iter()
        .filter(|(v, (region, op))| {
            let Some(reads) = reads.get(v) else {
                return false;
            };
            reads.iter().all(|r| r.region == *region)
                && (reads.len() == 1
                    || (reads.iter().all(|r| r.lanewise)
                        && cheap_to_recompute(op, |x| defs.contains_key(&x))))
        })
        .map(|(v, _)| *v)
        .collect()
}

/// Whether `op` is one add, subtract, multiply, max, min or cast of values that are not
/// themselves computed element-wise (`computed`): loads, broadcasts, constants, reductions.
fn cheap_to_recompute(op: &Op, computed: impl Fn(Value) -> bool) -> bool {
    let cheap = match &op.kind {
        OpKind::Binary { op, .. } => matches!(
            op,
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Max | BinaryOp::Min
        ),
        OpKind::Cast { .. } => true,
        _ => false,
    };
    cheap && op.kind.operands().into_iter().all(|x| !computed(x))
}

/// A tensor read from (part of) a memref: buffer dim `i` is indexed by `offsets[i]` plus
/// the value's index along `dims[i]` (or by `offsets[i]` alone when `None`).
#[derive(Clone, Debug)]
struct View {
    mem: String,
    mem_type: String,
    /// The memref's element type ([`storage`], or a ref's [`ref_storage`]).
    elem: &'static str,
    /// The memref's shape.
    shape: Vec<u64>,
    offsets: Vec<Option<String>>,
    dims: Vec<Option<usize>>,
}

/// One step of an element-wise loop: the value's index along each dim (the last one is
/// the first of `width` consecutive lanes).
struct Lane {
    idx: Vec<String>,
    width: u64,
}

impl View {
    /// Whether the memory holds 2-byte floats (a bf16/f16 ref), which reads widen to f32
    /// and writes narrow from it.
    fn narrow(&self) -> bool {
        matches!(self.elem, "bf16" | "f16")
    }
}

/// The element type of an input or output ref of a dtype: bf16 and f16 as themselves.
fn ref_storage(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        d => storage(d),
    }
}

/// The element type of a buffer inside the kernel holding a dtype.
fn storage(d: DType) -> &'static str {
    match d {
        DType::F32 | DType::BF16 | DType::F16 => "f32",
        DType::I32 => "i32",
        DType::Bool => "i8",
    }
}

/// The register element type of a dtype.
fn reg(d: DType) -> &'static str {
    match d {
        DType::Bool => "i1",
        _ => storage(d),
    }
}

/// The type of `width` lanes of `elem` (a scalar when `width` is 1).
fn lanes_of(elem: &str, width: u64) -> String {
    if width == 1 {
        elem.to_string()
    } else {
        format!("vector<{width}x{elem}>")
    }
}

fn memref_type(shape: &[u64], elem: &str) -> String {
    let mut s = String::from("memref<");
    for d in shape {
        let _ = write!(s, "{d}x");
    }
    s.push_str(elem);
    s.push('>');
    s
}

struct Emitter<'k> {
    k: &'k Kernel,
    registers: Registers,
    w: Writer,
    /// Allocations and constants, emitted at the function entry.
    entry: Vec<String>,
    deallocs: Vec<String>,
    consts: HashMap<(String, String), String>,
    values: HashMap<Value, Val>,
    padded: Vec<Vec<u64>>,
    /// The memref of each ref, and its element type.
    ref_mems: Vec<(String, &'static str)>,
    /// Program ids (i32) of the current program.
    pids: Vec<String>,
    /// Block start (index) per array dim of each ref, in the current program.
    starts: Vec<Vec<String>>,
    next_buffer: usize,
    /// What each dynamic window check guards (fault code `i + 1`).
    fault_sites: Vec<String>,
    /// Element-wise results computed where they are read (see [`fusible`]).
    fused: std::collections::HashSet<Value>,
    /// The `debug_print`s and `check`s emitted so far.
    debug_sites: Vec<DebugSite>,
}

impl<'k> Emitter<'k> {
    fn new(k: &'k Kernel, registers: Registers) -> Self {
        let padded = k.refs.iter().map(|r| r.padded_shape()).collect();
        Emitter {
            k,
            registers,
            w: Writer::new("v", 2),
            entry: Vec::new(),
            deallocs: Vec::new(),
            consts: HashMap::new(),
            values: HashMap::new(),
            padded,
            ref_mems: Vec::new(),
            pids: Vec::new(),
            starts: Vec::new(),
            next_buffer: 0,
            fault_sites: Vec::new(),
            fused: fusible(k),
            debug_sites: Vec::new(),
        }
    }

    // ---- text helpers ----------------------------------------------------------------

    fn line(&mut self, s: &str) {
        self.w.line(s)
    }

    /// `%new = <rhs>`.
    fn assign(&mut self, rhs: &str) -> String {
        let v = self.w.fresh();
        self.w.line(&format!("{v} = {rhs}"));
        v
    }
}

impl Emit for Emitter<'_> {
    fn emit(&mut self, rhs: &str) -> String {
        self.assign(rhs)
    }
}

impl<'k> Emitter<'k> {
    /// A constant hoisted to the function entry (`ty` is a scalar or vector type).
    fn constant(&mut self, value: &str, ty: &str) -> String {
        let key = (value.to_string(), ty.to_string());
        if let Some(c) = self.consts.get(&key) {
            return c.clone();
        }
        let name = format!("%c{}", self.consts.len());
        let attr = if ty.starts_with("vector") {
            format!("dense<{value}> : {ty}")
        } else if ty == "i1" {
            value.to_string() // `true`/`false` carry their type
        } else {
            format!("{value} : {ty}")
        };
        self.entry
            .push(format!("    {name} = arith.constant {attr}"));
        self.consts.insert(key, name.clone());
        name
    }

    fn index(&mut self, n: u64) -> String {
        self.constant(&n.to_string(), "index")
    }

    /// A literal of `dtype` in registers, splat over `width` lanes.
    fn literal(&mut self, dtype: DType, v: f64, width: u64) -> String {
        let text = match dtype {
            DType::Bool => (v != 0.0).to_string(),
            DType::BF16 | DType::F16 => {
                literal(DType::F32, kernel_ir::round_to(dtype, v as f32) as f64)
            }
            d => literal(d, v),
        };
        self.constant(&text, &lanes_of(reg(dtype), width))
    }

    /// A fresh buffer of `shape`, allocated once at the function entry.
    fn alloc(&mut self, shape: &[u64], dtype: DType) -> View {
        self.alloc_elements(shape, storage(dtype))
    }

    /// A fresh buffer of `shape` and MLIR element type `elem`, allocated once at the
    /// function entry.
    fn alloc_elements(&mut self, shape: &[u64], elem: &'static str) -> View {
        let ty = memref_type(shape, elem);
        let name = format!("%buf{}", self.next_buffer);
        self.next_buffer += 1;
        self.entry.push(format!(
            "    {name} = memref.alloc() {{alignment = 64 : i64}} : {ty}"
        ));
        self.deallocs
            .push(format!("    memref.dealloc {name} : {ty}"));
        View {
            mem: name,
            mem_type: ty,
            elem,
            shape: shape.to_vec(),
            offsets: vec![None; shape.len()],
            dims: (0..shape.len()).map(Some).collect(),
        }
    }

    /// Opens `scf.for %iv = lo to hi step st {` and returns `%iv`.
    fn open_for(&mut self, lo: &str, hi: &str, step: &str) -> String {
        let iv = self.w.fresh();
        self.line(&format!("scf.for {iv} = {lo} to {hi} step {step} {{"));
        self.w.indent += 1;
        iv
    }

    fn close(&mut self) {
        self.w.indent -= 1;
        self.line("}");
    }

    fn index_of(&mut self, i32_value: &str) -> String {
        self.assign(&format!("arith.index_cast {i32_value} : i32 to index"))
    }

    fn i32_of(&mut self, index: &str) -> String {
        self.assign(&format!("arith.index_cast {index} : index to i32"))
    }

    fn add_index(&mut self, a: &str, b: &str) -> String {
        self.assign(&format!("arith.addi {a}, {b} : index"))
    }

    // ---- the module --------------------------------------------------------------------

    fn module(&mut self) -> String {
        let k = self.k;
        let mut params = vec![
            "%lo: index".to_string(),
            "%hi: index".into(),
            "%step: index".into(),
        ];
        for (i, r) in k.refs.iter().enumerate() {
            if r.kind == RefKind::Scratch {
                let scratch = self.alloc(&r.ty.shape, r.ty.dtype);
                self.ref_mems.push((scratch.mem, scratch.elem));
            } else {
                let elem = ref_storage(r.ty.dtype);
                let ty = memref_type(&self.padded[i], elem);
                params.push(format!("%ref{i}: {ty}"));
                self.ref_mems.push((format!("%ref{i}"), elem));
            }
        }
        params.push("%fault: memref<1xi32>".into());
        self.grid();
        let body = self.w.take();
        let mut out = String::new();
        let _ = writeln!(out, "module {{");
        if !self.debug_sites.is_empty() {
            params.push("%debug: i64".into());
            let _ = writeln!(out, "  func.func private @{DEBUG_SYMBOL}(i64, i64, i64)");
        }
        let _ = writeln!(
            out,
            "  func.func @{}({}) attributes {{llvm.emit_c_interface}} {{",
            k.name,
            params.join(", ")
        );
        for l in &self.entry {
            out.push_str(l);
            out.push('\n');
        }
        out.push_str(&body);
        for l in &self.deallocs {
            out.push_str(l);
            out.push('\n');
        }
        out.push_str("    return\n  }\n}\n");
        out
    }

    /// The loops over programs: the flat parallel range, then the other axes in order.
    fn grid(&mut self) {
        let k = self.k;
        let prefix = parallel_prefix(k).to_vec();
        let flat = self.open_for("%lo", "%hi", "%step");
        let mut pids = Vec::new();
        let mut rest = flat;
        for (axis, _) in prefix.iter().enumerate() {
            let inner: u64 = prefix[axis + 1..].iter().product();
            let c = self.index(inner);
            let q = self.assign(&format!("arith.divui {rest}, {c} : index"));
            rest = self.assign(&format!("arith.remui {rest}, {c} : index"));
            pids.push(q);
        }
        let mut opened = 0;
        for &n in &k.grid[prefix.len()..] {
            let (zero, one, hi) = (self.index(0), self.index(1), self.index(n));
            pids.push(self.open_for(&zero, &hi, &one));
            opened += 1;
        }
        self.pids = pids.iter().map(|p| self.i32_of(p)).collect();
        self.block_starts();
        let body = &k.body;
        self.region(body);
        for _ in 0..opened {
            self.close();
        }
        self.close();
    }

    /// An index-map expression on `index` values (`arith.floordivsi` rounds toward
    /// negative infinity, as index maps do).
    fn index_expr(&mut self, e: &IndexExpr) -> String {
        e.fold(&mut |node: IndexNode<String>| match node {
            IndexNode::ProgramId(axis) => {
                let p = self.pids[axis].clone();
                self.index_of(&p)
            }
            IndexNode::Const(c) => self.constant(&c.to_string(), "index"),
            IndexNode::Scalar(r, index) => {
                // Runs after the runtime checked every program's reads and blocks
                // (`kernel_ir::check_scalar_prefetch`).
                let r = r.0 as usize;
                let element = self.assign(&format!(
                    "memref.load {}[{}] : {}",
                    self.ref_mems[r].0,
                    index.join(", "),
                    memref_type(&self.padded[r], "i32")
                ));
                self.index_of(&element)
            }
            IndexNode::Bin(op, a, b) => match arith_binary(op.as_binary(), false) {
                Some(name) => self.assign(&format!("{name} {a}, {b} : index")),
                None => {
                    let q = self.assign(&format!("arith.floordivsi {a}, {b} : index"));
                    if op == IndexBinOp::FloorDiv {
                        return q;
                    }
                    let m = self.assign(&format!("arith.muli {q}, {b} : index"));
                    self.assign(&format!("arith.subi {a}, {m} : index"))
                }
            },
        })
    }

    fn block_starts(&mut self) {
        let k = self.k;
        self.starts = k
            .refs
            .iter()
            .map(|r| match r.block_start() {
                Some(exprs) => exprs.iter().map(|e| self.index_expr(e)).collect(),
                None => r.ty.shape.iter().map(|_| self.index(0)).collect(),
            })
            .collect();
    }

    // ---- ops ---------------------------------------------------------------------------

    fn region(&mut self, r: &Region) {
        for (i, op) in r.ops.iter().enumerate() {
            self.op(op, &r.ops[i + 1..]);
        }
    }

    fn ty(&self, v: Value) -> &'k TensorType {
        self.k.type_of(v)
    }

    fn val(&self, v: Value) -> Val {
        self.values[&v].clone()
    }

    fn scalar(&self, v: Value) -> String {
        match &self.values[&v] {
            Val::Scalar(s) => s.clone(),
            other => unreachable!("%{} is a rank-0 tensor, held as {other:?}", v.0),
        }
    }

    /// Lowers `op`; `following` are the ops after it in its region (a reduction among
    /// them may be computed in the same pass as `op`).
    fn op(&mut self, op: &Op, following: &[Op]) {
        if op
            .results
            .first()
            .is_some_and(|r| self.values.contains_key(r))
        {
            return; // already computed, fused into the pass of its operand
        }
        let result_ty = op.results.first().map(|&r| self.ty(r).clone());
        let val = match &op.kind {
            OpKind::ProgramId { axis } => Val::Scalar(self.pids[*axis].clone()),
            OpKind::NumPrograms { axis } => {
                Val::Scalar(self.constant(&self.k.grid[*axis].to_string(), "i32"))
            }
            OpKind::Constant { value } => {
                let t = result_ty.unwrap();
                let c = self.literal(t.dtype, value.as_f64(), 1);
                if t.is_scalar() {
                    Val::Scalar(c)
                } else {
                    Val::Splat(c)
                }
            }
            OpKind::Iota { dim } => Val::Iota(*dim),
            OpKind::Load {
                src,
                index,
                mask,
                other,
            } => self.load(src.0 as usize, index, *mask, *other, &result_ty.unwrap()),
            OpKind::Store {
                dst,
                index,
                value,
                mask,
            } => {
                self.store(dst.0 as usize, index, *value, *mask);
                return;
            }
            OpKind::Broadcast { x, dims } => self.broadcast(*x, dims, &result_ty.unwrap()),
            OpKind::Reshape { x } => self.reshape(*x, &result_ty.unwrap()),
            OpKind::Transpose { x, perm } => self.transpose(*x, perm),
            OpKind::Gather { x, indices, axis } => {
                self.gather(*x, *indices, *axis, &result_ty.unwrap())
            }
            OpKind::Unary { .. }
            | OpKind::Binary { .. }
            | OpKind::Compare { .. }
            | OpKind::Select { .. }
            | OpKind::Cast { .. } => {
                self.elementwise(op.results[0], &op.kind, &result_ty.unwrap(), following)
            }
            OpKind::Reduce { op: r, x, axes } => self.reduce(*r, *x, axes, &result_ty.unwrap()),
            OpKind::Dot {
                lhs,
                rhs,
                transpose_lhs,
                transpose_rhs,
            } => self.dot(*lhs, *rhs, *transpose_lhs, *transpose_rhs),
            OpKind::For {
                lower,
                upper,
                step,
                inits,
                body,
            } => {
                self.for_op(op, *lower, *upper, *step, inits, body);
                return;
            }
            OpKind::If {
                cond,
                then_region,
                else_region,
            } => {
                self.if_op(op, *cond, then_region, else_region);
                return;
            }
            OpKind::Yield { .. } => return,
            OpKind::DebugPrint { message, values } => {
                self.debug_call(message, values, None);
                return;
            }
            OpKind::Check {
                kind,
                cond,
                message,
                values,
            } => {
                self.check(*kind, *cond, message, values);
                return;
            }
        };
        self.values.insert(op.results[0], val);
    }

    /// The view of a load/store window of ref `r`, by the shared window plan; dynamic
    /// starts are checked against the block (`checked`).
    fn window(&mut self, r: usize, index: &[Index], access: &str) -> View {
        let decl = &self.k.refs[r];
        let site = self.fault_sites.len() + 1;
        self.fault_sites
            .push(format!("{access} of `%{}`", decl.name));
        let mut offsets = Vec::new();
        let mut dims = Vec::new();
        let mut result_dim = 0;
        for (dim, w) in window_plan(decl, index).iter().enumerate() {
            let base = self.starts[r][dim].clone();
            let offset = match w.start {
                WindowStart::Block => base,
                WindowStart::Static(s) => {
                    let s = self.index(s);
                    self.add_index(&base, &s)
                }
                WindowStart::Dynamic(v) => {
                    let i = self.scalar(v);
                    let i = self.index_of(&i);
                    let i = self.checked(&i, w.count, w.extent, site);
                    self.add_index(&base, &i)
                }
            };
            offsets.push(Some(offset));
            if w.kept {
                dims.push(Some(result_dim));
                result_dim += 1;
            } else {
                dims.push(None);
            }
        }
        let (mem, elem) = self.ref_mems[r].clone();
        View {
            mem,
            mem_type: memref_type(&self.padded[r], elem),
            elem,
            shape: self.padded[r].clone(),
            offsets,
            dims,
        }
    }

    /// A dynamic window start `i` (index) for `size` elements of a block dim of
    /// `extent`: itself when the window fits, else 0, with fault site `site` recorded
    /// in `%fault` (the caller reports it; reads stay inside the block).
    fn checked(&mut self, i: &str, size: u64, extent: u64, site: usize) -> String {
        let zero = self.index(0);
        let limit = self.index(extent.saturating_sub(size));
        let low = self.assign(&format!("arith.cmpi sge, {i}, {zero} : index"));
        let high = self.assign(&format!("arith.cmpi sle, {i}, {limit} : index"));
        let ok = self.assign(&format!("arith.andi {low}, {high} : i1"));
        let yes = self.constant("true", "i1");
        let bad = self.assign(&format!("arith.xori {ok}, {yes} : i1"));
        let code = self.constant(&site.to_string(), "i32");
        self.line(&format!("scf.if {bad} {{"));
        self.line(&format!(
            "  memref.store {code}, %fault[{zero}] : memref<1xi32>"
        ));
        self.line("}");
        self.assign(&format!("arith.select {ok}, {i}, {zero} : index"))
    }

    fn load(
        &mut self,
        r: usize,
        index: &[Index],
        mask: Option<Value>,
        other: Option<Value>,
        ty: &TensorType,
    ) -> Val {
        let view = self.window(r, index, "load");
        if ty.is_scalar() {
            let lane = Lane {
                idx: vec![],
                width: 1,
            };
            let x = self.read(&Val::View(view), ty.dtype, &lane);
            return Val::Scalar(match (mask, other) {
                (Some(m), o) => {
                    let m = self.scalar(m);
                    let o = match o {
                        Some(o) => self.scalar(o),
                        None => self.literal(ty.dtype, 0.0, 1),
                    };
                    self.assign(&format!("arith.select {m}, {x}, {o} : {}", reg(ty.dtype)))
                }
                (None, _) => x,
            });
        }
        let immutable = self.k.refs[r].kind == RefKind::Input;
        if mask.is_none() && immutable {
            return Val::View(view);
        }
        // Snapshot (writable refs change later) and apply the mask.
        let src = Val::View(view);
        let mask = mask.map(|m| self.val(m));
        let other = other.map(|o| self.val(o));
        self.materialize(ty, &mut |e, lane| {
            let x = e.read(&src, ty.dtype, lane);
            match &mask {
                None => x,
                Some(m) => {
                    let m = e.read(m, DType::Bool, lane);
                    let o = match &other {
                        Some(o) => e.read(o, ty.dtype, lane),
                        None => e.literal(ty.dtype, 0.0, lane.width),
                    };
                    let t = lanes_of(reg(ty.dtype), lane.width);
                    e.assign(&format!(
                        "arith.select {m}, {x}, {o} : {}",
                        select_type(lane.width, &t)
                    ))
                }
            }
        })
    }

    fn store(&mut self, r: usize, index: &[Index], value: Value, mask: Option<Value>) {
        let view = self.window(r, index, "store");
        let ty = self.ty(value).clone();
        let src = self.val(value);
        let mask = mask.map(|m| self.val(m));
        let dst = Val::View(view.clone());
        self.lanes(&ty.shape, &mut |e, lane| {
            let mut x = e.read(&src, ty.dtype, lane);
            if let Some(m) = &mask {
                let m = e.read(m, DType::Bool, lane);
                let old = e.read(&dst, ty.dtype, lane);
                let t = lanes_of(reg(ty.dtype), lane.width);
                x = e.assign(&format!(
                    "arith.select {m}, {x}, {old} : {}",
                    select_type(lane.width, &t)
                ));
            }
            e.write(&view, ty.dtype, lane, &x);
        });
    }

    /// The value of `v`, stored first if it is a fused expression (for the view ops,
    /// which re-index their operand).
    fn stored_val(&mut self, v: Value) -> Val {
        match self.val(v) {
            Val::Expr(_) => {
                let ty = self.ty(v).clone();
                let x = self.val(v);
                Val::View(self.pack(&x, &ty))
            }
            other => other,
        }
    }

    fn broadcast(&mut self, x: Value, bdims: &[usize], ty: &TensorType) -> Val {
        let xt = self.ty(x).clone();
        match self.stored_val(x) {
            Val::Scalar(s) | Val::Splat(s) => Val::Splat(s),
            Val::Iota(d) => {
                let to = bdims[d];
                if xt.shape[d] == ty.shape[to] {
                    Val::Iota(to)
                } else {
                    Val::Splat(self.literal(DType::I32, 0.0, 1))
                }
            }
            Val::View(v) => Val::View(View {
                dims: v
                    .dims
                    .iter()
                    .map(|d| {
                        d.and_then(|xd| {
                            let to = bdims[xd];
                            (xt.shape[xd] == ty.shape[to]).then_some(to)
                        })
                    })
                    .collect(),
                ..v
            }),
            Val::Expr(_) => unreachable!("stored_val stores expressions"),
        }
    }

    fn transpose(&mut self, x: Value, perm: &[usize]) -> Val {
        let inverse = |d: usize| perm.iter().position(|&p| p == d).unwrap();
        match self.stored_val(x) {
            Val::Iota(d) => Val::Iota(inverse(d)),
            Val::View(v) => Val::View(View {
                dims: v.dims.iter().map(|d| d.map(inverse)).collect(),
                ..v
            }),
            other => other,
        }
    }

    /// Each lane's element of `x` at its clamped index along `axis`, read one by one
    /// (the positions are data; the other dims follow the lane).
    fn gather(&mut self, x: Value, indices: Value, axis: usize, ty: &TensorType) -> Val {
        let xt = self.ty(x).clone();
        let (src, picks) = (self.val(x), self.val(indices));
        self.materialize(ty, &mut |e, lane| {
            let w = lane.width;
            let t = lanes_of("i32", w);
            let at = e.read(&picks, DType::I32, lane);
            let (zero, top) = (
                e.literal(DType::I32, 0.0, w),
                e.literal(DType::I32, (xt.shape[axis] - 1) as f64, w),
            );
            let at = e.assign(&format!("arith.maxsi {at}, {zero} : {t}"));
            let at = e.assign(&format!("arith.minsi {at}, {top} : {t}"));
            let last = lane.idx.len() - 1;
            let elems: Vec<String> = (0..w)
                .map(|l| {
                    let i = if w == 1 {
                        at.clone()
                    } else {
                        e.assign(&format!("vector.extract {at}[{l}] : i32 from {t}"))
                    };
                    let mut idx = lane.idx.clone();
                    if l > 0 {
                        let step = e.index(l);
                        idx[last] = e.add_index(&idx[last], &step);
                    }
                    idx[axis] = e.index_of(&i);
                    e.read(&src, xt.dtype, &Lane { idx, width: 1 })
                })
                .collect();
            if w == 1 {
                return elems[0].clone();
            }
            e.assign(&format!(
                "vector.from_elements {} : {}",
                elems.join(", "),
                lanes_of(reg(ty.dtype), w)
            ))
        })
    }

    fn reshape(&mut self, x: Value, ty: &TensorType) -> Val {
        let xt = self.ty(x).clone();
        let src = self.stored_val(x);
        if ty.is_scalar() {
            let lane = Lane {
                idx: xt.shape.iter().map(|_| self.index(0)).collect(),
                width: 1,
            };
            return Val::Scalar(self.read(&src, xt.dtype, &lane));
        }
        // Same non-unit dims in the same order: re-index the view.
        let nonunit = |s: &[u64]| -> Vec<usize> { (0..s.len()).filter(|&d| s[d] != 1).collect() };
        let (from, to) = (nonunit(&xt.shape), nonunit(&ty.shape));
        let same = from.len() == to.len()
            && from
                .iter()
                .zip(&to)
                .all(|(&a, &b)| xt.shape[a] == ty.shape[b]);
        match &src {
            Val::Scalar(s) | Val::Splat(s) => return Val::Splat(s.clone()),
            Val::View(v) if same => {
                let remap = |d: usize| from.iter().position(|&f| f == d).map(|i| to[i]);
                return Val::View(View {
                    dims: v.dims.iter().map(|d| d.and_then(remap)).collect(),
                    ..v.clone()
                });
            }
            _ => {}
        }
        // General reshape: lay the elements out row-major, then reinterpret.
        let flat = self.materialize(&xt, &mut |e, lane| e.read(&src, xt.dtype, lane));
        let Val::View(flat) = flat else {
            unreachable!("materialize returns a buffer")
        };
        let strides = kernel_ir::row_major_strides(&ty.shape);
        let ty_text = memref_type(&ty.shape, storage(ty.dtype));
        let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
        let mem = self.assign(&format!(
            "memref.reinterpret_cast {} to offset: [0], sizes: [{}], strides: [{}] : {} to {}",
            flat.mem,
            list(&ty.shape),
            list(&strides),
            flat.mem_type,
            ty_text
        ));
        Val::View(View {
            mem,
            mem_type: ty_text,
            elem: storage(ty.dtype),
            shape: ty.shape.clone(),
            offsets: vec![None; ty.rank()],
            dims: (0..ty.rank()).map(Some).collect(),
        })
    }
}

/// The type clause of `arith.select` on `t`: vectors need the condition type too.
fn select_type(width: u64, t: &str) -> String {
    if width == 1 {
        t.to_string()
    } else {
        format!("{}, {t}", lanes_of("i1", width))
    }
}
