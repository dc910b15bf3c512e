//! Kernel IR -> upstream MLIR (func/scf/vector/arith/math/memref) for the native CPU
//! backend: one function that runs a range of programs of the grid on the host.
//!
//! * The function is `@NAME(%lo, %hi, %step: index, refs...)`: it runs programs
//!   `lo, lo + step, ...` (`< hi`) of the leading parallel grid axes, flattened row-major,
//!   and every program of the remaining axes in order, so callers split the parallel
//!   programs across threads. Every input and output is a memref of its array padded up
//!   to whole blocks (the caller pads); scratch is allocated per call, so it persists
//!   across the sequential axes as on a TPU core.
//! * Tensors are buffers (`memref.alloc`, hoisted to the function entry) or views: a load
//!   of an input ref, a broadcast, a transpose or a unit-dim reshape reads its operand in
//!   place, and constants and `iota` are never stored. Rank-0 tensors are SSA scalars.
//! * Element-wise work runs in loops whose innermost dimension goes 8 lanes at a time
//!   (AVX2 `vector<8xf32>`) with a scalar tail. `dot` packs its operands and runs a
//!   register-tiled 6x16 FMA micro-kernel. `exp` is a polynomial in `arith` (the LLVM
//!   intrinsic would become a scalar `expf` per lane).
//! * Floats compute in f32; bf16/f16 results are rounded after every op as the
//!   interpreter does. Bools are stored as bytes.

use std::collections::HashMap;
use std::f64::consts::LN_2;
use std::fmt::Write as _;

use kernel_ir::{
    BinaryOp, BlockDim, DType, Index, IndexBinOp, IndexExpr, Kernel, Literal, Op, OpKind, ReduceOp,
    RefKind, Region, Start, TensorType, UnaryOp, Value,
};

use crate::text::{comparison, literal, scf_if_header, Writer};

/// Lanes per vector: 256-bit AVX2 registers of 32-bit elements.
const LANES: u64 = 8;
/// Rows of the dot micro-kernel's register tile.
const TILE_ROWS: u64 = 6;
/// Independent vector accumulators of a reduction along the last dim.
const REDUCE_ACCUMULATORS: u64 = 4;
/// Vectors per row of the dot micro-kernel's register tile.
const TILE_VECTORS: u64 = 2;

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
}

/// Why a kernel cannot be compiled to native code, if it cannot.
pub fn unsupported(kernel: &Kernel) -> Option<String> {
    fn walk(k: &Kernel, r: &Region) -> Option<String> {
        for op in &r.ops {
            if let OpKind::Binary {
                op: BinaryOp::Div | BinaryOp::Rem,
                lhs,
                rhs,
            } = &op.kind
            {
                if !k.type_of(*lhs).dtype.is_float() && !is_nonzero_const(r, *rhs) {
                    return Some(format!(
                        "integer {} by a computed divisor (%{}): native code cannot report \
                         division by zero",
                        op.kind.mnemonic(),
                        rhs.0
                    ));
                }
            }
            if let Some(e) = op.kind.regions().into_iter().find_map(|r| walk(k, r)) {
                return Some(e);
            }
        }
        None
    }
    /// Whether `v` is an integer constant other than zero defined in `r`.
    fn is_nonzero_const(r: &Region, v: Value) -> bool {
        r.ops.iter().any(|op| {
            op.results.first() == Some(&v)
                && matches!(op.kind, OpKind::Constant { value: Literal::Int(i) } if i != 0)
        })
    }
    walk(kernel, &kernel.body)
}

