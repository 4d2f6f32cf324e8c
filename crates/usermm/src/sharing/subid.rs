//! Sub-IDs: the "special numbers" that make `mapcount × id == Σ ids` an exact test.
//!
//! Linux counterpart: none merged. This is patch 07 ("mm/rmap_id: track if one or multiple MMs
//! map a partially-mappable folio") and patch 11 ("support for 1, 2 and 3 values") of seed 003,
//! D. Hildenbrand's Nov-2023 WIP series, restated from `research/sharing-and-cow.md` §A.2.2.
//!
//! For a folio of `P` pages the sub-ID of an index `x` is `s(x) = Σ_{bit i of x} (P+1)^i`: every
//! bit of the index becomes one base-`(P+1)` digit that is 0 or 1. A sum of `M ≤ P` sub-IDs has
//! base-`(P+1)` digits `c_i ≤ M < P+1` (no carries), so it equals `M·s(y)` only if every summand
//! is `s(y)`, provided no sum ever reaches `2^64`: `(P+1)^bits ≤ 2^64` for the slice width.
//!
//! The 24-bit rmap ID is cut into equal slices, one per 64-bit value; the folio keeps one value
//! per slice. [`Sizing::Seed`] is the series' table (bucketed: one base per bucket of orders);
//! its order-6…9 bucket (three values of 8 bits in base 513) violates the no-overflow bound:
//! `513^8 > 2^64`. [`find_false_exclusive`] searches that wrap-around exhaustively for patterns
//! where one slice differs; orders 7, 8 and 9 have them (the smallest needs 71 mappings by 5
//! MMs), order 6 has none although it overflows (64 mappings are too few to reach a multiple
//! of `2^64`). [`Sizing::Safe`] uses base `P+1` per order and the fewest values whose slices
//! satisfy the bound (orders 8 and 9 need four values).

/// Bits of an rmap ID (IDs are below 16M).
pub(crate) const RMAP_ID_BITS: u32 = 24;
/// Largest rmap ID (`RMAP_ID_MAX`); 0 is the dummy ID of MMs that never map user folios.
pub const RMAP_ID_MAX: u32 = (1 << RMAP_ID_BITS) - 1;
/// Largest folio order the rmap-ID trackers support.
pub const MAX_ORDER: u32 = 15;
/// Smallest order of a tracked (partially-mappable anon) folio.
pub const MIN_ORDER: u32 = 2;
/// Most 64-bit values any order needs.
pub(crate) const MAX_VALUES: usize = 6;

/// How rmap IDs are cut into sub-IDs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sizing {
    /// The seed's table, including its overflowing order-6…9 bucket.
    Seed,
    /// Base `P+1` per order and the fewest values with `(P+1)^bits ≤ 2^64`.
    Safe,
}

/// The sub-ID parameters of one folio order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Number of 64-bit values (slices of the rmap ID).
    pub values: u32,
    /// Bits per slice.
    pub bits: u32,
    /// Digit base (`P_max + 1` of the bucket or order).
    pub base: u64,
}

impl Layout {
    /// Whether the largest reachable sum, `P × max sub-ID = base^bits − 1`, stays below 2^64.
    pub fn overflow_free(&self) -> bool {
        u128::from(self.base)
            .checked_pow(self.bits)
            .is_some_and(|v| v <= 1u128 << 64)
    }

    /// Slice `j` of `id`.
    #[inline]
    pub(crate) fn slice(&self, id: u32, j: u32) -> u32 {
        let shift = j * self.bits;
        if shift >= 32 {
            0
        } else {
            (id >> shift) & ((1u32 << self.bits) - 1)
        }
    }

    /// The sub-ID of slice value `x`: `Σ_{bit i of x} base^i` (wrapping, as the seed computes).
    #[inline]
    pub fn subid(&self, x: u32) -> u64 {
        let x = if self.bits >= 32 {
            x
        } else {
            x & ((1u32 << self.bits) - 1)
        };
        let k = (self.base - 1).trailing_zeros();
        if self.base > 1 && self.base - 1 == 1 << k && (k as usize) < POWS.len() {
            // Every base in use is 2^k + 1: powers from the table, one add per set bit.
            let pows = &POWS[k as usize];
            let mut s = 0u64;
            let mut rest = x;
            while rest != 0 {
                s = s.wrapping_add(pows[rest.trailing_zeros() as usize]);
                rest &= rest - 1;
            }
            return s;
        }
        let mut s = 0u64;
        let mut p = 1u64;
        for i in 0..self.bits {
            if x >> i & 1 != 0 {
                s = s.wrapping_add(p);
            }
            p = p.wrapping_mul(self.base);
        }
        s
    }

    /// The sub-ID of value `j` of rmap ID `id`.
    #[inline]
    pub(crate) fn subid_of(&self, id: u32, j: u32) -> u64 {
        self.subid(self.slice(id, j))
    }
}

