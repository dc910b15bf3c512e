use kernel_ir::dsl::prelude::*;
use kernel_macros::kernel;

#[kernel]
fn k(x: &Ref, o: &mut Ref) {
    o.write(x.read());
}

fn main() {}
