//! Element-wise ops on registers: arithmetic, comparisons, casts, bf16/f16 rounding, and
//! the polynomial `exp`, `log`, `sin` and `cos`, the `tanh` and `erf` built on `exp`, and
//! `pow` built on `exp` and `log`.

use super::*;

/// `n` below which AVX-512's `exp` gives 0 (`2^n` times the polynomial stays a normal
/// number from here up; exp there is under 2.4e-38).
const SCALEF_FLOOR: f64 = -125.0;

impl<'k> Emitter<'k> {
    pub(super) fn elementwise(
        &mut self,
        result: Value,
        kind: &OpKind,
        ty: &TensorType,
        following: &[Op],
    ) -> Val {
        let operands: Vec<(Val, DType)> = kind
            .operands()
            .iter()
            .map(|&v| (self.val(v), self.ty(v).dtype))
            .collect();
        let expr = Val::Expr(std::rc::Rc::new(Expr {
            kind: kind.clone(),
            operands,
            dtype: ty.dtype,
        }));
        if ty.is_scalar() {
            let lane = Lane {
                idx: vec![],
                width: 1,
            };
            return Val::Scalar(self.read(&expr, ty.dtype, &lane));
        }
        if self.fused.contains(&result) {
            return expr;
        }
        let mut compute = |e: &mut Self, lane: &Lane| e.read(&expr, ty.dtype, lane);
        // Reductions of this result along its last dim later in the region are computed
        // while it is stored (softmax's sum of exps, attention's row sums).
        let rank = ty.rank();
        let reductions: Vec<(ReduceOp, Value)> = following
            .iter()
            .filter_map(|op| match &op.kind {
                OpKind::Reduce { op: r, x, axes } if *x == result && axes == &[rank - 1] => {
                    Some((*r, op.results[0]))
                }
                _ => None,
            })
            .collect();
        if reductions.is_empty() || ty.dtype == DType::Bool {
            return self.materialize(ty, &mut compute);
        }
        self.materialize_reducing(ty, &mut compute, &reductions)
    }

    /// `erf` on vectors, no libm call (LLVM has no vector `erf`): for `|x| < 1`,
    /// `x * P(x^2)` (degree 5 in `x^2`); above, `1 - exp(-x^2) * G(|x|)` (`G` of degree 10
    /// fitting `erfc(a) e^(a^2)` on [1, 4]) with the polynomial [`Self::exp`]; `|x|` is
    /// clamped to 4, where `erf` is 1 in f32, and the sign of `x` restored. Within 3 ulp
    /// of libm over the whole f32 range (the coefficients are least-squares fits made for
    /// this, checked against `erf` in f64); NaN passes through the `exp` branch.
    fn erf(&mut self, x: &str, width: u64) -> String {
        const NEAR: [f64; 6] = [
            -5.625_399_062_409_997e-4,
            4.916_026_722_639_799e-3,
            -2.670_995_518_565_178e-2,
            1.128_013_059_496_879_6e-1,
            -3.761_231_899_261_474_6e-1,
            1.128_379_106_521_606_4,
        ];
        const FAR: [f64; 11] = [
            1.498_161_736_890_324_4e-6,
            -4.378_835_001_261_905e-5,
            5.791_969_597_339_63e-4,
            -4.594_458_267_092_705e-3,
            2.443_726_547_062_397e-2,
            -9.242_025_762_796_402e-2,
            2.575_716_972_351_074e-1,
            -5.418_185_591_697_693e-1,
            8.737_443_089_485_168e-1,
            -1.082_141_637_802_124,
            9.922_682_046_890_259e-1,
        ];
        let t = lanes_of("f32", width);
        let st = select_type(width, &t);
        let c = |e: &mut Self, v: f64| e.literal(DType::F32, v, width);
        let abs = self.assign(&format!("math.absf {x} : {t}"));
        let four = c(self, 4.0);
        // `ogt` is false for NaN, which stays.
        let big = self.assign(&format!("arith.cmpf ogt, {abs}, {four} : {t}"));
        let a = self.assign(&format!("arith.select {big}, {four}, {abs} : {st}"));
        let a2 = self.assign(&format!("arith.mulf {a}, {a} : {t}"));
        let p = self.horner(&NEAR, &a2, width);
        let near = self.assign(&format!("arith.mulf {a}, {p} : {t}"));
        let g = self.horner(&FAR, &a, width);
        let minus_a2 = self.assign(&format!("arith.negf {a2} : {t}"));
        let e = self.exp(&minus_a2, width);
        let minus_e = self.assign(&format!("arith.negf {e} : {t}"));
        let one = c(self, 1.0);
        let far = self.assign(&format!("math.fma {minus_e}, {g}, {one} : {t}"));
        let small = self.assign(&format!("arith.cmpf olt, {a}, {one} : {t}"));
        let r = self.assign(&format!("arith.select {small}, {near}, {far} : {st}"));
        self.assign(&format!("math.copysign {r}, {x} : {t}"))
    }

