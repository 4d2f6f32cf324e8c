//! Do the cost model's call counts hold on the running kernel?
//!
//! The recipes ([`crate::prices::RECIPES`]) price the kernel's instruction path as
//! out-of-line calls, counted per event from the 6.18 source and from which helpers one
//! build, 6.18.44-fc-v669 (GCC, on an Intel guest), had as functions in `/proc/kallsyms`
//! (`docs/research/kernel-calls-6.18.md` §0). Another build of the same release can inline
//! differently: 6.18.44-fc-v657 (GCC 15.3, on an AMD EPYC guest) has `pte_val`, `__pte`,
//! `pmd_val`, `pte_pfn` and `prot_commit_flush_ptes` as functions, and a host profile of its
//! `mprotect` loop puts 23 % of the time in `prot_commit_flush_ptes` alone (§12). The
//! counts are then wrong in both directions at once, and so is the call price itself: it is
//! calibrated on `mprotect`'s `change_pte_range` by dividing each entry's remainder by the
//! four calls the recipes count there.
//!
//! This module compares the running kernel's symbol table with the recipes' assumptions
//! and says where they fail, so that a model miss on such a kernel reads as what it is. It
//! cannot say how many calls per event a helper adds: that needs the call sites (no
//! `vmlinux` or `/proc/kcore` on these guests) or a function tracer on the host, which is
//! machine-wide.
//!
//! A symbol is a function when `/proc/kallsyms` lists it as text (`t`/`T`); compiler
//! clones (`.isra.0`, `.constprop.0`, `.part.0`) count as the function, `.cold` parts do
//! not (they hold the unlikely branches). Names are readable without root; only the
//! addresses are hidden.

use std::collections::BTreeSet;

/// Helpers every recipe counts as a call: the out-of-line functions of §0, and the four of
/// `change_pte_range`'s entry that the call price's calibration divides by (§3). Absent
/// from the running kernel, they were inlined and the recipes over-count.
#[rustfmt::skip]
pub const COUNTED_CALLS: &[&str] = &[
    "vm_normal_page", "vm_normal_folio", "folio_pte_batch", "folio_add_new_anon_rmap",
    "folio_add_anon_rmap_ptes", "folio_remove_rmap_ptes", "__folio_mod_stat",
    "__lruvec_stat_mod_folio", "__mod_lruvec_state", "mod_memcg_lruvec_state",
    "__mod_node_page_state", "__mod_zone_page_state", "css_rstat_updated",
    "mem_cgroup_update_lru_size", "count_memcg_events", "mem_cgroup_from_task",
    "get_mem_cgroup_from_mm", "__mem_cgroup_charge", "charge_memcg", "try_charge_memcg",
    "refill_stock", "memcg1_commit_charge", "memcg1_check_events",
    "__mem_cgroup_uncharge_folios", "uncharge_folio", "uncharge_batch",
    "memcg1_uncharge_batch", "memcg1_oom_recover", "__tlb_remove_folio_pages",
    "__tlb_batch_free_encoded_pages", "free_pages_and_swap_cache", "free_swap_cache",
    "folios_put_refs", "free_unref_folios", "free_pages_prepare", "get_pfnblock_migratetype",
    "free_frozen_page_commit", "free_pcppages_bulk", "__free_one_page", "folio_add_lru_vma",
    "folio_add_lru", "__folio_batch_add_and_move", "folio_batch_move_lru", "lru_add",
    "folio_mapping", "folio_lruvec_lock_irqsave", "__pte_offset_map_lock",
    "pte_offset_map_rw_nolock", "flush_tlb_batched_pending", "pte_mkwrite",
    "lock_vma_under_rcu", "mas_walk", "vma_refcount_put", "handle_mm_fault",
    "__handle_mm_fault", "do_anonymous_page", "vma_alloc_folio_noprof", "get_vma_policy",
    "folio_alloc_mpol_noprof", "alloc_pages_mpol", "policy_nodemask",
    "__alloc_frozen_pages_noprof", "get_page_from_freelist", "__rmqueue_pcplist",
    "post_alloc_hook", "clear_page_erms", "blk_cgroup_congested", "__folio_throttle_swaprate",
    "percpu_counter_add_batch", "mlock_pte_range", "munlock_folio", "mlock_folio_batch",
    "mlock_drain_local", "lru_add_drain", "__vma_start_write", "finish_rcuwait",
    "vma_mark_detached", "vm_area_dup", "vm_area_free", "remove_vma", "anon_vma_fork",
    "unlink_anon_vmas", "unlink_file_vma_batch_add", "vma_dup_policy", "dup_userfaultfd",
    "mas_find", "mas_store", "unmap_single_vma", "unmap_page_range", "free_pgd_range",
    "__cond_resched", "__memcg_slab_post_alloc_hook", "__memcg_slab_free_hook",
    "__ptep_modify_prot_start", "__ptep_modify_prot_commit", "native_set_pte",
];

