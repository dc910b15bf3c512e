//! What only the native backend does: its polynomial `exp`, `log`, `tanh`, `erf`, `sin`, `cos` and `pow`, carried buffers that swap in
//! a loop, parallel programs split across threads, and the kernels it declines.

use kernel_ir::dsl::for_range;
use kernel_ir::dsl::prelude::*;
use kernel_ir::{interpret, Array, InterpretOptions};
use lowering::cpu::Registers;
use runtime::native::{Native, NativeArray};
use runtime::{Backend, Error};

fn whole(shape: [u64; 2]) -> BlockSpecFn {
    block_spec(shape, |_| vec![0.into(), 0.into()])
}

fn f32_array(shape: [u64; 2], data: Vec<f32>) -> Array {
    Array::from_f32(DType::F32, shape, data).unwrap()
}

/// The inputs every element-wise math test starts from.
const SPECIALS: [f32; 5] = [f32::NEG_INFINITY, f32::INFINITY, f32::NAN, 0.0, -0.0];

/// One program applying `f` to a whole f32 array of `shape`.
fn unary_kernel(shape: [u64; 2], f: fn(Tensor) -> Tensor) -> kernel_ir::Kernel {
    let ty = TensorType::new(DType::F32, shape);
    pallas_call(move |x: Ref, o: Ref| o.write(f(x.read())))
        .grid([1])
        .input(ty.clone(), whole(shape))
        .output(ty, whole(shape))
        .build()
        .unwrap()
}

#[test]
fn exp_matches_libm_over_the_whole_f32_range() {
    // Rows of 16 lanes (`vscalefps` on AVX-512) and of 8 + 1 (exponent bits), for every
    // register width this CPU runs. Results under about 2e-38 are flushed to 0.
    let mut xs = SPECIALS.to_vec();
    xs.extend([
        1e-30,
        -1e-30,
        88.0,
        88.5,
        88.72,
        -87.0,
        -100.0,
        100.0,
        -95.0,
        -110.0,
        f32::MIN,
        f32::MAX,
    ]);
    while xs.len() < 144 {
        let i = xs.len() as f32;
        xs.push((i - 70.0) * 1.37);
    }
    for registers in Registers::ALL.into_iter().filter(|r| r.runs_here()) {
        let native = Native::for_registers(registers);
        for shape in [[9, 16], [16, 9]] {
            let k = unary_kernel(shape, Tensor::exp);
            let got = native.run(&k, &[f32_array(shape, xs.clone())]).unwrap();
            for (x, y) in xs.iter().zip(got[0].as_f32().unwrap()) {
                let want = x.exp();
                let ok = if want.is_nan() {
                    y.is_nan()
                } else if *x < -88.1 {
                    // Flushed to 0, never a denormal (each costs a microcode assist).
                    *y == 0.0
                } else if want.is_infinite() || *x > 88.0 {
                    *y == want || (*y - want).abs() <= 2e-6 * want
                } else {
                    (y - want).abs() <= 2e-6 * want.abs() + 1e-37
                };
                assert!(
                    ok,
                    "exp({x}) = {y}, libm says {want} ({registers:?}, {shape:?})"
                );
            }
        }
    }
}

#[test]
fn tanh_matches_libm_across_both_branches() {
    let k = unary_kernel([8, 64], Tensor::tanh);
    let mut xs = SPECIALS.to_vec();
    xs.extend([1e-30, -1e-30, 0.399_999_98, 0.4, -0.4, 9.0, 50.0, -1e4]);
    while xs.len() < 512 {
        // Dense around the branch point and out to where tanh is 1 in f32.
        let i = xs.len() as f32 - 256.0;
        xs.push(i * 0.004 + i.signum() * (i.abs() / 64.0).powi(3));
    }
    let (got, _) = runtime::run(&k, &[f32_array([8, 64], xs.clone())], Backend::Native).unwrap();
    for (x, y) in xs.iter().zip(got[0].as_f32().unwrap()) {
        let want = x.tanh();
        let ok = if want.is_nan() {
            y.is_nan()
        } else {
            (y - want).abs() <= 4e-7 * want.abs() + 1e-38 && y.signum() == want.signum()
        };
        assert!(ok, "tanh({x}) = {y}, libm says {want}");
    }
}

/// Distance from `y` to the f64 value `want` in units of the f32 spacing at `want`.
fn ulps(y: f32, want: f64) -> f64 {
    let w = want as f32;
    let next = f32::from_bits(w.abs().to_bits() + 1);
    (y as f64 - want).abs() / (next - w.abs()) as f64
}