const fn safe_layout(order: u32) -> Layout {
    let base = (1u64 << order) + 1;
    let mut values = 1;
    loop {
        let bits = RMAP_ID_BITS.div_ceil(values);
        // base^bits <= 2^64, computed in u128 without overflow (base < 2^16, bits <= 24).
        let mut v: u128 = 1;
        let mut i = 0;
        let mut ok = true;
        while i < bits {
            v *= base as u128;
            if v > 1u128 << 64 {
                ok = false;
                break;
            }
            i += 1;
        }
        if ok {
            return Layout { values, bits, base };
        }
        values += 1;
    }
}

const fn seed_layout(order: u32) -> Layout {
    let (values, bits, pmax) = match order {
        0..=2 => (1, 24, 4u64),
        3..=5 => (2, 12, 32),
        6..=9 => (3, 8, 512),
        10 => (4, 6, 1024),
        11..=12 => (5, 5, 4096),
        _ => (6, 4, 32768),
    };
    Layout {
        values,
        bits,
        base: pmax + 1,
    }
}

const fn table(seed: bool) -> [Layout; MAX_ORDER as usize + 1] {
    let mut t = [Layout {
        values: 1,
        bits: 24,
        base: 5,
    }; MAX_ORDER as usize + 1];
    let mut o = MIN_ORDER;
    while o <= MAX_ORDER {
        t[o as usize] = if seed { seed_layout(o) } else { safe_layout(o) };
        o += 1;
    }
    t
}

/// `POWS[k][i] = (2^k + 1)^i` (wrapping), the digit weights of every base in use.
static POWS: [[u64; 32]; 16] = {
    let mut t = [[0u64; 32]; 16];
    let mut k = 0;
    while k < 16 {
        let base = (1u64 << k) + 1;
        let mut p = 1u64;
        let mut i = 0;
        while i < 32 {
            t[k][i] = p;
            p = p.wrapping_mul(base);
            i += 1;
        }
        k += 1;
    }
    t
};

const SEED: [Layout; MAX_ORDER as usize + 1] = table(true);
const SAFE: [Layout; MAX_ORDER as usize + 1] = table(false);

impl Sizing {
    /// The layout of a folio of `order` (clamped to `MIN_ORDER..=MAX_ORDER`).
    #[inline]
    pub fn layout(self, order: u32) -> Layout {
        let o = order.clamp(MIN_ORDER, MAX_ORDER) as usize;
        match self {
            Sizing::Seed => SEED[o],
            Sizing::Safe => SAFE[o],
        }
    }

    /// `seed` or `safe`.
    pub fn name(self) -> &'static str {
        match self {
            Sizing::Seed => "seed",
            Sizing::Safe => "safe",
        }
    }
}

/// A concrete false "exclusive" answer: `mappings` (rmap ID, number of mappings) make the rmap
/// values of a folio equal `M × subid(victim)` although other MMs map it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FalseExclusive {
    /// Folio order.
    pub(crate) order: u32,
    /// The MM the tracker wrongly calls the exclusive owner (it maps pages itself).
    pub victim: u32,
    /// Every MM mapping the folio with its number of mappings (the victim included).
    pub mappings: Vec<(u32, u32)>,
}

impl FalseExclusive {
    /// Total mapcount of the pattern.
    pub fn total(&self) -> u32 {
        self.mappings.iter().map(|m| m.1).sum()
    }
}

/// Searches exhaustively for a pattern in which the MMs differ from the victim in one slice
/// only and the victim's test `value == M × subid` wraps around to a false "exclusive".
///
/// Per slice, a false answer needs digits `e_i = c_i − M·b_i(y)` (`c_i` summands with bit `i`,
/// `b_i(y)` the victim's bits) with `Σ e_i·base^i ≡ 0 (mod 2^64)`, not all zero, `|e_i| ≤ M ≤ P`.
/// Every candidate is `k·2^64` for `0 < |k| ≤ P·(base^bits−1)/(base−1)/2^64`; for each the
/// balanced base representation is unique while `M < base/2`, so the search is complete for
/// such `M` (all of it for order ≤ 7 in the seed's bucket). Returns the pattern with the fewest
/// mappings, or `None` when the sizing is exact for this order.
pub fn find_false_exclusive(order: u32, sizing: Sizing) -> Option<FalseExclusive> {
    let l = sizing.layout(order);
    let p = 1i128 << order;
    let base = i128::from(l.base);
    // Largest |Σ e_i base^i| with |e_i| <= P.
    let mut geo: i128 = 0;
    let mut pw: i128 = 1;
    for _ in 0..l.bits {
        geo = geo.checked_add(pw)?;
        pw = pw.checked_mul(base)?;
    }
    let max_abs = p.checked_mul(geo)?;
    let kmax = max_abs >> 64;
    let mut best: Option<(i128, Vec<i128>)> = None;
    for k in 1..=kmax {
        for sign in [1i128, -1] {
            let mut r = sign * (k << 64);
            let mut e = Vec::with_capacity(l.bits as usize);
            for _ in 0..l.bits - 1 {
                let mut d = r.rem_euclid(base);
                if d > base / 2 {
                    d -= base;
                }
                e.push(d);
                r = (r - d) / base;
            }
            e.push(r);
            let m = e.iter().map(|d| d.abs()).max().unwrap_or(0) + 1;
            if m <= p && best.as_ref().is_none_or(|b| m < b.0) {
                best = Some((m, e));
            }
        }
    }
    let (m, e) = best?;
    Some(realize(order, &l, m as u32, &e))
}

