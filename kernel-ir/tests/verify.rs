//! Each verifier rule rejects a kernel with a message naming the op (or declaration)
//! and what was expected.

use kernel_ir::{parse_kernel, Error};

/// A kernel `@k` with one `f32[16, 128]` input and output in `[8, 128]` blocks.
fn kernel(header: &str, decls: &str, body: &str) -> String {
    format!("kernel @k {header} {{\n{decls}\n  body {{\n{body}\n  }}\n}}\n")
}

const GRID: &str = "grid [2] semantics [parallel]";
const IO: &str = "  in %x : f32[16, 128] block [8, 128] map (i) -> (i, 0) vmem
  out %o : f32[16, 128] block [8, 128] map (i) -> (i, 0) vmem";
const COPY: &str = "    %0 = load %x[:, :] : f32[8, 128]\n    store %o[:, :], %0";

fn verify_error(text: &str) -> (String, String) {
    match parse_kernel(text) {
        Err(Error::Verify(e)) => (e.op, e.message),
        Err(e) => panic!("expected a verify error, got {e}\n{text}"),
        Ok(_) => panic!("verified:\n{text}"),
    }
}

fn assert_rejects(header: &str, decls: &str, body: &str, op: &str, message: &str) {
    let (got_op, got_message) = verify_error(&kernel(header, decls, body));
    assert!(got_op.contains(op), "op `{got_op}` should contain `{op}`");
    assert!(
        got_message.contains(message),
        "message `{got_message}` should contain `{message}`"
    );
}

#[test]
fn the_base_kernel_is_valid() {
    parse_kernel(&kernel(GRID, IO, COPY)).unwrap();
}

#[test]
fn grid_rules() {
    assert_rejects(
        "grid [2] semantics [parallel, parallel]",
        IO,
        COPY,
        "kernel @k",
        "grid has rank 1 but 2 dimension semantics",
    );
    let io0 = IO.replace("map (i) -> (i, 0)", "map () -> (0, 0)");
    assert_rejects(
        "grid [0] semantics [parallel]",
        &io0.replace("map () ->", "map (i) ->"),
        COPY,
        "kernel @k",
        "grid axis 0 has size 0",
    );
}

#[test]
fn ref_rules() {
    assert_rejects(
        GRID,
        "  in %x : f32[16, 128] block [8, 128] map (i) -> (i, 0) vmem",
        "    %0 = load %x[:, :] : f32[8, 128]",
        "kernel @k",
        "no output",
    );
    assert_rejects(
        GRID,
        &IO.replace(
            "block [8, 128] map (i) -> (i, 0) vmem\n  out",
            "block [16, 129] map (i) -> (0, 0) vmem\n  out",
        ),
        COPY,
        "in %x",
        "block dim 1 is 129, which does not tile the array dim of 128",
    );
    assert_rejects(
        GRID,
        &IO.replacen("map (i) -> (i, 0)", "map (i) -> (i * 2, 0)", 1),
        COPY,
        "in %x",
        "at program [1] the index map gives block index 2 for dim 0",
    );
    assert_rejects(
        GRID,
        &IO.replacen("map (i) -> (i, 0)", "map (i) -> (i, 0, 0)", 1),
        COPY,
        "in %x",
        "index map returns 3 block indices but the array has rank 2",
    );
    assert_rejects(
        GRID,
        &IO.replacen("-> (i, 0)", "-> (i floordiv 0, 0)", 1),
        COPY,
        "in %x",
        "cannot be evaluated",
    );
    let scratch = format!("{IO}\n  scratch %t : f32[8, 128] vmem");
    assert_rejects(
        GRID,
        &scratch,
        "    %0 = load %x[:, :] : f32[8, 128]\n    store %x[:, :], %0",
        "store %x",
        "is an input and cannot be stored to",
    );
}

