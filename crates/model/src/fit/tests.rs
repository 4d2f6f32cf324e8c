//! The fitter proven on synthetic probes of known prices.

use super::*;

/// A deterministic xorshift stream in [0, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    /// A standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.next().max(1e-12), self.next());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// Synthetic probes: four families over five counters, each swept on a grid with the
/// others held, timed as Σ counter × true price with 3 % relative noise.
fn synthetic(truth: &BTreeMap<String, f64>, noise: f64, seed: u64) -> Vec<Observation> {
    let mut rng = Rng(seed);
    let mut out = Vec::new();
    let fams: [(&str, &[(&str, f64)]); 4] = [
        (
            "mprotect",
            &[("syscalls", 1.0), ("pte_writes", 1.0), ("pte_reads", 1.0)],
        ),
        (
            "fork",
            &[("op_fork", 1.0), ("vmas_copied", 0.0), ("pte_writes", 2.0)],
        ),
        ("fault", &[("faults", 1.0), ("pages_zeroed", 1.0)]),
        (
            "munmap",
            &[("syscalls", 1.0), ("pte_reads", 1.0), ("pages_zeroed", 0.0)],
        ),
    ];
    for (fam, shape) in fams {
        for n in [1.0, 7.0, 40.0, 300.0, 2000.0] {
            for v in [0.0, 50.0, 900.0] {
                let mut counters = BTreeMap::new();
                for &(c, per) in shape {
                    // Per-call counters once, the swept ones n times; vmas swept by v.
                    let k = match c {
                        "syscalls" | "op_fork" => 1.0,
                        "vmas_copied" => v,
                        _ => per * n,
                    };
                    counters.insert(c.to_string(), k);
                }
                if fam == "munmap" {
                    // Zeroing swept apart from the reads: v pages.
                    counters.insert("pages_zeroed".into(), v);
                }
                if fam == "fault" {
                    counters.insert("pages_zeroed".into(), n + v);
                }
                let t: f64 = counters.iter().map(|(c, n)| n * truth[c]).sum();
                out.push(Observation {
                    family: fam.into(),
                    op: fam.into(),
                    label: format!("n={n} v={v}"),
                    counters,
                    ns: t * (1.0 + noise * rng.normal()),
                });
            }
        }
    }
    out
}

fn map(v: &[(&str, f64)]) -> BTreeMap<String, f64> {
    v.iter().map(|&(k, x)| (k.to_string(), x)).collect()
}

/// The true prices of [`synthetic`]'s counters, ns.
fn true_prices() -> BTreeMap<String, f64> {
    map(&[
        ("syscalls", 90.0),
        ("pte_writes", 6.0),
        ("pte_reads", 1.5),
        ("op_fork", 40_000.0),
        ("vmas_copied", 180.0),
        ("faults", 900.0),
        ("pages_zeroed", 300.0),
    ])
}

#[test]
fn synthetic_prices_are_recovered_within_their_reported_errors() {
    let truth = true_prices();
    // Recipes off by up to a factor of two either way.
    let priors = map(&[
        ("syscalls", 70.0),
        ("pte_writes", 12.0),
        ("pte_reads", 1.0),
        ("op_fork", 30_000.0),
        ("vmas_copied", 255.0),
        ("faults", 600.0),
        ("pages_zeroed", 450.0),
        ("tlb_flush_mm", 100.0),
    ]);
    let obs = synthetic(&truth, 0.03, 0x5eed);
    let fit = Fit::new(&priors, &obs).expect("fit");
    for (c, &t) in &truth {
        let g = fit.group_of(c).expect("priced");
        assert_eq!(
            fit.prices[g].counters,
            vec![c.clone()],
            "nothing merged: every counter swept apart"
        );
        // The families that carry it are named on the shared price too.
        assert!(!fit.prices[g].families.is_empty(), "{c}: no family named");
        // In every operation that has it: its own price, or the shared one.
        let ops: BTreeSet<&str> = obs
            .iter()
            .filter(|o| o.counters.get(c).is_some_and(|&n| n > 0.0))
            .map(|o| o.op.as_str())
            .collect();
        for op in ops {
            let (got, se) = (fit.price(op, c), fit.price_se(op, c));
            assert!(se > 0.0, "{c} in {op}: a standard error");
            assert!(
                (got - t).abs() <= 3.0 * se,
                "{c} in {op}: fitted {got:.2}, true {t}, se {se:.3}"
            );
            assert!(
                (got - t).abs() / t < 0.1,
                "{c} in {op}: fitted {got:.2}, true {t}"
            );
        }
    }
    // No probe excites the TLB flush: its recipe at the common scale, with no families.
    let mu = fit.price("fault", "tlb_flush_mm") / 100.0;
    assert!((0.5..1.6).contains(&mu), "{mu}");
    let g = fit.group_of("tlb_flush_mm").expect("group");
    assert!(fit.prices[g].families.is_empty());
    // Held out family by family: the noise, and where a family alone prices a counter
    // (fork's op_fork and vmas_copied) the recipe's error on it (up to 42 % here).
    assert!(
        fit.held_out_median_pct() < 15.0,
        "{}",
        fit.held_out_median_pct()
    );
    assert!(
        fit.in_sample_median_pct < 4.0,
        "{}",
        fit.in_sample_median_pct
    );
    // A prediction's interval covers the truth of a new operation.
    let new = map(&[("syscalls", 1.0), ("pte_writes", 5000.0), ("faults", 10.0)]);
    let truth_ns: f64 = new.iter().map(|(c, n)| n * truth[c]).sum();
    let p = fit.predict("another", &new);
    assert!(
        p.ci95[0] <= truth_ns && truth_ns <= p.ci95[1],
        "{p:?} vs {truth_ns}"
    );
}

