//! Kernel IR -> a StableHLO module (MLIR text, generic op form) that computes the same
//! outputs over whole arrays: the XLA fallback path.
//!
//! * Every input and output array is padded up to a whole number of blocks, so every
//!   block window is in bounds and `dynamic_slice` never clamps; outputs are sliced back
//!   at the end. Masked-off lanes read `other` (a `select` after the load) and are left
//!   untouched by stores (a read-`select`-write).
//! * The grid becomes a `stablehlo.while` over the flat program index in row-major order
//!   (a valid schedule for parallel and arbitrary axes alike); program ids are its
//!   div/mod by the grid strides.
//! * Refs are values: outputs and scratch buffers are threaded through the grid loop
//!   and through every `for` (another `while`) and `if`, and a store produces a new
//!   version of its array (`dynamic_update_slice`).
//! * bf16/f16 reductions and dots compute in f32, as the interpreter does.

use std::collections::HashMap;

use crate::hlo::{i64_array, tensor as tty, tensor_type as ty_of, HloBuilder};
use kernel_ir::{
    BinaryOp, BlockDim, CmpPred, DType, Index, IndexBinOp, IndexExpr, Kernel, Literal, Op, OpKind,
    ReduceOp, RefKind, Region, Start, TensorType, UnaryOp, Value,
};

/// Lowers a verified kernel to a StableHLO module whose `main` takes the inputs and
/// returns the outputs.
pub fn lower(kernel: &Kernel) -> String {
    let mut e = Emitter::new(kernel);
    e.module()
}

/// Where one array dimension of a load/store window starts and how long it is.
struct DimWindow {
    start: String,
    count: u64,
}

struct Emitter<'k> {
    k: &'k Kernel,
    b: HloBuilder,
    values: HashMap<Value, String>,
    /// Current version of each ref's (padded) array, by ref index; inputs never change.
    arrays: Vec<String>,
    /// Padded shape of each ref's array.
    padded: Vec<Vec<u64>>,
    /// Program ids of the current program.
    pids: Vec<String>,
    /// Block start (element offset) per array dim of each I/O ref, in the current program.
    starts: Vec<Vec<String>>,
}

impl<'k> Emitter<'k> {
    fn new(k: &'k Kernel) -> Self {
        let padded = k.refs.iter().map(|r| r.padded_shape()).collect();
        Emitter {
            k,
            b: HloBuilder::default(),
            values: HashMap::new(),
            arrays: vec![String::new(); k.refs.len()],
            padded,
            pids: Vec::new(),
            starts: Vec::new(),
        }
    }

    fn fresh(&mut self) -> String {
        self.b.fresh()
    }

    fn line(&mut self, s: &str) {
        self.b.line(s)
    }

    fn op(&mut self, name: &str, operands: &[(&str, &str)], attrs: &str, result: &str) -> String {
        self.b.op(name, operands, attrs, result)
    }

    fn constant(&mut self, dtype: DType, shape: &[u64], value: f64) -> String {
        self.b.constant(dtype, shape, value)
    }

    fn index_const(&mut self, v: i64) -> String {
        self.constant(DType::I32, &[], v as f64)
    }

    fn binary_raw(&mut self, name: &str, a: &str, b: &str, t: &str) -> String {
        self.b.binary(name, a, b, t)
    }

    fn compare(&mut self, dir: &str, a: &str, b: &str, dtype: DType, shape: &[u64]) -> String {
        self.b.compare(dir, a, b, dtype, shape)
    }

