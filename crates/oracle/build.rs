//! Compiles the signal-safe memory accessors (`csrc/access.c`).

fn main() {
    println!("cargo:rerun-if-changed=csrc/access.c");
    cc::Build::new()
        .file("csrc/access.c")
        .opt_level(2)
        .warnings(true)
        .compile("usermm_oracle_access");
}
