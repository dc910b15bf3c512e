//! Concurrent use of one runtime: threads launching different kernels at once through
//! the shared caches (trace memo, JIT memo, PJRT client, compilation cache) get exactly
//! the results of serial runs.

use std::sync::Barrier;

use kernel_ir::Array;
use kernels::{find, Params};
use runtime::Backend;

/// Library ops (name, parameters) with distinct kernels, so threads compile and run
/// different things at the same time.
const CASES: &[(&str, &str)] = &[
    ("matmul", "m=17,k=29,n=33"),
    ("softmax", "rows=9,cols=130"),
    ("rms_norm", "rows=5,cols=70"),
    ("layer_norm", "rows=7,cols=40,dtype=bf16"),
    ("swiglu", "rows=3,cols=33"),
    ("rope", "batch=1,heads=2,seq=13,head_dim=16"),
    ("flash_attention", "heads=4,kv_heads=1,q_len=17,kv_len=29"),
    (
        "flash_attention_bwd",
        "heads=2,kv_heads=1,q_len=20,kv_len=20,causal=true",
    ),
];

const THREADS: usize = 8;
const RUNS_PER_THREAD: usize = 3;

/// Runs op `case` (inputs from `seed`) on `backend`.
fn run_case(case: usize, seed: u64, backend: Backend) -> Vec<Array> {
    let (name, shape) = CASES[case];
    let k = find(name).unwrap();
    let p = Params::parse(k.params(), &[shape.to_string()]).unwrap();
    let inputs = k.inputs(&p, seed).unwrap();
    k.run(&p, &inputs, &mut |kernel, ins| {
        Ok(runtime::run(kernel, ins, backend)?.0)
    })
    .unwrap_or_else(|e| panic!("{name} {shape} on {backend}: {e}"))
}

/// Each of 8 threads runs a different op [`RUNS_PER_THREAD`] times with different inputs, all
/// released at once by a barrier; every result must equal the serial run's bit for bit.
fn concurrent_equals_serial(backend: Backend) {
    std::env::set_var(
        "TESSERA_CACHE_DIR",
        std::env::temp_dir().join(format!("tessera-concurrency-{}", std::process::id())),
    );
    let jobs: Vec<(usize, u64)> = (0..THREADS)
        .flat_map(|t| (0..RUNS_PER_THREAD).map(move |r| (t % CASES.len(), (t * 10 + r) as u64)))
        .collect();
    let barrier = Barrier::new(THREADS);
    let concurrent: Vec<Vec<Array>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let mine = &jobs[t * RUNS_PER_THREAD..(t + 1) * RUNS_PER_THREAD];
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    mine.iter()
                        .map(|&(c, seed)| run_case(c, seed, backend))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("no thread panics"))
            .collect()
    });
    for (&(case, seed), got) in jobs.iter().zip(&concurrent) {
        let want = run_case(case, seed, backend);
        assert_eq!(
            got, &want,
            "{} on {backend}, seed {seed}: concurrent run differs from serial",
            CASES[case].0
        );
    }
}

#[test]
fn eight_threads_on_the_interpreter() {
    concurrent_equals_serial(Backend::Interp);
}

#[test]
fn eight_threads_on_the_native_backend() {
    concurrent_equals_serial(Backend::Native);
}

#[cfg(tessera_pjrt)]
#[test]
fn eight_threads_on_the_xla_backend() {
    if let Some(reason) = Backend::Xla.unavailable_because(
        &find("softmax")
            .unwrap()
            .build(&Params::parse(find("softmax").unwrap().params(), &[]).unwrap())
            .unwrap()[0],
    ) {
        assert!(
            std::env::var_os("TESSERA_REQUIRE_XLA").is_none(),
            "XLA is unavailable: {reason}"
        );
        return eprintln!("skipping: {reason}");
    }
    concurrent_equals_serial(Backend::Xla);
}