    /// `log` on vectors, no libm call (LLVM would call `logf` lane by lane): `x = m 2^e`
    /// read from the bits (subnormals scaled by `2^23` first) with `m` in `[sqrt(1/2),
    /// sqrt(2))`, then `e ln2 + log1p(f)` for `f = m - 1`, `log1p(f) = f - f^2/2 + f^3
    /// P(f)` (`P` of degree 7, a least-squares fit made for this, checked against `log`
    /// in f64). Within 2 ulp of libm over the whole f32 range; 0 gives `-inf`, negative
    /// numbers NaN, `+inf` itself, NaN itself.
    fn log(&mut self, x: &str, width: u64) -> String {
        const P: [f64; 8] = [
            -8.101_719_617_843_628e-2,
            1.271_246_224_641_8e-1,
            -1.297_224_760_055_542e-1,
            1.420_215_517_282_486e-1,
            -1.664_224_565_029_144_3e-1,
            2.000_146_955_251_693_7e-1,
            -2.500_029_802_322_387_7e-1,
            3.333_332_836_627_96e-1,
        ];
        let (t, ti) = (lanes_of("f32", width), lanes_of("i32", width));
        let (st, sti) = (select_type(width, &t), select_type(width, &ti));
        let c = |e: &mut Self, v: f64| e.literal(DType::F32, v, width);
        let ci = |e: &mut Self, v: f64| e.literal(DType::I32, v, width);
        // Subnormals: scaled into the normal range, their exponent corrected below.
        let min_normal = c(self, f32::MIN_POSITIVE as f64);
        let small = self.assign(&format!("arith.cmpf olt, {x}, {min_normal} : {t}"));
        let two_23 = c(self, 8_388_608.0);
        let scaled = self.assign(&format!("arith.mulf {x}, {two_23} : {t}"));
        let xs = self.assign(&format!("arith.select {small}, {scaled}, {x} : {st}"));
        let bits = self.assign(&format!("arith.bitcast {xs} : {t} to {ti}"));
        let (k23, k127, k0) = (ci(self, 23.0), ci(self, 127.0), ci(self, 0.0));
        let biased = self.assign(&format!("arith.shrsi {bits}, {k23} : {ti}"));
        let e = self.assign(&format!("arith.subi {biased}, {k127} : {ti}"));
        let adjust = self.assign(&format!("arith.select {small}, {k23}, {k0} : {sti}"));
        let e = self.assign(&format!("arith.subi {e}, {adjust} : {ti}"));
        // The mantissa with the exponent of 1: m in [1, 2), halved above sqrt(2).
        let (mask, one_bits) = (ci(self, 8_388_607.0), ci(self, 1_065_353_216.0));
        let mantissa = self.assign(&format!("arith.andi {bits}, {mask} : {ti}"));
        let m_bits = self.assign(&format!("arith.ori {mantissa}, {one_bits} : {ti}"));
        let m = self.assign(&format!("arith.bitcast {m_bits} : {ti} to {t}"));
        let sqrt2 = c(self, std::f64::consts::SQRT_2);
        let big = self.assign(&format!("arith.cmpf ogt, {m}, {sqrt2} : {t}"));
        let half = c(self, 0.5);
        let halved = self.assign(&format!("arith.mulf {m}, {half} : {t}"));
        let m = self.assign(&format!("arith.select {big}, {halved}, {m} : {st}"));
        let k1 = ci(self, 1.0);
        let carry = self.assign(&format!("arith.select {big}, {k1}, {k0} : {sti}"));
        let e = self.assign(&format!("arith.addi {e}, {carry} : {ti}"));
        let ef = self.assign(&format!("arith.sitofp {e} : {ti} to {t}"));
        let one = c(self, 1.0);
        let f = self.assign(&format!("arith.subf {m}, {one} : {t}"));
        // f - f^2/2 + f^3 P(f) = f + f^2 (f P(f) - 1/2), then + e ln2 in two parts.
        let p = self.horner(&P, &f, width);
        let minus_half = c(self, -0.5);
        let fp = self.assign(&format!("math.fma {p}, {f}, {minus_half} : {t}"));
        let f2 = self.assign(&format!("arith.mulf {f}, {f} : {t}"));
        let tail = self.assign(&format!("arith.mulf {f2}, {fp} : {t}"));
        let (ln2_hi, ln2_lo) = (c(self, 0.693_359_375), c(self, -2.121_944_4e-4));
        let y = self.assign(&format!("math.fma {ef}, {ln2_lo}, {tail} : {t}"));
        let y = self.assign(&format!("arith.addf {y}, {f} : {t}"));
        let y = self.assign(&format!("math.fma {ef}, {ln2_hi}, {y} : {t}"));
        // 0 -> -inf, negative -> NaN, +inf and NaN -> themselves.
        let (zero, minus_inf, inf, nan) = (
            c(self, 0.0),
            c(self, f64::NEG_INFINITY),
            c(self, f64::INFINITY),
            c(self, f64::NAN),
        );
        let is_zero = self.assign(&format!("arith.cmpf oeq, {x}, {zero} : {t}"));
        let y = self.assign(&format!("arith.select {is_zero}, {minus_inf}, {y} : {st}"));
        let negative = self.assign(&format!("arith.cmpf olt, {x}, {zero} : {t}"));
        let y = self.assign(&format!("arith.select {negative}, {nan}, {y} : {st}"));
        let keep = self.assign(&format!("arith.cmpf ueq, {x}, {inf} : {t}"));
        self.assign(&format!("arith.select {keep}, {x}, {y} : {st}"))
    }

