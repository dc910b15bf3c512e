//! Every unsupported construct is a compile error at the user's span that says what to
//! write instead. Regenerate the expected messages with `TRYBUILD=overwrite`.

#[test]
fn unsupported_constructs_are_compile_errors() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
