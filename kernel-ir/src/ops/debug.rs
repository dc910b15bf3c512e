//! `debug_print`: prints a message and values with the program id. It has no results
//! and no effect on them, but is not pure (dead-code removal keeps it). The interpreter
//! and the native backend print through [`format_debug_print`]; the XLA and Mosaic
//! lowerings drop it.

use std::fmt::Write as _;

use super::{not_in_family, OpTraits, TypeCx};
use crate::array::Array;
use crate::ir::OpKind;
use crate::types::{DType, TensorType};

pub(super) const TRAITS: OpTraits = OpTraits {
    pure: false,
    elementwise: false,
    has_regions: false,
};

pub(super) fn infer(_cx: &TypeCx, op: &OpKind) -> Result<Vec<TensorType>, String> {
    match op {
        OpKind::DebugPrint { .. } => Ok(vec![]),
        _ => not_in_family(op, "debug"),
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