    /// The number a value holds when it is a constant splat (`x.pow(1.5)`'s exponent).
    fn known_constant(&self, v: &Val) -> Option<f64> {
        let (Val::Splat(name) | Val::Scalar(name)) = v else {
            return None;
        };
        self.consts
            .iter()
            .find(|((_, ty), c)| *c == name && ty == "f32")
            .and_then(|((text, _), _)| text.parse().ok())
    }

    /// `x^c` for a constant `c`: 1, `x`, `x * x` and `1 / x` (correctly rounded) for 0,
    /// 1, 2 and -1; otherwise [`Self::pow`]'s `exp(c log|x|)` with the sign rule decided
    /// here (an odd integer keeps a negative base's sign, a fraction makes it NaN).
    fn pow_constant(&mut self, x: &str, c: f64, width: u64) -> String {
        let t = lanes_of("f32", width);
        match c {
            0.0 => return self.literal(DType::F32, 1.0, width),
            1.0 => return x.to_string(),
            2.0 => return self.assign(&format!("arith.mulf {x}, {x} : {t}")),
            -1.0 => {
                let one = self.literal(DType::F32, 1.0, width);
                return self.assign(&format!("arith.divf {one}, {x} : {t}"));
            }
            _ if !c.is_finite() => {
                let y = self.literal(DType::F32, c, width);
                return self.pow(x, &y, width);
            }
            _ => {}
        }
        let y = self.literal(DType::F32, c, width);
        let ax = self.assign(&format!("math.absf {x} : {t}"));
        let r = self.pow_magnitude(&ax, &y, width);
        if c.fract() != 0.0 {
            let bad = self.negative_finite(x, &ax, width);
            self.nan_where(&bad, &r, width)
        } else if c % 2.0 != 0.0 {
            // An odd power keeps the base's sign (also -0 and -inf).
            let sign = self.sign_bit(x, width);
            self.negate_where(&sign, &r, width)
        } else {
            r
        }
    }

    /// Lanes of `x` (`ax` its magnitude) that are negative and finite: a negative base
    /// with no real power for a fractional exponent.
    fn negative_finite(&mut self, x: &str, ax: &str, width: u64) -> String {
        let t = lanes_of("f32", width);
        let zero = self.literal(DType::F32, 0.0, width);
        let inf = self.literal(DType::F32, f64::INFINITY, width);
        let negative = self.assign(&format!("arith.cmpf olt, {x}, {zero} : {t}"));
        let finite = self.assign(&format!("arith.cmpf one, {ax}, {inf} : {t}"));
        self.mask_and(&negative, &finite, width)
    }

    /// Lanes of `x` with the sign bit set (-0 and -NaN included).
    fn sign_bit(&mut self, x: &str, width: u64) -> String {
        let (t, ti) = (lanes_of("f32", width), lanes_of("i32", width));
        let bits = self.assign(&format!("arith.bitcast {x} : {t} to {ti}"));
        let k0 = self.literal(DType::I32, 0.0, width);
        self.assign(&format!("arith.cmpi slt, {bits}, {k0} : {ti}"))
    }

    fn mask_and(&mut self, a: &str, b: &str, width: u64) -> String {
        self.assign(&format!("arith.andi {a}, {b} : {}", lanes_of("i1", width)))
    }