/// Helpers every recipe counts as no call: inlined in v669 (§0), the paravirt accessors
/// patched to a `mov` (`pte_val`, `__pte`, `pmd_val`) and the header inlines around them.
/// Present in the running kernel, they may be calls where the recipes count none.
/// (`set_ptes` is left out: v669 had clones of it too, and §0 counts it "+0-1 call".)
#[rustfmt::skip]
pub const COUNTED_INLINE: &[&str] = &[
    "copy_pte_range", "copy_present_ptes", "__folio_try_dup_anon_rmap", "zap_pte_range",
    "zap_present_ptes", "zap_present_folio_ptes", "__folio_remove_rmap", "alloc_anon_folio",
    "rmqueue", "rmqueue_pcplist", "prep_new_page", "consume_stock", "lruvec_add_folio",
    "lruvec_del_folio", "__page_cache_release", "__munlock_folio", "dup_mm", "copy_mm",
    "exit_mm", "pte_val", "__pte", "pmd_val", "pte_pfn", "mprotect_folio_pte_batch",
    "change_present_ptes", "modify_prot_start_ptes", "prot_commit_flush_ptes",
    "modify_prot_commit_ptes",
];

/// Of [`COUNTED_INLINE`], those inside `change_pte_range`'s per-entry loop, on which
/// [`crate::prices::Primitives::kcall`] and `kcall_loop` are calibrated: one of them out
/// of line makes the entry's calls more than the four the calibration divides by, and
/// every call of every recipe over-priced.
#[rustfmt::skip]
pub const IN_CALIBRATION_LOOP: &[&str] = &[
    "pte_val", "__pte", "mprotect_folio_pte_batch", "change_present_ptes",
    "modify_prot_start_ptes", "prot_commit_flush_ptes", "modify_prot_commit_ptes",
];

/// The names of the running kernel's functions (text symbols, clone suffixes stripped,
/// `.cold` parts left out), from the text of `/proc/kallsyms`. Module symbols count too.
pub fn functions(kallsyms: &str) -> BTreeSet<String> {
    kallsyms
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_addr, kind, name) = (f.next()?, f.next()?, f.next()?);
            if !matches!(kind, "t" | "T") || name.contains(".cold") {
                return None;
            }
            Some(name.split('.').next().unwrap_or(name).to_string())
        })
        .collect()
}

/// Where the running kernel's functions differ from the recipes' assumptions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Drift {
    /// Counted as calls, absent: inlined here.
    pub inlined: Vec<&'static str>,
    /// Counted as no call, present as functions here.
    pub outlined: Vec<&'static str>,
}

impl Drift {
    /// Compares `functions` (see [`functions`]) with the recipes' assumptions.
    pub fn of(functions: &BTreeSet<String>) -> Drift {
        Drift {
            inlined: COUNTED_CALLS
                .iter()
                .copied()
                .filter(|n| !functions.contains(*n))
                .collect(),
            outlined: COUNTED_INLINE
                .iter()
                .copied()
                .filter(|n| functions.contains(*n))
                .collect(),
        }
    }

    /// The running kernel's drift, `None` if `/proc/kallsyms` cannot be read or lists no
    /// function (a kernel without `CONFIG_KALLSYMS`).
    pub fn read() -> Option<Drift> {
        let text = std::fs::read_to_string("/proc/kallsyms").ok()?;
        let f = functions(&text);
        (!f.is_empty()).then(|| Drift::of(&f))
    }

