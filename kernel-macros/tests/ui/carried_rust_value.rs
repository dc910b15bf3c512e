use kernel_ir::dsl::prelude::*;
use kernel_macros::kernel;

#[kernel]
fn k(x: Ref, o: Ref, #[comptime] n: u64) {
    let mut count = 0u32;
    for _ in 0..n {
        count += 1;
    }
    o.write(x.read() * count);
}

fn main() {}
