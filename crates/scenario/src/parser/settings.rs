//! `set …`: the machine settings, the THP and shmem policy pairs, rlimits, the memory
//! policy and the engine tunables (checked against the registry, with suggestions).

use super::*;

impl Parser {
    pub(super) fn setting(&mut self, c: &mut Cursor<'_, '_>) -> PResult<Setting> {
        let t = c.word(&format!("a setting ({SETTINGS})"))?;
        let setting = match t.text {
            "memory" => {
                let col = c.here();
                match c.size("a memory size")? {
                    0 => {
                        return fail(
                            col,
                            ErrorKind::Absurd {
                                text: "0".into(),
                                why: "memory cannot be empty".into(),
                            },
                        )
                    }
                    v => Setting::Memory(v),
                }
            }
            "swap" => {
                let size = c.size("a swap size")?;
                Setting::Swap(size, c.eat_word("ssd"))
            }
            "nodes" => Setting::Nodes(to_u32(c.bounded("a node count", 1, 1024)?)),
            "cpus" => Setting::Cpus(to_u32(c.bounded("a CPU count", 1, 8192)?)),
            "arch" => Setting::Arch(c.keyword::<Arch>("an architecture")?.0),
            "tunable" => {
                let (setting, name_col, value_col) = tunable(c)?;
                if let (true, Setting::Tunable { name, value }) = (self.check_tunables, &setting) {
                    if let Err(kind) = check_tunable(name, value) {
                        let col = match kind {
                            ErrorKind::BadTunableValue { .. } => value_col,
                            _ => name_col,
                        };
                        return fail(col, kind);
                    }
                }
                setting
            }
            "thp" => Setting::Thp(self.thp(c)?),
            "shmem" => Setting::Shmem(self.shmem(c)?),
            "rlimit" => {
                let (resource, _) = c.keyword::<Resource>("a resource")?;
                let limit = if c.eat_word("unlimited") {
                    Limit::Unlimited
                } else {
                    Limit::Bytes(c.size("a limit (SIZE|unlimited)")?)
                };
                Setting::Rlimit { resource, limit }
            }
            "mempolicy" => Setting::Mempolicy(c.keyword::<Mempolicy>("a memory policy")?.0),
            other => return fail(t.col, unknown_option(other, "set", SETTINGS)),
        };
        c.finish()?;
        if setting.is_machine() && self.spawned {
            return fail(
                t.col,
                ErrorKind::MachineAfterSpawn {
                    what: t.text.into(),
                },
            );
        }
        Ok(setting)
    }

    /// The pairs of `set thp` (to the end of the line).
    pub(super) fn thp(&self, c: &mut Cursor<'_, '_>) -> PResult<Vec<ThpSetting>> {
        let pairs = policy_pairs::<ThpTop, ThpPolicy>(c, "thp", "THP")?;
        Ok(pairs
            .into_iter()
            .map(|p| match p {
                PolicyPair::Top(t) => ThpSetting::Top(t),
                PolicyPair::Size(size, policy) => ThpSetting::Size { size, policy },
            })
            .collect())
    }

    /// The pairs of `set shmem` (to the end of the line).
    fn shmem(&self, c: &mut Cursor<'_, '_>) -> PResult<Vec<ShmemSetting>> {
        let pairs = policy_pairs::<ShmemTop, ShmemPolicy>(c, "shmem", "shmem")?;
        Ok(pairs
            .into_iter()
            .map(|p| match p {
                PolicyPair::Top(t) => ShmemSetting::Top(t),
                PolicyPair::Size(size, policy) => ShmemSetting::Size { size, policy },
            })
            .collect())
    }
}

/// One pair of `set thp` / `set shmem`: `top=POLICY` or `SIZE=POLICY`.
enum PolicyPair<T, P> {
    Top(T),
    Size(ThpSize, P),
}