    /// Integer division and remainder rounded toward negative infinity.
    fn floor_div_rem(&mut self, a: &str, b: &str, shape: &[u64], want_rem: bool) -> String {
        let t = ty_of(DType::I32, shape);
        let q = self.binary_raw("divide", a, b, &t);
        let r = self.binary_raw("remainder", a, b, &t);
        let zero = self.constant(DType::I32, shape, 0.0);
        let r_neg = self.compare("LT", &r, &zero, DType::I32, shape);
        let b_neg = self.compare("LT", b, &zero, DType::I32, shape);
        let signs_differ = self.compare("NE", &r_neg, &b_neg, DType::Bool, shape);
        let nonzero = self.compare("NE", &r, &zero, DType::I32, shape);
        let bt = ty_of(DType::Bool, shape);
        let adjust = self.binary_raw("and", &nonzero, &signs_differ, &bt);
        let (fixed, plain) = if want_rem {
            (self.binary_raw("add", &r, b, &t), r)
        } else {
            let one = self.constant(DType::I32, shape, 1.0);
            (self.binary_raw("subtract", &q, &one, &t), q)
        };
        self.op(
            "select",
            &[(&adjust, &bt), (&fixed, &t), (&plain, &t)],
            "",
            &t,
        )
    }

    fn convert(&mut self, x: &str, from: &TensorType, to: DType) -> String {
        self.b.convert(x, &tty(from), &ty_of(to, &from.shape))
    }

    fn reshape(&mut self, x: &str, dtype: DType, from: &[u64], to: &[u64]) -> String {
        if from == to {
            return x.to_string();
        }
        self.op(
            "reshape",
            &[(x, &ty_of(dtype, from))],
            "",
            &ty_of(dtype, to),
        )
    }

    fn index_expr(&mut self, e: &IndexExpr) -> String {
        match e {
            IndexExpr::ProgramId(axis) => self.pids[*axis].clone(),
            IndexExpr::Const(c) => self.index_const(*c),
            IndexExpr::Bin(op, a, b) => {
                let (a, b) = (self.index_expr(a), self.index_expr(b));
                let t = ty_of(DType::I32, &[]);
                match op {
                    IndexBinOp::Add => self.binary_raw("add", &a, &b, &t),
                    IndexBinOp::Sub => self.binary_raw("subtract", &a, &b, &t),
                    IndexBinOp::Mul => self.binary_raw("multiply", &a, &b, &t),
                    IndexBinOp::Min => self.binary_raw("minimum", &a, &b, &t),
                    IndexBinOp::Max => self.binary_raw("maximum", &a, &b, &t),
                    IndexBinOp::FloorDiv => self.floor_div_rem(&a, &b, &[], false),
                    IndexBinOp::Rem => self.floor_div_rem(&a, &b, &[], true),
                }
            }
        }
    }

    /// Writable refs (outputs, scratch), whose arrays are threaded through control flow.
    fn writable(&self) -> Vec<usize> {
        (0..self.k.refs.len())
            .filter(|&i| self.k.refs[i].kind != RefKind::Input)
            .collect()
    }

    fn writable_types(&self) -> Vec<String> {
        self.writable()
            .into_iter()
            .map(|i| ty_of(self.k.refs[i].ty.dtype, &self.padded[i]))
            .collect()
    }

    fn module(&mut self) -> String {
        let k = self.k;
        let mut params = Vec::new();
        for (i, r) in k.refs.iter().enumerate() {
            if r.kind == RefKind::Input {
                params.push(format!("%arg{i}: {}", tty(&r.ty)));
            }
        }
        let results: Vec<String> = k.output_types().iter().map(tty).collect();
        // Pad inputs; start outputs and scratch at zero.
        for (i, r) in k.refs.iter().enumerate() {
            let padded = self.padded[i].clone();
            self.arrays[i] = if r.kind == RefKind::Input {
                let arg = format!("%arg{i}");
                if padded == r.ty.shape {
                    arg
                } else {
                    let zero = self.constant(r.ty.dtype, &[], 0.0);
                    let high = padded.iter().zip(&r.ty.shape).map(|(p, n)| p - n);
                    let attrs = format!(
                        "edge_padding_low = {}, edge_padding_high = {}, interior_padding = {}",
                        i64_array(padded.iter().map(|_| 0)),
                        i64_array(high),
                        i64_array(padded.iter().map(|_| 0))
                    );
                    self.op(
                        "pad",
                        &[(&arg, &tty(&r.ty)), (&zero, &ty_of(r.ty.dtype, &[]))],
                        &attrs,
                        &ty_of(r.ty.dtype, &padded),
                    )
                }
            } else {
                self.constant(r.ty.dtype, &padded, 0.0)
            };
        }
        self.grid_loop();
        let mut returned = Vec::new();
        for (i, r) in k.refs.iter().enumerate() {
            if r.kind != RefKind::Output {
                continue;
            }
            let a = self.arrays[i].clone();
            let v = if self.padded[i] == r.ty.shape {
                a
            } else {
                let attrs = format!(
                    "start_indices = {}, limit_indices = {}, strides = {}",
                    i64_array(r.ty.shape.iter().map(|_| 0)),
                    i64_array(r.ty.shape.iter().copied()),
                    i64_array(r.ty.shape.iter().map(|_| 1))
                );
                self.op(
                    "slice",
                    &[(&a, &ty_of(r.ty.dtype, &self.padded[i]))],
                    &attrs,
                    &tty(&r.ty),
                )
            };
            returned.push(v);
        }
        let results: Vec<(String, String)> = returned.into_iter().zip(results).collect();
        std::mem::take(&mut self.b).module(&k.name, &params, &results)
    }

