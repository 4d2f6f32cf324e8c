//! Compiles the signal-safe memory accessors (`csrc/access.c`) into the crate, and the host
//! agent (`csrc/host_agent.c`, which includes them) into `OUT_DIR/host_agent`: the program
//! every host server runs (`src/server.rs`). The agent is linked statically where the C
//! library has a static archive, dynamically otherwise (with a build warning).

fn main() {
    println!("cargo:rerun-if-changed=csrc/access.c");
    println!("cargo:rerun-if-changed=csrc/host_agent.c");
    cc::Build::new()
        .file("csrc/access.c")
        .opt_level(2)
        .warnings(true)
        .compile("usermm_oracle_access");
    host_agent();
}

fn host_agent() {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let exe = out.join("host_agent");
    let compiler = cc::Build::new().opt_level(2).get_compiler();
    let link = |extra: &[&str]| {
        let mut cmd = compiler.to_command();
        cmd.args(["-O2", "-Wall", "-Wextra", "-Icsrc"])
            .args(extra)
            .arg("-o")
            .arg(&exe)
            .arg("csrc/host_agent.c");
        cmd.output()
    };
    // Position-independent, so the kernel loads it in the mmap area as it loads a dynamic
    // program's libraries, and low memory stays free for the fixed mappings scenarios place
    // there (0x10000000, 0x200000000, ...): a non-PIE static program loads at 0x400000.
    match link(&["-static-pie"]) {
        Ok(o) if o.status.success() => {}
        _ => match link(&[]) {
            Ok(o) if o.status.success() => println!(
                "cargo:warning=the C library has no static archive: the oracle's host agent is linked dynamically"
            ),
            Ok(o) => panic!(
                "compiling csrc/host_agent.c failed:\n{}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => panic!("cannot run the C compiler for csrc/host_agent.c: {e}"),
        },
    }
}