/// Runs `f` natively on `xs` for every register width this CPU runs and checks each
/// result against `reference` in f64: NaN for NaN, infinities exactly, anything else
/// within `max_ulps` and of the reference's sign, or within `max_abs` absolute when given
/// (for results near a zero of the function, where ulps say little).
fn check_unary(
    name: &str,
    f: fn(Tensor) -> Tensor,
    reference: fn(f64) -> f64,
    mut xs: Vec<f32>,
    max_ulps: f64,
    max_abs: Option<f64>,
) {
    let rows = xs.len().div_ceil(64) as u64;
    xs.resize(rows as usize * 64, 0.5);
    for registers in Registers::ALL.into_iter().filter(|r| r.runs_here()) {
        let native = Native::for_registers(registers);
        let k = unary_kernel([rows, 64], f);
        let got = native
            .run(&k, &[f32_array([rows, 64], xs.clone())])
            .unwrap();
        for (x, y) in xs.iter().zip(got[0].as_f32().unwrap()) {
            let want = reference(*x as f64);
            let ok = if want.is_nan() {
                y.is_nan()
            } else if want.is_infinite() {
                *y as f64 == want
            } else {
                (ulps(*y, want) <= max_ulps && y.is_sign_negative() == want.is_sign_negative())
                    || max_abs.is_some_and(|m| (*y as f64 - want).abs() <= m)
            };
            assert!(
                ok,
                "{name}({x:e}) = {y:e}, libm says {want:e}: {} ulp ({registers:?})",
                ulps(*y, want)
            );
        }
    }
}

#[test]
fn erf_is_within_3_ulp_of_libm_over_the_whole_f32_range() {
    let mut xs = SPECIALS.to_vec();
    xs.extend([
        1e-45,
        -1e-40,
        1e-38,
        0.999_999_94,
        1.0,
        -1.0,
        3.999_999_8,
        4.0,
        4.5,
        -1e4,
        f32::MAX,
        f32::MIN,
    ]);
    // Dense over [-4.5, 4.5] (both branches, the clamp), then geometric down to subnormals.
    for i in -4500..=4500 {
        xs.push(i as f32 * 1e-3);
    }
    for i in 0..400 {
        xs.push(10f32.powf(-(i as f32) * 0.1));
    }
    check_unary("erf", Tensor::erf, libm::erf, xs, 3.0, None);
}

#[test]
fn log_is_within_2_ulp_of_libm_over_the_whole_f32_range() {
    let mut xs = SPECIALS.to_vec();
    xs.extend([
        -1.0,
        1.0,
        1e-45,
        1e-40,
        f32::MIN_POSITIVE,
        f32::MAX,
        std::f32::consts::SQRT_2,
        std::f32::consts::FRAC_1_SQRT_2,
        0.999_999_94,
        1.000_000_1,
    ]);
    // Dense around 1 (both sides of the mantissa split), then geometric over every binade.
    for i in 0..3000 {
        xs.push(0.5 + i as f32 * 5e-4);
    }
    for i in 0..1700 {
        xs.push(2f32.powf(-149.0 + i as f32 * 0.16));
    }
    check_unary("log", Tensor::log, f64::ln, xs, 2.0, None);
}

/// `sin` and `cos` against libm: within 2 ulp, or 1e-7 absolute near their zeros (the
/// reduction by pi/2 leaves that much), for |x| < 1e5 over every quadrant and around
/// multiples of pi/2; NaN for infinities and NaN; `sin(-0) = -0`.
#[test]
fn sin_and_cos_are_within_2_ulp_of_libm() {
    let mut xs = SPECIALS.to_vec();
    xs.extend([
        1e-30,
        -1e-30,
        1e-3,
        std::f32::consts::FRAC_PI_4,
        1e5 - 1.0,
        -99_999.0,
    ]);
    for i in -2000..=2000 {
        xs.push(i as f32 * 0.0123);
    }
    for k in -200..=200 {
        let near = k as f32 * std::f32::consts::FRAC_PI_2;
        xs.extend([
            near,
            f32::from_bits(near.to_bits() + 1),
            f32::from_bits(near.to_bits().wrapping_sub(1)),
        ]);
    }
    for i in 0..500 {
        xs.push(1.1f32.powi(i) * if i % 2 == 0 { 1.0 } else { -1.0 });
    }
    xs.retain(|x| !x.is_finite() || x.abs() < 1e5);
    check_unary("sin", Tensor::sin, f64::sin, xs.clone(), 2.0, Some(1e-7));
    check_unary("cos", Tensor::cos, f64::cos, xs, 2.0, Some(1e-7));
    let k = unary_kernel([1, 64], Tensor::sin);
    let (got, _) =
        runtime::run(&k, &[f32_array([1, 64], vec![-0.0; 64])], Backend::Native).unwrap();
    assert!(got[0]
        .as_f32()
        .unwrap()
        .iter()
        .all(|y| *y == 0.0 && y.is_sign_negative()));
}

