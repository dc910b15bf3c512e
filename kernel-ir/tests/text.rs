mod common;

use common::*;
use kernel_ir::{parse_kernel, print_kernel, Error, Kernel};
use proptest::prelude::*;

fn samples() -> Vec<Kernel> {
    vec![
        add_one(16, 128, 8),
        softmax_masked(13, 7, 8),
        matmul_grid_k(32, 64, 48, 16, 16, 16),
        matmul_loop(16, 96, 24, 8, 32),
        kernel_ir::testing::op_zoo(),
        kernel_ir::testing::prefetch_gather(4, 3, 8, 16),
    ]
}

/// Scalar-prefetch reads print as `%table[...]`, nested and in arithmetic, and parse
/// back to the same maps.
#[test]
fn scalar_prefetch_reads_print_and_parse() {
    let text = print_kernel(&kernel_ir::testing::prefetch_gather(4, 3, 8, 16));
    assert!(text.contains("map (i0) -> (%table[i0], 0) vmem"), "{text}");
    let nested = text.replace(
        "map (i0) -> (%table[i0], 0) vmem",
        "map (i0) -> (min(%table[%table[i0 floordiv 2]] + 1, 3), 0) vmem",
    );
    let k = parse_kernel(&nested).unwrap_or_else(|e| panic!("{e}\n{nested}"));
    assert_eq!(print_kernel(&k), nested);
    let e = parse_err(&text.replace("(%table[i0], 0)", "(%o[i0], 0)"));
    assert!(
        e.contains("index maps read scalar-prefetch operands declared before them; %o is not"),
        "{e}"
    );
}

#[test]
fn print_parse_print_is_identity() {
    for k in samples() {
        let text = print_kernel(&k);
        let parsed = parse_kernel(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(print_kernel(&parsed), text);
        assert_eq!(parsed.grid, k.grid);
        assert_eq!(parsed.refs, k.refs);
    }
}

fn parse_err(text: &str) -> String {
    match parse_kernel(text) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("parsed:\n{text}"),
    }
}

#[test]
fn syntax_errors_have_positions() {
    let base = print_kernel(&add_one(16, 128, 8));
    let e = parse_err(&base.replace("add %", "frobnicate %"));
    assert!(
        e.contains("unknown op `frobnicate`") && e.contains("line "),
        "{e}"
    );
    let e = parse_err(&base.replace("f32[16, 128]", "f64[16, 128]"));
    assert!(e.contains("unknown dtype `f64`"), "{e}");
    let e = parse_err(&base.replace("%1 = const", "%1 = cnst"));
    assert!(e.contains("unknown op `cnst`"), "{e}");
    let e = parse_err(&base.replace("store %out0[:, :], %2", "store %out0[:, :], %9"));
    assert!(e.contains("value %9 is not defined"), "{e}");
    let e = parse_err(&base[..base.len() / 2]);
    assert!(e.contains("parse error"), "{e}");
}

#[test]
fn debug_print_messages_round_trip_and_bad_strings_are_named() {
    let base = print_kernel(&add_one(16, 128, 8));
    let with_print = base.replace(
        "store %out0[:, :], %2",
        "debug_print \"a \\\"b\\\" \\\\ c\\nd\" [%0, %2]\n    store %out0[:, :], %2",
    );
    let k = parse_kernel(&with_print).unwrap_or_else(|e| panic!("{e}\n{with_print}"));
    let printed = print_kernel(&k);
    assert_eq!(print_kernel(&parse_kernel(&printed).unwrap()), printed);
    let message = k.body.ops.iter().find_map(|op| match &op.kind {
        kernel_ir::OpKind::DebugPrint { message, .. } => Some(message.clone()),
        _ => None,
    });
    assert_eq!(message.as_deref(), Some("a \"b\" \\ c\nd"));
    let e = parse_err(&with_print.replace("\\nd", "\\td"));
    assert!(e.contains("bad escape `\\t`"), "{e}");
    let e = parse_err(&with_print.replace("c\\nd\"", "c"));
    assert!(e.contains("unterminated string"), "{e}");
}

#[test]
fn type_errors_name_the_op_and_types() {
    let base = print_kernel(&add_one(16, 128, 8));
    let e = parse_err(&base.replace(
        "%1 = const 1.0 : f32[8, 128]",
        "%1 = const 1.0 : f32[8, 64]",
    ));
    assert!(e.contains("`%2 = add %0, %1 : f32[8, 128]`"), "{e}");
    assert!(
        e.contains("operand 1 has type f32[8, 64], expected f32[8, 128]"),
        "{e}"
    );
}

#[test]
fn block_specs_that_do_not_tile_are_rejected() {
    let base = print_kernel(&add_one(16, 128, 8));
    let e = parse_err(&base.replacen("block [8, 128]", "block [8, 256]", 1));
    assert!(
        e.contains("block dim 1 is 256, which does not tile the array dim of 128"),
        "{e}"
    );
    let e = parse_err(&base.replacen("-> (i0, 0)", "-> (i0 + 5, 0)", 1));
    assert!(e.contains("block index 5 for dim 0"), "{e}");
    let e = parse_err(&base.replacen("block [8, 128]", "block [8]", 1));
    assert!(
        e.contains("block shape has rank 1 but the array has rank 2"),
        "{e}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Mutated valid kernels never panic the parser: they parse (and then print back
    /// to something that parses identically) or give an error.
    #[test]
    fn parser_never_panics_on_mutations(which in 0usize..5, pos in any::<prop::sample::Index>(),
                                        cut in any::<prop::sample::Index>(), insert in "[ -~]{0,8}") {
        let text = print_kernel(&samples()[which]);
        let mut chars: Vec<char> = text.chars().collect();
        let p = pos.index(chars.len());
        let c = cut.index(8).min(chars.len() - p);
        chars.splice(p..p + c, insert.chars());
        let mutated: String = chars.into_iter().collect();
        match parse_kernel(&mutated) {
            Ok(k) => {
                let again = print_kernel(&k);
                prop_assert_eq!(print_kernel(&parse_kernel(&again).unwrap()), again);
            }
            Err(Error::Parse(_)) | Err(Error::Verify(_)) => {}
            Err(e) => prop_assert!(false, "unexpected error kind: {e}"),
        }
    }

    #[test]
    fn parser_never_panics_on_garbage(text in "\\PC{0,200}") {
        let _ = parse_kernel(&text);
    }
}

#[test]
fn checks_round_trip_and_need_a_bool_condition() {
    let base = print_kernel(&add_one(16, 128, 8));
    let with_check = base.replace(
        "store %out0[:, :], %2",
        "%9 = cmp gt %2, %1 : bool[8, 128]\n    check_index %9, \"bad\" [%2]\n    \
         check %9, \"also bad\" []\n    store %out0[:, :], %2",
    );
    let k = parse_kernel(&with_check).unwrap_or_else(|e| panic!("{e}\n{with_check}"));
    let printed = print_kernel(&k);
    assert_eq!(print_kernel(&parse_kernel(&printed).unwrap()), printed);
    let kinds: Vec<_> = k
        .body
        .ops
        .iter()
        .filter_map(|op| match &op.kind {
            kernel_ir::OpKind::Check { kind, message, .. } => Some((*kind, message.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (kernel_ir::CheckKind::Index, "bad".to_string()),
            (kernel_ir::CheckKind::Value, "also bad".to_string())
        ]
    );
    let e = parse_err(&with_check.replace("check %9,", "check %2,"));
    assert!(
        e.contains("the condition has type f32[8, 128], expected bool"),
        "{e}"
    );
}