    /// `-r` where `mask`, else `r`.
    fn negate_where(&mut self, mask: &str, r: &str, width: u64) -> String {
        let t = lanes_of("f32", width);
        let minus_r = self.assign(&format!("arith.negf {r} : {t}"));
        self.assign(&format!(
            "arith.select {mask}, {minus_r}, {r} : {}",
            select_type(width, &t)
        ))
    }

    /// NaN where `mask`, else `r`.
    fn nan_where(&mut self, mask: &str, r: &str, width: u64) -> String {
        let t = lanes_of("f32", width);
        let nan = self.literal(DType::F32, f64::NAN, width);
        self.assign(&format!(
            "arith.select {mask}, {nan}, {r} : {}",
            select_type(width, &t)
        ))
    }

    /// `exp(y log ax)` for `ax >= 0`, the product's rounding error folded back in.
    fn pow_magnitude(&mut self, ax: &str, y: &str, width: u64) -> String {
        let t = lanes_of("f32", width);
        let st = select_type(width, &t);
        let l = self.log(ax, width);
        let p = self.assign(&format!("arith.mulf {y}, {l} : {t}"));
        let minus_p = self.assign(&format!("arith.negf {p} : {t}"));
        let err = self.assign(&format!("math.fma {y}, {l}, {minus_p} : {t}"));
        let r = self.exp(&p, width);
        // r (1 + err); where r or the product is infinite that is NaN: r stays.
        let corrected = self.assign(&format!("math.fma {r}, {err}, {r} : {t}"));
        let number = self.assign(&format!("arith.cmpf ord, {corrected}, {corrected} : {t}"));
        self.assign(&format!("arith.select {number}, {corrected}, {r} : {st}"))
    }

    /// `x^y` as `exp(y log|x|)` in registers (the product's rounding error folded back
    /// in), with C's `powf` for the rest: a negative `x` takes the sign of an odd integer
    /// `y` and gives NaN for a non-integer one; `y = 0` or `x = 1` give 1, `|x| = 1`
    /// with an infinite `y` gives 1, and `y = 1` gives `x`. Within `4 + |y ln x|` ulp
    /// (the log's error scaled by the exponent; tested against C's `pow`).
    fn pow(&mut self, x: &str, y: &str, width: u64) -> String {
        let t = lanes_of("f32", width);
        let st = select_type(width, &t);
        let c = |e: &mut Self, v: f64| e.literal(DType::F32, v, width);
        let ax = self.assign(&format!("math.absf {x} : {t}"));
        let r = self.pow_magnitude(&ax, y, width);
        // The sign of a negative base.
        let (zero, one, half, inf) = (
            c(self, 0.0),
            c(self, 1.0),
            c(self, 0.5),
            c(self, f64::INFINITY),
        );
        let floor_y = self.assign(&format!("math.floor {y} : {t}"));
        let integer = self.assign(&format!("arith.cmpf oeq, {floor_y}, {y} : {t}"));
        let half_y = self.assign(&format!("arith.mulf {y}, {half} : {t}"));
        let floor_half = self.assign(&format!("math.floor {half_y} : {t}"));
        let even = self.assign(&format!("arith.cmpf oeq, {floor_half}, {half_y} : {t}"));
        let sign_bit = self.sign_bit(x, width);
        let odd = self.assign(&format!(
            "arith.xori {integer}, {even} : {}",
            lanes_of("i1", width)
        ));
        let negate = self.mask_and(&sign_bit, &odd, width);
        let r = self.negate_where(&negate, &r, width);
        let fraction = self.assign(&format!("arith.cmpf une, {floor_y}, {y} : {t}"));
        let negative_finite = self.negative_finite(x, &ax, width);
        let bad = self.mask_and(&negative_finite, &fraction, width);
        let r = self.nan_where(&bad, &r, width);
        // 1 for y = 0, x = 1, and |x| = 1 with y = +-inf.
        let y_zero = self.assign(&format!("arith.cmpf oeq, {y}, {zero} : {t}"));
        let x_one = self.assign(&format!("arith.cmpf oeq, {x}, {one} : {t}"));
        let ay = self.assign(&format!("math.absf {y} : {t}"));
        let unit = self.assign(&format!("arith.cmpf oeq, {ax}, {one} : {t}"));
        let y_inf = self.assign(&format!("arith.cmpf oeq, {ay}, {inf} : {t}"));
        let unit_inf = self.mask_and(&unit, &y_inf, width);
        let ones = self.assign(&format!(
            "arith.ori {y_zero}, {x_one} : {}",
            lanes_of("i1", width)
        ));
        let ones = self.assign(&format!(
            "arith.ori {ones}, {unit_inf} : {}",
            lanes_of("i1", width)
        ));
        let r = self.assign(&format!("arith.select {ones}, {one}, {r} : {st}"));
        // x^1 is x exactly (the log would round it up to inf at f32::MAX).
        let y_one = self.assign(&format!("arith.cmpf oeq, {y}, {one} : {t}"));
        self.assign(&format!("arith.select {y_one}, {x}, {r} : {st}"))
    }