    /// The table note: `None` when the kernel matches the recipes' assumptions.
    pub fn note(&self) -> Option<String> {
        if self.inlined.is_empty() && self.outlined.is_empty() {
            return None;
        }
        let mut parts = Vec::new();
        if !self.outlined.is_empty() {
            let calib: Vec<&str> = self
                .outlined
                .iter()
                .copied()
                .filter(|n| IN_CALIBRATION_LOOP.contains(n))
                .collect();
            parts.push(format!(
                "{} helper(s) the recipes count as inline are functions here ({}): they under-count calls",
                self.outlined.len(),
                self.outlined.join(", ")
            ));
            if !calib.is_empty() {
                parts.push(format!(
                    "{} in mprotect's per-entry loop, on which the call price is calibrated: where that loop calls them it makes more than the four calls its time is divided by, and every call is over-priced (prot_commit_flush_ptes is, on 6.18.44-fc-v657)",
                    calib.join(", ")
                ));
            }
        }
        if !self.inlined.is_empty() {
            parts.push(format!(
                "{} function(s) the recipes count as calls are inlined here ({}): they over-count calls",
                self.inlined.len(),
                self.inlined.join(", ")
            ));
        }
        Some(format!(
            "model: this kernel's symbol table differs from the build the recipes' call counts were read from (6.18.44-fc-v669, docs/research/kernel-calls-6.18.md §0, §12): {}; its predictions carry that error (how many calls per event a helper adds needs its call sites, which no vmlinux here shows)",
            parts.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel_as_assumed() -> BTreeSet<String> {
        COUNTED_CALLS.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn functions_strips_clone_suffixes_and_skips_cold_parts_and_data() {
        let text = "\
ffffffff81000000 T vm_normal_page
ffffffff81000100 t set_ptes.isra.0
ffffffff81000200 t pte_val.cold
ffffffff81000300 d pte_pfn
0000000000000000 t prot_commit_flush_ptes
ffffffffc0000000 t kvm_thing\t[kvm]
garbage
";
        let f = functions(text);
        let names: Vec<&str> = f.iter().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "kvm_thing",
                "prot_commit_flush_ptes",
                "set_ptes",
                "vm_normal_page"
            ]
        );
    }

    #[test]
    fn the_assumed_kernel_has_no_note() {
        let d = Drift::of(&kernel_as_assumed());
        assert_eq!(d, Drift::default());
        assert_eq!(d.note(), None);
    }

    #[test]
    fn a_kernel_that_inlines_differently_is_named_both_ways() {
        let mut f = kernel_as_assumed();
        f.remove("vm_normal_folio");
        f.insert("pte_pfn".into());
        f.insert("prot_commit_flush_ptes".into());
        let d = Drift::of(&f);
        assert_eq!(d.inlined, ["vm_normal_folio"]);
        assert_eq!(d.outlined, ["pte_pfn", "prot_commit_flush_ptes"]);
        let note = d.note().expect("a note");
        assert!(
            note.contains("are functions here (pte_pfn, prot_commit_flush_ptes)"),
            "{note}"
        );
        assert!(
            note.contains("prot_commit_flush_ptes in mprotect's per-entry loop"),
            "{note}"
        );
        assert!(note.contains("inlined here (vm_normal_folio)"), "{note}");
        // pte_pfn is outside the calibration loop: only the per-event counts are named.
        let mut g = kernel_as_assumed();
        g.insert("pte_pfn".into());
        let note = Drift::of(&g).note().expect("a note");
        assert!(!note.contains("per-entry loop"), "{note}");
    }

    #[test]
    fn the_lists_do_not_contradict_each_other() {
        for n in COUNTED_INLINE {
            assert!(!COUNTED_CALLS.contains(n), "{n} is counted both ways");
        }
        for n in IN_CALIBRATION_LOOP {
            assert!(COUNTED_INLINE.contains(n), "{n} is not counted inline");
        }
    }
}