/// `pow` against f64 `powf` (C's rules) over every pairing of bases and exponents:
/// signs, zeros, infinities, NaN, integer and fractional exponents, results that
/// overflow and underflow. Finite results are within `4 + |y ln x|` ulp (the log's
/// error scaled by the exponent), results under 2.5e-38 may be flushed to 0.
#[test]
fn pow_follows_c_and_stays_within_its_bound() {
    let mut bases = SPECIALS.to_vec();
    bases.extend([
        1.0,
        -1.0,
        0.5,
        -0.5,
        2.0,
        -2.0,
        1e-30,
        3e-39,
        7.5,
        -7.5,
        1e30,
        f32::MAX,
    ]);
    bases.extend((0..40).map(|i| 0.05 + i as f32 * 0.37));
    let mut exponents = SPECIALS.to_vec();
    exponents.extend([
        1.0, -1.0, 2.0, 3.0, -3.0, 0.5, 1.5, -2.5, 7.3, 10.0, -10.0, 31.0, 100.0, -100.0, 1e9,
    ]);
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for &x in &bases {
        for &y in &exponents {
            xs.push(x);
            ys.push(y);
        }
    }
    let rows = xs.len().div_ceil(64) as u64;
    xs.resize(rows as usize * 64, 1.0);
    ys.resize(rows as usize * 64, 1.0);
    let ty = TensorType::new(DType::F32, [rows, 64]);
    let k = pallas_call(|x: Ref, y: Ref, o: Ref| o.write(x.read().pow(y.read())))
        .grid([1])
        .input(ty.clone(), whole([rows, 64]))
        .input(ty.clone(), whole([rows, 64]))
        .output(ty.clone(), whole([rows, 64]))
        .build()
        .unwrap();
    for registers in Registers::ALL.into_iter().filter(|r| r.runs_here()) {
        let native = Native::for_registers(registers);
        let inputs = [
            f32_array([rows, 64], xs.clone()),
            f32_array([rows, 64], ys.clone()),
        ];
        let got = native.run(&k, &inputs).unwrap();
        for ((x, y), got) in xs.iter().zip(&ys).zip(got[0].as_f32().unwrap()) {
            check_pow(*x, *y, *got, &format!("{registers:?}"));
        }
    }
    // Constant exponents take their own path (the sign rule decided when compiling).
    for c in [0.0, 1.0, 2.0, -1.0, 3.0, -3.0, 0.5, 1.5, -2.5, 10.0, 31.0] {
        let k = pallas_call(move |x: Ref, o: Ref| o.write(x.read().pow(c)))
            .grid([1])
            .input(ty.clone(), whole([rows, 64]))
            .output(ty.clone(), whole([rows, 64]))
            .build()
            .unwrap();
        let inputs = [f32_array([rows, 64], xs.clone())];
        let (got, _) = runtime::run(&k, &inputs, Backend::Native).unwrap();
        for (x, got) in xs.iter().zip(got[0].as_f32().unwrap()) {
            check_pow(*x, c as f32, *got, "a constant exponent");
        }
    }
}

/// `got = x^y` as C's `pow` has it: NaN, infinities and signs exactly, results under
/// 2.5e-38 possibly flushed to 0, the rest within `4 + |y ln x|` ulp.
fn check_pow(x: f32, y: f32, got: f32, case: &str) {
    let want = (x as f64).powf(y as f64);
    let ok = if want.is_nan() {
        got.is_nan()
    } else if (want as f32).is_infinite() {
        got == want as f32
    } else if want.abs() < 2.5e-38 {
        // exp flushes results under 2^-125 to 0.
        got.abs() <= 2.5e-38 && (got == 0.0 || got.signum() as f64 == want.signum())
    } else {
        let scale = (y as f64 * (x as f64).abs().ln()).abs();
        let bound = 4.0 + if scale.is_nan() { 0.0 } else { scale };
        ulps(got, want) <= bound && got.is_sign_negative() == want.is_sign_negative()
    };
    assert!(
        ok,
        "pow({x:e}, {y:e}) = {got:e}, C says {want:e}: {} ulp ({case})",
        ulps(got, want)
    );
}