    /// `sin(x)` (`quarter` 0) or `cos(x)` (`quarter` 1, as `sin` a quarter turn on): `x`
    /// less the nearest multiple `j` of pi/2 (pi/2 in three parts, exact products up to
    /// |x| ~ 1e5), then the sine or cosine polynomial on [-pi/4, pi/4] and its sign, by
    /// the quadrant `j + quarter` mod 4. Within 2 ulp of libm for |x| < 1e5 (absolute
    /// 1e-7 near the zeros); NaN for infinities and NaN.
    fn sin_cos(&mut self, x: &str, width: u64, quarter: i64) -> String {
        const SIN: [f64; 3] = [-1.951_529_589_1e-4, 8.332_160_873_6e-3, -1.666_665_461_1e-1];
        const COS: [f64; 3] = [
            2.443_315_711_809_948e-5,
            -1.388_731_625_493_765e-3,
            4.166_664_568_298_827e-2,
        ];
        let (t, ti) = (lanes_of("f32", width), lanes_of("i32", width));
        let st = select_type(width, &t);
        let c = |e: &mut Self, v: f64| e.literal(DType::F32, v, width);
        let two_over_pi = c(self, std::f64::consts::FRAC_2_PI);
        let scaled = self.assign(&format!("arith.mulf {x}, {two_over_pi} : {t}"));
        let j = self.assign(&format!("math.roundeven {scaled} : {t}"));
        // Huge, infinite or NaN x: any quadrant (the result is wrong or NaN anyway),
        // never an out-of-range conversion.
        let (limit, zero) = (c(self, 1e8), c(self, 0.0));
        let aj = self.assign(&format!("math.absf {j} : {t}"));
        let small = self.assign(&format!("arith.cmpf olt, {aj}, {limit} : {t}"));
        let j_safe = self.assign(&format!("arith.select {small}, {j}, {zero} : {st}"));
        let minus_j = self.assign(&format!("arith.negf {j} : {t}"));
        let mut r = x.to_string();
        for part in [
            1.570_312_5,
            4.837_512_969_970_703e-4,
            7.549_789_954_891_882e-8,
        ] {
            let p = c(self, part);
            r = self.assign(&format!("math.fma {minus_j}, {p}, {r} : {t}"));
        }
        let r2 = self.assign(&format!("arith.mulf {r}, {r} : {t}"));
        // sin r = r + r^3 S(r^2); cos r = 1 - r^2 / 2 + r^4 C(r^2).
        let sp = self.horner(&SIN, &r2, width);
        let r3 = self.assign(&format!("arith.mulf {r2}, {r} : {t}"));
        let sin = self.assign(&format!("math.fma {sp}, {r3}, {r} : {t}"));
        let cp = self.horner(&COS, &r2, width);
        let r4 = self.assign(&format!("arith.mulf {r2}, {r2} : {t}"));
        let minus_half = c(self, -0.5);
        let one = c(self, 1.0);
        let head = self.assign(&format!("math.fma {r2}, {minus_half}, {one} : {t}"));
        let cos = self.assign(&format!("math.fma {cp}, {r4}, {head} : {t}"));
        let ji = self.assign(&format!("arith.fptosi {j_safe} : {t} to {ti}"));
        let shift = self.literal(DType::I32, quarter as f64, width);
        let q = self.assign(&format!("arith.addi {ji}, {shift} : {ti}"));
        let (k1, k2, k0) = (
            self.literal(DType::I32, 1.0, width),
            self.literal(DType::I32, 2.0, width),
            self.literal(DType::I32, 0.0, width),
        );
        let odd = self.assign(&format!("arith.andi {q}, {k1} : {ti}"));
        let odd = self.assign(&format!("arith.cmpi ne, {odd}, {k0} : {ti}"));
        let half_turn = self.assign(&format!("arith.andi {q}, {k2} : {ti}"));
        let half_turn = self.assign(&format!("arith.cmpi ne, {half_turn}, {k0} : {ti}"));
        let y = self.assign(&format!("arith.select {odd}, {cos}, {sin} : {st}"));
        let minus_y = self.assign(&format!("arith.negf {y} : {t}"));
        let y = self.assign(&format!("arith.select {half_turn}, {minus_y}, {y} : {st}"));
        if quarter != 0 {
            return y;
        }
        // sin(-0) = -0.
        let is_zero = self.assign(&format!("arith.cmpf oeq, {x}, {zero} : {t}"));
        self.assign(&format!("arith.select {is_zero}, {x}, {y} : {st}"))
    }

