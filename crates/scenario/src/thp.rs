//! The workspace's one THP-policy parser and the one way a policy reaches the engine.
//!
//! A THP pair is `top=POLICY` or `SIZE=POLICY`, sysfs semantics: the scenario language's
//! `set thp` (parsed token by token with columns, in `parser/settings.rs`, into the same
//! [`ThpSetting`]), `usermm record --thp`, `usermm replay --thp` and the policy a trace's
//! header records all read it. Outside a scenario file the pair comes as text, so
//! [`ThpSetting::from_pair`] (and `str::parse`, for `KEY=POLICY` in one string) is the string
//! form of the same grammar: KEY `top` with `always|madvise|never`, or a folio size
//! (`usermm::units::parse_size`'s grammar, a power of two from 16K to 2M) with
//! `always|madvise|never|inherit`. [`apply_thp`] sets one checked pair on the engine's
//! tunables: the scenario engine, replay and trace export all go through it.

use crate::ast::{Keyword, ThpPolicy, ThpSetting, ThpSize, ThpTop};

/// Why a THP pair was refused (the text is echoed, so a caller adds only where it came from).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThpPairError {
    /// No `=` between key and policy.
    #[error("`{0}` is not KEY=POLICY (top=POLICY or SIZE=POLICY)")]
    NotAPair(String),
    /// The key is neither `top` nor a THP size.
    #[error("bad THP size `{0}` (expected top or a power of two from 16K to 2M, e.g. 64K, 2M)")]
    Size(String),
    /// Not a top-level policy (`inherit` is a size's only).
    #[error("bad top-level THP policy `{0}` (expected always, madvise or never)")]
    TopPolicy(String),
    /// Not a size's policy.
    #[error("bad THP policy `{0}` (expected always, madvise, never or inherit)")]
    Policy(String),
}

impl ThpSetting {
    /// One pair given as its key and policy (`("64K", "always")`, `("top", "never")`).
    pub fn from_pair(key: &str, policy: &str) -> Result<ThpSetting, ThpPairError> {
        if key == "top" {
            return ThpTop::from_keyword(policy)
                .map(ThpSetting::Top)
                .ok_or_else(|| ThpPairError::TopPolicy(policy.into()));
        }
        let size = usermm::units::parse_size(key)
            .ok()
            .and_then(ThpSize::new)
            .ok_or_else(|| ThpPairError::Size(key.into()))?;
        let policy =
            ThpPolicy::from_keyword(policy).ok_or_else(|| ThpPairError::Policy(policy.into()))?;
        Ok(ThpSetting::Size { size, policy })
    }

    /// The pair's key as a trace header and bench replay write it: `top` or the size in
    /// kB (`64K`, `2048K`).
    pub fn key_kb(&self) -> String {
        match self {
            ThpSetting::Top(_) => "top".into(),
            ThpSetting::Size { size, .. } => format!("{}K", size.bytes() >> 10),
        }
    }

    /// The policy's sysfs word.
    pub fn policy_word(&self) -> &'static str {
        match self {
            ThpSetting::Top(t) => t.as_str(),
            ThpSetting::Size { policy, .. } => policy.as_str(),
        }
    }
}

impl std::str::FromStr for ThpSetting {
    type Err = ThpPairError;

    /// `KEY=POLICY` in one string (`64K=always`).
    fn from_str(s: &str) -> Result<ThpSetting, ThpPairError> {
        let (key, policy) = s
            .split_once('=')
            .ok_or_else(|| ThpPairError::NotAPair(s.into()))?;
        ThpSetting::from_pair(key, policy)
    }
}

impl From<ThpTop> for usermm::ThpPolicy {
    /// The engine's policy of a top-level keyword.
    fn from(t: ThpTop) -> usermm::ThpPolicy {
        match t {
            ThpTop::Always => usermm::ThpPolicy::Always,
            ThpTop::Madvise => usermm::ThpPolicy::Madvise,
            ThpTop::Never => usermm::ThpPolicy::Never,
        }
    }
}

impl From<ThpPolicy> for usermm::ThpPolicy {
    /// The engine's policy of a size's keyword.
    fn from(p: ThpPolicy) -> usermm::ThpPolicy {
        match p {
            ThpPolicy::Always => usermm::ThpPolicy::Always,
            ThpPolicy::Madvise => usermm::ThpPolicy::Madvise,
            ThpPolicy::Never => usermm::ThpPolicy::Never,
            ThpPolicy::Inherit => usermm::ThpPolicy::Inherit,
        }
    }
}