#[test]
fn op_type_rules() {
    let cases: &[(&str, &str, &str)] = &[
        ("    %0 = load %x[:, :] : f32[8, 64]", "%0 = load %x", "result 0 has type f32[8, 64], expected f32[8, 128]"),
        ("    %0 = load %x[:] : f32[8]", "load %x", "has 1 indices but the ref has rank 2"),
        ("    %0 = load %x[ds(0, 9), :] : f32[9, 128]", "load %x", "slice of dim 0 has size 9, expected 1..=8"),
        ("    %0 = load %x[ds(4, 8), :] : f32[8, 128]", "load %x", "covers [4, 12) but the ref's extent is 8"),
        ("    %0 = const 1.0 : f32\n    %1 = load %x[%0, :] : f32[128]", "load %x", "index of dim 0 has type f32, expected i32"),
        ("    %0 = load %x[:, :] : f32[8, 128]\n    %1 = cast %0 : bf16[8, 128]\n    %2 = add %0, %1 : f32[8, 128]", "%2 = add %0, %1", "operand 1 has type bf16[8, 128], expected f32[8, 128]"),
        ("    %0 = load %x[:, :] : f32[8, 128]\n    %1 = not %0 : f32[8, 128]", "not", "`not` does not accept f32"),
        ("    %0 = load %x[:, :] : f32[8, 128]\n    %1 = broadcast %0 dims [1, 0] : f32[8, 128]", "broadcast", "must be increasing"),
        ("    %0 = load %x[:, :] : f32[8, 128]\n    %1 = broadcast %0 dims [0, 1] : f32[8, 256]", "broadcast", "operand dim 1 has size 128, cannot broadcast to 256"),
        ("    %0 = load %x[:, :] : f32[8, 128]\n    %1 = reshape %0 : f32[8, 127]", "reshape", "cannot reshape f32[8, 128] to f32[8, 127]"),
        ("    %0 = load %x[:, :] : f32[8, 128]\n    %1 = transpose %0 perm [0, 0] : f32[8, 8]", "transpose", "is not a permutation"),
        ("    %0 = load %x[:, :] : f32[8, 128]\n    %1 = gather %0, %0 axis 1 : f32[8, 128]", "gather", "indices have type f32[8, 128], expected i32"),
        ("    %0 = load %x[:, :] : f32[8, 128]\n    %1 = iota 0 : i32[8, 128]\n    %2 = gather %0, %1 axis 2 : f32[8, 128]", "gather", "axis 2 is out of range for f32[8, 128]"),
        ("    %0 = load %x[:, :] : f32[8, 128]\n    %1 = iota 0 : i32[4, 3]\n    %2 = gather %0, %1 axis 1 : f32[4, 3]", "gather", "must have the rank of the operand f32[8, 128] and its size on every dim but 1"),
        ("    %0 = load %x[:, :] : f32[8, 128]\n    %1 = reduce_sum %0 axes [2] : f32[8]", "reduce_sum", "axes [2] must be non-empty, increasing and < the rank"),
        ("    %0 = load %x[:, :] : f32[8, 128]\n    %1 = dot %0, %0 : f32[8, 128]", "dot", "contracting dims differ: lhs f32[8, 128] gives K=128, rhs f32[8, 128] gives K=8"),
        ("    %0 = load %x[:, :] : f32[8, 128]\n    %1 = dot %0, %0 transpose_rhs : f32[8, 9]", "dot", "result 0 has type f32[8, 9], expected f32[8, 8]"),
        ("    %0 = load %x[:, :] : f32[8, 128]\n    %1 = cmp lt %0, %0 : bool[8, 128]\n    %2 = select %1, %0, %1 : f32[8, 128]", "select", "operand 2 has type bool[8, 128], expected f32[8, 128]"),
        ("    %0 = const 1.5 : i32", "const", "literal Float(1.5) does not fit type i32"),
        ("    %0 = program_id 1 : i32", "program_id", "axis 1 is out of range for a grid of rank 1"),
        ("    %0 = iota 0 : f32[8]", "iota", "must be < the rank of an i32 result"),
        ("    %0 = const 0.0 : f32\n    %1 = const 4 : i32\n    for %2 = %0 to %1 step %1 {\n      yield\n    }", "for", "lower bound has type f32, expected i32"),
        ("    %0 = const 0 : i32\n    %1 = const 0.0 : f32\n    %2 = for %3 = %0 to %0 step %0 iter(%4 = %1) : f32 {\n      %5 = cast %4 : bf16\n      yield %5\n    }", "for", "the loop body yields bf16 as value 0, expected f32"),
        ("    %0 = const 1 : i32\n    if %0 {\n      yield\n    } else {\n      yield\n    }", "if", "condition has type i32, expected bool"),
        ("    %0 = const true : bool\n    %1 = const 1.0 : f32\n    %2 = if %0 : f32 {\n      yield %1\n    } else {\n      yield\n    }", "if", "the else branch yields 0 values, expected 1"),
        ("    %0 = const 1.0 : f32\n    yield %0", "yield", "only allowed at the end of a region"),
    ];
    for (body, op, message) in cases {
        assert_rejects(GRID, IO, body, op, message);
    }
}

#[test]
fn values_are_scoped_to_their_region() {
    let text = kernel(
        GRID,
        IO,
        "    %0 = const true : bool\n    if %0 {\n      %1 = const 1.0 : f32\n      yield\n    } else {\n      yield\n    }\n    %2 = add %1, %1 : f32",
    );
    match parse_kernel(&text) {
        Err(Error::Parse(e)) => assert!(e.message.contains("value %1 is not defined here"), "{e}"),
        other => panic!("{other:?}"),
    }
}

/// The operands index maps read are the leading inputs: i32, whole in SMEM, at block 0,
/// read at their rank.
#[test]
fn scalar_prefetch_rules() {
    let table = "  in %t : i32[2] block [2] map (i) -> (0) smem";
    let reads = "  in %x : f32[16, 128] block [8, 128] map (i) -> (%t[i], 0) vmem
  out %o : f32[16, 128] block [8, 128] map (i) -> (i, 0) vmem";
    parse_kernel(&kernel(GRID, &format!("{table}\n{reads}"), COPY)).unwrap();
    let bad = [
        (
            "  in %t : f32[2] block [2] map (i) -> (0) smem",
            "in %t",
            "must be an i32 input",
        ),
        (
            "  in %t : i32[2] block [2] map (i) -> (0) vmem",
            "in %t",
            "whole array in smem",
        ),
        (
            "  in %t : i32[4] block [2] map (i) -> (0) smem",
            "in %t",
            "whole array in smem",
        ),
        (
            "  in %t : i32[2] block [2] map (i) -> (i * 0) smem",
            "in %t",
            "at block 0",
        ),
    ];
    for (decl, op, message) in bad {
        assert_rejects(GRID, &format!("{decl}\n{reads}"), COPY, op, message);
    }
    // An input before the one the map reads is a scalar-prefetch operand too.
    let first = "  in %y : f32[16, 128] block [8, 128] map (i) -> (i, 0) vmem";
    let reads_second = reads.replace("%t[i]", "%t2[i]");
    assert_rejects(
        GRID,
        &format!("{first}\n  in %t2 : i32[2] block [2] map (i) -> (0) smem\n{reads_second}"),
        COPY,
        "in %y",
        "index maps read the first 2 inputs",
    );
    let wrong_rank = reads.replace("%t[i]", "%t[i, 0]");
    assert_rejects(
        GRID,
        &format!("{table}\n{wrong_rank}"),
        COPY,
        "in %x",
        "reads %t with 2 indices, but it has rank 1",
    );
}
