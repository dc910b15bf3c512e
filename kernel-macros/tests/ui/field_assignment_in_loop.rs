use kernel_ir::dsl::prelude::*;
use kernel_macros::kernel;

struct State {
    acc: Tensor,
}

#[kernel]
fn k(x: Ref, o: Ref, #[comptime] n: u64) {
    let mut state = State { acc: x.read() };
    for _ in 0..n {
        state.acc = state.acc + 1.0;
    }
    o.write(state.acc);
}

fn main() {}
