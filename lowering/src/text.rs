//! What the MLIR text emitters share: a writer that numbers SSA values and indents
//! lines, element type names, float literals MLIR parses exactly, and the `arith`/`math`
//! names of the element-wise operators (one table for Mosaic and the CPU lowering).

use kernel_ir::{BinaryOp, CmpPred, DType, UnaryOp};

/// Accumulates indented lines of MLIR and hands out fresh SSA names.
pub(crate) struct Writer {
    out: String,
    /// Nesting depth (two spaces per level).
    pub(crate) indent: usize,
    next: usize,
    prefix: &'static str,
}

impl Writer {
    /// A writer whose values are named `%{prefix}N`, starting at `indent`.
    pub(crate) fn new(prefix: &'static str, indent: usize) -> Self {
        Writer {
            out: String::new(),
            indent,
            next: 0,
            prefix,
        }
    }

    /// A new SSA name.
    pub(crate) fn fresh(&mut self) -> String {
        self.next += 1;
        format!("%{}{}", self.prefix, self.next)
    }

    /// Appends one line at the current indentation.
    pub(crate) fn line(&mut self, s: &str) {
        for _ in 0..self.indent {
            self.out.push_str("  ");
        }
        self.out.push_str(s);
        self.out.push('\n');
    }

    /// The lines written so far, leaving the writer empty.
    pub(crate) fn take(&mut self) -> String {
        std::mem::take(&mut self.out)
    }
}

/// The MLIR element type of a dtype.
pub(crate) fn element_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        DType::I32 => "i32",
        DType::Bool => "i1",
    }
}

/// A literal of `dtype` for `v`: hex bit patterns for NaN and infinities (MLIR has no
/// names for them), else an exact decimal.
pub(crate) fn literal(dtype: DType, v: f64) -> String {
    let hex = |f32bits: &str, bf16: &str, f16: &str| match dtype {
        DType::BF16 => bf16.to_string(),
        DType::F16 => f16.to_string(),
        _ => f32bits.to_string(),
    };
    match dtype {
        DType::Bool => (v != 0.0).to_string(),
        DType::I32 => (v as i64).to_string(),
        _ if v.is_nan() => hex("0x7FC00000", "0x7FC0", "0x7E00"),
        _ if v == f64::INFINITY => hex("0x7F800000", "0x7F80", "0x7C00"),
        _ if v == f64::NEG_INFINITY => hex("0xFF800000", "0xFF80", "0xFC00"),
        _ => format!("{v:.17e}"),
    }
}

/// The opening line of an `scf.if` on `cond` whose results (of `types`, possibly none)
/// are named `{result}#i`.
pub(crate) fn scf_if_header<T: AsRef<str>>(result: &str, cond: &str, types: &[T]) -> String {
    if types.is_empty() {
        format!("scf.if {cond} {{")
    } else {
        let types: Vec<&str> = types.iter().map(AsRef::as_ref).collect();
        format!(
            "{result}:{} = scf.if {cond} -> ({}) {{",
            types.len(),
            types.join(", ")
        )
    }
}

/// The one `arith`/`math` op of a binary operator on floats (`float`) or integers and
/// bools, or `None` for those each target expands (float `rem`; integer `div`, `rem`:
/// Mosaic does not legalize `arith.floordivsi`, the CPU pipeline does).
pub(crate) fn arith_binary(op: BinaryOp, float: bool) -> Option<&'static str> {
    Some(match (op, float) {
        (BinaryOp::Add, true) => "arith.addf",
        (BinaryOp::Sub, true) => "arith.subf",
        (BinaryOp::Mul, true) => "arith.mulf",
        (BinaryOp::Div, true) => "arith.divf",
        (BinaryOp::Max, true) => "arith.maximumf",
        (BinaryOp::Min, true) => "arith.minimumf",
        (BinaryOp::Pow, _) => "math.powf",
        (BinaryOp::Add, false) => "arith.addi",
        (BinaryOp::Sub, false) => "arith.subi",
        (BinaryOp::Mul, false) => "arith.muli",
        (BinaryOp::Max, false) => "arith.maxsi",
        (BinaryOp::Min, false) => "arith.minsi",
        (BinaryOp::And, _) => "arith.andi",
        (BinaryOp::Or, _) => "arith.ori",
        (BinaryOp::Rem, _) | (BinaryOp::Div, false) => return None,
    })
}

/// The one `arith`/`math` op of a unary operator on floats, or `None` for `not`.
/// (The CPU lowering computes `exp`, `log`, `tanh`, `rsqrt`, `erf`, `sin` and `cos` its own
/// way: see `cpu/math.rs`.)
pub(crate) fn arith_unary_float(op: UnaryOp) -> Option<&'static str> {
    Some(match op {
        UnaryOp::Neg => "arith.negf",
        UnaryOp::Abs => "math.absf",
        UnaryOp::Exp => "math.exp",
        UnaryOp::Log => "math.log",
        UnaryOp::Tanh => "math.tanh",
        UnaryOp::Rsqrt => "math.rsqrt",
        UnaryOp::Sqrt => "math.sqrt",
        UnaryOp::Erf => "math.erf",
        UnaryOp::Sin => "math.sin",
        UnaryOp::Cos => "math.cos",
        UnaryOp::Not => return None,
    })
}

