//! Vector code for the element-wise kernels without a nightly compiler: `vectorized!`
//! compiles a kernel's body three times (for AVX-512, for AVX2 with FMA, and for the
//! baseline) and picks one when it runs, as the products' kernels are chosen; the
//! body is plain scalar Rust that the compiler vectorises. The helpers here ([`exp`],
//! [`Lanes`]) are written so that it can: no branch, no call, a fixed order of operations.
//!
//! Every version gives the same bits: the compiler keeps IEEE semantics (no reassociation,
//! no fused multiply-add it was not asked for), so a wider vector only runs the same scalar
//! operations side by side. Sums that would be a chain of dependent additions are split into
//! [`LANES`] running sums in a fixed order ([`Lanes`]), which every version computes alike.

/// Defines `fn $name(args) -> ret` whose body is compiled for AVX-512, for AVX2 with FMA, and
/// for the baseline x86-64 (or the target's baseline elsewhere), and which runs the best one
/// the processor has. The body must call only `#[inline(always)]` functions for the wider
/// versions to reach them.
macro_rules! vectorized {
    ($(#[$attr:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$attr])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,bmi1,bmi2,lzcnt,popcnt")]
                fn v4($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                #[target_feature(enable = "avx2,fma,bmi1,bmi2,lzcnt,popcnt")]
                fn v3($($arg: $ty),*) $(-> $ret)? { body($($arg),*) }
                if $crate::kernels::simd::has_avx512() {
                    // SAFETY: the processor has every feature `v4` is compiled for.
                    return unsafe { v4($($arg),*) };
                }
                if $crate::kernels::simd::has_avx2() {
                    // SAFETY: the processor has every feature `v3` is compiled for.
                    return unsafe { v3($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use vectorized;

/// Whether the processor runs the AVX-512 versions (detected once; cached by `std`).
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn has_avx512() -> bool {
    std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512vl")
        && std::is_x86_feature_detected!("avx512bw")
        && std::is_x86_feature_detected!("avx512dq")
        && has_avx2()
}

/// Whether the processor runs the AVX2 versions.
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
        && std::is_x86_feature_detected!("bmi1")
        && std::is_x86_feature_detected!("bmi2")
        && std::is_x86_feature_detected!("lzcnt")
        && std::is_x86_feature_detected!("popcnt")
}

/// Running sums per [`Lanes`]: 16, one AVX-512 register of `f32`.
pub const LANES: usize = 16;

/// [`LANES`] running sums: element `i` of a slice goes to sum `i % LANES`, and the sums are
/// added at the end in a fixed tree. The order is fixed by the code, so it gives the same
/// bits in every version, and the compiler keeps the sums in vector registers.
#[derive(Clone, Copy, Debug)]
pub struct Lanes(pub [f32; LANES]);

impl Lanes {
    /// All zero.
    #[inline(always)]
    pub fn zero() -> Self {
        Self([0.0; LANES])
    }

    /// The sum of `f` over `values`.
    #[inline(always)]
    pub fn sum_of(values: &[f32], f: impl Fn(f32) -> f32) -> f32 {
        let mut lanes = Self::zero();
        let mut chunks = values.chunks_exact(LANES);
        for chunk in &mut chunks {
            for (lane, &v) in lanes.0.iter_mut().zip(chunk) {
                *lane += f(v);
            }
        }
        for (lane, &v) in lanes.0.iter_mut().zip(chunks.remainder()) {
            *lane += f(v);
        }
        lanes.total()
    }

    /// The sum of `f` over the pairs of `a` and `b` (as long as the shorter).
    #[inline(always)]
    pub fn sum_of_pairs(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
        let len = a.len().min(b.len());
        let (a, b) = (&a[..len], &b[..len]);
        let mut lanes = Self::zero();
        let (mut ca, mut cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
        for (x, y) in (&mut ca).zip(&mut cb) {
            for ((lane, &x), &y) in lanes.0.iter_mut().zip(x).zip(y) {
                *lane += f(x, y);
            }
        }
        for ((lane, &x), &y) in lanes.0.iter_mut().zip(ca.remainder()).zip(cb.remainder()) {
            *lane += f(x, y);
        }
        lanes.total()
    }

    /// The sum of `f` over the triples of `a`, `b` and `c` (as long as the shortest).
    #[inline(always)]
    pub fn sum_of_triples(
        a: &[f32],
        b: &[f32],
        c: &[f32],
        f: impl Fn(f32, f32, f32) -> f32,
    ) -> f32 {
        let len = a.len().min(b.len()).min(c.len());
        let (a, b, c) = (&a[..len], &b[..len], &c[..len]);
        let mut lanes = Self::zero();
        let (mut ca, mut cb, mut cc) = (
            a.chunks_exact(LANES),
            b.chunks_exact(LANES),
            c.chunks_exact(LANES),
        );
        for ((x, y), z) in (&mut ca).zip(&mut cb).zip(&mut cc) {
            for (((lane, &x), &y), &z) in lanes.0.iter_mut().zip(x).zip(y).zip(z) {
                *lane += f(x, y, z);
            }
        }
        let rest = ca
            .remainder()
            .iter()
            .zip(cb.remainder())
            .zip(cc.remainder());
        for (lane, ((&x, &y), &z)) in lanes.0.iter_mut().zip(rest) {
            *lane += f(x, y, z);
        }
        lanes.total()
    }

    /// The largest of `values` (`f32::MIN` for none; NaN is passed over).
    #[inline(always)]
    pub fn max_of(values: &[f32]) -> f32 {
        let mut lanes = [f32::MIN; LANES];
        let mut chunks = values.chunks_exact(LANES);
        for chunk in &mut chunks {
            for (lane, &v) in lanes.iter_mut().zip(chunk) {
                *lane = lane.max(v);
            }
        }
        for (lane, &v) in lanes.iter_mut().zip(chunks.remainder()) {
            *lane = lane.max(v);
        }
        lanes.into_iter().fold(f32::MIN, f32::max)
    }

    /// The sum of the lanes, in a fixed tree.
    #[inline(always)]
    pub fn total(self) -> f32 {
        let mut width = LANES / 2;
        let mut lanes = self.0;
        while width > 0 {
            for i in 0..width {
                lanes[i] += lanes[i + width];
            }
            width /= 2;
        }
        lanes[0]
    }
}

/// Asks the processor to bring the cache line holding `at` into its first cache, for a read a
/// few iterations from now: strided gathers (a head's columns of every row) otherwise wait
/// on each row's line in turn. Any address will do: a prefetch never faults.
#[inline(always)]
pub fn prefetch(at: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is in every x86-64 processor, and a prefetch reads nothing and never
    // faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// `e^x` to about one unit in the last place, without a branch: the argument is reduced by
/// powers of two (`x = n ln 2 + r`, `|r| <= ln 2 / 2`), `e^r` is a degree-6 polynomial
/// (Cephes' coefficients), and `2^n` is built in the exponent bits. Arguments below -87 give
/// `e^-87` (about 1.6e-38) and above 88 give `e^88`: the callers use it for softmax weights and
/// the GELU's sigmoid, where either end is as good as 0 or infinity.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23: adding it rounds to a whole number, which lands in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let p = p * r * r + r + 1.0;
    // `shifted`'s low bits hold n + 2^22; 2^n is (n + 127) in the exponent field.
    let whole = shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    p * f32::from_bits((whole.wrapping_add(127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    vectorized! {
        fn exps(values: &[f32], out: &mut [f32]) {
            for (o, &v) in out.iter_mut().zip(values) {
                *o = exp(v);
            }
        }
    }

    vectorized! {
        fn sum_squares(values: &[f32]) -> f32 {
            Lanes::sum_of(values, |v| v * v)
        }
    }

    #[test]
    fn exp_is_within_two_units_in_the_last_place_and_the_same_in_every_version() {
        let values: Vec<f32> = (0..200_001).map(|i| -87.0 + i as f32 * 0.000_875).collect();
        let mut fast = vec![0.0; values.len()];
        exps(&values, &mut fast);
        for (&v, &got) in values.iter().zip(&fast) {
            let want = (v as f64).exp();
            let ulp = (want as f32).to_bits().abs_diff(got.to_bits());
            assert!(ulp <= 2, "exp({v}) = {got}, want {want} ({ulp} ulp)");
            // The scalar build of the same function (no dispatch) gives the same bits.
            assert_eq!(exp(v).to_bits(), got.to_bits(), "exp({v})");
        }
        assert!(exp(-1000.0) < 1e-37 && exp(1000.0) > 1e38 && exp(0.0) == 1.0);
    }

    #[test]
    fn lane_sums_are_fixed_by_the_code() {
        let values: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut lanes = [0.0f32; LANES];
        for (i, v) in values.iter().enumerate() {
            lanes[i % LANES] += v * v;
        }
        assert_eq!(
            sum_squares(&values).to_bits(),
            Lanes(lanes).total().to_bits()
        );
        let exact: f64 = values.iter().map(|&v| (v as f64) * (v as f64)).sum();
        assert!((sum_squares(&values) as f64 - exact).abs() < 1e-3);
        assert_eq!(
            Lanes::max_of(&values),
            values.iter().copied().fold(f32::MIN, f32::max)
        );
        assert_eq!(Lanes::max_of(&[]), f32::MIN);
    }
}
