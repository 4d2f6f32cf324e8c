//! The profile's features, priors, safety as hostile input and cache.

use super::*;

fn profile() -> Profile {
    Profile {
        model_key: "k".into(),
        created_unix: 1000,
        fingerprint: Fingerprint::read(),
        calibrate_seconds: 1.0,
        ..Profile::example().expect("fit")
    }
}

#[test]
fn a_profile_round_trips_and_predicts() {
    let p = profile();
    let text = serde_json::to_string(&p).expect("json");
    let q = Profile::from_json(&text, "t").expect("valid");
    assert_eq!(p.fit.prices.len(), q.fit.prices.len());
    let c: BTreeMap<String, u64> = [("syscalls".to_string(), 1), ("pte_reads".to_string(), 50)]
        .into_iter()
        .collect();
    let pred = q.predict("probe", &c);
    assert!((pred.ns - 175.0).abs() < 5.0, "{pred:?}");
    assert!(pred.ci95[0] <= pred.ns && pred.ns <= pred.ci95[1]);
    assert!(q.fresh_for(&p.fingerprint, "k", 2000));
    assert!(!q.fresh_for(&p.fingerprint, "other probes", 2000));
    assert!(!q.fresh_for(&p.fingerprint, "k", 1000 + MAX_AGE_SECS + 1));
    let other = Fingerprint {
        kernel_build: "another build".into(),
        ..p.fingerprint.clone()
    };
    assert!(!q.fresh_for(&other, "k", 2000));
}

#[test]
fn probe_times_pool_across_models_with_the_same_timing_key_on_the_same_machine() {
    let mut p = profile();
    let here = p.fingerprint.clone();
    let other = Fingerprint {
        kernel_build: "another build".into(),
        ..here.clone()
    };
    // Without a timing key (a profile from before it): only its own model's.
    assert!(p.timings_poolable(&here, "k", "t", 2000));
    assert!(!p.timings_poolable(&here, "another model", "t", 2000));
    assert!(!p.timings_poolable(&here, "another model", "", 2000));
    // With one: another model's calibration pools it when the timing keys agree, on this
    // machine and kernel only, whatever the profile's age (each timing's is the pool's).
    p.timing_key = "t".into();
    assert!(p.timings_poolable(&here, "another model", "t", 2000));
    assert!(p.timings_poolable(&here, "another model", "t", 1000 + MAX_AGE_SECS + 1));
    assert!(!p.timings_poolable(&here, "another model", "other probes", 2000));
    assert!(!p.timings_poolable(&other, "another model", "t", 2000));
    assert!(!p.timings_poolable(&other, "k", "t", 2000));
}

