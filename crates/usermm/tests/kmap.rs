//! The arm64 kernel linear map (seed 002): translation, leaf choice, fixmap hygiene, the
//! safe-change rule, and exact TLBI counts per fully populated table for every variant.

use usermm::kmap::desc::{leaf_prot, MemType, PXN, RDONLY, UXN};
use usermm::kmap::*;

const K: u64 = 1 << 10;
const M: u64 = 1 << 20;
const G: u64 = 1 << 30;

fn space(layout: &RamLayout, granule: Granule, gran: LinearGranularity) -> KernelSpace {
    let mut cfg = KmapConfig::for_layout(layout, granule, gran);
    cfg.tlb_check = TlbCheck::Verify;
    cfg.pool_bytes += 64 * M;
    KernelSpace::new(layout, &cfg).expect("kernel space")
}

fn mapped(
    layout: &RamLayout,
    granule: Granule,
    gran: LinearGranularity,
    v: LinearMapVariant,
) -> KernelSpace {
    let mut ks = space(layout, granule, gran);
    ks.map_mem(gran, v).expect("map_mem");
    ks.validate().expect("invariants");
    ks
}

/// An early page-granular mapping request of `[phys, phys + size)` at its linear address.
fn early_pages(ks: &KernelSpace, phys: u64, size: u64) -> MapRequest {
    MapRequest {
        phys,
        virt: ks.phys_to_virt(phys),
        size,
        prot: Pgprot::KERNEL.tagged(),
        flags: LinearGranularity::ForcePages.flags(),
        phase: Phase::Early,
        alloc: TableAlloc::Allocate,
    }
}

/// Expected protection of the byte at `pa`: the image alias is plain `PAGE_KERNEL`.
fn expected_prot(layout: &RamLayout, pa: u64) -> Pgprot {
    let k = layout.kernel_image;
    if (k.start..k.end).contains(&pa) {
        Pgprot::KERNEL
    } else {
        Pgprot::KERNEL.tagged()
    }
}

fn check_translation(ks: &KernelSpace, pa: u64) {
    let g = ks.granule();
    let t = ks
        .translate(ks.phys_to_virt(pa))
        .unwrap_or_else(|e| panic!("{pa:#x}: {e}"));
    assert_eq!(t.pa, pa);
    assert_eq!(
        leaf_prot(t.desc, g),
        expected_prot(ks.layout(), pa),
        "prot at {pa:#x}"
    );
    assert!(t.uxn_table, "UXNTable on the path to {pa:#x}");
    assert_ne!(t.desc & PXN, 0);
    assert_ne!(t.desc & UXN, 0);
}

fn two_ranges() -> RamLayout {
    RamLayout::with_ranges(vec![
        PhysRange::new(G, G + 1100 * M + 64 * K),
        PhysRange::new(3 * G + 30 * M, 4 * G + 96 * M),
    ])
}

#[test]
fn every_page_translates_small_ram() {
    let layout = two_ranges();
    for gran in [LinearGranularity::Blocks, LinearGranularity::ForcePages] {
        for v in LinearMapVariant::ALL {
            let ks = mapped(&layout, Granule::K4, gran, v);
            for r in &layout.ranges {
                for pa in (r.start..r.end).step_by(4096) {
                    check_translation(&ks, pa);
                }
            }
            for hole in [
                G + 1100 * M + 64 * K,
                2 * G + 512 * M,
                3 * G + 30 * M - 4096,
                4 * G + 96 * M,
            ] {
                assert!(
                    ks.translate(ks.phys_to_virt(hole)).is_err(),
                    "hole {hole:#x} {v:?}"
                );
            }
            let s = ks.summary().unwrap();
            assert_eq!(s.mapped_bytes(), layout.total(), "{gran:?} {v:?}");
        }
    }
}