/// Lowers a verified kernel (one [`unsupported`] accepts) to a CPU module.
pub fn lower(kernel: &Kernel) -> CpuModule {
    let mut e = Emitter::new(kernel);
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

/// The values whose only use is an element-wise read in the region that defines them:
/// they are fused into that reader instead of being stored.
fn fusible(k: &Kernel) -> std::collections::HashSet<Value> {
    fn walk(
        r: &Region,
        id: &mut usize,
        defs: &mut HashMap<Value, usize>,
        uses: &mut HashMap<Value, Vec<usize>>,
    ) {
        let here = *id;
        for op in &r.ops {
            for v in op.kind.operands() {
                uses.entry(v).or_default().push(here);
            }
            let element_wise = matches!(
                op.kind,
                OpKind::Unary { .. }
                    | OpKind::Binary { .. }
                    | OpKind::Compare { .. }
                    | OpKind::Select { .. }
                    | OpKind::Cast { .. }
            );
            if element_wise {
                defs.insert(op.results[0], here);
            }
            for nested in op.kind.regions() {
                *id += 1;
                walk(nested, id, defs, uses);
            }
        }
    }
    let (mut defs, mut uses) = (HashMap::new(), HashMap::new());
    walk(&k.body, &mut 0, &mut defs, &mut uses);
    defs.into_iter()
        .filter(|(v, region)| uses.get(v).is_some_and(|u| u == &[*region]))
        .map(|(v, _)| v)
        .collect()
}

/// A tensor read from (part of) a memref: buffer dim `i` is indexed by `offsets[i]` plus
/// the value's index along `dims[i]` (or by `offsets[i]` alone when `None`).
#[derive(Clone, Debug)]
struct View {
    mem: String,
    mem_type: String,
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

/// The storage element type of a dtype.
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
    w: Writer,
    /// Allocations and constants, emitted at the function entry.
    entry: Vec<String>,
    deallocs: Vec<String>,
    consts: HashMap<(String, String), String>,
    values: HashMap<Value, Val>,
    padded: Vec<Vec<u64>>,
    /// The memref of each ref.
    ref_mems: Vec<String>,
    /// Program ids (i32) of the current program.
    pids: Vec<String>,
    /// Block start (index) per array dim of each ref, in the current program.
    starts: Vec<Vec<String>>,
    next_buffer: usize,
    /// Element-wise results computed where they are read (see [`fusible`]).
    fused: std::collections::HashSet<Value>,
}

impl<'k> Emitter<'k> {
    fn new(k: &'k Kernel) -> Self {
        let padded = k.refs.iter().map(|r| r.padded_shape()).collect();
        Emitter {
            k,
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
            fused: fusible(k),
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

    /// A constant hoisted to the function entry (`ty` is a scalar or vector type).
    fn constant(&mut self, value: &str, ty: &str) -> String {
        let key = (value.to_string(), ty.to_string());
        if let Some(c) = self.consts.get(&key) {
            return c.clone();
        }
        let name = format!("%c{}", self.consts.len());
        let attr = if ty.starts_with("vector") {
            format!("dense<{value}> : {ty}")
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
        let ty = memref_type(shape, storage(dtype));
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
                self.ref_mems.push(scratch.mem);
            } else {
                let ty = memref_type(&self.padded[i], storage(r.ty.dtype));
                params.push(format!("%ref{i}: {ty}"));
                self.ref_mems.push(format!("%ref{i}"));
            }
        }
        self.grid();
        let body = self.w.take();
        let mut out = String::new();
        let _ = writeln!(out, "module {{");
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

    fn index_expr(&mut self, e: &IndexExpr) -> String {
        match e {
            IndexExpr::ProgramId(axis) => {
                let p = self.pids[*axis].clone();
                self.index_of(&p)
            }
            IndexExpr::Const(c) => self.constant(&c.to_string(), "index"),
            IndexExpr::Bin(op, a, b) => {
                let (a, b) = (self.index_expr(a), self.index_expr(b));
                let name = match op {
                    IndexBinOp::Add => "addi",
                    IndexBinOp::Sub => "subi",
                    IndexBinOp::Mul => "muli",
                    IndexBinOp::Min => "minsi",
                    IndexBinOp::Max => "maxsi",
                    IndexBinOp::FloorDiv => "floordivsi",
                    IndexBinOp::Rem => {
                        let q = self.assign(&format!("arith.floordivsi {a}, {b} : index"));
                        let m = self.assign(&format!("arith.muli {q}, {b} : index"));
                        return self.assign(&format!("arith.subi {a}, {m} : index"));
                    }
                };
                self.assign(&format!("arith.{name} {a}, {b} : index"))
            }
        }
    }

    fn block_starts(&mut self) {
        let k = self.k;
        self.starts = k
            .refs
            .iter()
            .map(|r| match &r.block {
                Some(spec) => spec
                    .index_map
                    .exprs
                    .iter()
                    .zip(&spec.block_shape)
                    .map(|(e, b)| {
                        let block = self.index_expr(e);
                        let extent = self.index(b.extent());
                        self.assign(&format!("arith.muli {block}, {extent} : index"))
                    })
                    .collect(),
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
                let f = match *value {
                    Literal::Float(f) => f,
                    Literal::Int(i) => i as f64,
                    Literal::Bool(b) => f64::from(u8::from(b)),
                };
                let c = self.literal(t.dtype, f, 1);
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
        };
        self.values.insert(op.results[0], val);
    }

    /// The view of a load/store window of ref `r`.
    fn window(&mut self, r: usize, index: &[Index]) -> View {
        let decl = &self.k.refs[r];
        let mut offsets = Vec::new();
        let mut dims = Vec::new();
        let mut kernel_dim = 0;
        let mut result_dim = 0;
        for (dim, bd) in decl.block_dims().iter().enumerate() {
            let base = self.starts[r][dim].clone();
            if *bd == BlockDim::Squeezed {
                offsets.push(Some(base));
                dims.push(None);
                continue;
            }
            let (offset, keep) = match index[kernel_dim] {
                Index::Full => (base, true),
                Index::At(v) => {
                    let i = self.scalar(v);
                    let i = self.index_of(&i);
                    (self.add_index(&base, &i), false)
                }
                Index::Slice { start, .. } => {
                    let s = match start {
                        Start::Static(s) => self.index(s),
                        Start::Dynamic(v) => {
                            let i = self.scalar(v);
                            self.index_of(&i)
                        }
                    };
                    (self.add_index(&base, &s), true)
                }
            };
            kernel_dim += 1;
            offsets.push(Some(offset));
            if keep {
                dims.push(Some(result_dim));
                result_dim += 1;
            } else {
                dims.push(None);
            }
        }
        View {
            mem: self.ref_mems[r].clone(),
            mem_type: memref_type(&self.padded[r], storage(decl.ty.dtype)),
            shape: self.padded[r].clone(),
            offsets,
            dims,
        }
    }

    fn load(
        &mut self,
        r: usize,
        index: &[Index],
        mask: Option<Value>,
        other: Option<Value>,
        ty: &TensorType,
    ) -> Val {
        let view = self.window(r, index);
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
        let view = self.window(r, index);
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
            shape: ty.shape.clone(),
            offsets: vec![None; ty.rank()],
            dims: (0..ty.rank()).map(Some).collect(),
        })
    }

    fn elementwise(
        &mut self,
        result: Value,
        kind: &OpKind,
        ty: &TensorType,
        following: &[Op],
    ) -> Val {
        let operands: Vec<(Val, DType)> = kind
            .operands()
            .iter()
            .map(|&v| (self.val(v), self.ty(v).dtype))
            .collect();
        if !ty.is_scalar() && self.fused.contains(&result) {
            return Val::Expr(std::rc::Rc::new(Expr {
                kind: kind.clone(),
                operands,
                dtype: ty.dtype,
            }));
        }
        let compute = |e: &mut Self, lane: &Lane| {
            let args: Vec<String> = operands.iter().map(|(v, d)| e.read(v, *d, lane)).collect();
            let x = e.scalar_op(kind, &args, &operands, ty.dtype, lane.width);
            e.round(ty.dtype, &x, lane.width)
        };
        if ty.is_scalar() {
            let lane = Lane {
                idx: vec![],
                width: 1,
            };
            return Val::Scalar(compute(self, &lane));
        }
        let mut compute = compute;
        // Reductions of this result along its last dim later in the region are computed
        // while it is stored (softmax's sum of exps, attention's row sums).
        let rank = ty.rank();
        let reductions: Vec<(ReduceOp, Value)> = following
            .iter()
            .filter_map(|op| match &op.kind {
                OpKind::Reduce { op: r, x, axes } if *x == result && axes == &[rank - 1] => {
                    Some((*r, op.results[0]))
                }
                _ => None,
            })
            .collect();
        if reductions.is_empty() || ty.dtype == DType::Bool {
            return self.materialize(ty, &mut compute);
        }
        self.materialize_reducing(ty, &mut compute, &reductions)
    }

    /// Rounds an f32 result to bf16/f16 precision (the interpreter's per-op rounding).
    fn round(&mut self, dtype: DType, x: &str, width: u64) -> String {
        let narrow = match dtype {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            _ => return x.to_string(),
        };
        let (wide_t, narrow_t) = (lanes_of("f32", width), lanes_of(narrow, width));
        let t = self.assign(&format!("arith.truncf {x} : {wide_t} to {narrow_t}"));
        self.assign(&format!("arith.extf {t} : {narrow_t} to {wide_t}"))
    }

    /// One element-wise op on registers.
    fn scalar_op(
        &mut self,
        kind: &OpKind,
        a: &[String],
        operands: &[(Val, DType)],
        out: DType,
        width: u64,
    ) -> String {
        let in_dtype = operands[0].1;
        let t = lanes_of(reg(in_dtype), width);
        let float = in_dtype.is_float();
        match kind {
            OpKind::Unary { op, .. } => {
                let x = &a[0];
                match (op, in_dtype) {
                    (UnaryOp::Exp, _) => self.exp(x, width),
                    (UnaryOp::Neg, d) if d.is_float() => {
                        self.assign(&format!("arith.negf {x} : {t}"))
                    }
                    (UnaryOp::Neg, _) => {
                        let z = self.literal(in_dtype, 0.0, width);
                        self.assign(&format!("arith.subi {z}, {x} : {t}"))
                    }
                    (UnaryOp::Abs, d) if d.is_float() => {
                        self.assign(&format!("math.absf {x} : {t}"))
                    }
                    (UnaryOp::Abs, _) => self.assign(&format!("math.absi {x} : {t}")),
                    (UnaryOp::Log, _) => self.assign(&format!("math.log {x} : {t}")),
                    (UnaryOp::Tanh, _) => self.assign(&format!("math.tanh {x} : {t}")),
                    (UnaryOp::Sqrt, _) => self.assign(&format!("math.sqrt {x} : {t}")),
                    (UnaryOp::Rsqrt, _) => {
                        let s = self.assign(&format!("math.sqrt {x} : {t}"));
                        let one = self.literal(DType::F32, 1.0, width);
                        self.assign(&format!("arith.divf {one}, {s} : {t}"))
                    }
                    (UnaryOp::Not, d) => {
                        let ones = if d == DType::Bool { "true" } else { "-1" };
                        let m = self.constant(ones, &t);
                        self.assign(&format!("arith.xori {x}, {m} : {t}"))
                    }
                }
            }
            OpKind::Binary { op, .. } => {
                let (x, y) = (&a[0], &a[1]);
                let name = match (op, float) {
                    (BinaryOp::Add, true) => "addf",
                    (BinaryOp::Sub, true) => "subf",
                    (BinaryOp::Mul, true) => "mulf",
                    (BinaryOp::Div, true) => "divf",
                    (BinaryOp::Max, true) => "maximumf",
                    (BinaryOp::Min, true) => "minimumf",
                    (BinaryOp::Pow, _) => return self.assign(&format!("math.powf {x}, {y} : {t}")),
                    (BinaryOp::Rem, true) => {
                        let q = self.assign(&format!("arith.divf {x}, {y} : {t}"));
                        let f = self.assign(&format!("math.floor {q} : {t}"));
                        let m = self.assign(&format!("arith.mulf {y}, {f} : {t}"));
                        return self.assign(&format!("arith.subf {x}, {m} : {t}"));
                    }
                    (BinaryOp::Add, false) => "addi",
                    (BinaryOp::Sub, false) => "subi",
                    (BinaryOp::Mul, false) => "muli",
                    (BinaryOp::Div, false) => "floordivsi",
                    (BinaryOp::Max, false) => "maxsi",
                    (BinaryOp::Min, false) => "minsi",
                    (BinaryOp::And, _) => "andi",
                    (BinaryOp::Or, _) => "ori",
                    (BinaryOp::Rem, false) => {
                        let q = self.assign(&format!("arith.floordivsi {x}, {y} : {t}"));
                        let m = self.assign(&format!("arith.muli {q}, {y} : {t}"));
                        return self.assign(&format!("arith.subi {x}, {m} : {t}"));
                    }
                };
                self.assign(&format!("arith.{name} {x}, {y} : {t}"))
            }
            OpKind::Compare { pred, .. } => {
                let (op, p) = comparison(*pred, in_dtype);
                self.assign(&format!("{op} {p}, {}, {} : {t}", a[0], a[1]))
            }
            OpKind::Select { .. } => {
                let vt = lanes_of(reg(out), width);
                self.assign(&format!(
                    "arith.select {}, {}, {} : {}",
                    a[0],
                    a[1],
                    a[2],
                    select_type(width, &vt)
                ))
            }
            OpKind::Cast { .. } => self.cast(&a[0], in_dtype, out, width),
            _ => unreachable!("not an element-wise op: {}", kind.mnemonic()),
        }
    }

    fn cast(&mut self, x: &str, from: DType, to: DType, width: u64) -> String {
        let (ft, tt) = (lanes_of(reg(from), width), lanes_of(reg(to), width));
        match (from.is_float(), to.is_float(), from, to) {
            (true, true, ..) => x.to_string(),
            (true, false, _, DType::I32) => {
                self.assign(&format!("arith.fptosi {x} : {ft} to {tt}"))
            }
            (true, false, ..) => {
                let z = self.literal(DType::F32, 0.0, width);
                self.assign(&format!("arith.cmpf une, {x}, {z} : {ft}"))
            }
            (false, true, DType::Bool, _) => {
                self.assign(&format!("arith.uitofp {x} : {ft} to {tt}"))
            }
            (false, true, ..) => self.assign(&format!("arith.sitofp {x} : {ft} to {tt}")),
            (false, false, DType::Bool, DType::I32) => {
                self.assign(&format!("arith.extui {x} : {ft} to {tt}"))
            }
            (false, false, DType::I32, DType::Bool) => {
                let z = self.literal(DType::I32, 0.0, width);
                self.assign(&format!("arith.cmpi ne, {x}, {z} : {ft}"))
            }
            _ => x.to_string(),
        }
    }

    /// `exp` as a degree-6 polynomial on `x - n ln2` scaled by `2^n` (Cephes `expf`):
    /// relative error about 1e-7. The input is clamped so that `n` lies in [-127, 128],
    /// where the exponent bits of `2^n` are 0 (the result is 0, so `-inf` gives 0) and
    /// 255 (`+inf`); the clamps are `select`s that x86 does in one `vminps`/`vmaxps`.
    /// NaN passes through.
    fn exp(&mut self, x: &str, width: u64) -> String {
        let t = lanes_of("f32", width);
        let ti = lanes_of("i32", width);
        let c = |e: &mut Self, v: f64| e.literal(DType::F32, v, width);
        let (hi, lo) = (c(self, 128.0 * LN_2), c(self, -127.0 * LN_2));
        let st = select_type(width, &t);
        let below = self.assign(&format!("arith.cmpf olt, {x}, {hi} : {t}"));
        let clamped = self.assign(&format!("arith.select {below}, {x}, {hi} : {st}"));
        let above = self.assign(&format!("arith.cmpf ogt, {clamped}, {lo} : {t}"));
        let clamped = self.assign(&format!("arith.select {above}, {clamped}, {lo} : {st}"));
        let log2e = c(self, std::f64::consts::LOG2_E);
        let scaled = self.assign(&format!("arith.mulf {clamped}, {log2e} : {t}"));
        let n = self.assign(&format!("math.roundeven {scaled} : {t}"));
        let (ln2_hi, ln2_lo) = (c(self, -0.693_359_375), c(self, 2.121_944_4e-4));
        let r = self.assign(&format!("math.fma {n}, {ln2_hi}, {clamped} : {t}"));
        let r = self.assign(&format!("math.fma {n}, {ln2_lo}, {r} : {t}"));
        let coefficients = [
            1.987_569_15e-4,
            1.398_199_950_7e-3,
            8.333_451_907_3e-3,
            4.166_579_589_4e-2,
            1.666_666_545_9e-1,
            5.000_000_120_1e-1,
        ];
        let mut p = c(self, coefficients[0]);
        for &k in &coefficients[1..] {
            let kc = c(self, k);
            p = self.assign(&format!("math.fma {p}, {r}, {kc} : {t}"));
        }
        let r2 = self.assign(&format!("arith.mulf {r}, {r} : {t}"));
        let p = self.assign(&format!("math.fma {p}, {r2}, {r} : {t}"));
        let one = c(self, 1.0);
        let p = self.assign(&format!("arith.addf {p}, {one} : {t}"));
        let ni = self.assign(&format!("arith.fptosi {n} : {t} to {ti}"));
        let bias = self.literal(DType::I32, 127.0, width);
        let e = self.assign(&format!("arith.addi {ni}, {bias} : {ti}"));
        let shift = self.literal(DType::I32, 23.0, width);
        let e = self.assign(&format!("arith.shli {e}, {shift} : {ti}"));
        let scale = self.assign(&format!("arith.bitcast {e} : {ti} to {t}"));
        let y = self.assign(&format!("arith.mulf {p}, {scale} : {t}"));
        let nan = self.assign(&format!("arith.cmpf uno, {x}, {x} : {t}"));
        self.assign(&format!("arith.select {nan}, {x}, {y} : {st}"))
    }

    // ---- memory and loops ---------------------------------------------------------------

    /// Computes every element of a fresh `ty`-shaped buffer with `f`.
    fn materialize(
        &mut self,
        ty: &TensorType,
        f: &mut dyn FnMut(&mut Self, &Lane) -> String,
    ) -> Val {
        let buf = self.alloc(&ty.shape, ty.dtype);
        self.lanes(&ty.shape, &mut |e, lane| {
            let x = f(e, lane);
            e.write(&buf, ty.dtype, lane, &x);
        });
        Val::View(buf)
    }

    /// Like [`Self::materialize`], and also reduces the value along its last dim for each
    /// `(op, result)` in the same pass, binding those results.
    fn materialize_reducing(
        &mut self,
        ty: &TensorType,
        f: &mut dyn FnMut(&mut Self, &Lane) -> String,
        reductions: &[(ReduceOp, Value)],
    ) -> Val {
        let buf = self.alloc(&ty.shape, ty.dtype);
        let (&last, outer) = ty.shape.split_last().expect("rank >= 1");
        let mut idx = Vec::new();
        for &n in outer {
            let (zero, one, hi) = (self.index(0), self.index(1), self.index(n));
            idx.push(self.open_for(&zero, &hi, &one));
        }
        let elem = reg(ty.dtype);
        let ops: Vec<_> = reductions
            .iter()
            .map(|(op, _)| reduction(*op, ty.dtype))
            .collect();
        let main = last / LANES * LANES;
        // Per reduction: the vector and scalar partial results (None: segment empty).
        let mut partial: Vec<(Option<String>, Option<String>)> = vec![(None, None); ops.len()];
        for (lo, hi, width) in [(0, main, LANES), (main, last, 1)] {
            if lo == hi {
                continue;
            }
            let t = lanes_of(elem, width);
            let (lo, hi, step) = (self.index(lo), self.index(hi), self.index(width));
            let inits: Vec<String> = ops
                .iter()
                .map(|(identity, ..)| self.literal(ty.dtype, *identity, width))
                .collect();
            let (iv, res) = (self.w.fresh(), self.w.fresh());
            let args: Vec<String> = ops.iter().map(|_| self.w.fresh()).collect();
            let bindings = args
                .iter()
                .zip(&inits)
                .map(|(a, i)| format!("{a} = {i}"))
                .collect::<Vec<_>>()
                .join(", ");
            let types = vec![t.clone(); ops.len()].join(", ");
            self.line(&format!(
                "{res}:{} = scf.for {iv} = {lo} to {hi} step {step} iter_args({bindings}) -> ({types}) {{",
                ops.len()
            ));
            self.w.indent += 1;
            let mut lane_idx = idx.clone();
            lane_idx.push(iv);
            let lane = Lane {
                idx: lane_idx,
                width,
            };
            let x = f(self, &lane);
            self.write(&buf, ty.dtype, &lane, &x);
            let next: Vec<String> = ops
                .iter()
                .zip(&args)
                .map(|((_, combine, _), a)| self.assign(&format!("arith.{combine} {a}, {x} : {t}")))
                .collect();
            self.line(&format!("scf.yield {} : {types}", next.join(", ")));
            self.close();
            for (i, p) in partial.iter_mut().enumerate() {
                let r = Some(format!("{res}#{i}"));
                if width == 1 {
                    p.1 = r;
                } else {
                    p.0 = r;
                }
            }
        }
        for (((_, combine, kind), (vector, scalar)), (_, result)) in
            ops.iter().zip(partial).zip(reductions)
        {
            let vt = lanes_of(elem, LANES);
            let h = vector.map(|v| {
                self.assign(&format!(
                    "vector.reduction <{kind}>, {v} : {vt} into {elem}"
                ))
            });
            let total = match (h, scalar) {
                (Some(h), Some(s)) => self.assign(&format!("arith.{combine} {h}, {s} : {elem}")),
                (Some(x), None) | (None, Some(x)) => x,
                (None, None) => unreachable!("the last dim is not empty"),
            };
            let rty = self.ty(*result).clone();
            let total = self.round(rty.dtype, &total, 1);
            if rty.is_scalar() {
                self.values.insert(*result, Val::Scalar(total));
            } else {
                let out = self.alloc(&rty.shape, rty.dtype);
                self.values.insert(*result, Val::View(out.clone()));
                let lane = Lane {
                    idx: idx.clone(),
                    width: 1,
                };
                self.write(&out, rty.dtype, &lane, &total);
            }
        }
        for _ in outer {
            self.close();
        }
        Val::View(buf)
    }

    /// Loops over every index of `shape`, the last dim 8 lanes at a time, then a scalar tail.
    fn lanes(&mut self, shape: &[u64], f: &mut dyn FnMut(&mut Self, &Lane)) {
        let Some((&last, outer)) = shape.split_last() else {
            return f(
                self,
                &Lane {
                    idx: vec![],
                    width: 1,
                },
            );
        };
        let mut idx = Vec::new();
        for &n in outer {
            let (zero, one, hi) = (self.index(0), self.index(1), self.index(n));
            idx.push(self.open_for(&zero, &hi, &one));
        }
        let main = last / LANES * LANES;
        for (lo, hi, width) in [(0, main, LANES), (main, last, 1)] {
            if lo == hi {
                continue;
            }
            let (lo, hi, step) = (self.index(lo), self.index(hi), self.index(width));
            let j = self.open_for(&lo, &hi, &step);
            let mut lane_idx = idx.clone();
            lane_idx.push(j);
            f(
                self,
                &Lane {
                    idx: lane_idx,
                    width,
                },
            );
            self.close();
        }
        for _ in outer {
            self.close();
        }
    }

    /// The memref indices of `lane` in `view`, with the innermost value dim shifted by
    /// `shift` lanes.
    fn view_indices(&mut self, view: &View, lane: &Lane, shift: u64) -> Vec<String> {
        let last = lane.idx.len().wrapping_sub(1);
        (0..view.dims.len())
            .map(|i| {
                let mut ix = view.dims[i].map(|d| lane.idx[d].clone());
                if shift > 0 && view.dims[i] == Some(last) {
                    let s = self.index(shift);
                    ix = Some(self.add_index(ix.as_ref().unwrap(), &s));
                }
                match (&view.offsets[i], ix) {
                    (Some(o), Some(x)) => self.add_index(o, &x),
                    (Some(o), None) => o.clone(),
                    (None, Some(x)) => x,
                    (None, None) => self.index(0),
                }
            })
            .collect()
    }

    /// `lane`'s elements of `v` as registers of `dtype` (a scalar or `vector<8x..>`).
    fn read(&mut self, v: &Val, dtype: DType, lane: &Lane) -> String {
        let w = lane.width;
        let elem = storage(dtype);
        match v {
            Val::Expr(e) => {
                let args: Vec<String> = e
                    .operands
                    .iter()
                    .map(|(v, d)| self.read(v, *d, lane))
                    .collect();
                let x = self.scalar_op(&e.kind, &args, &e.operands, e.dtype, w);
                self.round(e.dtype, &x, w)
            }
            Val::Scalar(s) | Val::Splat(s) => {
                if w == 1 {
                    s.clone()
                } else {
                    let t = lanes_of(reg(dtype), w);
                    self.assign(&format!("vector.broadcast {s} : {} to {t}", reg(dtype)))
                }
            }
            Val::Iota(d) => {
                let last = lane.idx.len() - 1;
                let i = self.i32_of(&lane.idx[*d]);
                if w == 1 {
                    return i;
                }
                let t = lanes_of("i32", w);
                let base = self.assign(&format!("vector.broadcast {i} : i32 to {t}"));
                if *d != last {
                    return base;
                }
                let steps = (0..w).map(|l| l.to_string()).collect::<Vec<_>>().join(", ");
                let step = self.constant(&format!("[{steps}]"), &t);
                self.assign(&format!("arith.addi {base}, {step} : {t}"))
            }
            Val::View(view) => {
                let last = lane.idx.len().wrapping_sub(1);
                let contiguous = view.dims.last() == Some(&Some(last));
                let varies = view.dims.contains(&Some(last));
                let loaded = if w == 1 || !varies {
                    let ix = self.view_indices(view, lane, 0);
                    let s = self.assign(&format!(
                        "memref.load {}[{}] : {}",
                        view.mem,
                        ix.join(", "),
                        view.mem_type
                    ));
                    if w == 1 {
                        s
                    } else {
                        let t = lanes_of(elem, w);
                        self.assign(&format!("vector.broadcast {s} : {elem} to {t}"))
                    }
                } else if contiguous {
                    let ix = self.view_indices(view, lane, 0);
                    self.assign(&format!(
                        "vector.load {}[{}] : {}, {}",
                        view.mem,
                        ix.join(", "),
                        view.mem_type,
                        lanes_of(elem, w)
                    ))
                } else {
                    let elems: Vec<String> = (0..w)
                        .map(|l| {
                            let ix = self.view_indices(view, lane, l);
                            self.assign(&format!(
                                "memref.load {}[{}] : {}",
                                view.mem,
                                ix.join(", "),
                                view.mem_type
                            ))
                        })
                        .collect();
                    self.assign(&format!(
                        "vector.from_elements {} : {}",
                        elems.join(", "),
                        lanes_of(elem, w)
                    ))
                };
                if dtype == DType::Bool {
                    let (from, to) = (lanes_of("i8", w), lanes_of("i1", w));
                    self.assign(&format!("arith.trunci {loaded} : {from} to {to}"))
                } else {
                    loaded
                }
            }
        }
    }

    /// Stores `x` (registers of `dtype`) at `lane` of `view` (contiguous in its last dim).
    fn write(&mut self, view: &View, dtype: DType, lane: &Lane, x: &str) {
        let w = lane.width;
        let x = if dtype == DType::Bool {
            let (from, to) = (lanes_of("i1", w), lanes_of("i8", w));
            self.assign(&format!("arith.extui {x} : {from} to {to}"))
        } else {
            x.to_string()
        };
        let ix = self.view_indices(view, lane, 0);
        if w == 1 {
            self.line(&format!(
                "memref.store {x}, {}[{}] : {}",
                view.mem,
                ix.join(", "),
                view.mem_type
            ));
        } else {
            self.line(&format!(
                "vector.store {x}, {}[{}] : {}, {}",
                view.mem,
                ix.join(", "),
                view.mem_type,
                lanes_of(storage(dtype), w)
            ));
        }
    }

    /// Copies `v` (a `ty` tensor) into a fresh contiguous buffer.
    fn pack(&mut self, v: &Val, ty: &TensorType) -> View {
        match self.materialize(ty, &mut |e, lane| e.read(v, ty.dtype, lane)) {
            Val::View(b) => b,
            _ => unreachable!("materialize returns a buffer"),
        }
    }

    fn reduce(&mut self, op: ReduceOp, x: Value, axes: &[usize], ty: &TensorType) -> Val {
        let xt = self.ty(x).clone();
        let src = self.val(x);
        let rank = xt.rank();
        let (identity, combine, kind) = reduction(op, xt.dtype);
        let elem = reg(xt.dtype);
        if !axes.contains(&(rank - 1)) {
            // The last dim survives: accumulate rows into the result buffer.
            let out = self.alloc(&ty.shape, ty.dtype);
            let init = Val::Splat(self.literal(ty.dtype, identity, 1));
            self.lanes(&ty.shape, &mut |e, lane| {
                let x = e.read(&init, ty.dtype, lane);
                e.write(&out, ty.dtype, lane, &x);
            });
            let out_val = Val::View(out.clone());
            let kept: Vec<usize> = (0..rank).filter(|d| !axes.contains(d)).collect();
            self.lanes(&xt.shape, &mut |e, lane| {
                let v = e.read(&src, xt.dtype, lane);
                let out_lane = Lane {
                    idx: kept.iter().map(|&d| lane.idx[d].clone()).collect(),
                    width: lane.width,
                };
                let acc = e.read(&out_val, ty.dtype, &out_lane);
                let t = lanes_of(elem, lane.width);
                let r = e.assign(&format!("arith.{combine} {acc}, {v} : {t}"));
                e.write(&out, ty.dtype, &out_lane, &r);
            });
            return out_val;
        }
        // The last dim is reduced: per result element, loop over the reduced dims with a
        // vector accumulator, then reduce it horizontally.
        let kept: Vec<usize> = (0..rank).filter(|d| !axes.contains(d)).collect();
        let out = (!ty.is_scalar()).then(|| self.alloc(&ty.shape, ty.dtype));
        let mut idx = vec![String::new(); rank];
        let mut opened = 0;
        for &d in &kept {
            let (zero, one, hi) = (self.index(0), self.index(1), self.index(xt.shape[d]));
            idx[d] = self.open_for(&zero, &hi, &one);
            opened += 1;
        }
        let last = xt.shape[rank - 1];
        let main = last / LANES * LANES;
        let vt = lanes_of(elem, LANES);
        let vinit = self.literal(xt.dtype, identity, LANES);
        let sinit = self.literal(xt.dtype, identity, 1);
        let outer_reduced: Vec<usize> = axes.iter().copied().filter(|&d| d != rank - 1).collect();
        // Nested loops over the other reduced dims carry (vector acc, scalar acc).
        let mut accs = (vinit, sinit);
        let mut headers = Vec::new();
        for &d in &outer_reduced {
            let (zero, one, hi) = (self.index(0), self.index(1), self.index(xt.shape[d]));
            let iv = self.w.fresh();
            let (va, sa) = (self.w.fresh(), self.w.fresh());
            let res = self.w.fresh();
            self.line(&format!(
                "{res}:2 = scf.for {iv} = {zero} to {hi} step {one} iter_args({va} = {}, {sa} = {}) -> ({vt}, {elem}) {{",
                accs.0, accs.1
            ));
            self.w.indent += 1;
            idx[d] = iv;
            headers.push(res);
            accs = (va, sa);
        }
        let (mut vacc, mut sacc) = accs.clone();
        // Independent accumulators hide the latency of the combining op.
        let unrolled = last / (LANES * REDUCE_ACCUMULATORS) * LANES * REDUCE_ACCUMULATORS;
        let segments = [
            (0, unrolled, LANES, REDUCE_ACCUMULATORS),
            (unrolled, main, LANES, 1),
            (main, last, 1, 1),
        ];
        for (lo, hi, width, count) in segments {
            if lo == hi {
                continue;
            }
            let (lo_c, hi_c) = (self.index(lo), self.index(hi));
            let step = self.index(width * count);
            let iv = self.w.fresh();
            let res = self.w.fresh();
            let t = lanes_of(elem, width);
            let init = if width == 1 {
                sacc.clone()
            } else {
                vacc.clone()
            };
            let args: Vec<String> = (0..count).map(|_| self.w.fresh()).collect();
            // The first accumulator starts from the running value, the others from the
            // identity.
            let identity = self.literal(xt.dtype, identity, width);
            let inits = args
                .iter()
                .enumerate()
                .map(|(i, a)| format!("{a} = {}", if i == 0 { &init } else { &identity }))
                .collect::<Vec<_>>()
                .join(", ");
            let types = vec![t.clone(); count as usize].join(", ");
            self.line(&format!(
                "{res}:{count} = scf.for {iv} = {lo_c} to {hi_c} step {step} iter_args({inits}) -> ({types}) {{"
            ));
            self.w.indent += 1;
            let mut next = Vec::new();
            for (i, a) in args.iter().enumerate() {
                let off = self.index(i as u64 * width);
                idx[rank - 1] = self.add_index(&iv, &off);
                let lane = Lane {
                    idx: idx.clone(),
                    width,
                };
                let v = self.read(&src, xt.dtype, &lane);
                next.push(self.assign(&format!("arith.{combine} {a}, {v} : {t}")));
            }
            self.line(&format!("scf.yield {} : {types}", next.join(", ")));
            self.close();
            let mut acc = format!("{res}#0");
            for i in 1..count {
                acc = self.assign(&format!("arith.{combine} {acc}, {res}#{i} : {t}"));
            }
            if width == 1 {
                sacc = acc;
            } else {
                vacc = acc;
            }
        }
        for res in headers.iter().rev() {
            self.line(&format!("scf.yield {vacc}, {sacc} : {vt}, {elem}"));
            self.close();
            vacc = format!("{res}#0");
            sacc = format!("{res}#1");
        }
        let h = self.assign(&format!(
            "vector.reduction <{kind}>, {vacc} : {vt} into {elem}"
        ));
        let total = self.assign(&format!("arith.{combine} {h}, {sacc} : {elem}"));
        let total = self.round(ty.dtype, &total, 1);
        match out {
            Some(out) => {
                let lane = Lane {
                    idx: kept.iter().map(|&d| idx[d].clone()).collect(),
                    width: 1,
                };
                self.write(&out, ty.dtype, &lane, &total);
                for _ in 0..opened {
                    self.close();
                }
                Val::View(out)
            }
            None => Val::Scalar(total),
        }
    }

    /// `[M, K] x [K, N]`: both operands packed row-major, then register tiles of
    /// 6 rows x 16 columns over the whole K (12 accumulators), with narrower tiles for
    /// the edges.
    fn dot(&mut self, lhs: Value, rhs: Value, transpose_lhs: bool, transpose_rhs: bool) -> Val {
        let (lt, rt) = (self.ty(lhs).clone(), self.ty(rhs).clone());
        let swap = |v: Val| match v {
            Val::View(v) => Val::View(View {
                dims: v.dims.iter().map(|d| d.map(|d| 1 - d)).collect(),
                ..v
            }),
            Val::Iota(d) => Val::Iota(1 - d),
            other => other,
        };
        let (mut a, mut b) = (self.stored_val(lhs), self.stored_val(rhs));
        let (mut ashape, mut bshape) = (lt.shape.clone(), rt.shape.clone());
        if transpose_lhs {
            a = swap(a);
            ashape.reverse();
        }
        if transpose_rhs {
            b = swap(b);
            bshape.reverse();
        }
        let (m, k, n) = (ashape[0], ashape[1], bshape[1]);
        let a = match a {
            // The micro-kernel reads single elements of A: a view of dense rows will do.
            Val::View(view) if dense_rows(&view, k) => view,
            other => self.pack(&other, &TensorType::new(lt.dtype, ashape)),
        };
        let b = self.dot_rhs(b, &TensorType::new(rt.dtype, bshape));
        let float = lt.dtype.is_float();
        let out_dtype = if float { DType::F32 } else { DType::I32 };
        let c = self.alloc(&[m, n], out_dtype);
        let (rows_main, cols_main) = (
            m / TILE_ROWS * TILE_ROWS,
            n / (LANES * TILE_VECTORS) * LANES * TILE_VECTORS,
        );
        let cols_vec = n / LANES * LANES;
        let tiles = [
            (
                (0, rows_main),
                (0, cols_main),
                TILE_ROWS,
                TILE_VECTORS,
                LANES,
            ),
            (
                (rows_main, m),
                (0, cols_main),
                m - rows_main,
                TILE_VECTORS,
                LANES,
            ),
            ((0, m), (cols_main, cols_vec), 1, 1, LANES),
            ((0, m), (cols_vec, n), 1, 1, 1),
        ];
        for ((r0, r1), (c0, c1), rows, vectors, width) in tiles {
            if r0 < r1 && c0 < c1 {
                self.dot_tiles(
                    (r0, r1),
                    (c0, c1),
                    (rows, vectors, width),
                    k,
                    &a,
                    &b,
                    &c,
                    float,
                );
            }
        }
        Val::View(c)
    }

    /// The dot's right operand as a view whose rows are contiguous (the micro-kernel loads
    /// 8 consecutive elements of a row): read in place, transposed by 8x8 register
    /// blocks, or copied.
    fn dot_rhs(&mut self, b: Val, ty: &TensorType) -> View {
        match b {
            Val::View(view) if dense_rows(&view, ty.shape[1]) => view,
            Val::View(view) if transposed_2d(&view) && ty.shape.iter().all(|d| d % LANES == 0) => {
                self.pack_transposed(&view, ty)
            }
            other => self.pack(&other, ty),
        }
    }

    /// Copies a 2-D view that reads its buffer transposed into a fresh row-major buffer,
    /// 8x8 blocks at a time: 8 row loads, a register transpose (unpack, shuffle, lane
    /// swap: 24 shuffles), 8 row stores. Both dims are multiples of 8.
    fn pack_transposed(&mut self, src: &View, ty: &TensorType) -> View {
        let out = self.alloc(&ty.shape, ty.dtype);
        let t = lanes_of(storage(ty.dtype), LANES);
        let (zero, step) = (self.index(0), self.index(LANES));
        let (rows, cols) = (self.index(ty.shape[0]), self.index(ty.shape[1]));
        let a0 = self.open_for(&zero, &rows, &step);
        let b0 = self.open_for(&zero, &cols, &step);
        // Source row `r` holds R[a0..a0+8, b0+r].
        let mut v: Vec<String> = (0..LANES)
            .map(|r| {
                let o = self.index(r);
                let b = self.add_index(&b0, &o);
                let lane = Lane {
                    idx: vec![a0.clone(), b],
                    width: LANES,
                };
                let ix = self.view_indices(src, &lane, 0).join(", ");
                self.assign(&format!(
                    "vector.load {}[{ix}] : {}, {t}",
                    src.mem, src.mem_type
                ))
            })
            .collect();
        let stages: [TransposeStage; 3] = [
            (
                &[(0, 1), (2, 3), (4, 5), (6, 7)],
                [0, 8, 1, 9, 4, 12, 5, 13],
                [2, 10, 3, 11, 6, 14, 7, 15],
            ),
            (
                &[(0, 2), (1, 3), (4, 6), (5, 7)],
                [0, 1, 8, 9, 4, 5, 12, 13],
                [2, 3, 10, 11, 6, 7, 14, 15],
            ),
            (
                &[(0, 4), (1, 5), (2, 6), (3, 7)],
                [0, 1, 2, 3, 8, 9, 10, 11],
                [4, 5, 6, 7, 12, 13, 14, 15],
            ),
        ];
        // Stages 1 and 2 put pair k's results in slots 2k, 2k+1; stage 3 puts pair
        // (x, y)'s in x and y, leaving column i of the block in slot i.
        for (stage, (pairs, lo, hi)) in stages.iter().enumerate() {
            let mut next = v.clone();
            for (k, &(x, y)) in pairs.iter().enumerate() {
                let list =
                    |m: &[u64; 8]| m.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
                let l = self.assign(&format!(
                    "vector.shuffle {}, {} [{}] : {t}, {t}",
                    v[x],
                    v[y],
                    list(lo)
                ));
                let h = self.assign(&format!(
                    "vector.shuffle {}, {} [{}] : {t}, {t}",
                    v[x],
                    v[y],
                    list(hi)
                ));
                let (dl, dh) = if stage < 2 {
                    (2 * k, 2 * k + 1)
                } else {
                    (x, y)
                };
                next[dl] = l;
                next[dh] = h;
            }
            v = next;
        }
        for (i, row) in v.iter().enumerate() {
            let o = self.index(i as u64);
            let a = self.add_index(&a0, &o);
            self.line(&format!(
                "vector.store {row}, {}[{a}, {b0}] : {}, {t}",
                out.mem, out.mem_type
            ));
        }
        self.close();
        self.close();
        out
    }

    /// Register tiles of `rows x (vectors * width)` over `rows x cols` of `c = a b`.
    #[allow(clippy::too_many_arguments)]
    fn dot_tiles(
        &mut self,
        (r0, r1): (u64, u64),
        (c0, c1): (u64, u64),
        (rows, vectors, width): (u64, u64, u64),
        k: u64,
        a: &View,
        b: &View,
        c: &View,
        float: bool,
    ) {
        let elem = if float { "f32" } else { "i32" };
        let t = lanes_of(elem, width);
        let (lo, hi, step) = (self.index(r0), self.index(r1), self.index(rows));
        let i = self.open_for(&lo, &hi, &step);
        let (lo, hi, step) = (self.index(c0), self.index(c1), self.index(vectors * width));
        let j = self.open_for(&lo, &hi, &step);
        let row: Vec<String> = (0..rows)
            .map(|r| {
                let o = self.index(r);
                self.add_index(&i, &o)
            })
            .collect();
        let col: Vec<String> = (0..vectors)
            .map(|v| {
                let o = self.index(v * width);
                self.add_index(&j, &o)
            })
            .collect();
        let zero = self.literal(if float { DType::F32 } else { DType::I32 }, 0.0, width);
        let count = (rows * vectors) as usize;
        let accs: Vec<String> = (0..count).map(|_| self.w.fresh()).collect();
        let res = self.w.fresh();
        let (k0, k1, one) = (self.index(0), self.index(k), self.index(1));
        let kv = self.w.fresh();
        let iter_args = accs
            .iter()
            .map(|a| format!("{a} = {zero}"))
            .collect::<Vec<_>>()
            .join(", ");
        let types = vec![t.clone(); count].join(", ");
        self.line(&format!(
            "{res}:{count} = scf.for {kv} = {k0} to {k1} step {one} iter_args({iter_args}) -> ({types}) {{"
        ));
        self.w.indent += 1;
        let bvec: Vec<String> = col
            .iter()
            .map(|cj| {
                let lane = Lane {
                    idx: vec![kv.clone(), cj.clone()],
                    width,
                };
                let ix = self.view_indices(b, &lane, 0).join(", ");
                if width == 1 {
                    self.assign(&format!("memref.load {}[{ix}] : {}", b.mem, b.mem_type))
                } else {
                    self.assign(&format!(
                        "vector.load {}[{ix}] : {}, {t}",
                        b.mem, b.mem_type
                    ))
                }
            })
            .collect();
        let mut next = Vec::new();
        for (r, ri) in row.iter().enumerate() {
            let lane = Lane {
                idx: vec![ri.clone(), kv.clone()],
                width: 1,
            };
            let ix = self.view_indices(a, &lane, 0).join(", ");
            let s = self.assign(&format!("memref.load {}[{ix}] : {}", a.mem, a.mem_type));
            let av = if width == 1 {
                s
            } else {
                self.assign(&format!("vector.broadcast {s} : {elem} to {t}"))
            };
            for (v, bv) in bvec.iter().enumerate() {
                let acc = &accs[r * vectors as usize + v];
                next.push(if float {
                    self.assign(&format!("math.fma {av}, {bv}, {acc} : {t}"))
                } else {
                    let p = self.assign(&format!("arith.muli {av}, {bv} : {t}"));
                    self.assign(&format!("arith.addi {acc}, {p} : {t}"))
                });
            }
        }
        self.line(&format!("scf.yield {} : {types}", next.join(", ")));
        self.close();
        for (r, ri) in row.iter().enumerate() {
            for (v, cj) in col.iter().enumerate() {
                let acc = format!("{res}#{}", r * vectors as usize + v);
                if width == 1 {
                    self.line(&format!(
                        "memref.store {acc}, {}[{ri}, {cj}] : {}",
                        c.mem, c.mem_type
                    ));
                } else {
                    self.line(&format!(
                        "vector.store {acc}, {}[{ri}, {cj}] : {}, {t}",
                        c.mem, c.mem_type
                    ));
                }
            }
        }
        self.close();
        self.close();
    }

    // ---- control flow --------------------------------------------------------------------

    /// Copies `v` into the buffer `dst` (a `ty` tensor).
    fn copy_into(&mut self, v: &Val, dst: &View, ty: &TensorType) {
        let v = v.clone();
        self.lanes(&ty.shape, &mut |e, lane| {
            let x = e.read(&v, ty.dtype, lane);
            e.write(dst, ty.dtype, lane, &x);
        });
    }

    /// Carried tensors live in one buffer each for the whole loop; scalars are `iter_args`.
    fn for_op(
        &mut self,
        op: &Op,
        lower: Value,
        upper: Value,
        step: Value,
        inits: &[Value],
        body: &Region,
    ) {
        let (lo, hi, st) = (self.scalar(lower), self.scalar(upper), self.scalar(step));
        let (lo, hi, st) = (self.index_of(&lo), self.index_of(&hi), self.index_of(&st));
        let mut buffers: Vec<Option<View>> = Vec::new();
        let mut scalar_inits = Vec::new();
        for &init in inits {
            let ty = self.ty(init).clone();
            if ty.is_scalar() {
                buffers.push(None);
                scalar_inits.push((self.scalar(init), reg(ty.dtype)));
            } else {
                let b = self.alloc(&ty.shape, ty.dtype);
                let v = self.val(init);
                self.copy_into(&v, &b, &ty);
                buffers.push(Some(b));
            }
        }
        let iv = self.w.fresh();
        let res = self.w.fresh();
        let scalar_args: Vec<String> = scalar_inits.iter().map(|_| self.w.fresh()).collect();
        let types: Vec<&str> = scalar_inits.iter().map(|(_, t)| *t).collect();
        if scalar_inits.is_empty() {
            self.line(&format!("scf.for {iv} = {lo} to {hi} step {st} {{"));
        } else {
            let args = scalar_args
                .iter()
                .zip(&scalar_inits)
                .map(|(a, (i, _))| format!("{a} = {i}"))
                .collect::<Vec<_>>()
                .join(", ");
            self.line(&format!(
                "{res}:{} = scf.for {iv} = {lo} to {hi} step {st} iter_args({args}) -> ({}) {{",
                types.len(),
                types.join(", ")
            ));
        }
        self.w.indent += 1;
        let iv32 = self.i32_of(&iv);
        self.values.insert(body.args[0], Val::Scalar(iv32));
        let mut scalars = scalar_args.iter();
        for (arg, buf) in body.args[1..].iter().zip(&buffers) {
            let v = match buf {
                Some(b) => Val::View(b.clone()),
                None => Val::Scalar(scalars.next().unwrap().clone()),
            };
            self.values.insert(*arg, v);
        }
        self.region(body);
        let yielded = yield_values(body);
        let mut scalar_yields = Vec::new();
        // Stage tensors that read a carried buffer, so no copy clobbers another's source.
        let carried: Vec<String> = buffers.iter().flatten().map(|b| b.mem.clone()).collect();
        let mut sources = Vec::new();
        for (&y, buf) in yielded.iter().zip(&buffers) {
            let v = self.val(y);
            match buf {
                None => scalar_yields.push(self.scalar(y)),
                Some(b) => {
                    let ty = self.ty(y).clone();
                    let identical =
                        |w: &View| w.mem == b.mem && w.dims == b.dims && w.offsets == b.offsets;
                    if matches!(&v, Val::View(w) if identical(w)) {
                        continue;
                    }
                    // Reading its own buffer element by element is safe; anything else
                    // that reads a carried buffer is staged before the first copy.
                    let mut leaves = Vec::new();
                    v.leaves(&mut leaves);
                    let hazard = leaves
                        .iter()
                        .any(|w| carried.contains(&w.mem) && !identical(w));
                    let v = if hazard {
                        Val::View(self.pack(&v, &ty))
                    } else {
                        v
                    };
                    sources.push((v, b.clone(), ty));
                }
            }
        }
        for (v, b, ty) in sources {
            self.copy_into(&v, &b, &ty);
        }
        if !scalar_yields.is_empty() {
            self.line(&format!(
                "scf.yield {} : {}",
                scalar_yields.join(", "),
                types.join(", ")
            ));
        }
        self.close();
        self.bind_results(op, buffers, &res);
    }

    /// Binds a `for`/`if`'s results: tensors to their buffers, scalars to the
    /// successive results `res#i` of the `scf` op.
    fn bind_results(&mut self, op: &Op, buffers: Vec<Option<View>>, res: &str) {
        let mut scalars = 0;
        for (r, buf) in op.results.iter().zip(buffers) {
            let v = match buf {
                Some(b) => Val::View(b),
                None => {
                    scalars += 1;
                    Val::Scalar(format!("{res}#{}", scalars - 1))
                }
            };
            self.values.insert(*r, v);
        }
    }

    fn if_op(&mut self, op: &Op, cond: Value, then_region: &Region, else_region: &Region) {
        let c = self.scalar(cond);
        let mut buffers = Vec::new();
        let mut types = Vec::new();
        for &r in &op.results {
            let ty = self.ty(r).clone();
            if ty.is_scalar() {
                buffers.push(None);
                types.push(reg(ty.dtype));
            } else {
                buffers.push(Some(self.alloc(&ty.shape, ty.dtype)));
            }
        }
        let res = self.w.fresh();
        self.line(&scf_if_header(&res, &c, &types));
        for (i, region) in [then_region, else_region].into_iter().enumerate() {
            if i == 1 {
                self.line("} else {");
            }
            self.w.indent += 1;
            self.region(region);
            let mut scalars = Vec::new();
            for (&y, buf) in yield_values(region).iter().zip(&buffers) {
                let v = self.val(y);
                match buf {
                    None => scalars.push(self.scalar(y)),
                    Some(b) => {
                        let ty = self.ty(y).clone();
                        self.copy_into(&v, b, &ty);
                    }
                }
            }
            if !types.is_empty() {
                self.line(&format!(
                    "scf.yield {} : {}",
                    scalars.join(", "),
                    types.join(", ")
                ));
            }
            self.w.indent -= 1;
        }
        self.line("}");
        self.bind_results(op, buffers, &res);
    }
}

/// One stage of the 8x8 transpose: the register pairs it combines and the shuffle masks
/// of the two results of each pair.
type TransposeStage = (&'static [(usize, usize)], [u64; 8], [u64; 8]);

/// Whether a 2-D view's rows are `cols` consecutive elements of its buffer, one
/// buffer row each: the micro-kernel reads it in place. A window of a wider array is
/// copied instead (rows a page apart thrash the L1 sets and the TLB).
fn dense_rows(v: &View, cols: u64) -> bool {
    v.dims.last() == Some(&Some(1)) && v.shape.last() == Some(&cols)
}

/// Whether a 2-D value reads its buffer transposed: the buffer's last dim is the value's
/// first, the one before it the value's second, and no other buffer dim moves.
fn transposed_2d(v: &View) -> bool {
    let n = v.dims.len();
    n >= 2
        && v.dims[n - 1] == Some(0)
        && v.dims[n - 2] == Some(1)
        && v.dims[..n - 2].iter().all(Option::is_none)
}

/// A reduction's identity, its combining `arith` op and its `vector.reduction` kind.
fn reduction(op: ReduceOp, dtype: DType) -> (f64, &'static str, &'static str) {
    match (op, dtype.is_float()) {
        (ReduceOp::Sum, true) => (0.0, "addf", "add"),
        (ReduceOp::Max, true) => (f64::NEG_INFINITY, "maximumf", "maximumf"),
        (ReduceOp::Min, true) => (f64::INFINITY, "minimumf", "minimumf"),
        (ReduceOp::Sum, false) => (0.0, "addi", "add"),
        (ReduceOp::Max, false) => (i32::MIN as f64, "maxsi", "maxsi"),
        (ReduceOp::Min, false) => (i32::MAX as f64, "minsi", "minsi"),
    }
}

/// The values a region's closing `yield` passes out (none when it has no yield).
fn yield_values(r: &Region) -> Vec<Value> {
    match r.ops.last().map(|op| &op.kind) {
        Some(OpKind::Yield { values }) => values.clone(),
        _ => vec![],
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
