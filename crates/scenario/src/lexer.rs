//! Splitting one line into tokens.
//!
//! A token is a *word* (a run of ASCII letters, digits, `_` and `.`), one of the
//! punctuation characters `= + - ! |`, or any other single character (which the
//! parser then reports). `#` ends the line. Whitespace separates tokens but is not
//! required around punctuation: each token records whether it is *glued* to the
//! previous one, which is how `rw-p` or a tunable value are read back as one word.
//! The lexer never fails.

/// What a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokKind {
    /// Letters, digits, `_`, `.`.
    Word,
    /// `=`.
    Eq,
    /// `+`.
    Plus,
    /// `-`.
    Minus,
    /// `!`.
    Bang,
    /// `|`.
    Pipe,
    /// Any other character.
    Other,
}

/// A token of one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token<'a> {
    /// Its kind.
    pub kind: TokKind,
    /// Its text.
    pub text: &'a str,
    /// 1-based column (in characters) of its first character.
    pub col: u32,
    /// 1-based column just past its last character.
    pub end_col: u32,
    /// Byte offset of its start in the line.
    pub start: usize,
    /// Byte offset past its end in the line.
    pub end: usize,
    /// No whitespace between it and the previous token.
    pub glued: bool,
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.'
}

/// The tokens of `line` (without its line terminator), up to a `#` comment.
pub(crate) fn lex(line: &str) -> Vec<Token<'_>> {
    let mut toks: Vec<Token<'_>> = Vec::new();
    let mut col: u32 = 1;
    let mut glued = false;
    let mut chars = line.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        let start_col = col;
        col = col.saturating_add(1);
        if c == '#' {
            break;
        }
        if c.is_whitespace() {
            glued = false;
            continue;
        }
        let mut end = start + c.len_utf8();
        let kind = match c {
            '=' => TokKind::Eq,
            '+' => TokKind::Plus,
            '-' => TokKind::Minus,
            '!' => TokKind::Bang,
            '|' => TokKind::Pipe,
            c if is_word_char(c) => {
                while let Some(&(i, d)) = chars.peek() {
                    if !is_word_char(d) {
                        break;
                    }
                    end = i + d.len_utf8();
                    col = col.saturating_add(1);
                    chars.next();
                }
                TokKind::Word
            }
            _ => TokKind::Other,
        };
        toks.push(Token {
            kind,
            text: line.get(start..end).unwrap_or(""),
            col: start_col,
            end_col: col,
            start,
            end,
            glued: glued && !toks.is_empty(),
        });
        glued = true;
    }
    toks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(line: &str) -> Vec<(TokKind, &str, u32, bool)> {
        lex(line)
            .into_iter()
            .map(|t| (t.kind, t.text, t.col, t.glued))
            .collect()
    }

    #[test]
    fn words_punct_and_glue() {
        use TokKind::*;
        assert_eq!(
            kinds("a = p0 mmap 1G # x"),
            vec![
                (Word, "a", 1, false),
                (Eq, "=", 3, false),
                (Word, "p0", 5, false),
                (Word, "mmap", 8, false),
                (Word, "1G", 13, false),
            ]
        );
        assert_eq!(
            kinds("rw-p !dirty"),
            vec![
                (Word, "rw", 1, false),
                (Minus, "-", 3, true),
                (Word, "p", 4, true),
                (Bang, "!", 6, false),
                (Word, "dirty", 7, true),
            ]
        );
    }

    #[test]
    fn columns_count_characters() {
        let t = lex("é ü x");
        assert_eq!(t.len(), 3);
        assert_eq!((t[0].kind, t[0].col), (TokKind::Other, 1));
        assert_eq!((t[2].text, t[2].col, t[2].end_col), ("x", 5, 6));
    }

    #[test]
    fn comment_and_blank() {
        assert!(lex("   # only a comment").is_empty());
        assert!(lex("").is_empty());
        assert_eq!(lex("p0 munlockall#c").len(), 2);
    }
}