/// Emits one SSA op given its right-hand side and returns the result's name.
pub(crate) trait Emit {
    /// `%r = rhs`; returns `%r`.
    fn emit(&mut self, rhs: &str) -> String;
}

/// `x - y * floor(x / y)` on floats of type `t`: the interpreter's `rem`.
pub(crate) fn float_rem(e: &mut impl Emit, x: &str, y: &str, t: &str) -> String {
    let q = e.emit(&format!("arith.divf {x}, {y} : {t}"));
    let f = e.emit(&format!("math.floor {q} : {t}"));
    let m = e.emit(&format!("arith.mulf {y}, {f} : {t}"));
    e.emit(&format!("arith.subf {x}, {m} : {t}"))
}

/// The `arith` comparison for `pred` on `dtype` operands: the op (`arith.cmpf` or
/// `arith.cmpi`) and its predicate (ordered for floats except `une`, unsigned for bools).
pub(crate) fn comparison(pred: CmpPred, dtype: DType) -> (&'static str, &'static str) {
    let unsigned = dtype == DType::Bool;
    let p = match (dtype.is_float(), pred, unsigned) {
        (true, CmpPred::Eq, _) => "oeq",
        (true, CmpPred::Ne, _) => "une",
        (true, CmpPred::Lt, _) => "olt",
        (true, CmpPred::Le, _) => "ole",
        (true, CmpPred::Gt, _) => "ogt",
        (true, CmpPred::Ge, _) => "oge",
        (false, CmpPred::Eq, _) => "eq",
        (false, CmpPred::Ne, _) => "ne",
        (false, CmpPred::Lt, false) => "slt",
        (false, CmpPred::Le, false) => "sle",
        (false, CmpPred::Gt, false) => "sgt",
        (false, CmpPred::Ge, false) => "sge",
        (false, CmpPred::Lt, true) => "ult",
        (false, CmpPred::Le, true) => "ule",
        (false, CmpPred::Gt, true) => "ugt",
        (false, CmpPred::Ge, true) => "uge",
    };
    let op = if dtype.is_float() {
        "arith.cmpf"
    } else {
        "arith.cmpi"
    };
    (op, p)
}

/// The integer primitives a target offers for [`floor_div_rem`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IntPrim {
    /// i32 division rounded toward zero.
    TruncDiv,
    /// i32 remainder with the sign of the dividend.
    TruncRem,
    /// i32 `+`.
    Add,
    /// i32 `-`.
    Sub,
    /// i32 `<` (bool result).
    Less,
    /// `!=` of i32 or of bool operands (bool result).
    NotEqual,
    /// Bool `&`.
    And,
}

/// A target that emits the [`IntPrim`]s on i32/bool values of one shape.
pub(crate) trait IntEmit {
    /// `a op b` on values of `shape`; `dtype` is the operands' (i32, or bool for `And`
    /// and a `NotEqual` of bools).
    fn int_prim(&mut self, op: IntPrim, a: &str, b: &str, dtype: DType, shape: &[u64]) -> String;
    /// An i32 constant splatted over `shape`.
    fn int_const(&mut self, v: i64, shape: &[u64]) -> String;
    /// `cond ? a : b` on i32 values of `shape`.
    fn int_select(&mut self, cond: &str, a: &str, b: &str, shape: &[u64]) -> String;
}

/// Integer division (or, with `rem`, remainder) rounded toward negative infinity, as
/// `kernel_ir::ops::floor_div`/`floor_rem` define it, built from truncating division:
/// the truncated result is adjusted where the remainder is nonzero and its sign differs
/// from the divisor's.
pub(crate) fn floor_div_rem(
    e: &mut impl IntEmit,
    a: &str,
    b: &str,
    shape: &[u64],
    rem: bool,
) -> String {
    use IntPrim::*;
    let i32 = DType::I32;
    let q = e.int_prim(TruncDiv, a, b, i32, shape);
    let r = e.int_prim(TruncRem, a, b, i32, shape);
    let zero = e.int_const(0, shape);
    let r_neg = e.int_prim(Less, &r, &zero, i32, shape);
    let b_neg = e.int_prim(Less, b, &zero, i32, shape);
    let signs_differ = e.int_prim(NotEqual, &r_neg, &b_neg, DType::Bool, shape);
    let nonzero = e.int_prim(NotEqual, &r, &zero, i32, shape);
    let adjust = e.int_prim(And, &nonzero, &signs_differ, DType::Bool, shape);
    let (fixed, plain) = if rem {
        (e.int_prim(Add, &r, b, i32, shape), r)
    } else {
        let one = e.int_const(1, shape);
        (e.int_prim(Sub, &q, &one, i32, shape), q)
    };
    e.int_select(&adjust, &fixed, &plain, shape)
}
