use kernel_ir::dsl::prelude::*;
use kernel_macros::kernel;

#[kernel]
fn k(x: Ref, y: Ref, o: Ref) {
    o.write(std::cmp::max(x.read(), y.read()));
}

fn main() {}