/// A kernel that prints in a loop on a 2-d grid: an i32 scalar, f32 and bool tensors.
fn printing_kernel() -> kernel_ir::Kernel {
    let ty = TensorType::new(DType::F32, [4, 8]);
    pallas_call(|x: Ref, o: Ref| {
        let v = x.read();
        let acc = for_range(0, 2, 1, v, |j, acc| {
            kernel_ir::debug_print!("step", j, acc.sum(1), acc.gt(0.5));
            acc * 2.0
        });
        o.write(acc);
    })
    .grid([2, 3])
    .input(
        ty.clone(),
        block_spec([2, 8], |i| vec![i[0].clone(), 0.into()]),
    )
    .output(ty, block_spec([2, 8], |i| vec![i[0].clone(), 0.into()]))
    .build()
    .unwrap()
}

/// Child side of [`native_debug_prints_match_the_interpreter`]: runs the printing
/// kernel on the backend named by `TESSERA_PRINT_CHILD`.
#[test]
fn print_child() {
    let Ok(backend) = std::env::var("TESSERA_PRINT_CHILD") else {
        return;
    };
    let backend = if backend == "native" {
        Backend::Native
    } else {
        Backend::Interp
    };
    let x: Vec<f32> = (0..32).map(|i| i as f32 / 16.0).collect();
    runtime::run(&printing_kernel(), &[f32_array([4, 8], x)], backend).unwrap();
}