#[test]
fn features_split_what_one_counter_names_in_different_paths() {
    let prims = Primitives::default();
    let c = |v: &[(&str, u64)]| -> BTreeMap<String, u64> {
        v.iter().map(|&(k, n)| (k.to_string(), n)).collect()
    };
    // Fork: the child's entries are fork_ptes, not generic writes; a fork's fixed work.
    let f = features(
        "fork",
        &c(&[("pte_writes", 1010), ("fork_ptes", 1000), ("syscalls", 1)]),
        &prims,
        0,
    );
    assert_eq!((f["pte_writes"], f[OP_FORK]), (10.0, 1.0));
    assert!(!f.contains_key(OP_EXIT));
    // Zap: cleared entries out of the RMWs; munmap's call priced as a munmap.
    let f = features(
        "munmap",
        &c(&[("pte_atomics", 600), ("zap_ptes", 512), ("syscalls", 1)]),
        &prims,
        0,
    );
    assert_eq!((f["pte_atomics"], f[SYSCALLS_MM]), (88.0, 1.0));
    assert!(!f.contains_key("syscalls"));
    // mprotect: its entries apart; a PMD split's table fill stays plain writes.
    let f = features(
        "mprotect",
        &c(&[("pte_reads", 1), ("pte_writes", 513)]),
        &prims,
        0,
    );
    assert_eq!(
        (f[MPROTECT_ENTRIES], f[MPROTECT_WRITES], f["pte_writes"]),
        (1.0, 1.0, 512.0)
    );
    // Zeroing past a 32 MiB cache: 8192 pages warm, the rest cold.
    let f = features(
        "fault",
        &c(&[("pages_zeroed", 65536), ("pages_copied", 10)]),
        &prims,
        32 << 20,
    );
    assert_eq!((f["pages_zeroed"], f[PAGES_ZEROED_COLD]), (8192.0, 57344.0));
    assert!(!f.contains_key(PAGES_COPIED_COLD), "10 copies fit");
    // Past a 32 MiB cache, 3/4 of a 32 768-page walk is cold; half of its folio
    // boundaries far apart (HOST_FAR 500): zap's large batches apart from its small ones,
    // fork's all one kind, its write-protects' cold lines, a file fault's mapped folios.
    let f = features(
        "munmap",
        &c(&[
            ("zap_ptes", 32768),
            ("zap_batches", 3000),
            ("zap_batches_large", 1000),
            (HOST_FAR, 500),
        ]),
        &prims,
        32 << 20,
    );
    assert_eq!((f[FOLIOS_COLD], f[LARGE_FOLIOS_COLD]), (750.0, 375.0));
    // One page per MADV_DONTNEED call over 64 THPs: 64 distinct folios, not 32 768.
    let f = features(
        "madvise",
        &c(&[
            ("zap_ptes", 32768),
            ("zap_batches", 32768),
            ("syscalls", 32768),
            ("folios_freed", 64),
        ]),
        &prims,
        32 << 20,
    );
    assert_eq!(f[FOLIOS_COLD], 64.0 * 0.75);
    let f = features(
        "fork",
        &c(&[
            ("fork_ptes", 32768),
            ("pte_atomics", 32768),
            ("fork_batches", 2048),
            ("fork_batches_large", 2048),
            (HOST_FAR, 500),
        ]),
        &prims,
        32 << 20,
    );
    assert_eq!(f[FOLIOS_COLD], 768.0);
    assert!(
        !f.contains_key(LARGE_FOLIOS_COLD),
        "fork's large batches are not zap's"
    );
    assert!(
        !f.contains_key(PTE_ATOMICS_COLD),
        "a large folio's entries are write-protected in one streamed run"
    );
    let small = features(
        "fork",
        &c(&[
            ("fork_ptes", 32768),
            ("pte_atomics", 32768),
            ("fork_batches", 32768 - 1024),
            ("fork_batches_large", 256),
        ]),
        &prims,
        32 << 20,
    );
    // Of 31 744 batches 31 488 are single pages; 3/4 of the walk is cold.
    assert_eq!(small[PTE_ATOMICS_COLD], 31488.0 * 0.75);
    assert_eq!(f[OP_FORK_COLD], 1.0, "128 MiB written fill a 32 MiB cache");
    assert!(
        !f.contains_key(WALK_COLD),
        "fork's cold walk is its folios'"
    );
    let walk = features("mprotect", &c(&[("pte_reads", 32768)]), &prims, 32 << 20);
    assert_eq!(walk[WALK_COLD], 24576.0);
    // A fork's cold fixed work: the share of the cache its layout filled.
    let fork = |pages: u64, llc: u64| features("fork", &c(&[("fork_ptes", pages)]), &prims, llc);
    assert_eq!(fork(1024, 32 << 20)[OP_FORK_COLD], 0.125);
    assert_eq!(
        fork(0, 32 << 20)[OP_FORK_COLD],
        0.0,
        "empty VMAs fill nothing"
    );
    assert!(
        !fork(1024, 0).contains_key(OP_FORK_COLD),
        "no cache size read"
    );
    assert!(!f_has_cold_fixed("spawn", &prims) && !f_has_cold_fixed("munmap", &prims));
    let f = features(
        "fault_file",
        &c(&[
            ("pte_reads", 32768),
            ("fault_around_pages", 30720),
            ("faults_file", 2048),
        ]),
        &prims,
        32 << 20,
    );
    assert_eq!(f[FOLIOS_COLD], 24576.0, "no HOST_FAR: scattered");
    // Spawn: fork and exit.
    let f = features("spawn", &c(&[("vmas_copied", 21)]), &prims, 0);
    assert_eq!((f[OP_SPAWN], f[OP_EXIT]), (1.0, 1.0));
    assert!(
        !f.contains_key(OP_FORK),
        "the bench agent's fork is not the spawn agent's"
    );
}