    /// Runs the body once per program: inline for a single program, else a `while` over
    /// the flat program index carrying the writable arrays.
    fn grid_loop(&mut self) {
        let total = self.k.num_programs();
        if total == 1 {
            self.pids = (0..self.k.grid.len())
                .map(|_| self.index_const(0))
                .collect();
            self.program_body();
            return;
        }
        let writable = self.writable();
        let types = self.writable_types();
        let i32t = ty_of(DType::I32, &[]);
        let zero = self.index_const(0);
        let limit = self.index_const(total as i64);
        let one = self.index_const(1);
        let mut inits = vec![zero];
        inits.extend(writable.iter().map(|&i| self.arrays[i].clone()));
        let mut all_types = vec![i32t.clone()];
        all_types.extend(types.iter().cloned());
        let results = self.while_loop(&inits, &all_types, &limit, |e, args| {
            for (slot, &i) in writable.iter().enumerate() {
                e.arrays[i] = args[slot + 1].clone();
            }
            let p = args[0].clone();
            let grid = e.k.grid.clone();
            let mut stride: u64 = grid.iter().product();
            e.pids = grid
                .iter()
                .map(|&g| {
                    stride /= g;
                    let s = e.index_const(stride as i64);
                    let q = e.binary_raw("divide", &p, &s, &i32t);
                    let gg = e.index_const(g as i64);
                    e.binary_raw("remainder", &q, &gg, &i32t)
                })
                .collect();
            e.program_body();
            let next = e.binary_raw("add", &p, &one, &i32t);
            let mut yields = vec![next];
            yields.extend(writable.iter().map(|&i| e.arrays[i].clone()));
            yields
        });
        for (slot, &i) in writable.iter().enumerate() {
            self.arrays[i] = results[slot + 1].clone();
        }
    }

    /// Emits a block header `^bb0(%a: t, ...)` with fresh arguments of `types`.
    fn block_header(&mut self, types: &[String]) -> Vec<String> {
        let args: Vec<String> = types.iter().map(|_| self.fresh()).collect();
        let decl: Vec<String> = args
            .iter()
            .zip(types)
            .map(|(a, t)| format!("{a}: {t}"))
            .collect();
        self.line(&format!("^bb0({}):", decl.join(", ")));
        args
    }