#[test]
fn proportional_counters_are_merged_and_keep_their_recipe_shares() {
    // pte_reads and pte_writes always come together (one per entry): one group.
    let truth = map(&[
        ("syscalls", 100.0),
        ("pte_reads", 2.0),
        ("pte_writes", 8.0),
        ("faults", 1000.0),
    ]);
    let priors = map(&[
        ("syscalls", 100.0),
        ("pte_reads", 1.0),
        ("pte_writes", 4.0),
        ("faults", 1000.0),
    ]);
    let mut obs = Vec::new();
    for (fam, per_call) in [("a", "syscalls"), ("b", "faults")] {
        for n in [1.0, 10.0, 100.0, 1000.0] {
            let counters = map(&[(per_call, 1.0), ("pte_reads", n), ("pte_writes", n)]);
            let ns = counters.iter().map(|(c, n)| n * truth[c]).sum();
            obs.push(Observation {
                family: fam.into(),
                op: String::new(),
                label: format!("{n}"),
                counters,
                ns,
            });
        }
    }
    let fit = Fit::new(&priors, &obs).expect("fit");
    let g = fit.group_of("pte_reads").expect("group");
    assert_eq!(
        fit.prices[g].counters,
        vec!["pte_reads".to_string(), "pte_writes".to_string()]
    );
    // The pair's sum is determined (10 per entry, less the ridge's pull toward the
    // common scale), each keeps its recipe share (1:4).
    let sum = fit.price("", "pte_reads") + fit.price("", "pte_writes");
    assert!((sum - 10.0).abs() < 1.5, "{sum}");
    assert!((fit.price("", "pte_writes") / fit.price("", "pte_reads") - 4.0).abs() < 1e-9);
    let gain = fit.gain(
        "",
        &map(&[("syscalls", 1.0), ("pte_reads", 10.0)]),
        &map(&[("syscalls", 1.0), ("pte_reads", 20.0)]),
    );
    let (g, [lo, hi]) = gain.expect("a gain");
    assert!(lo <= g && g <= hi && g > 0.0, "{g} [{lo}, {hi}]");
}

#[test]
fn one_counter_priced_apart_in_two_operations_is_recovered_in_each() {
    // A PTE read costs 2 ns in fork's batched copy and 8 ns in munmap's walk (one recipe
    // of 4 for both): each operation's own price is found, where one shared price would
    // miss both by a factor of two.
    let mut rng = Rng(11);
    let mut obs = Vec::new();
    let ops = [
        ("fork", "op_fork", 50_000.0, 2.0),
        ("munmap", "syscalls", 900.0, 8.0),
    ];
    for (op, fixed, fixed_ns, read_ns) in ops {
        for (fam, grid) in [
            ("4K", [10.0, 300.0, 4000.0]),
            ("2M", [50.0, 900.0, 20_000.0]),
        ] {
            for n in grid {
                let counters = map(&[(fixed, 1.0), ("pte_reads", n)]);
                let ns = (fixed_ns + n * read_ns) * (1.0 + 0.02 * rng.normal());
                obs.push(Observation {
                    family: format!("{op}/{fam}"),
                    op: op.into(),
                    label: format!("{n}"),
                    counters,
                    ns,
                });
            }
        }
    }
    let priors = map(&[
        ("op_fork", 40_000.0),
        ("syscalls", 1000.0),
        ("pte_reads", 4.0),
    ]);
    let fit = Fit::new(&priors, &obs).expect("fit");
    for (op, _, _, truth) in ops {
        let (got, se) = (fit.price(op, "pte_reads"), fit.price_se(op, "pte_reads"));
        assert!(
            (got - truth).abs() <= 3.0 * se && (got - truth).abs() / truth < 0.1,
            "{op}: fitted {got:.2} ± {se:.2}, true {truth}"
        );
    }
    assert!(
        fit.op_lambda <= 0.01,
        "the operations' own prices are chosen: λ_o {}",
        fit.op_lambda
    );
    assert!(
        fit.held_out_median_pct() < 6.0,
        "{}",
        fit.held_out_median_pct()
    );
    // An operation no probe timed is priced with the shared price, between the two.
    let shared = fit.price("mremap", "pte_reads");
    assert!((2.0..8.0).contains(&shared), "{shared}");
}

