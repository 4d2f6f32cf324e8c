//! `usermm record` (crate `trace`): the options, the user the command runs as, the summary.

use std::path::PathBuf;

/// Arguments of `usermm record`.
#[derive(clap::Args, Debug)]
pub struct RecordArgs {
    /// Output file. Checked before the command runs: its directory must be one only root or
    /// you can change (or a sticky one such as /tmp); the trace is written under a temporary
    /// name there and renamed over FILE at the end (a link at FILE is replaced, not followed).
    #[arg(long, short, default_value = "trace.umt", value_name = "FILE")]
    pub out: PathBuf,
    /// Data pages of each per-CPU perf ring buffer (a power of two).
    #[arg(long, default_value_t = 2048)]
    pub ring_pages: usize,
    /// Run the command as this user (name or uid) with its groups; the recorder stays root.
    /// Default: the invoking user when run through sudo (SUDO_UID), else root. `--user root`
    /// keeps root under sudo.
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// Record under this THP policy (repeatable), over `never` at every size, e.g.
    /// `--thp 64K=always` or `--thp 2M=inherit --thp top=always` (sysfs semantics, as `set
    /// thp`): a fault then maps the folio the kernel chose, touches inside it make no event,
    /// and `usermm replay` sets the same policy from the trace's header.
    #[arg(long, value_name = "SIZE=POLICY")]
    pub thp: Vec<String>,
    /// The command and its arguments (after `--`).
    #[arg(required = true, last = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

/// The user the command runs as: `--user`, else sudo's invoking user, else none (root).
fn identity(a: &RecordArgs) -> anyhow::Result<Option<trace::sys::Identity>> {
    let spec = match (&a.user, std::env::var("SUDO_UID")) {
        (Some(u), _) => u.clone(),
        (None, Ok(uid)) if !uid.is_empty() && uid != "0" => uid,
        _ => return Ok(None),
    };
    let id = trace::sys::lookup_user(&spec).map_err(|e| anyhow::anyhow!("--user {spec}: {e}"))?;
    Ok((id.uid != 0).then_some(id))
}

/// `usermm record`: exit 0, or 130 when a signal ended the recording (the trace of what ran
/// until then is written all the same).
pub fn record_main(a: &RecordArgs) -> anyhow::Result<u8> {
    let user = identity(a)?;
    if let Some(u) = &user {
        eprintln!(
            "usermm record: running the command as {} (uid {}, gid {})",
            u.name, u.uid, u.gid
        );
    }
    let thp = crate::trace_cmd::pairs(&a.thp, "--thp")?;
    let opts = trace::RecordOptions {
        out: a.out.clone(),
        ring_pages: a.ring_pages.next_power_of_two(),
        progress: true,
        user,
        thp,
    };
    let s = trace::record(&a.cmd, &opts)?;
    println!(
        "recorded {}: {} events, {} bytes ({:.2} bytes/event), {} processes, {:.2} s; command exit status {}",
        a.out.display(),
        s.events,
        s.bytes,
        s.bytes as f64 / s.events.max(1) as f64,
        s.processes,
        s.seconds,
        s.exit_status
    );
    println!(
        "lost records: {}; file mappings replayed as anonymous: {}; faults above user space left out: {}",
        s.lost, s.file_as_anon, s.faults_outside_user
    );
    if s.left_out > 0 {
        eprintln!(
            "usermm record: {} items were left out of the trace to keep it within the format's bounds (see docs/trace-format.md)",
            s.left_out
        );
    }
    if s.interrupted {
        eprintln!("usermm record: interrupted; the command was killed, the THP knobs restored, the trace holds what ran until then");
        return Ok(130);
    }
    Ok(0)
}
