use kernel_ir::dsl::prelude::*;
use kernel_macros::kernel;

#[kernel]
fn k(x: Ref) -> Tensor {
    x.read()
}

fn main() {}
