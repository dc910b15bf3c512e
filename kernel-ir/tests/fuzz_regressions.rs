//! Replays the parser fuzzer's kept inputs (`fuzz/regressions/parse`, inputs that once
//! crashed it or probe a rule) through the same checks, without libFuzzer.

#[test]
fn kept_fuzz_inputs_pass_the_parser_checks() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/parse");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        if let Ok(text) = std::str::from_utf8(&bytes) {
            kernel_ir::testing::check_text_input(text);
        }
        n += 1;
    }
    assert!(n > 0, "no inputs in {}", dir.display());
}
