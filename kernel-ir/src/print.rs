//! The text form. Values are renumbered `%0, %1, ...` in textual order, so printing a
//! parsed kernel gives back the same text.
//!
//! ```text
//! kernel @add_one grid [2] semantics [parallel] {
//!   in %x : f32[16, 128] block [8, 128] map (i0) -> (i0, 0) vmem
//!   out %o : f32[16, 128] block [8, 128] map (i0) -> (i0, 0) vmem
//!   body {
//!     %0 = load %x[:, :] : f32[8, 128]
//!     %1 = const 1.0 : f32[8, 128]
//!     %2 = add %0, %1 : f32[8, 128]
//!     store %o[:, :], %2
//!   }
//! }
//! ```

use std::collections::HashMap;
use std::fmt::Write;

use crate::ir::{BlockDim, Index, IndexExpr, Kernel, Literal, Op, OpKind, Region, Start, Value};

/// Assigns printed numbers to values in textual order.
#[derive(Debug)]
pub struct Namer {
    numbers: HashMap<Value, usize>,
}

impl Namer {
    /// Numbers every value of `kernel`.
    pub fn new(kernel: &Kernel) -> Self {
        let mut namer = Namer {
            numbers: HashMap::new(),
        };
        namer.region(&kernel.body);
        namer
    }

    fn assign(&mut self, v: Value) {
        let n = self.numbers.len();
        self.numbers.entry(v).or_insert(n);
    }

    fn region(&mut self, region: &Region) {
        for &a in &region.args {
            self.assign(a);
        }
        for op in &region.ops {
            for &r in &op.results {
                self.assign(r);
            }
            match &op.kind {
                OpKind::For { body, .. } => self.region(body),
                OpKind::If {
                    then_region,
                    else_region,
                    ..
                } => {
                    self.region(then_region);
                    self.region(else_region);
                }
                _ => {}
            }
        }
    }

    /// The printed name of a value (`%7`); values not in the kernel print as `%?N`.
    pub fn name(&self, v: Value) -> String {
        match self.numbers.get(&v) {
            Some(n) => format!("%{n}"),
            None => format!("%?{}", v.0),
        }
    }

    /// The first line of an op as printed (without its regions), for messages.
    pub fn op_header(&self, kernel: &Kernel, op: &Op) -> String {
        op_line(kernel, self, op)
    }
}

/// Prints a kernel in the text form.
pub fn print_kernel(kernel: &Kernel) -> String {
    let namer = Namer::new(kernel);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "kernel @{} grid {} semantics [{}] {{",
        kernel.name,
        list(&kernel.grid),
        kernel
            .dimension_semantics
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    for r in &kernel.refs {
        let _ = write!(out, "  {} %{} : {}", r.kind.keyword(), r.name, r.ty);
        match &r.block {
            Some(spec) => {
                let dims: Vec<String> = spec
                    .block_shape
                    .iter()
                    .map(|d| match d {
                        BlockDim::Size(n) => n.to_string(),
                        BlockDim::Squeezed => "None".into(),
                    })
                    .collect();
                let params: Vec<String> = (0..kernel.grid.len()).map(|i| format!("i{i}")).collect();
                let exprs: Vec<String> = spec
                    .index_map
                    .exprs
                    .iter()
                    .map(|e| index_expr(kernel, e, true))
                    .collect();
                let _ = writeln!(
                    out,
                    " block [{}] map ({}) -> ({}) {}",
                    dims.join(", "),
                    params.join(", "),
                    exprs.join(", "),
                    spec.memory_space.name()
                );
            }
            None => {
                let _ = writeln!(out, " {}", r.memory_space.name());
            }
        }
    }
    out.push_str("  body {\n");
    print_ops(&mut out, kernel, &namer, &kernel.body, 2);
    out.push_str("  }\n}\n");
    out
}

