//! What a benchmark sees while it runs ([`Ctx`]: the options, the host side, its progress
//! bar, the cost model's primitives) and how many times a row repeats ([`Repetitions`]).

use crate::columns::EngineColumn;
use crate::host::HostSide;
use crate::model::{Better, Column, Variant, VariantKind};
use crate::options::Options;
use crate::progress::Task;
use std::cell::RefCell;
use std::time::{Duration, Instant};
use usermm_model::prices::Primitives;

/// What a benchmark sees while it runs.
pub struct Ctx<'a> {
    /// The options.
    pub opts: &'a Options,
    /// Whether and how host columns are measured.
    pub host: &'a HostSide,
    /// Its progress bar.
    pub task: &'a Task,
    /// The cost model's primitives measured so far for this benchmark (modelled benchmarks
    /// only): see [`Ctx::row_done`].
    pub primitives: Option<&'a RefCell<Vec<Primitives>>>,
}

impl Ctx<'_> {
    /// The engine columns of a table whose own are `defaults`: those, or `--variants`'.
    pub fn engine_columns(&self, defaults: Vec<EngineColumn>) -> Vec<EngineColumn> {
        crate::columns::engine_columns(&self.opts.variants, defaults)
    }

    /// Called by a modelled benchmark after each row: one more fresh process measures the
    /// primitives, so that the table is priced with the median over processes spread
    /// through its run (three before it, one after each row), not only with the state of
    /// the machine before it. One process's own memory moves its primitives too:
    /// back-to-back fresh processes read `kcall` from 5.5 to 9.4 ns, and one table's three
    /// processes read it at 9.5 ns where the next table's read 4.5.
    pub fn row_done(&self) {
        if let Some(all) = self.primitives {
            if let Some(p) = crate::host::agent::fresh_primitives() {
                all.borrow_mut().push(p);
            }
        }
    }

    /// The repetitions of a row of a table whose columns are `variants`, its gains taken
    /// against the one named `baseline`, `better` their direction.
    pub fn repetitions(
        &self,
        variants: &[Variant],
        baseline: &str,
        better: Better,
    ) -> Repetitions<'_> {
        let base = variants.iter().position(|v| v.name == baseline);
        let gains = (0..variants.len())
            .filter(|&i| Some(i) != base)
            .filter(|&i| matches!(variants[i].kind, VariantKind::Engine | VariantKind::Control))
            .collect();
        Repetitions {
            opts: self.opts,
            task: self.task,
            steps: variants.len() as u64,
            base,
            gains,
            better,
            started: Instant::now(),
            first: None,
            done: 0,
            until: self.opts.reps,
        }
    }
}

/// The repetitions of one row of a table with gains: [`Options::reps`] of them always; then,
/// while some engine or control column's 95 % gain interval is wider than
/// [`Options::tight_pp`], more, up to [`Options::max_reps`] in all and while the extra
/// repetitions take no longer than the first ones did (the time budget: a row at most about
/// doubles). More repetitions go straight to the next count at which the sign-test interval
/// can narrow: 7 repetitions give their lowest and highest gain, so one outlier widens it; 8
/// cannot do better, 9 leave the outermost out on each side, 12 two (so 9, then 12).
#[must_use = "a row runs its repetitions by calling next until it returns None"]
pub struct Repetitions<'a> {
    opts: &'a Options,
    task: &'a Task,
    steps: u64,
    /// The baseline's column, if the table has it.
    base: Option<usize>,
    /// The engine and control columns whose gains get intervals.
    gains: Vec<usize>,
    better: Better,
    started: Instant,
    first: Option<Duration>,
    done: usize,
    until: usize,
}

impl Repetitions<'_> {
    /// The next repetition's number (for the rotation), or `None` when the row is done.
    /// `cols` are the row's cells so far, one per variant.
    pub fn next(&mut self, cols: &[Column]) -> Option<usize> {
        let n = self.done;
        if n >= self.until {
            let first = *self.first.get_or_insert_with(|| self.started.elapsed());
            let widest = self
                .base
                .and_then(|b| widest_gain_interval(cols, b, &self.gains, self.better));
            let more = more_repetitions(self.opts, n, widest, self.started.elapsed(), first)?;
            self.task.extend(self.steps * (more - n) as u64);
            self.until = more;
        }
        self.done += 1;
        Some(n)
    }
}