/// `top=TOP` and `SIZE=POLICY` pairs (at least one, each key once) to the end of the line,
/// for `set {what}` (`name` names the knobs in messages).
fn policy_pairs<T: Keyword, P: Keyword>(
    c: &mut Cursor<'_, '_>,
    what: &str,
    name: &str,
) -> PResult<Vec<PolicyPair<T, P>>> {
    let mut out: Vec<PolicyPair<T, P>> = Vec::new();
    loop {
        let k = c.word("SIZE=POLICY or top=POLICY")?;
        let dup = || Fail {
            col: k.col,
            kind: ErrorKind::Duplicate {
                option: k.text.into(),
            },
        };
        if k.text == "top" {
            c.eq("top")?;
            let (policy, _) = c.keyword::<T>(&format!("the top-level {name} policy"))?;
            if out.iter().any(|s| matches!(s, PolicyPair::Top(_))) {
                return Err(dup());
            }
            out.push(PolicyPair::Top(policy));
        } else {
            // A word that is no size at all is a misspelt option; else the size's own errors.
            if is_ident(k.text) && parse_size(k.text) == Err(NumErr::Syntax) {
                return fail(
                    k.col,
                    unknown_option(k.text, what, "SIZE=POLICY or top=POLICY"),
                );
            }
            let size = ThpSize::new(size_of(k)?).ok_or_else(|| Fail {
                col: k.col,
                kind: ErrorKind::BadThpSize {
                    text: k.text.into(),
                },
            })?;
            c.eq(k.text)?;
            let (policy, _) = c.keyword::<P>(&format!("a {name} policy"))?;
            if out
                .iter()
                .any(|s| matches!(s, PolicyPair::Size(z, _) if *z == size))
            {
                return Err(dup());
            }
            out.push(PolicyPair::Size(size, policy));
        }
        if c.peek().is_none() {
            return Ok(out);
        }
    }
}

/// `set tunable NAME=VALUE`, with the columns of NAME and VALUE.
pub(super) fn tunable(c: &mut Cursor<'_, '_>) -> PResult<(Setting, u32, u32)> {
    let Some((col, run)) = c.glued_run() else {
        return c.missing("NAME=VALUE");
    };
    let (name, value, value_col) = match run.split_once('=') {
        Some((n, v)) => {
            let value_col = col.saturating_add(to_u32(n.chars().count() as u64) + 1);
            (n, v, value_col)
        }
        None if c.eat_kind(TokKind::Eq) => match c.glued_run() {
            Some((vcol, v)) => (run, v, vcol),
            None => return c.missing("a tunable VALUE after `=`"),
        },
        None => return c.missing(format!("`=VALUE` after `{run}`")),
    };
    if name.is_empty() {
        return fail(
            col,
            ErrorKind::MissingArgument {
                what: "a tunable NAME before `=`".into(),
            },
        );
    }
    if value.is_empty() {
        return c.missing("a tunable VALUE after `=`");
    }
    Ok((
        Setting::Tunable {
            name: name.into(),
            value: value.into(),
        },
        col,
        value_col,
    ))
}

/// [`ErrorKind::check_tunable`].
pub(super) fn check_tunable(name: &str, value: &str) -> Result<(), ErrorKind> {
    match usermm::Tunables::default().set(name, value) {
        Ok(()) => Ok(()),
        Err(usermm::tunables::TunableError::Unknown(_)) => {
            let names: Vec<&str> = usermm::Tunables::default()
                .list()
                .iter()
                .map(|t| t.name)
                .collect();
            Err(ErrorKind::UnknownTunable {
                name: name.into(),
                suggestion: closest(name, &names),
            })
        }
        Err(usermm::tunables::TunableError::BadValue { accepted, .. }) => {
            let values = accepted_values(accepted);
            let refs: Vec<&str> = values.iter().map(String::as_str).collect();
            Err(ErrorKind::BadTunableValue {
                name: name.into(),
                value: value.into(),
                accepted: accepted.into(),
                suggestion: closest(value, &refs),
            })
        }
    }
}

/// The plain words of an accepted-values text (`batched|per-pte`, `stage0..stage7|modern`,
/// `rmap-id[+shared|...]`): the `|` alternatives, `wordN..wordM` ranges expanded, optional
/// `[...]` parts dropped.
pub(super) fn accepted_values(accepted: &str) -> Vec<String> {
    let mut out = Vec::new();
    for alt in accepted.split('|') {
        let word = alt.split('[').next().unwrap_or("");
        if word.is_empty() || word.contains(['+', ']']) {
            continue;
        }
        match word.split_once("..") {
            Some((a, b)) => {
                let digits = |w: &str| w.trim_start_matches(|ch: char| !ch.is_ascii_digit()).len();
                let (pa, pb) = (&a[..a.len() - digits(a)], &b[..b.len() - digits(b)]);
                match (a[pa.len()..].parse::<u32>(), b[pb.len()..].parse::<u32>()) {
                    (Ok(lo), Ok(hi)) if pa == pb && hi >= lo && hi - lo <= 64 => {
                        out.extend((lo..=hi).map(|n| format!("{pa}{n}")));
                    }
                    _ => out.extend([a.to_string(), b.to_string()]),
                }
            }
            None => out.push(word.to_string()),
        }
    }
    out
}