fn list<T: ToString>(items: &[T]) -> String {
    format!(
        "[{}]",
        items
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn index_expr(kernel: &Kernel, e: &IndexExpr, top: bool) -> String {
    let index_expr = |e, top| index_expr(kernel, e, top);
    match e {
        IndexExpr::ProgramId(axis) => format!("i{axis}"),
        IndexExpr::Scalar(r, index) => {
            let name = kernel
                .refs
                .get(r.0 as usize)
                .map_or_else(|| format!("?{}", r.0), |d| d.name.clone());
            let index: Vec<String> = index.iter().map(|e| index_expr(e, true)).collect();
            format!("%{name}[{}]", index.join(", "))
        }
        IndexExpr::Const(c) if *c < 0 && !top => format!("({c})"),
        IndexExpr::Const(c) => c.to_string(),
        IndexExpr::Bin(op, a, b) => {
            use crate::ir::IndexBinOp::{Max, Min};
            match op {
                Min | Max => format!(
                    "{}({}, {})",
                    op.name(),
                    index_expr(a, true),
                    index_expr(b, true)
                ),
                _ => {
                    let s = format!(
                        "{} {} {}",
                        index_expr(a, false),
                        op.name(),
                        index_expr(b, false)
                    );
                    if top {
                        s
                    } else {
                        format!("({s})")
                    }
                }
            }
        }
    }
}

fn print_ops(out: &mut String, kernel: &Kernel, namer: &Namer, region: &Region, depth: usize) {
    let pad = "  ".repeat(depth);
    for op in &region.ops {
        let _ = write!(out, "{pad}{}", op_line(kernel, namer, op));
        match &op.kind {
            OpKind::For { body, .. } => {
                out.push_str(" {\n");
                print_ops(out, kernel, namer, body, depth + 1);
                let _ = write!(out, "{pad}}}");
            }
            OpKind::If {
                then_region,
                else_region,
                ..
            } => {
                out.push_str(" {\n");
                print_ops(out, kernel, namer, then_region, depth + 1);
                let _ = writeln!(out, "{pad}}} else {{");
                print_ops(out, kernel, namer, else_region, depth + 1);
                let _ = write!(out, "{pad}}}");
            }
            _ => {}
        }
        out.push('\n');
    }
}

fn literal(l: &Literal) -> String {
    match l {
        Literal::Float(f) if f.is_nan() => "nan".into(),
        Literal::Float(f) if f.is_infinite() => if *f > 0.0 { "inf" } else { "-inf" }.into(),
        Literal::Float(f) => format!("{f:?}"),
        Literal::Int(i) => i.to_string(),
        Literal::Bool(b) => b.to_string(),
    }
}

fn op_line(kernel: &Kernel, namer: &Namer, op: &Op) -> String {
    let n = |v: &Value| namer.name(*v);
    let ty = |v: &Value| kernel.type_of(*v).to_string();
    let ref_name = |r: &crate::ir::RefId| {
        kernel
            .refs
            .get(r.0 as usize)
            .map_or_else(|| format!("%?ref{}", r.0), |d| format!("%{}", d.name))
    };
    let index = |ix: &[Index]| {
        let parts: Vec<String> = ix
            .iter()
            .map(|i| match i {
                Index::Full => ":".into(),
                Index::At(v) => n(v),
                Index::Slice { start, size } => match start {
                    Start::Static(s) => format!("ds({s}, {size})"),
                    Start::Dynamic(v) => format!("ds({}, {size})", n(v)),
                },
            })
            .collect();
        format!("[{}]", parts.join(", "))
    };
    let results = op.results.iter().map(n).collect::<Vec<_>>().join(", ");
    let lhs = if op.results.is_empty() {
        String::new()
    } else {
        format!("{results} = ")
    };
    let result_ty = op.results.first().map(ty).unwrap_or_default();
    let m = op.kind.mnemonic();
    let body = match &op.kind {
        OpKind::ProgramId { axis } | OpKind::NumPrograms { axis } => {
            format!("{m} {axis} : {result_ty}")
        }
        OpKind::Constant { value } => format!("{m} {} : {result_ty}", literal(value)),
        OpKind::Iota { dim } => format!("{m} {dim} : {result_ty}"),
        OpKind::Load {
            src,
            index: ix,
            mask,
            other,
        } => {
            let mut s = format!("{m} {}{}", ref_name(src), index(ix));
            if let Some(v) = mask {
                let _ = write!(s, " mask {}", n(v));
            }
            if let Some(v) = other {
                let _ = write!(s, " other {}", n(v));
            }
            format!("{s} : {result_ty}")
        }
        OpKind::Store {
            dst,
            index: ix,
            value,
            mask,
        } => {
            let mut s = format!("{m} {}{}, {}", ref_name(dst), index(ix), n(value));
            if let Some(v) = mask {
                let _ = write!(s, " mask {}", n(v));
            }
            s
        }
        OpKind::Broadcast { x, dims } => format!("{m} {} dims {} : {result_ty}", n(x), list(dims)),
        OpKind::Transpose { x, perm } => format!("{m} {} perm {} : {result_ty}", n(x), list(perm)),
        OpKind::Gather { x, indices, axis } => {
            format!("{m} {}, {} axis {axis} : {result_ty}", n(x), n(indices))
        }
        OpKind::Reshape { x } | OpKind::Unary { x, .. } | OpKind::Cast { x } => {
            format!("{m} {} : {result_ty}", n(x))
        }
        OpKind::Binary { lhs, rhs, .. } => format!("{m} {}, {} : {result_ty}", n(lhs), n(rhs)),
        OpKind::Compare { pred, lhs, rhs } => {
            format!("{m} {} {}, {} : {result_ty}", pred.name(), n(lhs), n(rhs))
        }
        OpKind::Select {
            cond,
            on_true,
            on_false,
        } => format!(
            "{m} {}, {}, {} : {result_ty}",
            n(cond),
            n(on_true),
            n(on_false)
        ),
        OpKind::Reduce { x, axes, .. } => format!("{m} {} axes {} : {result_ty}", n(x), list(axes)),
        OpKind::Dot {
            lhs,
            rhs,
            transpose_lhs,
            transpose_rhs,
        } => {
            let mut s = format!("{m} {}, {}", n(lhs), n(rhs));
            if *transpose_lhs {
                s.push_str(" transpose_lhs");
            }
            if *transpose_rhs {
                s.push_str(" transpose_rhs");
            }
            format!("{s} : {result_ty}")
        }
        OpKind::DebugPrint { message, values } => {
            let vs: Vec<String> = values.iter().map(n).collect();
            format!("{m} {} [{}]", crate::parse::quote(message), vs.join(", "))
        }
        OpKind::Check {
            cond,
            message,
            values,
            ..
        } => {
            let vs: Vec<String> = values.iter().map(n).collect();
            let quoted = crate::parse::quote(message);
            format!("{m} {}, {quoted} [{}]", n(cond), vs.join(", "))
        }
        OpKind::For {
            lower,
            upper,
            step,
            inits,
            body,
        } => {
            let iv = body.args.first().map(n).unwrap_or_else(|| "%?iv".into());
            let mut s = format!("{m} {iv} = {} to {} step {}", n(lower), n(upper), n(step));
            if !inits.is_empty() {
                let pairs: Vec<String> = body
                    .args
                    .iter()
                    .skip(1)
                    .zip(inits)
                    .map(|(a, i)| format!("{} = {}", n(a), n(i)))
                    .collect();
                let types: Vec<String> = inits.iter().map(ty).collect();
                let _ = write!(s, " iter({}) : {}", pairs.join(", "), types.join(", "));
            }
            s
        }
        OpKind::If { cond, .. } => {
            let types: Vec<String> = op.results.iter().map(ty).collect();
            if types.is_empty() {
                format!("{m} {}", n(cond))
            } else {
                format!("{m} {} : {}", n(cond), types.join(", "))
            }
        }
        OpKind::Yield { values } => {
            let vals: Vec<String> = values.iter().map(n).collect();
            if vals.is_empty() {
                m.to_string()
            } else {
                format!("{m} {}", vals.join(", "))
            }
        }
    };
    format!("{lhs}{body}")
}
