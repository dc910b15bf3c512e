use kernel_ir::dsl::prelude::*;
use kernel_macros::kernel;

#[kernel]
fn k(x: Ref, o: Ref, #[comptime] skip: bool) {
    if skip {
        return;
    }
    o.write(x.read());
}

fn main() {}
