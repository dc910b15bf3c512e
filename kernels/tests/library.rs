//! Every library kernel against its plain reference, through the interpreter.

use kernel_ir::{interpret, print_kernel, parse_kernel, InterpretOptions};
use kernels::{all, check, find, BoxError, LibraryKernel, Params};
use kernel_ir::{Array, Kernel};

fn interp(k: &Kernel, inputs: &[Array]) -> Result<Vec<Array>, BoxError> {
    Ok(interpret(k, inputs, &InterpretOptions { poison_uninitialized: true, threads: 0 })?)
}

fn check_ok(name: &str, pairs: &[(&str, &str)], seed: u64) {
    let k = find(name).unwrap();
    let p = Params::with(k.params(), pairs).unwrap();
    let c = check(k, &p, seed, &mut interp).unwrap_or_else(|e| panic!("{name} {p}: {e}"));
    assert!(c.ok(), "{name} {p}: {c:?}");
}

#[test]
fn defaults_match_reference() {
    for k in all() {
        let small: Vec<(&str, &str)> = match k.name() {
            "flash_attention" | "flash_attention_bwd" => vec![("q_len", "70"), ("kv_len", "90"), ("block_q", "32"), ("block_k", "32")],
            _ => vec![],
        };
        check_ok(k.name(), &small, 7);
    }
}

#[test]
fn every_kernel_round_trips_through_text() {
    for k in all() {
        let p = Params::parse(k.params(), &[]).unwrap();
        for kernel in k.build(&p).unwrap() {
            let text = print_kernel(&kernel);
            let parsed = parse_kernel(&text).unwrap_or_else(|e| panic!("{}: {e}\n{text}", k.name()));
            assert_eq!(print_kernel(&parsed), text);
        }
    }
}
