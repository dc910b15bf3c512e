use kernel_ir::dsl::prelude::*;
use kernel_macros::kernel;

#[kernel]
fn k(x: Ref, o: Ref) {
    let v = x.read();
    println!("{:?}", v);
    o.write(v);
}

fn main() {}
