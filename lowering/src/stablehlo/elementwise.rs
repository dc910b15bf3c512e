//! Element-wise ops: StableHLO (and `chlo.erf`) math, `compare`, `select`, `convert`.
//! Integer `div`/`rem` round toward negative infinity (`text::floor_div_rem`).

use kernel_ir::{BinaryOp, CmpPred, DType, Op, OpKind, TensorType, UnaryOp};

use super::Emitter;
use crate::hlo::{tensor as tty, tensor_type as ty_of};
use crate::text::{floor_div_rem, IntEmit, IntPrim};

impl Emitter<'_> {
    pub(super) fn elementwise(&mut self, op: &Op) -> String {
        let k = self.k;
        match &op.kind {
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
                    UnaryOp::Sin => "sine",
                    UnaryOp::Cos => "cosine",
                    UnaryOp::Not => "not",
                };
                self.op(name, &[(&self.v(*x), &self.vt(*x))], "", &self.vt(*x))
            }
            OpKind::Binary { op: b, lhs, rhs } => {
                let (a, c) = (self.v(*lhs), self.v(*rhs));
                self.binary(*b, &a, &c, &k.type_of(*lhs).clone())
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
                self.convert(&self.v(*x), &from, k.type_of(op.results[0]).dtype)
            }
            _ => unreachable!("not an element-wise op"),
        }
    }

    /// `a op b` on values of type `t` (also used for index maps, on i32 scalars).
    pub(super) fn binary(&mut self, op: BinaryOp, a: &str, c: &str, t: &TensorType) -> String {
        let tt = tty(t);
        let name = match (op, t.dtype) {
            (BinaryOp::Div | BinaryOp::Rem, DType::I32) => {
                return floor_div_rem(self, a, c, &t.shape, op == BinaryOp::Rem)
            }
            (BinaryOp::Rem, _) => {
                // a - b * floor(a / b), as the interpreter computes it.
                let q = self.binary_raw("divide", a, c, &tt);
                let f = self.op("floor", &[(&q, &tt)], "", &tt);
                let p = self.binary_raw("multiply", c, &f, &tt);
                return self.binary_raw("subtract", a, &p, &tt);
            }
            (BinaryOp::Add, _) => "add",
            (BinaryOp::Sub, _) => "subtract",
            (BinaryOp::Mul, _) => "multiply",
            (BinaryOp::Div, _) => "divide",
            (BinaryOp::Max, _) => "maximum",
            (BinaryOp::Min, _) => "minimum",
            (BinaryOp::Pow, _) => "power",
            (BinaryOp::And, _) => "and",
            (BinaryOp::Or, _) => "or",
        };
        self.binary_raw(name, a, c, &tt)
    }
}

impl IntEmit for Emitter<'_> {
    fn int_prim(&mut self, op: IntPrim, a: &str, b: &str, dtype: DType, shape: &[u64]) -> String {
        let t = ty_of(dtype, shape);
        match op {
            IntPrim::TruncDiv => self.binary_raw("divide", a, b, &t),
            IntPrim::TruncRem => self.binary_raw("remainder", a, b, &t),
            IntPrim::Add => self.binary_raw("add", a, b, &t),
            IntPrim::Sub => self.binary_raw("subtract", a, b, &t),
            IntPrim::And => self.binary_raw("and", a, b, &t),
            IntPrim::Less => self.compare("LT", a, b, dtype, shape),
            IntPrim::NotEqual => self.compare("NE", a, b, dtype, shape),
        }
    }

    fn int_const(&mut self, v: i64, shape: &[u64]) -> String {
        self.constant(DType::I32, shape, v as f64)
    }

    fn int_select(&mut self, cond: &str, a: &str, b: &str, shape: &[u64]) -> String {
        self.select(cond, a, b, &TensorType::new(DType::I32, shape.to_vec()))
    }
}