/// How many repetitions in all a row that has run `done` (at least [`Options::reps`]), the
/// first [`Options::reps`] of them in `first`, all of them in `elapsed`, with its widest gain
/// interval `widest`, goes on to: `None` when the interval is tight (or there is none), or the
/// next count at which the interval can narrow is beyond [`Options::max_reps`] or would take
/// the row past twice `first` at the first repetitions' pace.
fn more_repetitions(
    opts: &Options,
    done: usize,
    widest: Option<f64>,
    elapsed: Duration,
    first: Duration,
) -> Option<usize> {
    if !widest.is_some_and(|w| w > opts.tight_pp) {
        return None;
    }
    let rank = crate::stats::sign_test_rank(done);
    let target = (done + 1..=opts.max_reps).find(|&n| crate::stats::sign_test_rank(n) > rank)?;
    let pace = first.div_f64(opts.reps.max(1) as f64);
    (elapsed + pace.mul_f64((target - done) as f64) <= first * 2).then_some(target)
}

/// The widest 95 % gain interval, percentage points, of the columns `gains` against
/// `cols[base]`; `None` when none has one yet.
fn widest_gain_interval(
    cols: &[Column],
    base: usize,
    gains: &[usize],
    better: Better,
) -> Option<f64> {
    let b = &cols.get(base)?.samples;
    gains
        .iter()
        .filter_map(|&i| cols.get(i))
        .filter_map(|c| crate::stats::gain_ci95(&c.samples, b, better))
        .map(|[lo, hi]| hi - lo)
        .reduce(f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Progress;
    use std::collections::BTreeMap;

    #[test]
    fn a_row_repeats_to_where_a_wide_interval_can_narrow_within_the_limit_and_the_budget() {
        let more = |opts: &Options, done, widest, elapsed| {
            let (elapsed, first) = (Duration::from_secs(elapsed), Duration::from_secs(7));
            more_repetitions(opts, done, widest, elapsed, first)
        };
        let opts = Options {
            max_reps: 12,
            ..Options::default()
        };
        // 7 repetitions in 7 s: the interval narrows at 9 and at 12, not at 8, 10 or 11.
        assert_eq!(more(&opts, 7, Some(10.5), 7), Some(9), "wide: on to 9");
        assert_eq!(
            more(&opts, 9, Some(10.5), 9),
            Some(12),
            "still wide: on to 12"
        );
        assert_eq!(more(&opts, 7, Some(9.5), 7), None, "tight: done");
        assert_eq!(more(&opts, 7, None, 7), None, "no interval: done");
        assert_eq!(more(&opts, 12, Some(40.0), 12), None, "at max_reps");
        assert_eq!(
            more(&opts, 9, Some(40.0), 12),
            None,
            "slow repetitions spent the budget"
        );
        let more_allowed = Options {
            max_reps: 15,
            ..Options::default()
        };
        assert_eq!(
            more(&more_allowed, 12, Some(40.0), 12),
            None,
            "15 would take 15 s of a 14 s budget"
        );
        assert_eq!(more(&more_allowed, 9, Some(40.0), 9), Some(12));
    }

    #[test]
    fn a_rows_gains_are_its_engine_and_control_columns_against_the_baseline() {
        let opts = Options::default();
        let host = HostSide::disabled("test");
        let progress = Progress::new(1, false);
        let task = progress.task("t", 0);
        let ctx = Ctx {
            opts: &opts,
            host: &host,
            task: &task,
            primitives: None,
        };
        let variants = [
            Variant::engine("a", ""),
            Variant::engine("b", ""),
            Variant::control("b"),
            Variant::host(""),
        ];
        let reps = ctx.repetitions(&variants, "b", Better::Lower);
        assert_eq!((reps.base, reps.gains.as_slice()), (Some(1), &[0, 2][..]));
        let reps = ctx.repetitions(&variants, "none", Better::Lower);
        assert_eq!(
            reps.base, None,
            "no baseline: no intervals, the least repetitions"
        );
    }

    #[test]
    fn the_widest_interval_is_of_the_gain_columns_only() {
        let col = |samples: &[f64]| Column::new("c", samples.to_vec(), BTreeMap::new());
        let base = col(&[1.0; 7]);
        // Gains of 0 % and 10 %... 30 %, and a host column far off that must not count.
        let engine = col(&[1.0, 0.9, 0.8, 0.7, 0.9, 0.8, 1.0]);
        let control = col(&[1.0; 7]);
        let host = col(&[5.0, 0.1, 5.0, 0.1, 5.0, 0.1, 5.0]);
        let cols = [base, engine, control, host];
        let w = widest_gain_interval(&cols, 0, &[1, 2], Better::Lower).expect("intervals");
        assert!((w - 30.0).abs() < 1e-9, "{w}");
        assert_eq!(widest_gain_interval(&cols, 0, &[], Better::Lower), None);
    }
}