    /// A `stablehlo.while` whose first carried value is an i32 counter running while it is
    /// below `limit`. `body` gets the region arguments and returns the next values.
    fn while_loop(
        &mut self,
        inits: &[String],
        types: &[String],
        limit: &str,
        body: impl FnOnce(&mut Self, &[String]) -> Vec<String>,
    ) -> Vec<String> {
        let r = self.fresh();
        let n = inits.len();
        let sig = types.join(", ");
        self.line(&format!(
            "{r}:{n} = \"stablehlo.while\"({}) ({{",
            inits.join(", ")
        ));
        let cond_args = self.block_header(types);
        self.b.w.indent += 1;
        let c = self.compare("LT", &cond_args[0], limit, DType::I32, &[]);
        self.line(&format!("\"stablehlo.return\"({c}) : (tensor<i1>) -> ()"));
        self.b.w.indent -= 1;
        self.line("}, {");
        let body_args = self.block_header(types);
        self.b.w.indent += 1;
        let next = body(self, &body_args);
        self.line(&format!(
            "\"stablehlo.return\"({}) : ({sig}) -> ()",
            next.join(", ")
        ));
        self.b.w.indent -= 1;
        self.line(&format!("}}) : ({sig}) -> ({sig})"));
        (0..n).map(|i| format!("{r}#{i}")).collect()
    }

    fn program_body(&mut self) {
        let k = self.k;
        self.starts = k
            .refs
            .iter()
            .map(|r| match r.block_start() {
                Some(exprs) => exprs.iter().map(|e| self.index_expr(e)).collect(),
                None => Vec::new(),
            })
            .collect();
        self.region_ops(&k.body);
    }

    fn v(&self, v: Value) -> String {
        self.values[&v].clone()
    }

    fn vt(&self, v: Value) -> String {
        tty(self.k.type_of(v))
    }

    /// Lowers a region's ops; returns the values of its `yield` (empty for the body).
    fn region_ops(&mut self, region: &Region) -> Vec<String> {
        for op in &region.ops {
            if let OpKind::Yield { values } = &op.kind {
                return values.iter().map(|&v| self.v(v)).collect();
            }
            self.lower_op(op);
        }
        Vec::new()
    }

    fn window(&mut self, r: usize, index: &[Index]) -> Vec<DimWindow> {
        let decl = &self.k.refs[r];
        let block_dims = decl.block_dims();
        let i32t = ty_of(DType::I32, &[]);
        let mut kernel_dim = 0;
        let mut out = Vec::new();
        for (dim, bd) in block_dims.iter().enumerate() {
            let base = match self.starts[r].get(dim) {
                Some(s) => s.clone(),
                None => self.index_const(0),
            };
            let BlockDim::Size(extent) = *bd else {
                out.push(DimWindow {
                    start: base,
                    count: 1,
                });
                continue;
            };
            let (offset, count) = match index[kernel_dim] {
                Index::Full => (None, extent),
                Index::At(v) => (Some(self.v(v)), 1),
                Index::Slice {
                    start: Start::Static(s),
                    size,
                } => (Some(self.index_const(s as i64)), size),
                Index::Slice {
                    start: Start::Dynamic(v),
                    size,
                } => (Some(self.v(v)), size),
            };
            kernel_dim += 1;
            let start = match offset {
                Some(o) => self.binary_raw("add", &base, &o, &i32t),
                None => base,
            };
            out.push(DimWindow { start, count });
        }
        out
    }

    /// The current contents of a window of ref `r`'s (padded) array.
    fn read_window(&mut self, r: usize, dims: &[DimWindow]) -> String {
        let dtype = self.k.refs[r].ty.dtype;
        let full: Vec<u64> = dims.iter().map(|d| d.count).collect();
        let mut operands = vec![(self.arrays[r].clone(), ty_of(dtype, &self.padded[r]))];
        operands.extend(
            dims.iter()
                .map(|d| (d.start.clone(), ty_of(DType::I32, &[]))),
        );
        let refs: Vec<(&str, &str)> = operands
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let attrs = format!("slice_sizes = {}", i64_array(full.iter().copied()));
        self.op("dynamic_slice", &refs, &attrs, &ty_of(dtype, &full))
    }

    /// Element-wise `cond ? a : b` on values of type `t`.
    fn select(&mut self, cond: &str, a: &str, b: &str, t: &TensorType) -> String {
        let operands = [
            (cond, ty_of(DType::Bool, &t.shape)),
            (a, tty(t)),
            (b, tty(t)),
        ];
        let refs: Vec<(&str, &str)> = operands.iter().map(|(n, ty)| (*n, ty.as_str())).collect();
        self.op("select", &refs, "", &tty(t))
    }

