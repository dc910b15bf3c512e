//! `debug_print`: prints a message and values with the program id. `check` and
//! `check_index`: fail the run when an element of a bool tensor is false, reporting the
//! message and values as a [`CheckFailure`]. They have no results and no effect on them,
//! but are not pure (dead-code removal keeps them). The interpreter and the native
//! backend format both through [`format_debug_print`]; the XLA backend runs checks as
//! outputs ([`CheckOutputs`](crate::CheckOutputs)); the StableHLO and Mosaic lowerings
//! drop what is left.

use std::fmt::Write as _;

use super::{not_in_family, OpTraits, TypeCx};
use crate::array::Array;
use crate::ir::{CheckKind, OpKind};
use crate::types::{DType, TensorType};

pub(super) const TRAITS: OpTraits = OpTraits {
    pure: false,
    elementwise: false,
    has_regions: false,
};

pub(super) fn infer(cx: &TypeCx, op: &OpKind) -> Result<Vec<TensorType>, String> {
    match op {
        OpKind::DebugPrint { .. } => Ok(vec![]),
        OpKind::Check { cond, .. } => {
            let ty = cx.ty(*cond);
            if ty.dtype != DType::Bool {
                return Err(format!("the condition has type {ty}, expected bool"));
            }
            Ok(vec![])
        }
        _ => not_in_family(op, "debug"),
    }
}

/// A failed `check`: the first program whose condition was false (in grid order), and
/// the line [`format_debug_print`] makes of its message and values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckFailure {
    /// What the failure stands for.
    pub kind: CheckKind,
    /// Program ids of the failing program.
    pub program: Vec<u64>,
    /// `[program (i, ..)] message values...`.
    pub line: String,
}

impl std::fmt::Display for CheckFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "check failed: {}", self.line)
    }
}

impl std::error::Error for CheckFailure {}

impl CheckFailure {
    /// The failure somewhere in `e`'s chain of sources, if any.
    pub fn in_chain<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a CheckFailure> {
        std::iter::successors(Some(e), |e| e.source()).find_map(|e| e.downcast_ref())
    }
}

/// Elements printed per value; the rest are counted, not printed.
pub const DEBUG_PRINT_ELEMENTS: usize = 16;

/// One printed line: `[program (i, j, ..)] message v0 v1 ...`. A scalar prints as its
/// number; a tensor as `dtype[shape] [e0, e1, ...]` with at most
/// [`DEBUG_PRINT_ELEMENTS`] elements and a count of the rest.
pub fn format_debug_print(message: &str, pids: &[u64], values: &[&Array]) -> String {
    let ids: Vec<String> = pids.iter().map(u64::to_string).collect();
    let mut line = format!("[program ({})] {message}", ids.join(", "));
    for v in values {
        let element = |x: f64| match v.dtype() {
            DType::Bool => (x != 0.0).to_string(),
            DType::I32 => format!("{}", x as i64),
            // Floats hold f32 values: print the shortest text that reads back as them.
            _ => format!("{}", x as f32),
        };
        line.push(' ');
        if v.ty().is_scalar() {
            line.push_str(&v.iter_f64().next().map_or(String::new(), element));
            continue;
        }
        let shown: Vec<String> = v
            .iter_f64()
            .take(DEBUG_PRINT_ELEMENTS)
            .map(element)
            .collect();
        let dims: Vec<String> = v.shape().iter().map(u64::to_string).collect();
        let _ = write!(
            line,
            "{}[{}] [{}",
            v.dtype().name(),
            dims.join(","),
            shown.join(", ")
        );
        let total = v.ty().num_elements() as usize;
        if total > shown.len() {
            let _ = write!(line, ", ... ({} more)", total - shown.len());
        }
        line.push(']');
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_the_program_and_bound_the_elements() {
        let scalar = Array::from_i32(Vec::<u64>::new(), vec![7]).unwrap();
        let long = Array::from_f32(
            DType::F32,
            [4, 5],
            (0..20).map(|i| i as f32 * 0.5).collect(),
        )
        .unwrap();
        let line = format_debug_print("x =", &[1, 0], &[&scalar, &long]);
        assert_eq!(
            line,
            "[program (1, 0)] x = 7 f32[4,5] [0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5, \
             6, 6.5, 7, 7.5, ... (4 more)]"
        );
    }
}
