//! Every library kernel at two sizes on each backend, with the baselines of the same
//! math timed in the same process: PyTorch's ATen op (through tch) and a plain StableHLO
//! module on XLA (`cargo bench -p benches`).

use benches::{sizes, Case};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use runtime::Backend;

fn backends(c: &mut Criterion) {
    let probe = Case::new(kernels::find("softmax").expect("softmax exists"), &[])
        .expect("defaults are valid");
    let xla = probe.run_on(Backend::Xla).is_ok();
    for kernel in kernels::all() {
        let mut group = c.benchmark_group(kernel.name());
        group.sample_size(10);
        for (label, overrides) in sizes(kernel.name()) {
            let case = Case::new(kernel, &overrides).expect("bench parameters are valid");
            let flops = kernel.flops(&case.params);
            if flops > 0.0 {
                group.throughput(Throughput::Elements(flops as u64));
            }
            group.bench_function(format!("interp/{label}"), |b| {
                b.iter(|| case.run_interpreter().expect("the kernel runs"))
            });
            group.bench_function(format!("native/{label}"), |b| {
                b.iter(|| case.run_on(Backend::Native).expect("the kernel runs"))
            });
            if let Some(torch) = case.torch_baseline() {
                group.bench_function(format!("torch/{label}"), |b| b.iter(|| torch.run()));
            }
            if !xla {
                continue;
            }
            group.bench_function(format!("xla/{label}"), |b| {
                b.iter(|| case.run_on(Backend::Xla).expect("the kernel runs"))
            });
            if case
                .run_xla_baseline()
                .expect("the baseline runs")
                .is_some()
            {
                group.bench_function(format!("xla-baseline/{label}"), |b| {
                    b.iter(|| case.run_xla_baseline().expect("the baseline runs"))
                });
            }
        }
        group.finish();
    }
}

criterion_group!(benches, backends);
criterion_main!(benches);
