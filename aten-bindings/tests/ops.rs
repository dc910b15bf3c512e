//! The tch API against PyTorch's own ops, on every backend, with argument errors.

use aten_bindings::{
    flash_attention, layer_norm, matmul, rms_norm, rope, sdpa, softmax, swiglu, SdpaPath,
};
use runtime::Backend;
use tch::{Kind, Tensor};

fn close(a: &Tensor, b: &Tensor, tol: f64) {
    let diff = (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[]);
    assert!(diff <= tol, "max difference {diff} > {tol}");
}

fn rand(shape: &[i64]) -> Tensor {
    Tensor::randn(shape, (Kind::Float, tch::Device::Cpu))
}

#[test]
fn ops_match_pytorch_on_every_backend() {
    tch::manual_seed(0);
    for backend in [Backend::Native, Backend::Interp, Backend::Auto] {
        let x = rand(&[3, 5, 33]);
        close(
            &softmax(&x, backend).unwrap(),
            &x.softmax(-1, Kind::Float),
            1e-6,
        );
        let w = rand(&[33]);
        let b = rand(&[33]);
        close(
            &rms_norm(&x, &w, 1e-5, backend).unwrap(),
            &x.rms_norm([33], Some(&w), 1e-5),
            1e-5,
        );
        close(
            &layer_norm(&x, &w, &b, 1e-5, backend).unwrap(),
            &x.layer_norm([33], Some(&w), Some(&b), 1e-5, false),
            1e-5,
        );
        let (g, u) = (rand(&[3, 7, 20]), rand(&[3, 7, 20]));
        close(&swiglu(&g, &u, backend).unwrap(), &(g.silu() * &u), 1e-5);
        let (xr, cos, sin) = (rand(&[2, 3, 11, 8]), rand(&[11, 8]), rand(&[11, 8]));
        let rotated = Tensor::cat(&[-xr.narrow(3, 4, 4), xr.narrow(3, 0, 4)], 3);
        close(
            &rope(&xr, &cos, &sin, backend).unwrap(),
            &(&xr * &cos + rotated * &sin),
            1e-5,
        );
        let (p, q) = (rand(&[17, 40]), rand(&[40, 9]));
        close(&matmul(&p, &q, backend).unwrap(), &p.matmul(&q), 1e-4);
        let (qq, k, v) = (
            rand(&[2, 4, 19, 16]),
            rand(&[2, 2, 23, 16]),
            rand(&[2, 2, 23, 16]),
        );
        let (o, lse) = flash_attention(&qq, &k, &v, true, None, backend).unwrap();
        let want = Tensor::scaled_dot_product_attention(
            &qq,
            &k,
            &v,
            None::<Tensor>,
            0.0,
            true,
            None,
            true,
        );
        close(&o, &want, 1e-5);
        assert_eq!(lse.size(), [2, 4, 19, 1]);
    }
}

#[test]
fn sdpa_uses_tessera_when_it_can_and_pytorch_otherwise() {
    let (q, k, v) = (
        rand(&[1, 2, 8, 16]),
        rand(&[1, 2, 8, 16]),
        rand(&[1, 2, 8, 16]),
    );
    let want =
        Tensor::scaled_dot_product_attention(&q, &k, &v, None::<Tensor>, 0.0, false, None, false);
    let (out, path) = sdpa(&q, &k, &v, None, 0.0, false, None);
    assert!(matches!(path, SdpaPath::Tessera(_)), "{path:?}");
    close(&out, &want, 1e-5);
    let mask = Tensor::ones([8, 8], (Kind::Bool, tch::Device::Cpu)).tril(0);
    let (out, path) = sdpa(&q, &k, &v, Some(&mask), 0.0, false, None);
    assert!(
        matches!(path, SdpaPath::Tessera(_)),
        "a mask for every head: {path:?}"
    );
    let want =
        Tensor::scaled_dot_product_attention(&q, &k, &v, Some(&mask), 0.0, false, None, false);
    close(&out, &want, 1e-5);
    let per_head = mask.expand([1, 2, 8, 8], false).contiguous();
    let (out, path) = sdpa(&q, &k, &v, Some(&per_head), 0.0, false, None);
    assert_eq!(path, SdpaPath::PyTorch, "a mask per head");
    close(&out, &want, 0.0);
    let (_, path) = sdpa(
        &q.to_kind(Kind::Half),
        &k.to_kind(Kind::Half),
        &v.to_kind(Kind::Half),
        None,
        0.0,
        false,
        None,
    );
    assert_eq!(path, SdpaPath::PyTorch);
}

#[test]
fn bad_arguments_are_named() {
    let x = rand(&[4, 8]);
    let e = matmul(&x, &rand(&[5, 3]), Backend::Auto)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("y: expected 8 rows"), "{e}");
    let e = softmax(&x.to_kind(Kind::Int), Backend::Auto)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("x: dtype torch.int32 is not supported"),
        "{e}"
    );
    let e = rms_norm(&x, &rand(&[7]), 1e-5, Backend::Auto)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("weight: expected 8 elements, got 7"), "{e}");
    let q = rand(&[1, 3, 4, 8]);
    let e = flash_attention(
        &q,
        &rand(&[1, 2, 4, 8]),
        &rand(&[1, 2, 4, 8]),
        false,
        None,
        Backend::Auto,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("2 heads do not divide the query's 3 heads"),
        "{e}"
    );
}
