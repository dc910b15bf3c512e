//! Element-wise ops: `arith`/`math` (names shared with the CPU lowering in `text.rs`),
//! comparisons, `arith.select`, casts. Integer `div`/`rem` round toward negative infinity,
//! built from `divsi`/`remsi` (`text::floor_div_rem`: Mosaic does not legalize
//! `arith.floordivsi`).

use kernel_ir::{BinaryOp, DType, Op, OpKind, TensorType, UnaryOp};

use super::{tty, vty, Emitter};
use crate::text::{
    arith_binary, arith_unary_float, comparison, float_rem, floor_div_rem, IntEmit, IntPrim,
};

impl Emitter<'_> {
    pub(super) fn elementwise(&mut self, op: &Op) -> String {
        match &op.kind {
            OpKind::Unary { op: u, x } => {
                let t = self.ty(*x);
                let x = self.v(*x);
                self.unary(*u, &x, &t)
            }
            OpKind::Binary { op: b, lhs, rhs } => {
                let t = self.ty(*lhs);
                let (a, c) = (self.v(*lhs), self.v(*rhs));
                self.binary(*b, &a, &c, &t)
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
                self.cast(&x, &xt, self.ty(op.results[0]).dtype)
            }
            _ => unreachable!("not an element-wise op"),
        }
    }

    fn unary(&mut self, u: UnaryOp, x: &str, t: &TensorType) -> String {
        let ts = tty(t);
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
                let name = arith_unary_float(u).expect("`not` is handled above");
                self.def(&format!("{name} {x} : {ts}"))
            }
        }
    }

    /// `a op b` on values of type `t` (also used for index maps, on i32 scalars).
    pub(super) fn binary(&mut self, op: BinaryOp, a: &str, c: &str, t: &TensorType) -> String {
        let ts = tty(t);
        let float = t.dtype.is_float();
        match (arith_binary(op, float), float) {
            (Some(name), _) => self.def(&format!("{name} {a}, {c} : {ts}")),
            (None, true) => float_rem(self, a, c, &ts),
            (None, false) => floor_div_rem(self, a, c, &t.shape, op == BinaryOp::Rem),
        }
    }

    /// Converts `x` of type `from` to dtype `to`.
    pub(super) fn cast(&mut self, x: &str, from: &TensorType, to: DType) -> String {
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

impl IntEmit for Emitter<'_> {
    fn int_prim(&mut self, op: IntPrim, a: &str, b: &str, dtype: DType, shape: &[u64]) -> String {
        let t = vty(dtype, shape);
        let rhs = match op {
            IntPrim::TruncDiv => "arith.divsi",
            IntPrim::TruncRem => "arith.remsi",
            IntPrim::Add => "arith.addi",
            IntPrim::Sub => "arith.subi",
            IntPrim::And => "arith.andi",
            IntPrim::Less => "arith.cmpi slt,",
            IntPrim::NotEqual => "arith.cmpi ne,",
        };
        self.def(&format!("{rhs} {a}, {b} : {t}"))
    }

    fn int_const(&mut self, v: i64, shape: &[u64]) -> String {
        self.constant(DType::I32, shape, v as f64)
    }

    fn int_select(&mut self, cond: &str, a: &str, b: &str, shape: &[u64]) -> String {
        self.select(cond, a, b, &TensorType::new(DType::I32, shape.to_vec()))
    }
}