#[test]
fn leaves_blocks_and_cont_only_where_aligned() {
    let layout = two_ranges();
    let ks = mapped(
        &layout,
        Granule::K4,
        LinearGranularity::Blocks,
        LinearMapVariant::SingleMap,
    );
    let s = ks.summary().unwrap();
    let n = |level, cont| {
        s.leaves
            .get(&LeafKind { level, cont })
            .copied()
            .unwrap_or(0)
    };
    // [4G, 4G+96M) lies in a 1 GiB window that is not fully RAM: no 1 GiB block at all here.
    // [1G, 2G) would be one, but the kernel image hole splits it.
    assert_eq!(n(1, false), 0);
    assert!(
        n(2, true) > 0 && n(2, true) % 16 == 0,
        "32M cont-PMD runs: {}",
        n(2, true)
    );
    assert!(n(2, false) > 0);
    assert!(n(3, true) > 0 && n(3, true) % 16 == 0);
    for r in &s.runs {
        let size = Granule::K4.entry_size(r.kind.level) * if r.kind.cont { 16 } else { 1 };
        assert_eq!(r.va % size, 0, "{r:?}");
        assert_eq!(r.pa % size, 0, "{r:?}");
        assert_eq!(r.size % size, 0, "{r:?}");
    }
    // Aligned 1 GiB of RAM gets a PUD block.
    let one = RamLayout::single(4 * G);
    let ks = mapped(
        &one,
        Granule::K4,
        LinearGranularity::Blocks,
        LinearMapVariant::SingleMap,
    );
    let s = ks.summary().unwrap();
    assert_eq!(
        s.leaves.get(&LeafKind {
            level: 1,
            cont: false
        }),
        Some(&3)
    );
}

#[test]
fn forced_pages_map_only_pages_outside_the_alias() {
    let layout = two_ranges();
    let ks = mapped(
        &layout,
        Granule::K4,
        LinearGranularity::ForcePages,
        LinearMapVariant::SingleMap,
    );
    let k = layout.kernel_image;
    let (ks_va, ke_va) = (ks.phys_to_virt(k.start), ks.phys_to_virt(k.end));
    for r in ks.summary().unwrap().runs {
        if r.va >= ks_va && r.va + r.size <= ke_va {
            assert!(!r.kind.cont, "alias is mapped NO_CONT");
            continue;
        }
        assert_eq!(
            r.kind,
            LeafKind {
                level: 3,
                cont: false
            },
            "{r:?}"
        );
    }
}

#[test]
fn table_descriptors_carry_pxntable_outside_the_alias() {
    let layout = RamLayout::single(3 * G);
    let ks = mapped(
        &layout,
        Granule::K4,
        LinearGranularity::ForcePages,
        LinearMapVariant::SingleMap,
    );
    for pa in (layout.ranges[0].start..layout.ranges[0].end).step_by(2 * M as usize) {
        let t = ks.translate(ks.phys_to_virt(pa)).unwrap();
        let k = layout.kernel_image;
        let in_alias = pa >= k.start && pa + 2 * M <= k.end;
        assert!(t.uxn_table);
        if !in_alias {
            assert!(t.pxn_table, "PXNTable on the path to {pa:#x}");
        }
    }
}

/// Per-level TLBIs when mapping 1 GiB page by page into an empty space: one new PUD table
/// (one entry used), one full PMD table, 512 full PTE tables.
fn one_gib_pages(v: LinearMapVariant) -> KmapStats {
    let layout = RamLayout::single(4 * G);
    let mut ks = space(&layout, Granule::K4, LinearGranularity::ForcePages);
    let before = ks.stats().clone();
    let req = early_pages(&ks, 2 * G, G);
    ks.create_pgd_mapping(&req, v).unwrap();
    ks.validate().unwrap();
    ks.stats().delta(&before)
}

