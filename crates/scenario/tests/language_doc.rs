//! The language reference (`docs/scenario-language.md`) and the parser agree: every keyword
//! the parser accepts (each keyword enum of `ast.rs` and `ast/*.rs`, each word its statements match) appears
//! in the reference, and every literal word of the reference's grammar is one the parser
//! knows. A keyword added to the parser without documentation, or a grammar word the parser
//! dropped, fails here.

use std::collections::BTreeSet;

fn read(rel: &str) -> String {
    let p = format!("{}/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// Every `.rs` file of the folder `rel`, in name order, concatenated: a module's parts.
fn read_dir(rel: &str) -> String {
    let dir = format!("{}/{rel}", env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{dir}: no .rs file");
    files
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect()
}

/// The quoted literals of `text` that are one word (letters, digits, `_`).
fn quoted_words(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, part) in text.split('"').enumerate() {
        let word = !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if i % 2 == 1 && word {
            out.insert(part.to_string());
        }
    }
    out
}

/// Keywords of the keyword enums: the string of every `Variant = "text",` line of ast.rs and its parts.
fn enum_keywords(ast: &str) -> BTreeSet<String> {
    ast.lines()
        .filter_map(|l| {
            let (_, rhs) = l.trim().split_once(" = \"")?;
            let kw = rhs.strip_suffix("\",")?;
            Some(kw.to_string())
        })
        .collect()
}

/// Words the parser's statements match: the literal patterns of its `match` arms, its word
/// checks (`is_word`, `eat_word`, `key_eq`, `optional_flag`, comparisons) and its list of
/// observations.
fn parser_words(parser: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if let Some(obs) = parser.split("const OBSERVATIONS").nth(1) {
        if let Some((list, _)) = obs.split_once("];") {
            out.extend(quoted_words(list));
        }
    }
    for l in parser.lines() {
        let t = l.trim();
        if let Some((pat, _)) = t.split_once("=>") {
            if pat.trim_start().starts_with('"') {
                out.extend(quoted_words(pat));
            }
        }
        for key in [
            "is_word(\"",
            "eat_word(\"",
            "key_eq(\"",
            "optional_flag(c, \"",
            "text == \"",
            "text != \"",
        ] {
            for (i, part) in t.split(key).enumerate() {
                if i > 0 {
                    if let Some((w, _)) = part.split_once('"') {
                        out.extend(quoted_words(&format!("\"{w}\"")));
                    }
                }
            }
        }
    }
    out
}

fn grammar_block(doc: &str) -> &str {
    let start = doc
        .find("## Grammar")
        .expect("the reference has a Grammar section");
    let rest = &doc[start..];
    let open = rest
        .find("```text\n")
        .expect("the grammar is a ```text block")
        + 8;
    let len = rest[open..].find("```").expect("the block ends");
    &rest[open..open + len]
}

#[test]
fn every_keyword_is_documented_and_every_grammar_word_is_accepted() {
    let doc = read("../../docs/scenario-language.md");
    let ast = read("src/ast.rs") + &read_dir("src/ast");
    let parser = read("src/parser.rs") + &read_dir("src/parser");
    let keywords = enum_keywords(&ast);
    let words = parser_words(&parser);
    assert!(
        keywords.len() > 100,
        "found {} enum keywords",
        keywords.len()
    );
    assert!(words.contains("mmap") && words.contains("dump") && words.contains("counters"));
    // Every accepted keyword appears in the reference as a whole word.
    let doc_words: BTreeSet<&str> = doc
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect();
    let undocumented: Vec<&String> = keywords
        .iter()
        .chain(&words)
        .filter(|k| !doc_words.contains(k.as_str()))
        .collect();
    assert!(
        undocumented.is_empty(),
        "accepted but not in the reference: {undocumented:?}"
    );
    // Every literal word of the grammar is one the parser accepts (sizes' unit letters and
    // the `0x`/`cpu` prefixes are lexical, not words).
    let lexical = [
        "K", "M", "G", "k", "m", "g", "cpu", "0x", "r", "w", "x", "p", "s", "_",
    ];
    let unknown: Vec<String> = quoted_words(grammar_block(&doc))
        .into_iter()
        .filter(|w| !keywords.contains(w) && !words.contains(w) && !lexical.contains(&w.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "in the grammar but not accepted: {unknown:?}"
    );
}
