use kernel_ir::dsl::prelude::*;
use kernel_macros::kernel;

fn helper(r: &Ref) -> Tensor {
    r.read()
}

#[kernel]
fn k(x: Ref, o: Ref) {
    o.write(helper(&x));
}

fn main() {}
