//! The reference interpreter on every library kernel at two sizes
//! (`cargo bench -p benches`).

use benches::{sizes, Case};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn interpreter(c: &mut Criterion) {
    for kernel in kernels::all() {
        let mut group = c.benchmark_group(format!("interp/{}", kernel.name()));
        group.sample_size(10);
        for (label, overrides) in sizes(kernel.name()) {
            let case = Case::new(kernel, &overrides).expect("bench parameters are valid");
            let flops = kernel.flops(&case.params);
            if flops > 0.0 {
                group.throughput(Throughput::Elements(flops as u64));
            }
            group.bench_function(label, |b| {
                b.iter(|| case.run_interpreter().expect("the kernel runs"))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, interpreter);
criterion_main!(benches);