#[test]
fn native_debug_prints_match_the_interpreter() {
    let lines = |backend: &str| {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "native::print_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("TESSERA_PRINT_CHILD", backend)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut lines: Vec<String> = String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.starts_with("[program"))
            .map(String::from)
            .collect();
        // Programs of the parallel axis may run on different threads.
        lines.sort();
        lines
    };
    let (interp, native) = (lines("interp"), lines("native"));
    assert_eq!(interp.len(), 12, "{interp:#?}");
    assert_eq!(interp, native);
    assert_eq!(
        interp[0],
        "[program (0, 0)] step 0 f32[2] [1.75, 5.75] bool[2,8] [false, false, false, false, \
         false, false, false, false, false, true, true, true, true, true, true, true]"
    );
}

#[test]
fn loops_that_swap_carried_tensors_match_the_interpreter() {
    let ty = TensorType::new(DType::F32, [4, 8]);
    let k = pallas_call(|x: Ref, o: Ref| {
        let a = x.read();
        let b = a * 2.0 + 1.0;
        // Fibonacci on tensors: the next `a` is the old `b`, the next `b` reads both.
        let (a, b) = for_range(0, 5, 1, (a, b), |_, (a, b)| (b, a + b.t().t()));
        o.write(a * 10.0 + b);
    })
    .grid([1])
    .input(ty.clone(), whole([4, 8]))
    .output(ty, whole([4, 8]))
    .build()
    .unwrap();
    let x = f32_array([4, 8], (0..32).map(|i| i as f32 * 0.25).collect());
    let want = interpret(&k, std::slice::from_ref(&x), &InterpretOptions::default()).unwrap();
    let (got, _) = runtime::run(&k, &[x], Backend::Native).unwrap();
    assert_eq!(got, want);
}

#[test]
fn parallel_programs_write_their_own_blocks() {
    // 37 programs on however many cores (the arrays are large enough to be split: small
    // kernels run on the calling thread): each writes its row block plus its program id.
    let ty = TensorType::new(DType::F32, [37 * 8, 256]);
    let k = pallas_call(|x: Ref, o: Ref| {
        let p = program_id(0).cast(DType::F32);
        o.write(x.read() + p.broadcast_to([8, 256]));
    })
    .grid([37])
    .input(
        ty.clone(),
        block_spec([8, 256], |i| vec![i[0].clone(), 0.into()]),
    )
    .output(ty, block_spec([8, 256], |i| vec![i[0].clone(), 0.into()]))
    .build()
    .unwrap();
    let x = f32_array([37 * 8, 256], (0..37 * 8 * 256).map(|i| i as f32).collect());
    let want = interpret(&k, std::slice::from_ref(&x), &InterpretOptions::default()).unwrap();
    let (got, _) = runtime::run(&k, &[x], Backend::Native).unwrap();
    assert_eq!(got, want);
}

fn computed_divisor() -> kernel_ir::Kernel {
    let ty = TensorType::new(DType::I32, [8, 8]);
    pallas_call(|a: Ref, b: Ref, o: Ref| o.write(a.read() / b.read()))
        .grid([1])
        .input(ty.clone(), whole([8, 8]))
        .input(ty.clone(), whole([8, 8]))
        .output(ty, whole([8, 8]))
        .build()
        .unwrap()
}

#[test]
fn integer_division_by_a_computed_divisor_falls_back_with_the_reason() {
    let k = computed_divisor();
    let reason = Backend::Native
        .unavailable_because(&k)
        .expect("native declines");
    assert!(reason.contains("division by zero"), "{reason}");
    match runtime::resolve(Backend::Native, &k) {
        Err(Error::Unavailable { backend, .. }) => assert_eq!(backend, Backend::Native),
        other => panic!("expected an error, got {other:?}"),
    }
    let r = runtime::resolve(Backend::Auto, &k).unwrap();
    assert_ne!(r.backend, Backend::Native);
    assert!(
        r.fallbacks[0].starts_with("native: integer div"),
        "{:?}",
        r.fallbacks
    );
}

#[test]
fn the_jit_reports_bad_modules_instead_of_crashing() {
    use runtime::cache::Compiler;
    let jit = runtime::native::JitCompiler;
    let e = jit.compile("module { func.func @k( }").err().unwrap();
    assert!(e.contains("could not parse"), "{e}");
    // Parses, but no pass lowers `tensor.empty` to LLVM.
    let e = jit
        .compile("module { func.func @k() -> tensor<4xf32> { %0 = tensor.empty() : tensor<4xf32> return %0 : tensor<4xf32> } }")
        .err()
        .unwrap();
    assert!(!e.is_empty());
    let ok = "module { func.func @k() attributes {llvm.emit_c_interface} { return } }";
    assert!(jit.compile(ok).is_ok());
}

#[test]
fn in_place_runs_read_and_write_caller_storage() {
    // 13 rows in blocks of 4: the input is padded through a copy, the output unpadded.
    let lib = kernels::find("softmax").unwrap();
    let p = kernels::Params::parse(
        lib.params(),
        &["rows=13".into(), "cols=70".into(), "block_rows=4".into()],
    )
    .unwrap();
    let k = &lib.build(&p).unwrap()[0];
    let x = lib.inputs(&p, 7).unwrap();
    let want = interpret(k, &x, &InterpretOptions::default()).unwrap();
    let mut out = vec![f32::NAN; 13 * 70];
    let native = runtime::native::backend();
    unsafe {
        native
            .run_in_place(
                k,
                &[x[0].as_f32().unwrap().as_ptr() as *const _],
                &[out.as_mut_ptr() as *mut _],
            )
            .unwrap();
    }
    for (a, b) in out.iter().zip(want[0].as_f32().unwrap()) {
        assert!((a - b).abs() <= 1e-6, "{a} vs {b}");
    }
    // bf16 and f16 in their 2-byte form, as tensors hold them (ragged rows again).
    for dtype in ["bf16", "f16"] {
        let pairs = [
            "rows=13".into(),
            "cols=70".into(),
            "block_rows=4".into(),
            format!("dtype={dtype}"),
        ];
        let p16 = kernels::Params::parse(lib.params(), &pairs).unwrap();
        let k16 = &lib.build(&p16).unwrap()[0];
        let x = lib.inputs(&p16, 7).unwrap();
        let d = x[0].dtype();
        let want = interpret(k16, &x, &InterpretOptions::default()).unwrap();
        let bits: Vec<u16> = x[0]
            .as_f32()
            .unwrap()
            .iter()
            .map(|&v| kernel_ir::to_half_bits(d, v))
            .collect();
        let mut out = vec![u16::MAX; 13 * 70];
        unsafe {
            native
                .run_in_place(
                    k16,
                    &[bits.as_ptr() as *const _],
                    &[out.as_mut_ptr() as *mut _],
                )
                .unwrap();
        }
        let got: Vec<f32> = out
            .iter()
            .map(|&b| kernel_ir::from_half_bits(d, b))
            .collect();
        for (a, b) in got.iter().zip(want[0].as_f32().unwrap()) {
            assert!(
                (a - b).abs() <= 1e-2 * (1.0 + b.abs()),
                "{dtype}: {a} vs {b}"
            );
        }
        // The same through arrays converted to that layout once, and reused outputs.
        let prepared = native.prepare(k16).unwrap();
        let ins = [NativeArray::from_array(&x[0]).unwrap()];
        let mut outs = [NativeArray::zeros(k16.output_types()[0].clone(), "out").unwrap()];
        prepared.run_on(&ins, &mut outs).unwrap();
        let [out] = outs;
        assert_eq!(out.into_array().unwrap().as_f32().unwrap(), got);
    }
    let e = unsafe { native.run_in_place(k, &[], &[]) };
    assert!(e
        .unwrap_err()
        .to_string()
        .contains("takes 1 inputs and 1 outputs"));
}

/// Runs a `[6, cols]` -> `[6, cols]` kernel natively and with the interpreter on the same
/// inputs and compares (f32: 1e-5, bf16: 2e-2, relative to 1 + |want|).
fn native_matches_interpreter_on_rows(k: &kernel_ir::Kernel, dtype: DType, cols: u64) {
    let x = Array::from_f32(
        dtype,
        [6, cols],
        (0..6 * cols)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 3.0)
            .collect(),
    )
    .unwrap();
    let want = interpret(k, std::slice::from_ref(&x), &InterpretOptions::default()).unwrap();
    let (got, _) = runtime::run(k, &[x], Backend::Native).unwrap();
    let tol = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
    for (a, b) in got[0].to_f64().iter().zip(want[0].to_f64()) {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{dtype} cols={cols}: {a} vs {b}"
        );
    }
}