#[test]
fn tlbis_per_fully_populated_table() {
    for (v, per_table, pud) in [
        (LinearMapVariant::RemapPerCont, 33, 2),
        (LinearMapVariant::RemapAllocPopulate, 2, 2),
        (LinearMapVariant::SingleMap, 1, 1),
        (LinearMapVariant::VaLate, 1, 1),
    ] {
        let d = one_gib_pages(v);
        assert_eq!(d.tables_allocated, [0, 1, 1, 512], "{v:?}");
        assert_eq!(
            d.tlbi_page_by_level[3],
            512 * per_table,
            "{v:?}: PTE tables"
        );
        assert_eq!(d.tlbi_page_by_level[2], per_table, "{v:?}: the PMD table");
        assert_eq!(d.tlbi_page_by_level[1], pud, "{v:?}: the PUD table");
        assert_eq!(d.tlbi_page, 513 * per_table + pud);
        assert_eq!(d.fixmap_maps, d.fixmap_unmaps);
        assert_eq!(d.fixmap_unmaps, d.tlbi_page, "one TLBI per slot clear");
        assert_eq!(d.entries_written, 512 * 512 + 512 + 1 + 1);
        println!("{}: {per_table} TLBIs per full table", v.name());
    }
}

#[test]
fn tlbis_for_one_new_table_under_existing_ones() {
    for (v, expected) in [
        (LinearMapVariant::RemapPerCont, 33),
        (LinearMapVariant::RemapAllocPopulate, 2),
        (LinearMapVariant::SingleMap, 1),
        (LinearMapVariant::VaLate, 1),
    ] {
        let layout = RamLayout::single(4 * G);
        let mut ks = space(&layout, Granule::K4, LinearGranularity::ForcePages);
        let req = early_pages(&ks, 2 * G, 2 * M);
        ks.create_pgd_mapping(&req, v).unwrap();
        let before = ks.stats().clone();
        let req = early_pages(&ks, 2 * G + 2 * M, 2 * M);
        ks.create_pgd_mapping(&req, v).unwrap();
        let d = ks.stats().delta(&before);
        assert_eq!(d.tables_allocated, [0, 0, 0, 1]);
        assert_eq!(d.tlbi_page_by_level[3], expected, "{v:?}");
        // The PUD and PMD tables are only revisited: one map/unmap each.
        assert_eq!(d.tlbi_page_by_level[1], 1, "{v:?}");
        assert_eq!(d.tlbi_page_by_level[2], 1, "{v:?}");
        ks.validate().unwrap();
    }
}

#[test]
fn late_tlbis_per_table() {
    for (v, per_table) in [
        (LinearMapVariant::RemapPerCont, 32),
        (LinearMapVariant::RemapAllocPopulate, 1),
        (LinearMapVariant::SingleMap, 1),
        (LinearMapVariant::VaLate, 0),
    ] {
        let layout = RamLayout::single(2 * G);
        let gran = LinearGranularity::ForcePages;
        let mut ks = space(&layout, Granule::K4, gran);
        ks.map_mem(gran, v).unwrap();
        let before = ks.stats().clone();
        ks.add_memory(PhysRange::new(4 * G, 5 * G), gran, v)
            .unwrap();
        let d = ks.stats().delta(&before);
        ks.validate().unwrap();
        assert_eq!(d.tables_allocated, [0, 0, 1, 512], "{v:?}");
        assert_eq!(d.tlbi_page_by_level[3], 512 * per_table, "{v:?}");
        assert_eq!(d.tlbi_page_by_level[2], per_table, "{v:?}");
        if v == LinearMapVariant::VaLate {
            assert_eq!(d.tlbi(), 0, "no TLBI at all for late changes");
            assert_eq!(d.fixmap_maps, 0);
        }
        for pa in (4 * G..5 * G).step_by(4096) {
            let t = ks.translate(ks.phys_to_virt(pa)).unwrap();
            assert_eq!((t.pa, leaf_prot(t.desc, Granule::K4)), (pa, Pgprot::KERNEL));
        }
    }
}