/// Builds MMs from digit offsets `e` with `M` summands: bit `i` is set in the victim where
/// `e_i < 0`; `c_i = M·b_i + e_i` summands carry bit `i`; victim-set bits go to the first
/// summands, victim-clear bits to the last, so the victim itself keeps `M − max|e|` mappings.
fn realize(order: u32, l: &Layout, m: u32, e: &[i128]) -> FalseExclusive {
    let y: u32 = e
        .iter()
        .enumerate()
        .filter(|(_, d)| **d < 0)
        .map(|(i, _)| 1u32 << i)
        .sum();
    let c: Vec<i128> = e
        .iter()
        .enumerate()
        .map(|(i, d)| {
            if y >> i & 1 != 0 {
                i128::from(m) + d
            } else {
                *d
            }
        })
        .collect();
    // The other slices of every ID: a fixed non-zero pattern above slice 0.
    let high = (0x00a5_a5a5u32 & RMAP_ID_MAX) & !((1u32 << l.bits) - 1);
    let mut mappings: Vec<(u32, u32)> = Vec::new();
    for j in 0..i128::from(m) {
        let mut x = 0u32;
        for (i, ci) in c.iter().enumerate() {
            let set = if y >> i & 1 != 0 {
                j < *ci
            } else {
                j >= i128::from(m) - ci
            };
            if set {
                x |= 1 << i;
            }
        }
        let id = high | x;
        match mappings.iter_mut().find(|(mid, _)| *mid == id) {
            Some(slot) => slot.1 += 1,
            None => mappings.push((id, 1)),
        }
    }
    FalseExclusive {
        order,
        victim: high | y,
        mappings,
    }
}

/// Evaluates the seed's test for `victim` over `mappings` with `sizing`: every value equals
/// `M × subid` (wrapping u64 arithmetic, as the folio's values hold them).
pub fn values_say_exclusive(
    order: u32,
    sizing: Sizing,
    victim: u32,
    mappings: &[(u32, u32)],
) -> bool {
    let l = sizing.layout(order);
    let m: u64 = mappings.iter().map(|x| u64::from(x.1)).sum();
    if m == 0 || m > 1 << order {
        return false;
    }
    (0..l.values).all(|j| {
        let v = mappings.iter().fold(0u64, |acc, &(id, n)| {
            acc.wrapping_add(u64::from(n).wrapping_mul(l.subid_of(id, j)))
        });
        v == m.wrapping_mul(l.subid_of(victim, j))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_layouts_are_overflow_free_and_cover_24_bits() {
        for o in MIN_ORDER..=MAX_ORDER {
            let l = Sizing::Safe.layout(o);
            assert!(l.overflow_free(), "order {o}: {l:?}");
            assert!(l.values * l.bits >= RMAP_ID_BITS);
            assert!(l.values as usize <= MAX_VALUES);
            let s = Sizing::Seed.layout(o);
            assert!(s.values * s.bits >= RMAP_ID_BITS);
            assert_eq!(s.overflow_free(), !(6..=9).contains(&o), "order {o}");
        }
        assert_eq!(Sizing::Safe.layout(8).values, 4);
        assert_eq!(Sizing::Safe.layout(9).values, 4);
        assert_eq!(Sizing::Safe.layout(7).values, 3);
        assert_eq!(Sizing::Seed.layout(9).values, 3);
    }

    #[test]
    fn sub_ids_follow_the_generation_rule() {
        // P = 4: 0, 1, 5, 6, 25, 26, 30, 31.
        let l = Layout {
            values: 1,
            bits: 3,
            base: 5,
        };
        let v: Vec<u64> = (0..8).map(|x| l.subid(x)).collect();
        assert_eq!(v, [0, 1, 5, 6, 25, 26, 30, 31]);
        // The table path agrees with the multiplication path (base 7 is not 2^k + 1).
        for sizing in [Sizing::Seed, Sizing::Safe] {
            for o in MIN_ORDER..=MAX_ORDER {
                let l = sizing.layout(o);
                for x in [0u32, 1, 0x55, 0xabc, 0xff_ffff, 0x12_3456] {
                    let mut slow = 0u64;
                    let mut p = 1u64;
                    for i in 0..l.bits {
                        if x >> i & 1 != 0 {
                            slow = slow.wrapping_add(p);
                        }
                        p = p.wrapping_mul(l.base);
                    }
                    assert_eq!(l.subid(x), slow, "{sizing:?} order {o} x {x:#x}");
                }
            }
        }
        let odd = Layout {
            values: 1,
            bits: 3,
            base: 7,
        };
        assert_eq!(odd.subid(7), 1 + 7 + 49);
    }
}
