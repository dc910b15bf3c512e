//! The IR text parser and the verifier behind it, on any bytes: see
//! `kernel_ir::testing::check_text_input` for what is asserted.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        kernel_ir::testing::check_text_input(text);
    }
});