    /// `coefficients[0] * y^n + ... + coefficients[n]` by fused multiply-adds.
    fn horner(&mut self, coefficients: &[f64], y: &str, width: u64) -> String {
        let t = lanes_of("f32", width);
        let mut p = self.literal(DType::F32, coefficients[0], width);
        for &k in &coefficients[1..] {
            let kc = self.literal(DType::F32, k, width);
            p = self.assign(&format!("math.fma {p}, {y}, {kc} : {t}"));
        }
        p
    }

    /// Rounds an f32 result to bf16/f16 precision (the interpreter's per-op rounding).
    pub(super) fn round(&mut self, dtype: DType, x: &str, width: u64) -> String {
        let narrow = match dtype {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            _ => return x.to_string(),
        };
        let (wide_t, narrow_t) = (lanes_of("f32", width), lanes_of(narrow, width));
        let t = self.assign(&format!("arith.truncf {x} : {wide_t} to {narrow_t}"));
        self.assign(&format!("arith.extf {t} : {narrow_t} to {wide_t}"))
    }

    /// One element-wise op on registers.
    pub(super) fn scalar_op(
        &mut self,
        kind: &OpKind,
        a: &[String],
        operands: &[(Val, DType)],
        out: DType,
        width: u64,
    ) -> String {
        let in_dtype = operands[0].1;
        let t = lanes_of(reg(in_dtype), width);
        let float = in_dtype.is_float();
        match kind {
            OpKind::Unary { op, .. } => {
                let x = &a[0];
                match (op, in_dtype) {
                    (UnaryOp::Exp, _) => self.exp(x, width),
                    (UnaryOp::Tanh, _) => self.tanh(x, width),
                    (UnaryOp::Neg, d) if d.is_float() => {
                        self.assign(&format!("arith.negf {x} : {t}"))
                    }
                    (UnaryOp::Neg, _) => {
                        let z = self.literal(in_dtype, 0.0, width);
                        self.assign(&format!("arith.subi {z}, {x} : {t}"))
                    }
                    (UnaryOp::Abs, d) if d.is_float() => {
                        self.assign(&format!("math.absf {x} : {t}"))
                    }
                    (UnaryOp::Abs, _) => self.assign(&format!("math.absi {x} : {t}")),
                    (UnaryOp::Erf, _) => self.erf(x, width),
                    (UnaryOp::Log, _) => self.log(x, width),
                    (UnaryOp::Sin, _) => self.sin_cos(x, width, 0),
                    (UnaryOp::Cos, _) => self.sin_cos(x, width, 1),
                    // `math.rsqrt` has no LLVM lowering: 1 / sqrt(x), correctly rounded.
                    (UnaryOp::Rsqrt, _) => {
                        let s = self.assign(&format!("math.sqrt {x} : {t}"));
                        let one = self.literal(DType::F32, 1.0, width);
                        self.assign(&format!("arith.divf {one}, {s} : {t}"))
                    }
                    (UnaryOp::Not, d) => {
                        let ones = if d == DType::Bool { "true" } else { "-1" };
                        let m = self.constant(ones, &t);
                        self.assign(&format!("arith.xori {x}, {m} : {t}"))
                    }
                    (op, _) => {
                        let name = arith_unary_float(*op).expect("`not` is handled above");
                        self.assign(&format!("{name} {x} : {t}"))
                    }
                }
            }
            OpKind::Binary { op, .. } => {
                let (x, y) = (&a[0], &a[1]);
                match (arith_binary(*op, float), float, op) {
                    (_, true, BinaryOp::Pow) => match self.known_constant(&operands[1].0) {
                        Some(c) => self.pow_constant(x, c, width),
                        None => self.pow(x, y, width),
                    },
                    (Some(name), ..) => self.assign(&format!("{name} {x}, {y} : {t}")),
                    (None, true, _) => float_rem(self, x, y, &t),
                    // Integers round toward -inf: `arith-expand` lowers `floordivsi`.
                    (None, false, BinaryOp::Div) => {
                        self.assign(&format!("arith.floordivsi {x}, {y} : {t}"))
                    }
                    (None, false, _) => {
                        let q = self.assign(&format!("arith.floordivsi {x}, {y} : {t}"));
                        let m = self.assign(&format!("arith.muli {q}, {y} : {t}"));
                        self.assign(&format!("arith.subi {x}, {m} : {t}"))
                    }
                }
            }
            OpKind::Compare { pred, .. } => {
                let (op, p) = comparison(*pred, in_dtype);
                self.assign(&format!("{op} {p}, {}, {} : {t}", a[0], a[1]))
            }
            OpKind::Select { .. } => {
                let vt = lanes_of(reg(out), width);
                self.assign(&format!(
                    "arith.select {}, {}, {} : {}",
                    a[0],
                    a[1],
                    a[2],
                    select_type(width, &vt)
                ))
            }
            OpKind::Cast { .. } => self.cast(&a[0], in_dtype, out, width),
            _ => unreachable!("not an element-wise op: {}", kind.mnemonic()),
        }
    }