#[test]
fn reductions_fused_into_the_pass_that_stores_their_operand() {
    // `e` is stored (three uses); its row sum and row max are computed in that pass.
    // 45 columns: a 16-lane run, an 8-lane run and a scalar tail.
    for (cols, dtype) in [(45, DType::F32), (64, DType::BF16), (5, DType::F32)] {
        let ty = TensorType::new(dtype, [6, cols]);
        let k = pallas_call(move |x: Ref, o: Ref| {
            let e = (x.read() * 0.5).exp();
            let total = e.sum_keepdims(1) + e.max_keepdims(1);
            o.write(e * 2.0 + total.broadcast_to([6, cols]));
        })
        .grid([1])
        .input(ty.clone(), whole([6, cols]))
        .output(ty, whole([6, cols]))
        .build()
        .unwrap();
        native_matches_interpreter_on_rows(&k, dtype, cols);
    }
}

#[test]
fn cheap_values_read_twice_are_recomputed_not_stored() {
    // `centered` (one subtract of a load and a broadcast) is read by the variance and by
    // the output: it gets no buffer, and the results equal the interpreter's.
    for (cols, dtype) in [(45, DType::F32), (64, DType::BF16), (5, DType::F32)] {
        let ty = TensorType::new(dtype, [6, cols]);
        let k = pallas_call(move |x: Ref, o: Ref| {
            let v = x.read();
            let centered = v - v.sum_keepdims(1) / cols as f64;
            let var = (centered * centered).sum_keepdims(1) / cols as f64;
            o.write(centered * (var + 1e-5).rsqrt());
        })
        .grid([1])
        .input(ty.clone(), whole([6, cols]))
        .output(ty, whole([6, cols]))
        .build()
        .unwrap();
        let module = lowering::cpu::lower(&k, lowering::cpu::Registers::host());
        let block = format!("memref<6x{cols}xf32>");
        assert!(
            !module
                .text
                .lines()
                .any(|l| l.contains("memref.alloc") && l.contains(&block)),
            "a {block} buffer:\n{}",
            module.text
        );
        native_matches_interpreter_on_rows(&k, dtype, cols);
    }
}

