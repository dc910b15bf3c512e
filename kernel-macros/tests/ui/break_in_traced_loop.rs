use kernel_ir::dsl::prelude::*;
use kernel_macros::kernel;

#[kernel]
fn k(x: Ref, o: Ref, #[comptime] n: u64) {
    let mut acc = x.read();
    for i in 0..n {
        acc = acc + 1.0;
        break;
    }
    o.write(acc);
}

fn main() {}
