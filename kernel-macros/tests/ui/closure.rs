use kernel_ir::dsl::prelude::*;
use kernel_macros::kernel;

#[kernel]
fn k(x: Ref, o: Ref) {
    let double = |t: Tensor| t * 2.0;
    o.write(double(x.read()));
}

fn main() {}
