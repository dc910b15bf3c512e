use kernel_ir::dsl::prelude::*;
use kernel_macros::kernel;

#[kernel(grid = 4)]
fn k(x: Ref, o: Ref) {
    o.write(x.read());
}

fn main() {}
