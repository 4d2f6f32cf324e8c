//! The README's table of tunables is what the registry renders (`tunables::markdown_table`).
//! `USERMM_BLESS=1` rewrites it.

const BEGIN: &str = "<!-- tunables:begin -->\n";
const END: &str = "<!-- tunables:end -->";

#[test]
fn readme_tunables_table_is_current() {
    let path = format!("{}/../../README.md", env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(&path).expect("README.md");
    let start = readme
        .find(BEGIN)
        .expect("README lacks `<!-- tunables:begin -->`")
        + BEGIN.len();
    let end = start
        + readme[start..]
            .find(END)
            .expect("README lacks `<!-- tunables:end -->`");
    let want = usermm::tunables::markdown_table();
    if readme[start..end] == want {
        return;
    }
    if std::env::var_os("USERMM_BLESS").is_some_and(|v| v == "1") {
        let updated = format!("{}{want}{}", &readme[..start], &readme[end..]);
        std::fs::write(&path, updated).expect("write README.md");
        return;
    }
    panic!(
        "README.md's tunables table is stale; rerun with USERMM_BLESS=1 to rewrite it.\n\
         --- README ---\n{}\n--- registry ---\n{want}",
        &readme[start..end]
    );
}
