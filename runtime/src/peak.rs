//! What this machine can do at best, measured: FP32 FMA throughput on every core and
//! streaming memory bandwidth. Benches report their results as a share of these.

use std::time::{Duration, Instant};

/// Independent FMA chains per core: enough to cover FMA latency on two ports.
const CHAINS: usize = 12;

/// FP32 GFLOP/s of one core running `iters` rounds of `CHAINS` independent FMAs of the
/// widest registers it has (16 lanes with AVX-512, else 8).
fn fma_core_gflops(iters: u64) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            let t = Instant::now();
            // SAFETY: the CPU supports AVX-512F (checked just above).
            let sink = unsafe { fma_avx512(iters) };
            let secs = t.elapsed().as_secs_f64();
            std::hint::black_box(sink);
            return (iters * CHAINS as u64 * 16 * 2) as f64 / secs / 1e9;
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            let t = Instant::now();
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            let sink = unsafe { fma_avx2(iters) };
            let secs = t.elapsed().as_secs_f64();
            std::hint::black_box(sink);
            return (iters * CHAINS as u64 * 8 * 2) as f64 / secs / 1e9;
        }
    }
    let t = Instant::now();
    let mut acc = [1.0f32; CHAINS];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = a.mul_add(0.999_999, 1e-7);
        }
    }
    std::hint::black_box(acc);
    (iters * CHAINS as u64 * 2) as f64 / t.elapsed().as_secs_f64() / 1e9
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_avx2(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm256_set1_ps(0.999_999);
    let b = _mm256_set1_ps(1e-7);
    let mut acc = [_mm256_set1_ps(1.0); CHAINS];
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = _mm256_fmadd_ps(*v, a, b);
        }
    }
    let mut total = _mm256_setzero_ps();
    for v in acc {
        total = _mm256_add_ps(total, v);
    }
    let mut out = [0.0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), total);
    out.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_avx512(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm512_set1_ps(0.999_999);
    let b = _mm512_set1_ps(1e-7);
    let mut acc = [_mm512_set1_ps(1.0); CHAINS];
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = _mm512_fmadd_ps(*v, a, b);
        }
    }
    let mut total = _mm512_setzero_ps();
    for v in acc {
        total = _mm512_add_ps(total, v);
    }
    _mm512_reduce_add_ps(total)
}

/// Peak FP32 FMA GFLOP/s of the machine: the best of three rounds, every core busy.
pub fn fma_peak_gflops() -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let iters = 20_000_000;
    (0..3)
        .map(|_| {
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..cores)
                    .map(|_| s.spawn(|| fma_core_gflops(iters)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or(0.0))
                    .sum::<f64>()
            })
        })
        .fold(0.0, f64::max)
}

/// Streaming read+write bandwidth in GB/s (a 256 MiB copy, best of three).
pub fn memory_bandwidth_gbs() -> f64 {
    let n = 32 << 20;
    let src = vec![1.0f64; n];
    let mut dst = vec![0.0f64; n];
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed());
    }
    (2 * n * 8) as f64 / best.as_secs_f64() / 1e9
}

#[cfg(test)]
mod tests {
    #[test]
    fn peaks_are_positive_and_plausible() {
        let fma = super::fma_core_gflops(1_000_000);
        assert!(fma > 0.1 && fma < 1e4, "{fma}");
        let bw = super::memory_bandwidth_gbs();
        assert!(bw > 0.1 && bw < 1e4, "{bw}");
    }
}
