//! Small kernels built with the DSL (no macro) that exercise every op.
#![allow(dead_code)]

use kernel_ir::dsl::prelude::*;
use kernel_ir::dsl::{branch, for_range, KernelOrd};
use kernel_ir::{Array, DimSemantics};

pub fn rows(i: &[IndexExpr]) -> Vec<IndexExpr> {
    vec![i[0].clone(), 0.into()]
}

/// o = x + 1 over row blocks.
pub fn add_one(m: u64, n: u64, bm: u64) -> Kernel {
    let ty = TensorType::new(DType::F32, [m, n]);
    pallas_call(|x: Ref, o: Ref| o.write(x.read() + 1.0))
        .name("add_one")
        .grid([m.div_ceil(bm)])
        .input(ty.clone(), block_spec([bm, n], rows))
        .output(ty, block_spec([bm, n], rows))
        .build()
        .unwrap()
}

/// Row softmax with a masked tail: rows past `m` are never read or written.
pub fn softmax_masked(m: u64, n: u64, bm: u64) -> Kernel {
    let ty = TensorType::new(DType::F32, [m, n]);
    pallas_call(move |x: Ref, o: Ref| {
        let row0 = program_id(0) * bm;
        let rows = iota([bm, n], 0) + row0;
        let valid = rows.lt(m);
        let v = x.load_masked(s![.., ..], valid, 0.0);
        let e = (v - v.max_keepdims(1)).exp();
        let p = e / e.sum_keepdims(1);
        o.store_masked(s![.., ..], p, valid);
    })
    .name("softmax_masked")
    .grid([m.div_ceil(bm)])
    .input(ty.clone(), block_spec([bm, n], rows))
    .output(ty, block_spec([bm, n], rows))
    .build()
    .unwrap()
}

/// Tiled matmul with a K loop over an `arbitrary` grid axis and a scratch accumulator.
pub fn matmul_grid_k(m: u64, k: u64, n: u64, bm: u64, bk: u64, bn: u64) -> Kernel {
    let nk = k / bk;
    pallas_call(move |x: Ref, y: Ref, o: Ref, acc: Ref| {
        let kk = program_id(2);
        branch(
            kk.k_lt(1),
            (),
            |v| {
                acc.write(zeros([bm, bn], DType::F32));
                (v, ())
            },
            |v| (v, ()),
        );
        acc.write(acc.read() + x.read().dot(y.read()));
        branch(
            kk.k_ge(nk as i64 - 1),
            (),
            |v| {
                o.write(acc.read());
                (v, ())
            },
            |v| (v, ()),
        );
    })
    .name("matmul_grid_k")
    .grid([m / bm, n / bn, nk])
    .dimension_semantics([
        DimSemantics::Parallel,
        DimSemantics::Parallel,
        DimSemantics::Arbitrary,
    ])
    .input(
        TensorType::new(DType::F32, [m, k]),
        block_spec([bm, bk], |i| vec![i[0].clone(), i[2].clone()]),
    )
    .input(
        TensorType::new(DType::F32, [k, n]),
        block_spec([bk, bn], |i| vec![i[2].clone(), i[1].clone()]),
    )
    .output(
        TensorType::new(DType::F32, [m, n]),
        block_spec([bm, bn], |i| vec![i[0].clone(), i[1].clone()]),
    )
    .scratch(TensorType::new(DType::F32, [bm, bn]))
    .build()
    .unwrap()
}

/// Matmul with the K loop inside the kernel: a `for` with a carried accumulator.
pub fn matmul_loop(m: u64, k: u64, n: u64, bm: u64, bk: u64) -> Kernel {
    pallas_call(move |x: Ref, y: Ref, o: Ref| {
        let acc = for_range(0, k / bk, 1, zeros([bm, n], DType::F32), |kk, acc| {
            let a = x.load(s![.., ds(kk * bk, bk)]);
            let b = y.load(s![ds(kk * bk, bk), ..]);
            acc + a.dot(b)
        });
        o.write(acc);
    })
    .name("matmul_loop")
    .grid([m / bm])
    .input(
        TensorType::new(DType::F32, [m, k]),
        block_spec([bm, k], rows),
    )
    .input(
        TensorType::new(DType::F32, [k, n]),
        block_spec([k, n], |_| vec![0.into(), 0.into()]),
    )
    .output(
        TensorType::new(DType::F32, [m, n]),
        block_spec([bm, n], rows),
    )
    .build()
    .unwrap()
}

/// Deterministic pseudo-random data in [-1, 1).
pub fn random(dtype: DType, shape: &[u64], seed: u64) -> Array {
    let n: u64 = shape.iter().product();
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let data = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    Array::from_f32(dtype, shape.to_vec(), data).unwrap()
}

pub fn naive_matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k)
                .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                .sum();
        }
    }
    c
}

pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}
