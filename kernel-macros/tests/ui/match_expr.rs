use kernel_ir::dsl::prelude::*;
use kernel_macros::kernel;

#[kernel]
fn k(x: Ref, o: Ref, #[comptime] mode: u32) {
    let v = match mode {
        0 => x.read(),
        _ => x.read() * 2.0,
    };
    o.write(v);
}

fn main() {}
