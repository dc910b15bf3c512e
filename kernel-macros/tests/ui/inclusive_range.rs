use kernel_ir::dsl::prelude::*;
use kernel_macros::kernel;

#[kernel]
fn k(x: Ref, o: Ref) {
    let mut v = x.read();
    for _ in 0..=3 {
        v = v + 1.0;
    }
    o.write(v);
}

fn main() {}