    pub(super) fn cast(&mut self, x: &str, from: DType, to: DType, width: u64) -> String {
        let (ft, tt) = (lanes_of(reg(from), width), lanes_of(reg(to), width));
        match (from.is_float(), to.is_float(), from, to) {
            (true, true, ..) => x.to_string(),
            (true, false, _, DType::I32) => {
                self.assign(&format!("arith.fptosi {x} : {ft} to {tt}"))
            }
            (true, false, ..) => {
                let z = self.literal(DType::F32, 0.0, width);
                self.assign(&format!("arith.cmpf une, {x}, {z} : {ft}"))
            }
            (false, true, DType::Bool, _) => {
                self.assign(&format!("arith.uitofp {x} : {ft} to {tt}"))
            }
            (false, true, ..) => self.assign(&format!("arith.sitofp {x} : {ft} to {tt}")),
            (false, false, DType::Bool, DType::I32) => {
                self.assign(&format!("arith.extui {x} : {ft} to {tt}"))
            }
            (false, false, DType::I32, DType::Bool) => {
                let z = self.literal(DType::I32, 0.0, width);
                self.assign(&format!("arith.cmpi ne, {x}, {z} : {ft}"))
            }
            _ => x.to_string(),
        }
    }

    /// `tanh` on vectors (LLVM would call libm's `tanhf` lane by lane): for `|x| < 0.4`
    /// its odd Taylor series to `x^15` (truncation below 1e-8 relative), else
    /// `1 - 2 / (exp(2|x|) + 1)` with the polynomial [`Self::exp`] (error a few 1e-7
    /// relative; `exp` overflowing to `inf` gives exactly 1), with the sign of `x`
    /// restored. NaN passes through the `exp` branch.
    fn tanh(&mut self, x: &str, width: u64) -> String {
        let t = lanes_of("f32", width);
        let st = select_type(width, &t);
        let c = |e: &mut Self, v: f64| e.literal(DType::F32, v, width);
        let a = self.assign(&format!("math.absf {x} : {t}"));
        // Taylor: x * (1 + x^2 * (c1 + x^2 * (c2 + ...))).
        let coefficients = [
            -929_569.0 / 638_512_875.0,
            21_844.0 / 6_081_075.0,
            -1_382.0 / 155_925.0,
            62.0 / 2_835.0,
            -17.0 / 315.0,
            2.0 / 15.0,
            -1.0 / 3.0,
            1.0,
        ];
        let a2 = self.assign(&format!("arith.mulf {a}, {a} : {t}"));
        let p = self.horner(&coefficients, &a2, width);
        let series = self.assign(&format!("arith.mulf {p}, {a} : {t}"));
        let two_a = self.assign(&format!("arith.addf {a}, {a} : {t}"));
        let e = self.exp(&two_a, width);
        let (one, two) = (c(self, 1.0), c(self, 2.0));
        let e1 = self.assign(&format!("arith.addf {e}, {one} : {t}"));
        let q = self.assign(&format!("arith.divf {two}, {e1} : {t}"));
        let far = self.assign(&format!("arith.subf {one}, {q} : {t}"));
        let limit = c(self, 0.4);
        let near = self.assign(&format!("arith.cmpf olt, {a}, {limit} : {t}"));
        let r = self.assign(&format!("arith.select {near}, {series}, {far} : {st}"));
        self.assign(&format!("math.copysign {r}, {x} : {t}"))
    }

