use kernel_ir::dsl::prelude::*;
use kernel_macros::kernel;

#[kernel]
fn k(x: Ref, o: Ref) {
    let mut v = x.read();
    for s in vec![1.0, 2.0] {
        v = v * s;
    }
    o.write(v);
}

fn main() {}
