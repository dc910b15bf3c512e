//! Kernel IR -> a Mosaic TPU module in the form JAX Pallas emits, and the StableHLO
//! module that calls it through `stablehlo.custom_call @tpu_custom_call`.
//!
//! The kernel function takes the grid indices (i32), then one memref per input, output
//! and scratch buffer (`#tpu.memory_space<vmem>`; squeezed block dims stay as size-1
//! dims, as in Pallas), and carries `dimension_semantics`, `iteration_bounds`,
//! `scalar_prefetch`, `scratch_operands` and `window_params` whose `transform_indices`
//! name one `@transform_i` function per input/output (the index map). The body uses
//! `vector.load`/`tpu.vector_store`, `arith`/`math` element-wise ops, `tpu.matmul`,
//! `vector.multi_reduction`, `tpu.iota` and `scf.for`/`scf.if` with i32 loop bounds.
//! Masked loads and stores are a `select` against the block's contents (blocks are whole
//! in VMEM, so reading the masked-off lanes is safe).
//!
//! The body goes into the custom call as base64 MLIR text without `serialization_format`
//! (which the Mosaic compiler accepts); JAX itself stores versioned bytecode
//! (`mosaic-serde`), which needs the `tpu` dialect that only jaxlib/libtpu link.

use std::collections::HashMap;
use std::fmt::Write;

use kernel_ir::{
    BinaryOp, BlockDim, DType, DimSemantics, Index, IndexBinOp, IndexExpr, Kernel, Literal,
    MemorySpace, Op, OpKind, ReduceOp, RefKind, Region, Start, TensorType, UnaryOp, Value,
};

use crate::text::{
    arith_binary, arith_unary_float, comparison, element_type as elem, float_rem, literal,
    scf_if_header, Emit, Writer,
};
use crate::tpu_rules::{self, TpuLimits, TpuRuleError};

/// The MLIR type of a value: a scalar for rank 0, else a vector.
fn vty(dtype: DType, shape: &[u64]) -> String {
    if shape.is_empty() {
        return elem(dtype).into();
    }
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("vector<{}x{}>", dims.join("x"), elem(dtype))
}

fn tty(t: &TensorType) -> String {
    vty(t.dtype, &t.shape)
}

fn memory_space(space: MemorySpace) -> &'static str {
    match space {
        MemorySpace::Vmem => "#tpu.memory_space<vmem>",
        MemorySpace::Smem => "#tpu.memory_space<smem>",
        MemorySpace::Any => "#tpu.memory_space<any>",
    }
}

/// The memref shape of each ref: the block shape with squeezed dims as 1 (I/O), or
/// the buffer shape (scratch).
fn memref_shape(k: &Kernel, r: usize) -> Vec<u64> {
    k.refs[r].block_dims().iter().map(|d| d.extent()).collect()
}

fn memref_type(k: &Kernel, r: usize) -> String {
    let decl = &k.refs[r];
    let space = decl
        .block
        .as_ref()
        .map_or(decl.memory_space, |s| s.memory_space);
    let dims: Vec<String> = memref_shape(k, r).iter().map(|d| d.to_string()).collect();
    format!(
        "memref<{}x{}, {}>",
        dims.join("x"),
        elem(decl.ty.dtype),
        memory_space(space)
    )
}

/// Checks the TPU rules, then emits the Mosaic module text.
pub fn lower_body(kernel: &Kernel, limits: &TpuLimits) -> Result<String, TpuRuleError> {
    tpu_rules::check(kernel, limits)?;
    Ok(Emitter::new(kernel).module())
}

/// Checks the TPU rules, then returns the `backend_config` JSON of the
/// `tpu_custom_call` that runs the kernel: its Mosaic body, base64-encoded as text.
pub fn custom_call_config(kernel: &Kernel, limits: &TpuLimits) -> Result<String, TpuRuleError> {
    let body = lower_body(kernel, limits)?;
    Ok(format!(
        r#"{{"custom_call_config": {{"body": "{}", "needs_layout_passes": true}}}}"#,
        base64(body.as_bytes())
    ))
}

