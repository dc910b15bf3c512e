//! The README's kernel, from a crate that knows only `tessera`: built, run on the
//! interpreter (the only backend without features) and checked.

include!("readme.rs");

/// The other Rust snippets of the docs, compiled (`tests/outside_crate.rs` writes them).
mod snippets;

use tessera::kernel_ir::Array;
use tessera::runtime::{run, Backend};

fn main() {
    // 37 rows: the last block of 8 overhangs the array (Pallas's edge-block semantics).
    let (rows, cols) = (37, 512);
    let xs: Vec<f32> = (0..rows * cols).map(|i| (i % 7) as f32 - 3.0).collect();
    let ws: Vec<f32> = (0..cols).map(|i| 1.0 + (i % 3) as f32).collect();
    let x = Array::from_f32(DType::F32, [rows, cols], xs.clone()).unwrap();
    let w = Array::from_f32(DType::F32, [cols], ws.clone()).unwrap();
    let kernel = build(rows, cols).unwrap();
    let (out, resolution) = run(&kernel, &[x, w], Backend::Auto).unwrap();
    assert_eq!(resolution.backend, Backend::Interp, "{:?}", resolution.fallbacks);
    let got = out[0].as_f32().unwrap();
    for (r, row) in xs.chunks(cols as usize).enumerate() {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / cols as f32;
        for (c, v) in row.iter().enumerate() {
            let want = v / (ms + 1e-5).sqrt() * ws[c];
            let g = got[r * cols as usize + c];
            assert!((g - want).abs() <= 1e-4 * (1.0 + want.abs()), "[{r}, {c}]: {g} vs {want}");
        }
    }
    println!("ok: rms_norm on {}", resolution.backend);
}
