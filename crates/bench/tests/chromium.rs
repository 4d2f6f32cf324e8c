//! The HTML report in a real browser: a tiny suite's report is loaded by headless Chromium
//! (Debian's package, installed by `.ci/setup-chromium` when missing), which dumps the DOM
//! after the page's script ran. The test checks that the script set its marker to the
//! number of tables (it ran, without an error before it), that every table and plot is in
//! the DOM, that nothing was logged to the console, and that nothing external is loaded.
//! It skips, saying why, only when Chromium is missing and cannot be installed.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const FLAGS: [&str; 10] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
];

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Chromium, installing it with the project's setup script if needed; `Err(reason)` if
/// that is impossible.
fn chromium() -> Result<PathBuf, String> {
    if let Some(p) = on_path("chromium") {
        return Ok(p);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.ci/setup-chromium");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "chromium is not installed and {} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    on_path("chromium").ok_or_else(|| "chromium still not on PATH after setup".to_string())
}

/// Runs `cmd` with a deadline: (status ok, stdout, stderr).
fn run_with_deadline(mut cmd: Command, limit: Duration) -> (bool, String, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start chromium");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let ok = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st.success();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        ok,
        t_out.join().unwrap_or_default(),
        t_err.join().unwrap_or_default(),
    )
}

#[test]
fn report_loads_in_headless_chromium() {
    let browser = match chromium() {
        Ok(b) => b,
        Err(why) => {
            println!("SKIPPED report_loads_in_headless_chromium: {why}");
            return;
        }
    };
    let report = common::tiny_report();
    let dir = std::env::temp_dir().join(format!("usermm-report-{}", std::process::id()));
    let html = dir.join("report.html");
    let outs = usermm_bench::output::Outputs {
        html: Some(html.clone()),
        ..Default::default()
    };
    usermm_bench::output::write(&report, &outs).expect("write report");
    let profile = dir.join("chromium-profile");
    let mut cmd = Command::new(&browser);
    cmd.args(FLAGS)
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", html.display()));
    let t = Instant::now();
    let (ok, dom, log) = run_with_deadline(cmd, Duration::from_secs(120));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok, "chromium failed or timed out:\n{log}");
    println!(
        "chromium loaded the report in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let marker = format!("data-report-ok=\"{}\"", report.tables.len());
    assert!(
        dom.contains(&marker),
        "the page's script did not run to its end ({marker} missing)"
    );
    for t in &report.tables {
        assert!(
            dom.contains(&format!("id=\"table-{}\"", t.id)),
            "table {} missing",
            t.id
        );
        assert!(
            dom.contains(&format!("id=\"plot-{}\"", t.id)),
            "plot {} missing",
            t.id
        );
    }
    let console: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(
        console.is_empty(),
        "console messages:\n{}",
        console.join("\n")
    );
    assert!(
        !dom.contains(" src=") && !dom.contains("<link"),
        "the report loads a resource"
    );
}
