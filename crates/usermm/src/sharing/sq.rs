//! The exact alternative: moment sums (`rmap-id-sq`).
//!
//! Linux counterpart: none (not in seed 003 nor upstream). Derived in
//! `research/sharing-and-cow.md` §A.2.2 ("A simpler exact scheme"): keep per folio the total
//! mapcount `M`, `S1 = Σ id` and `S2 = Σ id²` over all mappings. Then
//! `Σ (id_j − y)² = S2 − 2y·S1 + M·y²`, so "every mapping belongs to `y`" holds exactly when
//! `S1 == M·y` and `S2 == M·y²` (the sum of squares is then zero, forcing every `id_j = y`).
//! With IDs below 2^24 and `M ≤ 2^15` (folio order ≤ 15) `S2 < 2^63`, so wrapping u64
//! arithmetic is exact once `M ≤ P`. Two accumulators for any order, instead of up to six.

use super::rmap_id::Snapshot;
use super::subid::{MAX_ORDER, RMAP_ID_MAX};

/// Whether every mapping in `s` belongs to `id` (and there is at least one).
pub(crate) fn exclusive(s: &Snapshot, order: u32, id: u32) -> bool {
    let m = s.total;
    if m == 0 || m > 1 << order.min(MAX_ORDER) || id > RMAP_ID_MAX {
        return false;
    }
    let y = u64::from(id);
    s.s1 == m * y && s.s2 == m * y * y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_of_the_square_sum_fits() {
        let m = 1u128 << MAX_ORDER;
        let id = u128::from(RMAP_ID_MAX);
        assert!(m * id * id < 1u128 << 63);
    }

    #[test]
    fn exhaustive_small_multisets() {
        // Every multiset of up to 6 mappings over IDs 1..=7: exact answer for every y.
        fn rec(start: u32, left: u32, ids: &mut Vec<u32>) {
            check(ids);
            if left == 0 {
                return;
            }
            for id in start..=7 {
                ids.push(id);
                rec(id, left - 1, ids);
                ids.pop();
            }
        }
        fn check(ids: &[u32]) {
            let s = Snapshot {
                total: ids.len() as u64,
                s1: ids.iter().map(|&i| u64::from(i)).sum(),
                s2: ids.iter().map(|&i| u64::from(i) * u64::from(i)).sum(),
                ..Snapshot::default()
            };
            for y in 0..=8 {
                let truth = !ids.is_empty() && ids.iter().all(|&i| i == y);
                assert_eq!(exclusive(&s, 3, y), truth, "{ids:?} y={y}");
            }
        }
        rec(1, 6, &mut Vec::new());
    }
}