/// Checks the TPU rules, then emits the StableHLO module whose `main` calls the kernel
/// through `stablehlo.custom_call @tpu_custom_call`, as JAX does.
pub fn lower(kernel: &Kernel, limits: &TpuLimits) -> Result<String, TpuRuleError> {
    let config = custom_call_config(kernel, limits)?.replace('"', "\\22");
    let tensor = |t: &TensorType| {
        let mut s = String::from("tensor<");
        for d in &t.shape {
            let _ = write!(s, "{d}x");
        }
        s.push_str(elem(t.dtype));
        s.push('>');
        s
    };
    let layout = |t: &TensorType| {
        let dims: Vec<String> = (0..t.rank()).rev().map(|d| d.to_string()).collect();
        format!("dense<[{}]> : tensor<{}xindex>", dims.join(", "), t.rank())
    };
    let inputs = kernel.input_types();
    let outputs = kernel.output_types();
    let params: Vec<String> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| format!("%arg{i}: {}", tensor(t)))
        .collect();
    let args: Vec<String> = (0..inputs.len()).map(|i| format!("%arg{i}")).collect();
    let in_types: Vec<String> = inputs.iter().map(tensor).collect();
    let out_types: Vec<String> = outputs.iter().map(tensor).collect();
    let results = if outputs.len() == 1 {
        "%0".to_string()
    } else {
        format!("%0:{}", outputs.len())
    };
    let returned: Vec<String> = if outputs.len() == 1 {
        vec!["%0".into()]
    } else {
        (0..outputs.len()).map(|i| format!("%0#{i}")).collect()
    };
    let out_sig = if outputs.len() == 1 {
        out_types[0].clone()
    } else {
        format!("({})", out_types.join(", "))
    };
    Ok(format!(
        "module @{name} attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{\n  \
         func.func public @main({params}) -> ({outs}) {{\n    \
         {results} = stablehlo.custom_call @tpu_custom_call({args}) {{backend_config = \"{config}\", \
         kernel_name = \"{name}\", operand_layouts = [{in_layouts}], result_layouts = [{out_layouts}]}} : \
         ({in_types}) -> {out_sig}\n    \
         return {returned} : {outs}\n  }}\n}}\n",
        name = kernel.name,
        params = params.join(", "),
        outs = out_types.join(", "),
        args = args.join(", "),
        in_layouts = inputs.iter().map(layout).collect::<Vec<_>>().join(", "),
        out_layouts = outputs.iter().map(layout).collect::<Vec<_>>().join(", "),
        in_types = in_types.join(", "),
        returned = returned.join(", "),
    ))
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(TABLE[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

struct Emitter<'k> {
    k: &'k Kernel,
    w: Writer,
    values: HashMap<Value, String>,
}

impl<'k> Emitter<'k> {
    fn new(k: &'k Kernel) -> Self {
        Emitter {
            k,
            w: Writer::new("", 2),
            values: HashMap::new(),
        }
    }

    fn fresh(&mut self) -> String {
        self.w.fresh()
    }

    fn line(&mut self, s: &str) {
        self.w.line(s)
    }

    /// Emits `%r = <text>` and returns `%r`.
    fn def(&mut self, text: &str) -> String {
        let r = self.fresh();
        self.line(&format!("{r} = {text}"));
        r
    }
}

impl Emit for Emitter<'_> {
    fn emit(&mut self, rhs: &str) -> String {
        self.def(rhs)
    }
}

