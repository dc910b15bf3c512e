use kernel_ir::dsl::prelude::*;
use kernel_macros::kernel;

#[kernel]
fn k(x: Ref, o: Ref, #[comptime] scale: Option<f64>) {
    let mut v = x.read();
    if let Some(s) = scale {
        v = v * s;
    }
    o.write(v);
}

fn main() {}
