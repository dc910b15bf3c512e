//! What the MLIR text emitters share: a writer that numbers SSA values and indents
//! lines, element type names, and float literals MLIR parses exactly.

use kernel_ir::{CmpPred, DType};

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