impl Emitter<'_> {
    fn constant(&mut self, dtype: DType, shape: &[u64], v: f64) -> String {
        let t = vty(dtype, shape);
        if shape.is_empty() {
            self.def(&format!("arith.constant {} : {t}", literal(dtype, v)))
        } else {
            self.def(&format!(
                "arith.constant dense<{}> : {t}",
                literal(dtype, v)
            ))
        }
    }

    fn i32_const(&mut self, v: i64) -> String {
        self.def(&format!("arith.constant {v} : i32"))
    }

    fn index(&mut self, v: &str) -> String {
        self.def(&format!("arith.index_cast {v} : i32 to index"))
    }

    fn shape_cast(&mut self, x: &str, dtype: DType, from: &[u64], to: &[u64]) -> String {
        if from == to {
            return x.to_string();
        }
        if to.is_empty() {
            let zeros: Vec<&str> = from.iter().map(|_| "0").collect();
            return self.def(&format!(
                "vector.extract {x}[{}] : {} from {}",
                zeros.join(", "),
                elem(dtype),
                vty(dtype, from)
            ));
        }
        if from.is_empty() {
            return self.def(&format!(
                "vector.broadcast {x} : {} to {}",
                elem(dtype),
                vty(dtype, to)
            ));
        }
        self.def(&format!(
            "vector.shape_cast {x} : {} to {}",
            vty(dtype, from),
            vty(dtype, to)
        ))
    }

    fn module(&mut self) -> String {
        let k = self.k;
        let grid_args: Vec<String> = (0..k.grid.len()).map(|i| format!("%arg{i}: i32")).collect();
        let ref_args: Vec<String> = (0..k.refs.len())
            .map(|r| format!("%arg{}: {}", k.grid.len() + r, memref_type(k, r)))
            .collect();
        let semantics: Vec<String> = k
            .dimension_semantics
            .iter()
            .map(|s| {
                let n = match s {
                    DimSemantics::Parallel => "parallel",
                    DimSemantics::Arbitrary => "arbitrary",
                };
                format!("#tpu.dimension_semantics<{n}>")
            })
            .collect();
        let io: Vec<usize> = (0..k.refs.len())
            .filter(|&r| k.refs[r].block.is_some())
            .collect();
        let windows: Vec<String> = io
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                let bounds: Vec<String> =
                    memref_shape(k, r).iter().map(|d| d.to_string()).collect();
                format!(
                    "{{transform_indices = @transform_{i}, window_bounds = array<i64: {}>}}",
                    bounds.join(", ")
                )
            })
            .collect();
        let scratch = k.refs.iter().filter(|r| r.kind == RefKind::Scratch).count();
        let bounds: Vec<String> = k.grid.iter().map(|g| g.to_string()).collect();
        self.region_ops(&k.body);
        let body = self.w.take();
        let mut text = format!(
            "module attributes {{stable_mosaic.version = 11 : i64}} {{\n  func.func @{name}({args}) attributes \
             {{dimension_semantics = [{semantics}], iteration_bounds = array<i64: {bounds}>, \
             scalar_prefetch = 0 : i64, scratch_operands = {scratch} : i64, tpu.core_type = #tpu.core_type<tc>, \
             window_params = [{windows}]}} {{\n{body}    return\n  }}\n",
            name = k.name,
            args = grid_args.iter().chain(&ref_args).cloned().collect::<Vec<_>>().join(", "),
            semantics = semantics.join(", "),
            bounds = bounds.join(", "),
            windows = windows.join(", "),
        );
        for (i, &r) in io.iter().enumerate() {
            text.push_str(&self.transform(i, r));
        }
        text.push_str("}\n");
        text
    }

    /// `@transform_i`: the index map of ref `r` as a function of the grid indices.
    fn transform(&mut self, i: usize, r: usize) -> String {
        let k = self.k;
        let spec = k.refs[r].block.as_ref().expect("I/O refs have block specs");
        self.w.indent = 2;
        let results: Vec<String> = spec
            .index_map
            .exprs
            .iter()
            .map(|e| self.index_expr(e))
            .collect();
        let body = self.w.take();
        let args: Vec<String> = (0..k.grid.len()).map(|a| format!("%arg{a}: i32")).collect();
        let types: Vec<&str> = results.iter().map(|_| "i32").collect();
        format!(
            "  func.func @transform_{i}({}) -> ({}) {{\n{body}    return {} : {}\n  }}\n",
            args.join(", "),
            types.join(", "),
            results.join(", "),
            types.join(", ")
        )
    }

    fn index_expr(&mut self, e: &IndexExpr) -> String {
        match e {
            IndexExpr::ProgramId(axis) => format!("%arg{axis}"),
            IndexExpr::Const(c) => self.i32_const(*c),
            IndexExpr::Bin(op, a, b) => {
                let (a, b) = (self.index_expr(a), self.index_expr(b));
                let name = match op {
                    IndexBinOp::Add => "arith.addi",
                    IndexBinOp::Sub => "arith.subi",
                    IndexBinOp::Mul => "arith.muli",
                    IndexBinOp::Min => "arith.minsi",
                    IndexBinOp::Max => "arith.maxsi",
                    IndexBinOp::FloorDiv => return self.floor_div_rem(&a, &b, &[], false),
                    IndexBinOp::Rem => return self.floor_div_rem(&a, &b, &[], true),
                };
                self.def(&format!("{name} {a}, {b} : i32"))
            }
        }
    }

    /// Integer division (or remainder) rounded toward negative infinity, built from
    /// `divsi`/`remsi` (Mosaic does not legalize `arith.floordivsi`).
    fn floor_div_rem(&mut self, a: &str, b: &str, shape: &[u64], want_rem: bool) -> String {
        let (t, c) = (vty(DType::I32, shape), vty(DType::Bool, shape));
        let q = self.def(&format!("arith.divsi {a}, {b} : {t}"));
        let r = self.def(&format!("arith.remsi {a}, {b} : {t}"));
        let zero = self.constant(DType::I32, shape, 0.0);
        let r_neg = self.def(&format!("arith.cmpi slt, {r}, {zero} : {t}"));
        let b_neg = self.def(&format!("arith.cmpi slt, {b}, {zero} : {t}"));
        let differ = self.def(&format!("arith.cmpi ne, {r_neg}, {b_neg} : {c}"));
        let nonzero = self.def(&format!("arith.cmpi ne, {r}, {zero} : {t}"));
        let adjust = self.def(&format!("arith.andi {nonzero}, {differ} : {c}"));
        let (fixed, plain) = if want_rem {
            (self.def(&format!("arith.addi {r}, {b} : {t}")), r)
        } else {
            let one = self.constant(DType::I32, shape, 1.0);
            (self.def(&format!("arith.subi {q}, {one} : {t}")), q)
        };
        self.select(
            &adjust,
            &fixed,
            &plain,
            &TensorType::new(DType::I32, shape.to_vec()),
        )
    }

    fn v(&self, v: Value) -> String {
        self.values[&v].clone()
    }

    fn ty(&self, v: Value) -> TensorType {
        self.k.type_of(v).clone()
    }

    fn region_ops(&mut self, region: &Region) -> Vec<String> {
        for op in &region.ops {
            if let OpKind::Yield { values } = &op.kind {
                return values.iter().map(|&v| self.v(v)).collect();
            }
            self.lower_op(op);
        }
        Vec::new()
    }

    /// Memref indices (`index` values) and the per-memref-dim window of a load/store.
    fn window(&mut self, r: usize, index: &[Index]) -> (Vec<String>, Vec<u64>) {
        let decl = &self.k.refs[r];
        let block_dims = decl.block_dims();
        let mut indices = Vec::new();
        let mut counts = Vec::new();
        let mut kernel_dim = 0;
        for bd in block_dims {
            let BlockDim::Size(extent) = bd else {
                indices.push(self.def("arith.constant 0 : index"));
                counts.push(1);
                continue;
            };
            let (i, c) = match index[kernel_dim] {
                Index::Full => (self.def("arith.constant 0 : index"), extent),
                Index::At(v) => {
                    let v = self.v(v);
                    (self.index(&v), 1)
                }
                Index::Slice {
                    start: Start::Static(s),
                    size,
                } => (self.def(&format!("arith.constant {s} : index")), size),
                Index::Slice {
                    start: Start::Dynamic(v),
                    size,
                } => {
                    let v = self.v(v);
                    (self.index(&v), size)
                }
            };
            kernel_dim += 1;
            indices.push(i);
            counts.push(c);
        }
        (indices, counts)
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

    fn lower_op(&mut self, op: &Op) {
        let k = self.k;
        let result_ty = || k.type_of(op.results[0]).clone();
        let value = match &op.kind {
            OpKind::ProgramId { axis } => format!("%arg{axis}"),
            OpKind::NumPrograms { axis } => self.i32_const(k.grid[*axis] as i64),
            OpKind::Constant { value } => {
                let t = result_ty();
                let v = match value {
                    Literal::Float(f) => *f,
                    Literal::Int(i) => *i as f64,
                    Literal::Bool(b) => f64::from(u8::from(*b)),
                };
                self.constant(t.dtype, &t.shape, v)
            }
            OpKind::Iota { dim } => {
                let t = result_ty();
                if t.rank() == 1 {
                    // Mosaic's iota is at least 2-D: count along lanes, then drop the row.
                    let row = [1, t.shape[0]];
                    let i = self.def(&format!(
                        "tpu.iota {{dimensions = array<i32: 1>}} : {}",
                        vty(DType::I32, &row)
                    ));
                    self.shape_cast(&i, DType::I32, &row, &t.shape)
                } else {
                    self.def(&format!(
                        "tpu.iota {{dimensions = array<i32: {dim}>}} : {}",
                        tty(&t)
                    ))
                }
            }
            OpKind::Load {
                src,
                index,
                mask,
                other,
            } => {
                let r = src.0 as usize;
                let t = result_ty();
                let (indices, counts) = self.window(r, index);
                let loaded = self.load_window(r, &indices, &counts);
                let loaded = self.shape_cast(&loaded, t.dtype, &counts, &t.shape);
                match mask {
                    None => loaded,
                    Some(m) => {
                        let fill = match other {
                            Some(o) => {
                                let o = self.v(*o);
                                self.shape_cast(&o, t.dtype, &[], &t.shape)
                            }
                            None => self.constant(t.dtype, &t.shape, 0.0),
                        };
                        let m = self.v(*m);
                        self.select(&m, &loaded, &fill, &t)
                    }
                }
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
                return;
            }
            OpKind::Broadcast { x, dims } => {
                let xt = self.ty(*x);
                let t = result_ty();
                let x = self.v(*x);
                if xt.is_scalar() {
                    self.def(&format!(
                        "vector.broadcast {x} : {} to {}",
                        elem(t.dtype),
                        tty(&t)
                    ))
                } else {
                    let mut aligned = vec![1u64; t.rank()];
                    for (i, &d) in dims.iter().enumerate() {
                        aligned[d] = xt.shape[i];
                    }
                    let a = self.shape_cast(&x, t.dtype, &xt.shape, &aligned);
                    if aligned == t.shape {
                        a
                    } else {
                        self.def(&format!(
                            "vector.broadcast {a} : {} to {}",
                            vty(t.dtype, &aligned),
                            tty(&t)
                        ))
                    }
                }
            }
            OpKind::Reshape { x } => {
                let (xt, t) = (self.ty(*x), result_ty());
                let x = self.v(*x);
                self.shape_cast(&x, t.dtype, &xt.shape, &t.shape)
            }
            OpKind::Transpose { x, perm } => {
                let (xt, t) = (self.ty(*x), result_ty());
                let p: Vec<String> = perm.iter().map(|d| d.to_string()).collect();
                let x = self.v(*x);
                self.def(&format!(
                    "vector.transpose {x}, [{}] : {} to {}",
                    p.join(", "),
                    tty(&xt),
                    tty(&t)
                ))
            }
            OpKind::Unary { op: u, x } => {
                let t = self.ty(*x);
                let x = self.v(*x);
                let ts = tty(&t);
                match (u, t.dtype) {
                    (UnaryOp::Not, DType::Bool) => {
                        let one = self.constant(DType::Bool, &t.shape, 1.0);
                        self.def(&format!("arith.xori {x}, {one} : {ts}"))
                    }
                    (UnaryOp::Not, _) => {
                        let ones = self.constant(DType::I32, &t.shape, -1.0);
                        self.def(&format!("arith.xori {x}, {ones} : {ts}"))
                    }
                    (UnaryOp::Neg, DType::I32) => {
                        let zero = self.constant(DType::I32, &t.shape, 0.0);
                        self.def(&format!("arith.subi {zero}, {x} : {ts}"))
                    }
                    (UnaryOp::Abs, DType::I32) => self.def(&format!("math.absi {x} : {ts}")),
                    _ => {
                        let name = arith_unary_float(*u).expect("`not` is handled above");
                        self.def(&format!("{name} {x} : {ts}"))
                    }
                }
            }
            OpKind::Binary { op: b, lhs, rhs } => {
                let t = self.ty(*lhs);
                let (a, c) = (self.v(*lhs), self.v(*rhs));
                let ts = tty(&t);
                let float = t.dtype.is_float();
                let r = match (arith_binary(*b, float), float) {
                    (Some(name), _) => self.def(&format!("{name} {a}, {c} : {ts}")),
                    (None, true) => float_rem(self, &a, &c, &ts),
                    (None, false) => self.floor_div_rem(&a, &c, &t.shape, *b == BinaryOp::Rem),
                };
                self.values.insert(op.results[0], r);
                return;
            }
            OpKind::Compare { pred, lhs, rhs } => {
                let t = self.ty(*lhs);
                let (a, c) = (self.v(*lhs), self.v(*rhs));
                let (op_name, p) = comparison(*pred, t.dtype);
                self.def(&format!("{op_name} {p}, {a}, {c} : {}", tty(&t)))
            }
            OpKind::Select {
                cond,
                on_true,
                on_false,
            } => {
                let t = self.ty(*on_true);
                let (c, a, b) = (self.v(*cond), self.v(*on_true), self.v(*on_false));
                self.select(&c, &a, &b, &t)
            }
            OpKind::Cast { x } => {
                let xt = self.ty(*x);
                let x = self.v(*x);
                self.cast(&x, &xt, result_ty().dtype)
            }
            OpKind::Reduce { op: r, x, axes } => {
                let xt = self.ty(*x);
                let t = result_ty();
                let acc = if xt.dtype.is_float() {
                    DType::F32
                } else {
                    xt.dtype
                };
                let x = self.v(*x);
                let input = self.cast(&x, &xt, acc);
                let (kind, init) = match (r, acc) {
                    (ReduceOp::Sum, _) => ("add", 0.0),
                    (ReduceOp::Max, DType::I32) => ("maxsi", f64::from(i32::MIN)),
                    (ReduceOp::Min, DType::I32) => ("minsi", f64::from(i32::MAX)),
                    (ReduceOp::Max, _) => ("maximumf", f64::NEG_INFINITY),
                    (ReduceOp::Min, _) => ("minimumf", f64::INFINITY),
                };
                let init = self.constant(acc, &t.shape, init);
                let a: Vec<String> = axes.iter().map(|d| d.to_string()).collect();
                let reduced = self.def(&format!(
                    "vector.multi_reduction <{kind}>, {input}, {init} [{}] : {} to {}",
                    a.join(", "),
                    vty(acc, &xt.shape),
                    vty(acc, &t.shape)
                ));
                self.cast(&reduced, &TensorType::new(acc, t.shape.clone()), t.dtype)
            }
            OpKind::Dot {
                lhs,
                rhs,
                transpose_lhs,
                transpose_rhs,
            } => {
                let (lt, rt, t) = (self.ty(*lhs), self.ty(*rhs), result_ty());
                let zero = self.constant(t.dtype, &t.shape, 0.0);
                let (lc, ln) = if *transpose_lhs { (0, 1) } else { (1, 0) };
                let (rc, rn) = if *transpose_rhs { (1, 0) } else { (0, 1) };
                let (a, b) = (self.v(*lhs), self.v(*rhs));
                self.def(&format!(
                    "tpu.matmul {a}, {b}, {zero} {{dimension_numbers = #tpu.dot_dimension_numbers<[{lc}], [{rc}], [{ln}], [{rn}], [0, {ln}, 1, {rn}], [], []>, transpose_lhs_hint = false}} : {}, {}, {} -> {}",
                    tty(&lt),
                    tty(&rt),
                    tty(&t),
                    tty(&t)
                ))
            }
            OpKind::For {
                lower,
                upper,
                step,
                inits,
                body,
            } => {
                let (lo, hi, st) = (self.v(*lower), self.v(*upper), self.v(*step));
                let iv = self.fresh();
                let args: Vec<String> = body.args[1..].iter().map(|_| self.fresh()).collect();
                self.values.insert(body.args[0], iv.clone());
                for (a, &v) in args.iter().zip(&body.args[1..]) {
                    self.values.insert(v, a.clone());
                }
                let types: Vec<String> = inits.iter().map(|&v| tty(&self.ty(v))).collect();
                let r = self.fresh();
                let head = if inits.is_empty() {
                    format!("scf.for {iv} = {lo} to {hi} step {st} : i32 {{")
                } else {
                    let pairs: Vec<String> = args
                        .iter()
                        .zip(inits)
                        .map(|(a, &i)| format!("{a} = {}", self.v(i)))
                        .collect();
                    format!(
                        "{r}:{} = scf.for {iv} = {lo} to {hi} step {st} iter_args({}) -> ({}) : i32 {{",
                        inits.len(),
                        pairs.join(", "),
                        types.join(", ")
                    )
                };
                self.line(&head);
                self.nested_region(body, &types);
                self.line("}");
                self.bind_results(op, &r);
                return;
            }
            OpKind::If {
                cond,
                then_region,
                else_region,
            } => {
                let c = self.v(*cond);
                let types: Vec<String> = op.results.iter().map(|&v| tty(&self.ty(v))).collect();
                let r = self.fresh();
                self.line(&scf_if_header(&r, &c, &types));
                for (which, region) in [then_region, else_region].into_iter().enumerate() {
                    if which == 1 {
                        self.line("} else {");
                    }
                    self.nested_region(region, &types);
                }
                self.line("}");
                self.bind_results(op, &r);
                return;
            }
            OpKind::Yield { .. } => unreachable!("handled by region_ops"),
        };
        self.values.insert(op.results[0], value);
    }

    /// Emits a region's ops one level deeper, ending with `scf.yield` of its values
    /// (of `types`) when it yields any.
    fn nested_region(&mut self, region: &Region, types: &[String]) {
        self.w.indent += 1;
        let yielded = self.region_ops(region);
        if !yielded.is_empty() {
            self.line(&format!(
                "scf.yield {} : {}",
                yielded.join(", "),
                types.join(", ")
            ));
        }
        self.w.indent -= 1;
    }

    /// Names `op`'s results `{r}#i`.
    fn bind_results(&mut self, op: &Op, r: &str) {
        for (i, &res) in op.results.iter().enumerate() {
            self.values.insert(res, format!("{r}#{i}"));
        }
    }

    fn select(&mut self, c: &str, a: &str, b: &str, t: &TensorType) -> String {
        if t.is_scalar() {
            self.def(&format!("arith.select {c}, {a}, {b} : {}", tty(t)))
        } else {
            self.def(&format!(
                "arith.select {c}, {a}, {b} : {}, {}",
                vty(DType::Bool, &t.shape),
                tty(t)
            ))
        }
    }

    fn cast(&mut self, x: &str, from: &TensorType, to: DType) -> String {
        if from.dtype == to {
            return x.to_string();
        }
        let (ft, tt) = (tty(from), vty(to, &from.shape));
        let width = |d: DType| match d {
            DType::F32 => 32,
            _ => 16,
        };
        match (from.dtype, to) {
            (f, t) if f.is_float() && t.is_float() && width(f) == width(t) => {
                let wide = self.cast(x, from, DType::F32);
                self.cast(&wide, &from.with_dtype(DType::F32), to)
            }
            (f, t) if f.is_float() && t.is_float() && width(f) < width(t) => {
                self.def(&format!("arith.extf {x} : {ft} to {tt}"))
            }
            (f, t) if f.is_float() && t.is_float() => {
                self.def(&format!("arith.truncf {x} : {ft} to {tt}"))
            }
            (f, DType::I32) if f.is_float() => {
                self.def(&format!("arith.fptosi {x} : {ft} to {tt}"))
            }
            (DType::I32, t) if t.is_float() => {
                self.def(&format!("arith.sitofp {x} : {ft} to {tt}"))
            }
            (DType::Bool, DType::I32) => self.def(&format!("arith.extui {x} : {ft} to {tt}")),
            (DType::Bool, t) => {
                let i = self.def(&format!(
                    "arith.extui {x} : {ft} to {}",
                    vty(DType::I32, &from.shape)
                ));
                self.cast(&i, &from.with_dtype(DType::I32), t)
            }
            (f, _) => {
                let zero = self.constant(f, &from.shape, 0.0);
                if f.is_float() {
                    self.def(&format!("arith.cmpf une, {x}, {zero} : {ft}"))
                } else {
                    self.def(&format!("arith.cmpi ne, {x}, {zero} : {ft}"))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        assert_eq!(super::base64(b""), "");
        assert_eq!(super::base64(b"f"), "Zg==");
        assert_eq!(super::base64(b"fo"), "Zm8=");
        assert_eq!(super::base64(b"foo"), "Zm9v");
        assert_eq!(super::base64(b"foobar"), "Zm9vYmFy");
    }
}