#[test]
fn map_mem_tlbis_are_tables_plus_revisits() {
    // single_map: every table visit costs exactly one TLBI; remap_alloc_populate adds one per
    // allocation; remap_per_cont pays per chunk.
    let layout = RamLayout::single(8 * G);
    let gran = LinearGranularity::ForcePages;
    let s = |v| {
        let ks = mapped(&layout, Granule::K4, gran, v);
        ks.stats().clone()
    };
    let single = s(LinearMapVariant::SingleMap);
    let rap = s(LinearMapVariant::RemapAllocPopulate);
    let rpc = s(LinearMapVariant::RemapPerCont);
    assert_eq!(single.tables_allocated, rap.tables_allocated);
    assert_eq!(single.tables_allocated, rpc.tables_allocated);
    assert_eq!(rap.tlbi_page - single.tlbi_page, single.tables_total());
    assert!(rpc.tlbi_page > 30 * single.tlbi_page);
    assert_eq!(single.tables_zeroed, single.tables_total());
    assert_eq!(rap.tables_zeroed, rap.tables_total());
}

#[test]
fn fixmap_clear_after_every_call_and_every_error() {
    let layout = RamLayout::single(G);
    for v in LinearMapVariant::ALL {
        let mut ks = space(&layout, Granule::K4, LinearGranularity::Blocks);
        ks.map_mem(LinearGranularity::Blocks, v).unwrap();
        assert!(ks.fixmap_slots_in_use().is_empty());
        assert_eq!(ks.fixmap_tlb_entries(), 0);
        // A failing call (page request inside a 2 MiB block) leaves no slot behind.
        let mut req = early_pages(&ks, G + 512 * M, 4096);
        req.phase = Phase::Late;
        let err = ks.create_pgd_mapping(&req, v).unwrap_err();
        assert!(
            matches!(err, KmapError::BlockInTheWay { level: 2, .. }),
            "{err}"
        );
        assert!(ks.fixmap_slots_in_use().is_empty(), "{v:?}");
        assert_eq!(ks.fixmap_tlb_entries(), 0);
        ks.validate().unwrap();
    }
}

#[test]
fn out_of_tables_is_an_error_with_clean_fixmap() {
    let layout = RamLayout::single(8 * G);
    let mut cfg = KmapConfig::for_layout(&layout, Granule::K4, LinearGranularity::Blocks);
    cfg.pool_bytes = 4 * M;
    let mut ks = KernelSpace::new(&layout, &cfg).unwrap();
    let err = ks
        .map_mem(LinearGranularity::ForcePages, LinearMapVariant::SingleMap)
        .unwrap_err();
    assert!(matches!(err, KmapError::OutOfTables { .. }), "{err}");
    assert!(ks.fixmap_slots_in_use().is_empty());
}

#[test]
fn no_table_entry_is_overwritten_by_a_block() {
    let layout = RamLayout::single(4 * G);
    for v in LinearMapVariant::ALL {
        let mut ks = space(&layout, Granule::K4, LinearGranularity::ForcePages);
        let req = early_pages(&ks, 2 * G, 2 * M);
        ks.create_pgd_mapping(&req, v).unwrap();
        let blocks = MapRequest {
            flags: LinearGranularity::Blocks.flags(),
            ..req
        };
        let err = ks.create_pgd_mapping(&blocks, v).unwrap_err();
        assert!(
            matches!(err, KmapError::UnsafeChange { level: 2, .. }),
            "{v:?}: {err}"
        );
        // A 1 GiB block over the existing PMD table is refused too.
        let gib = MapRequest { size: G, ..blocks };
        let err = ks.create_pgd_mapping(&gib, v).unwrap_err();
        assert!(
            matches!(err, KmapError::UnsafeChange { level: 1, .. }),
            "{err}"
        );
        ks.validate().unwrap();
        let t = ks.translate(ks.phys_to_virt(2 * G + 4096)).unwrap();
        assert_eq!(t.level, 3, "the table is still there");
    }
}