    /// `exp` as a degree-6 polynomial on `x - n ln2` scaled by `2^n` (Cephes `expf`):
    /// relative error about 1e-7. NaN passes through.
    ///
    /// On AVX-512, full registers scale with one `vscalefps`, the input clamped to
    /// [[`SCALEF_FLOOR`] ln2, 128 ln2] (`+inf` at the top) and results below the floor
    /// selected to 0 (`-inf` gives 0): `vscalefps` never makes a denormal, which would
    /// cost a microcode assist per lane (masked attention scores doubled the kernel's
    /// time). The clamps are `select`s that x86 does in one `vminps`/`vmaxps`, ordered
    /// so that NaN passes through them. Elsewhere `2^n` is built from exponent bits, `n`
    /// clamped to [-127, 128] (bits 0 give 0, 255 give `+inf`), and NaN, which the
    /// clamps turn into a number there, is selected back.
    fn exp(&mut self, x: &str, width: u64) -> String {
        let t = lanes_of("f32", width);
        let c = |e: &mut Self, v: f64| e.literal(DType::F32, v, width);
        let scalef = self.registers == Registers::Avx512 && width == self.registers.lanes();
        let st = select_type(width, &t);
        let clamped = if scalef {
            let (hi, lo) = (c(self, 128.0 * LN_2), c(self, SCALEF_FLOOR * LN_2));
            let above = self.assign(&format!("arith.cmpf ogt, {x}, {hi} : {t}"));
            let clamped = self.assign(&format!("arith.select {above}, {hi}, {x} : {st}"));
            let below = self.assign(&format!("arith.cmpf olt, {clamped}, {lo} : {t}"));
            self.assign(&format!("arith.select {below}, {lo}, {clamped} : {st}"))
        } else {
            let (hi, lo) = (c(self, 128.0 * LN_2), c(self, -127.0 * LN_2));
            let below = self.assign(&format!("arith.cmpf olt, {x}, {hi} : {t}"));
            let clamped = self.assign(&format!("arith.select {below}, {x}, {hi} : {st}"));
            let above = self.assign(&format!("arith.cmpf ogt, {clamped}, {lo} : {t}"));
            self.assign(&format!("arith.select {above}, {clamped}, {lo} : {st}"))
        };
        let log2e = c(self, std::f64::consts::LOG2_E);
        let scaled = self.assign(&format!("arith.mulf {clamped}, {log2e} : {t}"));
        let n = self.assign(&format!("math.roundeven {scaled} : {t}"));
        let (ln2_hi, ln2_lo) = (c(self, -0.693_359_375), c(self, 2.121_944_4e-4));
        let r = self.assign(&format!("math.fma {n}, {ln2_hi}, {clamped} : {t}"));
        let r = self.assign(&format!("math.fma {n}, {ln2_lo}, {r} : {t}"));
        let coefficients = [
            1.987_569_15e-4,
            1.398_199_950_7e-3,
            8.333_451_907_3e-3,
            4.166_579_589_4e-2,
            1.666_666_545_9e-1,
            5.000_000_120_1e-1,
        ];
        let p = self.horner(&coefficients, &r, width);
        let r2 = self.assign(&format!("arith.mulf {r}, {r} : {t}"));
        let p = self.assign(&format!("math.fma {p}, {r2}, {r} : {t}"));
        let one = c(self, 1.0);
        let p = self.assign(&format!("arith.addf {p}, {one} : {t}"));
        if scalef {
            // Every lane (mask -1), the current rounding mode (4).
            let (all, rounding) = (self.constant("-1", "i16"), self.constant("4", "i32"));
            let y = self.assign(&format!(
                "x86vector.avx512.mask.scalef {p}, {n}, {p}, {all}, {rounding} : {t}"
            ));
            let (floor, zero) = (c(self, SCALEF_FLOOR * LN_2), c(self, 0.0));
            let tiny = self.assign(&format!("arith.cmpf olt, {x}, {floor} : {t}"));
            return self.assign(&format!("arith.select {tiny}, {zero}, {y} : {st}"));
        }
        let ti = lanes_of("i32", width);
        let ni = self.assign(&format!("arith.fptosi {n} : {t} to {ti}"));
        // 2^n with n at most 127 (2^128 is not a float: for x in [88.38, 88.72] the
        // result is p 2^127 2).
        let bias = self.literal(DType::I32, 127.0, width);
        let capped = self.assign(&format!("arith.minsi {ni}, {bias} : {ti}"));
        let e = self.assign(&format!("arith.addi {capped}, {bias} : {ti}"));
        let shift = self.literal(DType::I32, 23.0, width);
        let e = self.assign(&format!("arith.shli {e}, {shift} : {ti}"));
        let scale = self.assign(&format!("arith.bitcast {e} : {ti} to {t}"));
        let y = self.assign(&format!("arith.mulf {p}, {scale} : {t}"));
        let top = self.assign(&format!("arith.cmpi sgt, {ni}, {bias} : {ti}"));
        let two = c(self, 2.0);
        let doubled = self.assign(&format!("arith.mulf {y}, {two} : {t}"));
        let y = self.assign(&format!(
            "arith.select {top}, {doubled}, {y} : {}",
            select_type(width, &t)
        ));
        let nan = self.assign(&format!("arith.cmpf uno, {x}, {x} : {t}"));
        self.assign(&format!("arith.select {nan}, {x}, {y} : {st}"))
    }
}