#[test]
fn row_max_and_sum_propagate_nan_from_every_lane() {
    // 48 columns: 4 accumulators of 8 lanes, then the partials combined by halving.
    let cols = 48u64;
    let ty = TensorType::new(DType::F32, [cols, cols]);
    let rows_ty = TensorType::new(DType::F32, [cols, 2]);
    let k = pallas_call(move |x: Ref, o: Ref| {
        let v = x.read();
        o.store(s![.., ds(0, 1)], v.max_keepdims(1));
        o.store(s![.., ds(1, 1)], v.sum_keepdims(1));
    })
    .grid([1])
    .input(ty, whole([cols, cols]))
    .output(rows_ty, whole([cols, 2]))
    .build()
    .unwrap();
    // Row r has a NaN in column r - 1 (row 0 has none): every lane position.
    let data: Vec<f32> = (0..cols * cols)
        .map(|i| {
            let (r, c) = (i / cols, i % cols);
            if r > 0 && c == r - 1 {
                f32::NAN
            } else {
                (c as f32 - 20.0) * 0.25
            }
        })
        .collect();
    let x = Array::from_f32(DType::F32, [cols, cols], data).unwrap();
    let (got, _) = runtime::run(&k, std::slice::from_ref(&x), Backend::Native).unwrap();
    let got = got[0].to_f64();
    assert_eq!((got[0], got[1]), (6.75, 42.0), "row 0: max and sum");
    for r in 1..cols as usize {
        assert!(
            got[2 * r].is_nan() && got[2 * r + 1].is_nan(),
            "row {r}: {:?}",
            &got[2 * r..2 * r + 2]
        );
    }
}

#[test]
fn dynamic_indices_outside_the_block_are_errors_not_wild_accesses() {
    let ty = TensorType::new(DType::F32, [16]);
    let k = pallas_call(|x: Ref, o: Ref| {
        // Program 1 starts its slice at 12: elements 12..20 of a 16-element block.
        let start = program_id(0) * 12;
        o.store(s![ds(0, 8)], x.load(s![ds(start, 8)]));
    })
    .grid([2])
    .input(ty.clone(), block_spec([16], |_| vec![0.into()]))
    .output(
        TensorType::new(DType::F32, [16]),
        block_spec([8], |i| vec![i[0].clone()]),
    )
    .build()
    .unwrap();
    let x = Array::from_f32(DType::F32, [16], (0..16).map(|i| i as f32).collect()).unwrap();
    assert!(interpret(&k, std::slice::from_ref(&x), &InterpretOptions::default()).is_err());
    let e = runtime::run(&k, &[x], Backend::Native)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("a dynamic index of the load of `%in0` left its block"),
        "{e}"
    );
}

#[test]
fn dots_of_every_layout_and_integer_dots_match_the_interpreter() {
    // 13 x 11 x 19 and x 57: every micro-kernel edge for both register widths (rows % 6
    // or 8; columns past the 16- or 32-wide tiles in strips of 16, 8 and 1);
    // 16 x 24 x 32: transposed operands go through 8x8 register transposes.
    let widths: Vec<(Native, Registers)> = Registers::ALL
        .into_iter()
        .filter(|r| r.runs_here())
        .map(|r| (Native::for_registers(r), r))
        .collect();
    for (dtype, (m, kk, n)) in [
        (DType::F32, (13, 11, 19)),
        (DType::F32, (13, 11, 57)),
        (DType::I32, (13, 11, 19)),
        (DType::F32, (16, 24, 32)),
    ] {
        for (tl, tr) in [(false, false), (true, false), (false, true), (true, true)] {
            let a_shape = if tl { [kk, m] } else { [m, kk] };
            let b_shape = if tr { [n, kk] } else { [kk, n] };
            let (at, bt) = (
                TensorType::new(dtype, a_shape),
                TensorType::new(dtype, b_shape),
            );
            let out_dtype = if dtype == DType::F32 {
                DType::F32
            } else {
                DType::I32
            };
            let k = pallas_call(move |a: Ref, b: Ref, o: Ref| {
                o.write(dot_general(a.read(), b.read(), tl, tr))
            })
            .grid([1])
            .input(at, whole(a_shape))
            .input(bt, whole(b_shape))
            .output(TensorType::new(out_dtype, [m, n]), whole([m, n]))
            .build()
            .unwrap();
            let fill = |shape: [u64; 2], salt: i32| -> Array {
                let n = (shape[0] * shape[1]) as i32;
                let v: Vec<i32> = (0..n).map(|i| (i * 7 + salt) % 11 - 5).collect();
                match dtype {
                    DType::I32 => Array::from_i32(shape, v).unwrap(),
                    _ => f32_array(shape, v.iter().map(|&x| x as f32 * 0.5).collect()),
                }
            };
            let inputs = [fill(a_shape, 1), fill(b_shape, 3)];
            let want = interpret(&k, &inputs, &InterpretOptions::default()).unwrap();
            let (got, _) = runtime::run(&k, &inputs, Backend::Native).unwrap();
            assert_eq!(got, want, "{dtype} transpose_lhs={tl} transpose_rhs={tr}");
            for (native, registers) in &widths {
                let got = native.run(&k, &inputs).unwrap();
                assert_eq!(
                    got, want,
                    "{dtype} {m}x{kk}x{n} transpose_lhs={tl} transpose_rhs={tr} for {registers:?}"
                );
            }
        }
    }
}