#[test]
fn safe_change_rule_is_enforced() {
    let layout = RamLayout::single(2 * G);
    for gran in [LinearGranularity::Blocks, LinearGranularity::ForcePages] {
        let mut ks = mapped(&layout, Granule::K4, gran, LinearMapVariant::SingleMap);
        // Permission-only change of live entries: allowed, no table allocated.
        let tables = ks.stats().tables_total();
        ks.mark_linear_text_alias_ro(LinearMapVariant::SingleMap)
            .unwrap();
        assert_eq!(ks.stats().tables_total(), tables);
        let k = layout.kernel_image;
        for pa in (k.start..k.end).step_by(64 * K as usize) {
            let t = ks.translate(ks.phys_to_virt(pa)).unwrap();
            assert_ne!(t.desc & RDONLY, 0, "{pa:#x} read-only");
            assert_eq!(MemType::of(t.desc), Some(MemType::Normal));
        }
        ks.validate().unwrap();
        // Pointing a live mapping at other memory is refused. With blocks, [1G+28M, 1G+30M)
        // is a plain 2 MiB block (between the image and the first 32 MiB run).
        let (target, size) = match gran {
            LinearGranularity::Blocks => (G + 28 * M, 2 * M),
            LinearGranularity::ForcePages => (G + 512 * M, 4096),
        };
        let mut req = early_pages(&ks, target + 8 * M, size);
        req.virt = ks.phys_to_virt(target);
        req.flags = gran.flags();
        let err = ks
            .create_pgd_mapping(&req, LinearMapVariant::SingleMap)
            .unwrap_err();
        assert!(matches!(err, KmapError::UnsafeChange { .. }), "{err}");
        // So is making it executable for EL0 or global -> non-global -> global.
        let same = MapRequest {
            phys: target,
            prot: Pgprot(Pgprot::KERNEL.tagged().0 & !UXN),
            ..req
        };
        assert!(matches!(
            ks.create_pgd_mapping(&same, LinearMapVariant::SingleMap),
            Err(KmapError::UnsafeChange { .. })
        ));
        let ng = MapRequest {
            prot: Pgprot::KERNEL.tagged().non_global(),
            ..same
        };
        ks.create_pgd_mapping(&ng, LinearMapVariant::SingleMap)
            .unwrap();
        let g_again = MapRequest {
            prot: Pgprot::KERNEL.tagged(),
            ..ng
        };
        assert!(matches!(
            ks.create_pgd_mapping(&g_again, LinearMapVariant::SingleMap),
            Err(KmapError::UnsafeChange { .. })
        ));
        ks.validate().unwrap();
    }
}

#[test]
fn offset_mismatch_is_refused() {
    let layout = RamLayout::single(G);
    let mut ks = space(&layout, Granule::K4, LinearGranularity::Blocks);
    let mut req = early_pages(&ks, G, 8192);
    req.virt += 8;
    assert!(matches!(
        ks.create_pgd_mapping(&req, LinearMapVariant::SingleMap),
        Err(KmapError::OffsetMismatch { .. })
    ));
}

#[test]
fn other_granules() {
    // Per full PTE table, remap_per_cont pays one TLBI per contiguous chunk plus one:
    // 16K: 2048 / 128 + 1 = 17; 64K: 8192 / 32 + 1 = 257.
    for (granule, rpc_per_table) in [(Granule::K16, 17), (Granule::K64, 257)] {
        let layout = RamLayout::single(3 * G);
        for gran in [LinearGranularity::Blocks, LinearGranularity::ForcePages] {
            for v in LinearMapVariant::ALL {
                let ks = mapped(&layout, granule, gran, v);
                let r = layout.ranges[0];
                for pa in (r.start..r.end).step_by(granule.page_size() as usize * 7) {
                    check_translation(&ks, pa);
                }
            }
        }
        let pte_span = granule.entry_size(2);
        for (v, per_table) in [
            (LinearMapVariant::RemapPerCont, rpc_per_table),
            (LinearMapVariant::RemapAllocPopulate, 2),
            (LinearMapVariant::SingleMap, 1),
        ] {
            let mut ks = space(&layout, granule, LinearGranularity::ForcePages);
            let base = 2 * G;
            ks.create_pgd_mapping(&early_pages(&ks, base, pte_span), v)
                .unwrap();
            let before = ks.stats().clone();
            ks.create_pgd_mapping(&early_pages(&ks, base + pte_span, 4 * pte_span), v)
                .unwrap();
            let d = ks.stats().delta(&before);
            assert_eq!(d.tables_allocated[3], 4);
            assert_eq!(d.tlbi_page_by_level[3], 4 * per_table, "{granule:?} {v:?}");
            ks.validate().unwrap();
        }
    }
}