    fn lower_op(&mut self, op: &Op) {
        let k = self.k;
        let result_ty = |i: usize| k.type_of(op.results[i]).clone();
        let value = match &op.kind {
            OpKind::ProgramId { axis } => self.pids[*axis].clone(),
            OpKind::NumPrograms { axis } => self.index_const(k.grid[*axis] as i64),
            OpKind::Constant { value } => {
                let t = result_ty(0);
                let v = match value {
                    Literal::Float(f) => *f,
                    Literal::Int(i) => *i as f64,
                    Literal::Bool(b) => f64::from(u8::from(*b)),
                };
                self.constant(t.dtype, &t.shape, v)
            }
            OpKind::Iota { dim } => {
                let t = result_ty(0);
                self.op(
                    "iota",
                    &[],
                    &format!("iota_dimension = {dim} : i64"),
                    &tty(&t),
                )
            }
            OpKind::Load {
                src,
                index,
                mask,
                other,
            } => {
                let r = src.0 as usize;
                let t = result_ty(0);
                let dims = self.window(r, index);
                let dtype = k.refs[r].ty.dtype;
                let full: Vec<u64> = dims.iter().map(|d| d.count).collect();
                let sliced = self.read_window(r, &dims);
                let loaded = self.reshape(&sliced, dtype, &full, &t.shape);
                match mask {
                    None => loaded,
                    Some(m) => {
                        let fill = match other {
                            Some(o) => {
                                let o = self.v(*o);
                                self.b.broadcast(&o, &ty_of(dtype, &[]), &[], &tty(&t))
                            }
                            None => self.constant(dtype, &t.shape, 0.0),
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
                let dims = self.window(r, index);
                let vt = k.type_of(*value).clone();
                let window =
                    TensorType::new(vt.dtype, dims.iter().map(|d| d.count).collect::<Vec<_>>());
                let mut new = self.reshape(&self.v(*value), vt.dtype, &vt.shape, &window.shape);
                if let Some(m) = mask {
                    let old = self.read_window(r, &dims);
                    let m = self.reshape(&self.v(*m), DType::Bool, &vt.shape, &window.shape);
                    new = self.select(&m, &new, &old, &window);
                }
                let array_t = ty_of(vt.dtype, &self.padded[r]);
                let mut operands = vec![
                    (self.arrays[r].clone(), array_t.clone()),
                    (new, tty(&window)),
                ];
                operands.extend(
                    dims.iter()
                        .map(|d| (d.start.clone(), ty_of(DType::I32, &[]))),
                );
                let refs: Vec<(&str, &str)> = operands
                    .iter()
                    .map(|(a, b)| (a.as_str(), b.as_str()))
                    .collect();
                self.arrays[r] = self.op("dynamic_update_slice", &refs, "", &array_t);
                return;
            }
            OpKind::Broadcast { x, dims } => {
                let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
                let (xv, xt) = (self.v(*x), self.vt(*x));
                self.b.broadcast(&xv, &xt, &dims, &tty(&result_ty(0)))
            }
            OpKind::Reshape { x } => self.op(
                "reshape",
                &[(&self.v(*x), &self.vt(*x))],
                "",
                &tty(&result_ty(0)),
            ),
            OpKind::Transpose { x, perm } => {
                let attrs = format!(
                    "permutation = {}",
                    i64_array(perm.iter().map(|&d| d as u64))
                );
                self.op(
                    "transpose",
                    &[(&self.v(*x), &self.vt(*x))],
                    &attrs,
                    &tty(&result_ty(0)),
                )
            }
            OpKind::Unary { op: u, x } => {
                let name = match u {
                    UnaryOp::Neg => "negate",
                    UnaryOp::Abs => "abs",
                    UnaryOp::Exp => "exponential",
                    UnaryOp::Log => "log",
                    UnaryOp::Tanh => "tanh",
                    UnaryOp::Rsqrt => "rsqrt",
                    UnaryOp::Sqrt => "sqrt",
                    UnaryOp::Erf => "chlo.erf",
                    UnaryOp::Not => "not",
                };
                self.op(name, &[(&self.v(*x), &self.vt(*x))], "", &self.vt(*x))
            }
            OpKind::Binary { op: b, lhs, rhs } => {
                let t = k.type_of(*lhs).clone();
                let (a, c) = (self.v(*lhs), self.v(*rhs));
                match (b, t.dtype) {
                    (BinaryOp::Div, DType::I32) => self.floor_div_rem(&a, &c, &t.shape, false),
                    (BinaryOp::Rem, DType::I32) => self.floor_div_rem(&a, &c, &t.shape, true),
                    (BinaryOp::Rem, _) => {
                        // a - b * floor(a / b), as the interpreter computes it.
                        let tt = tty(&t);
                        let q = self.binary_raw("divide", &a, &c, &tt);
                        let f = self.op("floor", &[(&q, &tt)], "", &tt);
                        let p = self.binary_raw("multiply", &c, &f, &tt);
                        self.binary_raw("subtract", &a, &p, &tt)
                    }
                    _ => {
                        let name = match b {
                            BinaryOp::Add => "add",
                            BinaryOp::Sub => "subtract",
                            BinaryOp::Mul => "multiply",
                            BinaryOp::Div => "divide",
                            BinaryOp::Max => "maximum",
                            BinaryOp::Min => "minimum",
                            BinaryOp::Pow => "power",
                            BinaryOp::And => "and",
                            BinaryOp::Or => "or",
                            BinaryOp::Rem => unreachable!("handled above"),
                        };
                        self.binary_raw(name, &a, &c, &tty(&t))
                    }
                }
            }
            OpKind::Compare { pred, lhs, rhs } => {
                let t = k.type_of(*lhs).clone();
                let dir = match pred {
                    CmpPred::Eq => "EQ",
                    CmpPred::Ne => "NE",
                    CmpPred::Lt => "LT",
                    CmpPred::Le => "LE",
                    CmpPred::Gt => "GT",
                    CmpPred::Ge => "GE",
                };
                self.compare(dir, &self.v(*lhs), &self.v(*rhs), t.dtype, &t.shape)
            }
            OpKind::Select {
                cond,
                on_true,
                on_false,
            } => {
                let (c, a, b) = (self.v(*cond), self.v(*on_true), self.v(*on_false));
                self.select(&c, &a, &b, &k.type_of(*on_true).clone())
            }
            OpKind::Cast { x } => {
                let from = k.type_of(*x).clone();
                self.convert(&self.v(*x), &from, result_ty(0).dtype)
            }
            OpKind::Reduce { op: r, x, axes } => {
                let xt = k.type_of(*x).clone();
                let acc = if xt.dtype.is_float() {
                    DType::F32
                } else {
                    xt.dtype
                };
                let input = self.convert(&self.v(*x), &xt, acc);
                let init_value = match (r, acc) {
                    (ReduceOp::Sum, _) => 0.0,
                    (ReduceOp::Max, DType::I32) => f64::from(i32::MIN),
                    (ReduceOp::Min, DType::I32) => f64::from(i32::MAX),
                    (ReduceOp::Max, _) => f64::NEG_INFINITY,
                    (ReduceOp::Min, _) => f64::INFINITY,
                };
                let out_t = result_ty(0);
                let combine = match r {
                    ReduceOp::Sum => "add",
                    ReduceOp::Max => "maximum",
                    ReduceOp::Min => "minimum",
                };
                let res = self.b.reduce(
                    combine,
                    &input,
                    &TensorType::new(acc, xt.shape.clone()),
                    init_value,
                    &axes.iter().map(|&a| a as u64).collect::<Vec<_>>(),
                );
                self.convert(
                    &res,
                    &TensorType::new(acc, out_t.shape.clone()),
                    out_t.dtype,
                )
            }
            OpKind::Dot {
                lhs,
                rhs,
                transpose_lhs,
                transpose_rhs,
            } => {
                let (lt, rt) = (k.type_of(*lhs).clone(), k.type_of(*rhs).clone());
                let acc = if lt.dtype.is_float() {
                    DType::F32
                } else {
                    DType::I32
                };
                let a = self.convert(&self.v(*lhs), &lt, acc);
                let b = self.convert(&self.v(*rhs), &rt, acc);
                let attrs = format!(
                    "dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [{}], rhs_contracting_dimensions = [{}]>",
                    if *transpose_lhs { 0 } else { 1 },
                    if *transpose_rhs { 1 } else { 0 }
                );
                self.op(
                    "dot_general",
                    &[(&a, &ty_of(acc, &lt.shape)), (&b, &ty_of(acc, &rt.shape))],
                    &attrs,
                    &tty(&result_ty(0)),
                )
            }
            OpKind::For {
                lower,
                upper,
                step,
                inits,
                body,
            } => {
                let writable = self.writable();
                let mut init_names = vec![self.v(*lower)];
                init_names.extend(inits.iter().map(|&v| self.v(v)));
                init_names.extend(writable.iter().map(|&i| self.arrays[i].clone()));
                let mut types = vec![ty_of(DType::I32, &[])];
                types.extend(inits.iter().map(|&v| self.vt(v)));
                types.extend(self.writable_types());
                let (upper, step) = (self.v(*upper), self.v(*step));
                let carried = inits.len();
                let results = self.while_loop(&init_names, &types, &upper, |e, args| {
                    for (arg, &v) in args.iter().zip(&body.args) {
                        e.values.insert(v, arg.clone());
                    }
                    for (slot, &i) in writable.iter().enumerate() {
                        e.arrays[i] = args[1 + carried + slot].clone();
                    }
                    let yielded = e.region_ops(body);
                    let next = e.binary_raw("add", &args[0], &step, &ty_of(DType::I32, &[]));
                    let mut out = vec![next];
                    out.extend(yielded);
                    out.extend(writable.iter().map(|&i| e.arrays[i].clone()));
                    out
                });
                for (i, &r) in op.results.iter().enumerate() {
                    self.values.insert(r, results[1 + i].clone());
                }
                for (slot, &i) in writable.iter().enumerate() {
                    self.arrays[i] = results[1 + carried + slot].clone();
                }
                return;
            }
            OpKind::If {
                cond,
                then_region,
                else_region,
            } => {
                let writable = self.writable();
                let mut types: Vec<String> = op.results.iter().map(|&r| self.vt(r)).collect();
                types.extend(self.writable_types());
                let before: Vec<String> =
                    writable.iter().map(|&i| self.arrays[i].clone()).collect();
                let r = self.fresh();
                let n = types.len();
                self.line(&format!(
                    "{r}:{n} = \"stablehlo.if\"({}) ({{",
                    self.v(*cond)
                ));
                for (which, region) in [then_region, else_region].into_iter().enumerate() {
                    if which == 1 {
                        self.line("}, {");
                    }
                    self.b.w.indent += 1;
                    for (slot, &i) in writable.iter().enumerate() {
                        self.arrays[i] = before[slot].clone();
                    }
                    let mut out = self.region_ops(region);
                    out.extend(writable.iter().map(|&i| self.arrays[i].clone()));
                    self.line(&format!(
                        "\"stablehlo.return\"({}) : ({}) -> ()",
                        out.join(", "),
                        types.join(", ")
                    ));
                    self.b.w.indent -= 1;
                }
                self.line(&format!("}}) : (tensor<i1>) -> ({})", types.join(", ")));
                for (i, &res) in op.results.iter().enumerate() {
                    self.values.insert(res, format!("{r}#{i}"));
                }
                for (slot, &i) in writable.iter().enumerate() {
                    self.arrays[i] = format!("{r}#{}", op.results.len() + slot);
                }
                return;
            }
            OpKind::Yield { .. } => unreachable!("handled by region_ops"),
        };
        self.values.insert(op.results[0], value);
    }
}