/// Scratch and block buffers are malloc'ed by the JIT'd code, which cannot fail
/// cleanly: a kernel whose buffers cannot be allocated is refused before it runs, on
/// every backend, with the interpreter's error.
#[test]
fn buffers_too_large_for_memory_are_refused_before_running() {
    let text = "kernel @k grid [1] semantics [parallel] {\n\
                out %o : f32[8, 128] block [8, 128] map (i0) -> (0, 0) vmem\n\
                scratch %s : f32[16777216, 16777216] vmem\n\
                body {\n%0 = const 1.0 : f32[8, 128]\nstore %o[:, :], %0\n}\n}";
    let k = kernel_ir::parse_kernel(text).unwrap();
    for backend in [Backend::Native, Backend::Xla, Backend::Interp] {
        if backend.unavailable_because(&k).is_some() {
            continue;
        }
        match runtime::run(&k, &[], backend) {
            Err(Error::Run(kernel_ir::RunError::Alloc(e))) => {
                assert_eq!(e.bytes, Some(1 << 50), "{backend}");
                assert!(e.what.starts_with("scratch %s"), "{backend}: {e}");
            }
            other => panic!("{backend}: expected an allocation error, got {other:?}"),
        }
    }
}

/// The buffers JIT'd code allocates are kept per thread and reused by the next call, not
/// page-faulted in afresh (the engine's `malloc`/`free` are the runtime's pool).
#[test]
fn kernel_buffers_are_reused_across_calls() {
    let op = kernels::find("softmax").unwrap();
    let p = kernels::Params::parse(op.params(), &["rows=16,cols=256".into()]).unwrap();
    let kernel = op.build(&p).unwrap().remove(0);
    let inputs = op.inputs(&p, 0).unwrap();
    // Small enough to run on the calling thread, whose pool this reads.
    let before = runtime::native::buffers::pooled_bytes();
    runtime::run(&kernel, &inputs, Backend::Native).unwrap();
    let after_one = runtime::native::buffers::pooled_bytes();
    assert!(
        after_one > before,
        "the softmax's row buffers were not pooled"
    );
    for _ in 0..3 {
        runtime::run(&kernel, &inputs, Backend::Native).unwrap();
    }
    assert_eq!(
        runtime::native::buffers::pooled_bytes(),
        after_one,
        "later calls must reuse the pooled buffers"
    );
}

#[test]
fn padded_copies_start_zeroed_when_the_pool_hands_back_used_blocks() {
    // A 10x16 array in 8-row blocks is padded to 16x16 (1 KiB) for native code, in
    // blocks of the calling thread's pool (the run is small enough to stay on it). The
    // output accumulates over the sequential axis, so it must start at zero although the
    // pool holds two 1 KiB blocks full of NaN bytes, which the copies take.
    let ty = TensorType::new(DType::F32, [10, 16]);
    let spec = || block_spec([8, 16], |i| vec![i[0].clone(), 0.into()]);
    let k = pallas_call(|x: Ref, o: Ref| o.write(o.read() + x.read()))
        .grid([2, 3])
        .dimension_semantics([
            kernel_ir::DimSemantics::Parallel,
            kernel_ir::DimSemantics::Arbitrary,
        ])
        .input(ty.clone(), spec())
        .output(ty, spec())
        .build()
        .unwrap();
    let x = f32_array([10, 16], (0..160).map(|i| i as f32).collect());
    let want: Vec<f64> = (0..160).map(|i| 3.0 * i as f64).collect();
    let pooled = || runtime::native::buffers::pooled_bytes();
    let mut steady = 0;
    for run in 0..3 {
        let padded = 16 * 16 * 4;
        let blocks = [0; 2].map(|_| runtime::native::buffers::malloc(padded));
        for b in blocks {
            // SAFETY: a live block of `padded` bytes.
            unsafe { std::ptr::write_bytes(b as *mut u8, 0xff, padded) };
            runtime::native::buffers::free(b);
        }
        let (got, _) = runtime::run(&k, std::slice::from_ref(&x), Backend::Native).unwrap();
        assert_eq!(got[0].to_f64(), want, "run {run}");
        if run == 1 {
            steady = pooled();
        }
    }
    assert_eq!(pooled(), steady, "later runs reuse the pooled blocks");
}
