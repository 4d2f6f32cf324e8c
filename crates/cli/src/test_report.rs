//! TAP and JUnit renderings shared by `usermm run` and `usermm oracle`: one test point per
//! scenario file, its messages as diagnostics.

/// One scenario file as a test.
pub struct TestPoint {
    /// The file as named.
    pub name: String,
    /// 0 passed, 1 failed (a failed expectation or difference), 2 or more not runnable.
    pub exit_code: u8,
    /// What went wrong, one line each (`FILE:LINE: …`).
    pub messages: Vec<String>,
    /// Wall time, seconds (0 when not measured).
    pub seconds: f64,
}

/// TAP version 13: `ok`/`not ok` per file, failures as a YAML block of messages.
pub fn tap(points: &[TestPoint]) -> String {
    let mut s = format!("TAP version 13\n1..{}\n", points.len());
    for (i, p) in points.iter().enumerate() {
        let ok = if p.exit_code == 0 { "ok" } else { "not ok" };
        s.push_str(&format!("{ok} {} - {}\n", i + 1, p.name));
        if !p.messages.is_empty() {
            s.push_str("  ---\n  messages:\n");
            for m in &p.messages {
                s.push_str(&format!("    - {}\n", serde_json::Value::String(m.clone())));
            }
            s.push_str(&format!("  exit_code: {}\n  ...\n", p.exit_code));
        }
    }
    s
}

/// Escapes text for XML attributes and content.
fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One JUnit testsuite named `suite`: exit code 1 is a `failure`, 2 or more an `error`.
pub fn junit(suite: &str, points: &[TestPoint]) -> String {
    let failures = points.iter().filter(|p| p.exit_code == 1).count();
    let errors = points.iter().filter(|p| p.exit_code >= 2).count();
    let time: f64 = points.iter().map(|p| p.seconds).sum();
    let mut s = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"{}\" \
         tests=\"{}\" failures=\"{failures}\" errors=\"{errors}\" time=\"{time:.6}\">\n",
        xml(suite),
        points.len()
    );
    for p in points {
        s.push_str(&format!(
            "  <testcase name=\"{}\" classname=\"scenario\" time=\"{:.6}\"",
            xml(&p.name),
            p.seconds
        ));
        if p.exit_code == 0 {
            s.push_str("/>\n");
            continue;
        }
        let tag = if p.exit_code == 1 { "failure" } else { "error" };
        let first = p.messages.first().cloned().unwrap_or_default();
        s.push_str(&format!(
            ">\n    <{tag} message=\"{}\">{}</{tag}>\n  </testcase>\n",
            xml(&first),
            xml(&p.messages.join("\n"))
        ));
    }
    s.push_str("</testsuite>\n");
    s
}