/// Sets one pair on the engine's tunables: the workspace's one `apply_thp`. Total: a
/// [`ThpSetting`] is valid by construction (`ThpTop` has no `inherit`, a [`ThpSize`] is a
/// size the engine takes), so nothing can be refused here.
pub fn apply_thp(t: &mut usermm::Tunables, s: &ThpSetting) {
    match *s {
        ThpSetting::Top(top) => t.thp.top = top.into(),
        ThpSetting::Size { size, policy } => {
            let set = t.thp.set_size(size.bytes(), policy.into());
            debug_assert!(set.is_ok(), "{size} is a THP size");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{apply_thp, ThpPairError};
    use crate::ast::{ThpPolicy, ThpSetting, ThpSize, ThpTop};

    fn size(bytes: u64, policy: ThpPolicy) -> ThpSetting {
        ThpSetting::Size {
            size: ThpSize::new(bytes).expect("a THP size"),
            policy,
        }
    }

    #[test]
    fn accepted_pairs() {
        let ok = |s: &str| s.parse::<ThpSetting>();
        assert_eq!(ok("top=always"), Ok(ThpSetting::Top(ThpTop::Always)));
        assert_eq!(ok("top=madvise"), Ok(ThpSetting::Top(ThpTop::Madvise)));
        assert_eq!(ok("top=never"), Ok(ThpSetting::Top(ThpTop::Never)));
        assert_eq!(ok("64K=always"), Ok(size(64 << 10, ThpPolicy::Always)));
        assert_eq!(ok("16k=madvise"), Ok(size(16 << 10, ThpPolicy::Madvise)));
        assert_eq!(ok("2M=inherit"), Ok(size(2 << 20, ThpPolicy::Inherit)));
        assert_eq!(ok("2m=never"), Ok(size(2 << 20, ThpPolicy::Never)));
        assert_eq!(ok("2048K=never"), Ok(size(2 << 20, ThpPolicy::Never)));
        // The one size grammar: hex and plain bytes too, as `set thp` takes them.
        assert_eq!(ok("0x200000=never"), Ok(size(2 << 20, ThpPolicy::Never)));
        assert_eq!(ok("65536=always"), Ok(size(64 << 10, ThpPolicy::Always)));
        assert_eq!(
            ThpSetting::from_pair("32K", "always"),
            Ok(size(32 << 10, ThpPolicy::Always))
        );
    }

    #[test]
    fn refused_pairs_say_why() {
        let err = |s: &str| s.parse::<ThpSetting>().err();
        assert_eq!(err("64K"), Some(ThpPairError::NotAPair("64K".into())));
        assert_eq!(err(""), Some(ThpPairError::NotAPair("".into())));
        assert_eq!(
            err("top=inherit"),
            Some(ThpPairError::TopPolicy("inherit".into()))
        );
        assert_eq!(err("top="), Some(ThpPairError::TopPolicy("".into())));
        for key in [
            "8K",
            "4M",
            "48K",
            "64",
            "64G",
            "",
            "TOP",
            "64é",
            "64K ",
            " 64K",
            "+64K",
            "-64K",
            "18014398509481984064K",
            "99999999999999999999999K",
        ] {
            assert_eq!(
                ThpSetting::from_pair(key, "always"),
                Err(ThpPairError::Size(key.into())),
                "{key:?}"
            );
        }
        for policy in ["sometimes", "", "Always", "always "] {
            assert_eq!(
                ThpSetting::from_pair("64K", policy),
                Err(ThpPairError::Policy(policy.into())),
                "{policy:?}"
            );
        }
        assert_eq!(
            err("64K=always=never"),
            Some(ThpPairError::Policy("always=never".into()))
        );
        let msg = err("48K=always").map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("48K") && msg.contains("16K to 2M"), "{msg}");
    }

    #[test]
    fn keys_and_words_as_headers_write_them() {
        let s: ThpSetting = "2M=always".parse().expect("pair");
        assert_eq!((s.key_kb(), s.policy_word()), ("2048K".into(), "always"));
        let s: ThpSetting = "top=never".parse().expect("pair");
        assert_eq!((s.key_kb(), s.policy_word()), ("top".into(), "never"));
    }

    #[test]
    fn applied_pairs_reach_the_engine() {
        let mut t = usermm::Tunables::default();
        apply_thp(&mut t, &ThpSetting::Top(ThpTop::Always));
        assert_eq!(t.thp.top, usermm::ThpPolicy::Always);
        let mut want = usermm::tunables::ThpSettings::default();
        want.top = usermm::ThpPolicy::Always;
        for (s, bytes, p) in [
            ("64K=always", 64 << 10, usermm::ThpPolicy::Always),
            ("2M=never", 2 << 20, usermm::ThpPolicy::Never),
            ("16K=inherit", 16 << 10, usermm::ThpPolicy::Inherit),
            ("32K=madvise", 32 << 10, usermm::ThpPolicy::Madvise),
        ] {
            apply_thp(&mut t, &s.parse().expect("pair"));
            assert_eq!(want.set_size(bytes, p), Ok(()), "{s}");
            assert_eq!(t.thp, want, "{s}");
        }
    }
}
