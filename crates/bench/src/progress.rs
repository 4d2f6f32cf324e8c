//! Progress bars on stderr (hidden when stderr is not a terminal), and the interruption
//! check: a SIGINT/SIGTERM during a run with host columns ends it between two measurements,
//! so the THP knobs are restored before the process exits.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The bars of one run: the whole suite and the current table.
pub struct Progress {
    multi: MultiProgress,
    suite: ProgressBar,
}

/// The bar of one benchmark.
pub struct Task {
    bar: ProgressBar,
}

impl Progress {
    /// A suite of `benchmarks` benchmarks; `visible: false` draws nothing.
    pub fn new(benchmarks: u64, visible: bool) -> Progress {
        let target = if visible {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let multi = MultiProgress::with_draw_target(target);
        let suite = multi.add(ProgressBar::new(benchmarks));
        if let Ok(st) = ProgressStyle::with_template("{prefix:>10} [{bar:30}] {pos}/{len} {msg}") {
            suite.set_style(st.progress_chars("=> "));
        }
        suite.set_prefix("suite");
        Progress { multi, suite }
    }

    /// Starts a benchmark of `steps` measurements.
    pub fn task(&self, name: &str, steps: u64) -> Task {
        self.suite.set_message(name.to_string());
        let bar = self.multi.add(ProgressBar::new(steps));
        if let Ok(st) = ProgressStyle::with_template(
            "{prefix:>10} [{bar:30}] {pos}/{len} {elapsed_precise} {msg}",
        ) {
            bar.set_style(st.progress_chars("=> "));
        }
        bar.set_prefix(name.to_string());
        Task { bar }
    }

    /// Marks one benchmark done.
    pub fn done(&self, task: Task) {
        task.bar.finish_and_clear();
        self.multi.remove(&task.bar);
        self.suite.inc(1);
    }

    /// Runs `f` (which prints) with the bars out of the way.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.multi.suspend(f)
    }

    /// Removes the bars.
    pub fn finish(&self) {
        self.suite.finish_and_clear();
    }
}

impl Task {
    /// `n` more measurements than planned (a row's extra repetitions).
    pub fn extend(&self, n: u64) {
        self.bar.inc_length(n);
    }

    /// One measurement done; fails if the run was interrupted.
    pub fn step(&self, what: &str) -> anyhow::Result<()> {
        self.bar.set_message(what.to_string());
        self.bar.inc(1);
        check_stop()
    }
}

/// Fails if SIGINT/SIGTERM/SIGHUP arrived (only caught while host columns are measured).
pub fn check_stop() -> anyhow::Result<()> {
    anyhow::ensure!(!oracle::sys::stop_requested(), "interrupted");
    Ok(())
}