#[test]
fn a_workload_of_several_operations_is_the_sum_of_their_predictions() {
    let truth = true_prices();
    let fit = Fit::new(&truth, &synthetic(&truth, 0.03, 3)).expect("fit");
    let fork = map(&[("op_fork", 1.0), ("pte_writes", 2000.0)]);
    let munmap = map(&[("syscalls", 1.0), ("pte_reads", 1000.0)]);
    let (a, b) = (fit.predict("fork", &fork), fit.predict("munmap", &munmap));
    let both = fit.predict_all(&[("fork", &fork), ("munmap", &munmap)]);
    assert!((both.ns - (a.ns + b.ns)).abs() < 1e-6 * both.ns, "{both:?}");
    // Fully correlated at worst, independent at best.
    assert!(both.fit_sd <= a.fit_sd + b.fit_sd + 1e-9);
    assert!(both.fit_sd >= (a.fit_sd.powi(2) + b.fit_sd.powi(2)).sqrt() * 0.5);
    // The same workload gains nothing; fewer PTE writes gain.
    let same = [("fork", &fork), ("munmap", &munmap)];
    let (g, [lo, hi]) = fit.gain_all(&same, &same).expect("gain");
    assert!(g.abs() < 1e-9 && lo <= 0.0 && hi >= 0.0, "{g} [{lo}, {hi}]");
    let lighter = map(&[("op_fork", 1.0), ("pte_writes", 1000.0)]);
    let (g, _) = fit
        .gain_all(&[("fork", &lighter), ("munmap", &munmap)], &same)
        .expect("gain");
    assert!(g > 0.0, "{g}");
}

#[test]
fn a_machine_where_every_recipe_is_off_by_one_factor_transfers_to_a_held_out_family() {
    // Every true price a third of its recipe: a family held out is priced at the common
    // scale the others found, not at the recipes.
    let priors = map(&[
        ("syscalls", 300.0),
        ("pte_writes", 18.0),
        ("pte_reads", 4.5),
        ("op_fork", 120_000.0),
        ("vmas_copied", 540.0),
        ("faults", 2700.0),
        ("pages_zeroed", 900.0),
    ]);
    let truth: BTreeMap<String, f64> = priors.iter().map(|(k, v)| (k.clone(), v / 3.0)).collect();
    let fit = Fit::new(&priors, &synthetic(&truth, 0.02, 7)).expect("fit");
    assert!(
        fit.held_out_median_pct() < 8.0,
        "{}",
        fit.held_out_median_pct()
    );
}

#[test]
fn prices_stay_non_negative_and_bad_input_is_refused() {
    let priors = map(&[("syscalls", 100.0), ("faults", 100.0)]);
    // A family whose time falls as faults rise would want a negative fault price.
    let obs: Vec<Observation> = [(1.0, 1000.0), (10.0, 900.0), (100.0, 800.0)]
        .iter()
        .flat_map(|&(f, t)| {
            ["x", "y"].map(|fam| Observation {
                family: fam.into(),
                op: fam.into(),
                label: format!("{f}"),
                counters: map(&[("syscalls", 1.0), ("faults", f)]),
                ns: t,
            })
        })
        .collect();
    let fit = Fit::new(&priors, &obs).expect("fit");
    assert!(fit.prices.iter().all(|p| p.multiplier >= 0.0));
    assert!(fit.op_prices.iter().all(|p| p.multiplier >= 0.0));
    assert_eq!(Fit::new(&priors, &[]), Err(FitError::NoData));
    assert_eq!(Fit::new(&priors, &obs[..1]), Err(FitError::OneFamily(1)));
}

#[test]
fn nnls_from_any_start_reaches_the_same_solution() {
    // A positive definite system whose unconstrained minimum has negative entries, so
    // that the bounds bind.
    let mut rng = Rng(7);
    let p = 12;
    let a = DMatrix::from_fn(30, p, |_, _| rng.normal());
    let g = a.transpose() * &a + DMatrix::identity(p, p) * 0.1;
    let b = DVector::from_fn(p, |_, _| rng.normal());
    let cold = nnls_gram(&g, &b, None);
    assert!(cold.iter().all(|&v| v >= 0.0));
    assert!(cold.iter().any(|&v| v == 0.0), "no bound binds: {cold}");
    // Optimality (KKT): the gradient is zero where x > 0 and points outward where x = 0.
    let w = &b - &g * &cold;
    for j in 0..p {
        if cold[j] > 0.0 {
            assert!(w[j].abs() < 1e-8, "{j}: {}", w[j]);
        } else {
            assert!(w[j] < 1e-8, "{j}: {}", w[j]);
        }
    }
    let starts = [
        DVector::zeros(p),
        DVector::from_element(p, 5.0),
        cold.map(|v| v * 1.1 + 0.01),
        DVector::from_fn(p, |_, _| rng.next() - 0.5),
    ];
    for s in starts {
        let warm = nnls_gram(&g, &b, Some(s.clone()));
        assert!(
            (&warm - &cold).norm() < 1e-9,
            "from {s}: {warm} against {cold}"
        );
    }
}
