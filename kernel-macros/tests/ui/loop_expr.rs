use kernel_ir::dsl::prelude::*;
use kernel_macros::kernel;

#[kernel]
fn k(x: Ref, o: Ref) {
    loop {
        o.write(x.read());
    }
}

fn main() {}