#[test]
fn sixteen_k_and_sixty_four_k_leaf_shapes() {
    // PHYS_OFFSET is only 512 MiB aligned with 64K pages: start RAM at 16 GiB so that VA and
    // PA agree modulo a 16 GiB contiguous run.
    let layout = RamLayout::with_ranges(vec![PhysRange::new(16 * G, 56 * G)]);
    let ks = mapped(
        &layout,
        Granule::K64,
        LinearGranularity::Blocks,
        LinearMapVariant::SingleMap,
    );
    let s = ks.summary().unwrap();
    assert!(
        s.leaves.contains_key(&LeafKind {
            level: 2,
            cont: true
        }),
        "16G cont-PMD runs"
    );
    assert!(!s.leaves.contains_key(&LeafKind {
        level: 1,
        cont: false
    }));
    let layout = RamLayout::single(40 * G);
    let ks = mapped(
        &layout,
        Granule::K16,
        LinearGranularity::Blocks,
        LinearMapVariant::SingleMap,
    );
    let s = ks.summary().unwrap();
    assert!(
        s.leaves.contains_key(&LeafKind {
            level: 2,
            cont: true
        }),
        "1G cont-PMD runs"
    );
    assert!(
        !s.leaves.contains_key(&LeafKind {
            level: 1,
            cont: false
        }),
        "no PUD blocks on 16K"
    );
}

#[test]
fn sampled_translation_large_blocks() {
    let layout = RamLayout::with_ranges(vec![
        PhysRange::new(G, 40 * G + 6 * M),
        PhysRange::new(64 * G + 64 * K, 100 * G),
    ]);
    for v in LinearMapVariant::ALL {
        let ks = mapped(&layout, Granule::K4, LinearGranularity::Blocks, v);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for r in &layout.ranges {
            for _ in 0..20_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let pa = r.start + (x % r.size()) / 4096 * 4096;
                check_translation(&ks, pa);
            }
            check_translation(&ks, r.end - 4096);
        }
    }
}

#[test]
fn late_access_reaches_tables_through_the_linear_map() {
    let layout = RamLayout::single(G);
    let mut ks = mapped(
        &layout,
        Granule::K4,
        LinearGranularity::ForcePages,
        LinearMapVariant::VaLate,
    );
    let pgd = ks.pgd_pa();
    let word = ks.read_u64(ks.phys_to_virt(pgd)).unwrap();
    assert_ne!(
        word, 0,
        "the PGD, read through its linear alias, points at the PUD table"
    );
}

/// The headline configuration: 512 GiB, page granular (1 GiB of PTE tables).
#[test]
#[ignore = "maps 512 GiB page by page: ~1 GiB of tables, several seconds"]
fn map_512g_page_granular() {
    let layout = RamLayout::single(512 * G);
    let gran = LinearGranularity::ForcePages;
    let cfg = KmapConfig::for_layout(&layout, Granule::K4, gran);
    let mut ks = KernelSpace::new(&layout, &cfg).unwrap();
    ks.map_mem(gran, LinearMapVariant::SingleMap).unwrap();
    let s = ks.stats().clone();
    // Every 2 MiB gets a PTE table except those inside the kernel image, whose alias is mapped
    // afterwards with blocks allowed (NO_CONT_MAPPINGS only), as map_mem does.
    assert_eq!(
        s.tables_allocated[3],
        512 * 512 - KERNEL_IMAGE_SIZE / (2 * M)
    );
    assert!(s.tables_total() * 4096 >= G, "a GiB of tables");
    ks.validate().unwrap();
    let mut x = 12345u64;
    for _ in 0..100_000 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let pa = G + ((x >> 11) % (512 * G)) / 4096 * 4096;
        check_translation(&ks, pa);
    }
}
