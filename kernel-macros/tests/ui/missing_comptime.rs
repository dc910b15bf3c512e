use kernel_ir::dsl::prelude::*;
use kernel_macros::kernel;

#[kernel]
fn k(x: Ref, o: Ref, block: u64) {
    o.store(s![ds(0, block)], x.load(s![ds(0, block)]));
}

fn main() {}
