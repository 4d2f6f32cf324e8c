//! Sizes and numbers as people write them: the one grammar of the workspace.
//!
//! The scenario language (`docs/scenario-language.md`, "Sizes"), the Python module, the CLI
//! (`usermm kmap --ram`, `usermm bench --scale`) and the benchmarks all read sizes with
//! [`parse_size`]: a decimal number or a `0x`/`0X` hexadecimal one, with an optional unit `K`,
//! `M` or `G` (also `k`, `m`, `g`), powers of 1024. Nothing else is accepted: no sign, no
//! space, no fraction, no `KB`. A caller that allows surrounding spaces trims them first.
//! The scenario parser and the Python module turn [`NumErr`] into their own error types; a
//! command-line argument ([`parse_size_arg`]) is refused with [`BadSize`], which names the
//! text, so that no caller writes the grammar or its message again.

/// Why a number did not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumErr {
    /// Not a number of this grammar.
    Syntax,
    /// A number too large for 64 bits.
    Overflow,
}

impl std::fmt::Display for NumErr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NumErr::Syntax => "not a size (e.g. 4096, 0x1000, 64K, 2M, 1G)",
            NumErr::Overflow => "does not fit in 64 bits",
        })
    }
}

impl std::error::Error for NumErr {}

/// A decimal or `0x` hexadecimal number without unit.
pub fn parse_uint(s: &str) -> Result<u64, NumErr> {
    let (digits, radix) = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => (h, 16u32),
        None => (s, 10u32),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(NumErr::Syntax);
    }
    let mut v: u64 = 0;
    for c in digits.chars() {
        let d = u64::from(c.to_digit(radix).ok_or(NumErr::Syntax)?);
        v = v
            .checked_mul(u64::from(radix))
            .and_then(|v| v.checked_add(d))
            .ok_or(NumErr::Overflow)?;
    }
    Ok(v)
}

/// A size: a number ([`parse_uint`]) with an optional unit K, M, G (or k, m, g), powers of
/// 1024.
pub fn parse_size(s: &str) -> Result<u64, NumErr> {
    let shift = match s.as_bytes().last() {
        Some(b'K' | b'k') => 10,
        Some(b'M' | b'm') => 20,
        Some(b'G' | b'g') => 30,
        _ => 0,
    };
    // The unit is one ASCII byte, so the cut is on a character boundary.
    let num = if shift == 0 {
        s
    } else {
        s.get(..s.len().saturating_sub(1)).ok_or(NumErr::Syntax)?
    };
    parse_uint(num)?
        .checked_mul(1u64 << shift)
        .ok_or(NumErr::Overflow)
}

/// A size argument [`parse_size`] refused, with the text given: `bad size `64X`: not a size
/// (e.g. 4096, 0x1000, 64K, 2M, 1G)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadSize {
    /// The argument as given.
    pub text: String,
    /// Why it is not a size.
    pub why: NumErr,
}

impl std::fmt::Display for BadSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad size `{}`: {}", self.text, self.why)
    }
}

impl std::error::Error for BadSize {}

/// [`parse_size`] of a command-line argument (`usermm bench --scale`, `usermm kmap --ram`):
/// a refusal names the text ([`BadSize`]).
pub fn parse_size_arg(s: &str) -> Result<u64, BadSize> {
    parse_size(s).map_err(|why| BadSize {
        text: s.into(),
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::{parse_size, parse_size_arg, parse_uint, NumErr};

    #[test]
    fn units_and_radix() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("2M"), Ok(2 << 20));
        assert_eq!(parse_size("2m"), Ok(2 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("0x2000"), Ok(0x2000));
        assert_eq!(parse_size("0X2000"), Ok(0x2000));
        assert_eq!(parse_size("0x10M"), Ok(16 << 20));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("0K"), Ok(0));
        assert_eq!(parse_uint("0xff"), Ok(255));
        assert_eq!(parse_size_arg("256M"), Ok(256 << 20));
    }

    #[test]
    fn overflow() {
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_size("18446744073709551616"), Err(NumErr::Overflow));
        assert_eq!(parse_size("17179869183G"), Ok(17179869183 << 30));
        assert_eq!(parse_size("17179869184G"), Err(NumErr::Overflow));
        assert_eq!(parse_size("0x10000000000000000"), Err(NumErr::Overflow));
        assert_eq!(parse_size("0xffffffffffffffffK"), Err(NumErr::Overflow));
    }

    #[test]
    fn rejected() {
        for s in [
            "", "K", "0x", "0xK", "4KB", "4T", "1.5G", "-1", "+1", "1e3", "0b101", "4 K", " 4K",
            "4K ", "\t4", "4\n", "0x-1", "x", "KK", "4KK",
        ] {
            assert_eq!(parse_size(s), Err(NumErr::Syntax), "{s:?}");
        }
    }

    #[test]
    fn hostile_input_never_panics() {
        for s in [
            "é",
            "4é",
            "é4K",
            "4\u{212A}",
            "\u{FF14}K",
            "0x\u{0661}",
            "\0",
            "4\0K",
            "٤K",
            "99999999999999999999x",
            "0xfffffffffffffffffffffffffffffffffffffffffffffG",
        ] {
            assert!(parse_size(s).is_err(), "{s:?}");
        }
        let long = "9".repeat(100_000);
        assert_eq!(parse_size(&long), Err(NumErr::Overflow));
        let zeros = format!("{}1K", "0".repeat(100_000));
        assert_eq!(parse_size(&zeros), Ok(1024));
    }

    #[test]
    fn arguments_name_their_text() {
        let e = parse_size_arg("64X").expect_err("not a size");
        assert_eq!(e.why, NumErr::Syntax);
        assert_eq!(
            e.to_string(),
            "bad size `64X`: not a size (e.g. 4096, 0x1000, 64K, 2M, 1G)"
        );
        let e = parse_size_arg("17179869184G").expect_err("too large");
        assert_eq!(
            e.to_string(),
            "bad size `17179869184G`: does not fit in 64 bits"
        );
    }
}