#[test]
fn hostile_profiles_are_refused() {
    let p = profile();
    let bad = |f: &dyn Fn(&mut Profile)| {
        let mut q = p.clone();
        f(&mut q);
        let text = serde_json::to_string(&q).expect("json");
        assert!(Profile::from_json(&text, "t").is_err(), "accepted");
    };
    bad(&|q| q.version = 99);
    bad(&|q| q.fit.prices[0].multiplier = -1.0);
    bad(&|q| q.fit.covariance.pop().map(drop).unwrap_or(()));
    bad(&|q| q.primitives.kcall = -3.0);
    bad(&|q| {
        q.fit.priors.insert("../../etc".into(), 1.0);
    });
    bad(&|q| q.fingerprint.cmdline = "x".repeat(5000));
    bad(&|q| q.observations[0].ns = -1.0);
    let timings = |ns: f64| crate::pool::Timings {
        created_unix: 1,
        ns: [("fork/4K 0v 100p".to_string(), ns)].into_iter().collect(),
    };
    bad(&|q| q.timings = vec![timings(0.0)]);
    bad(&|q| q.timings = vec![timings(1.0); crate::pool::POOL + 1]);
    let mut ok = p.clone();
    ok.timings = vec![timings(1.0); crate::pool::POOL];
    let text = serde_json::to_string(&ok).expect("json");
    assert_eq!(Profile::from_json(&text, "t").expect("valid"), ok);
    assert!(Profile::from_json("{", "t").is_err());
    assert!(Profile::from_json("[]", "t").is_err());
    // NaN cannot be written as JSON; a huge number parses as infinity and is refused.
    let text = serde_json::to_string(&p).expect("json").replacen(
        "\"lambda\":",
        "\"lambda\":1e999,\"x\":",
        1,
    );
    assert!(Profile::from_json(&text, "t").is_err());
}

#[test]
fn saving_never_follows_a_link_and_loading_is_bounded() {
    let dir = std::env::temp_dir().join(format!("usermm-profile-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let p = profile();
    let path = dir.join("p.json");
    p.save(&path).expect("save");
    assert_eq!(
        Profile::load(&path).expect("load").fit.prices.len(),
        p.fit.prices.len()
    );
    // A symbolic link is neither followed by a load nor replaced through by a save.
    let target = dir.join("target");
    std::fs::write(&target, "keep").expect("write");
    let link = dir.join("link.json");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    assert!(Profile::load(&link).is_err());
    p.save(&link).expect("save over a link replaces the link");
    assert_eq!(std::fs::read_to_string(&target).expect("read"), "keep");
    // Too large.
    let big = dir.join("big.json");
    std::fs::write(&big, vec![b' '; (MAX_PROFILE_BYTES + 10) as usize]).expect("write");
    assert!(matches!(
        Profile::load(&big),
        Err(ProfileError::Invalid { .. })
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether `op`'s features of a 256 MiB walk carry fork's cold fixed work.
fn f_has_cold_fixed(op: &str, prims: &Primitives) -> bool {
    let c: BTreeMap<String, u64> = [
        ("fork_ptes".to_string(), 65536),
        ("zap_ptes".to_string(), 65536),
    ]
    .into_iter()
    .collect();
    features(op, &c, prims, 32 << 20).contains_key(OP_FORK_COLD)
}
