//! Records the git commit the benchmark binary was built from, for the report's metadata,
//! and builds the static spawn agent (`agent/spawn_agent.c`) where a C compiler can: a
//! freestanding x86-64 Linux program the spawn table's host cells fork (see
//! `src/host/agent.rs`). Without one, the build goes on and those cells use the re-executed
//! `usermm` binary instead.

fn main() {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!("cargo:rustc-env=USERMM_GIT_COMMIT={commit}");
    println!("cargo:rerun-if-changed=../../.git/HEAD");
    println!("cargo:rerun-if-changed=../../.git/refs/heads");
    static_agent();
}

/// Compiles the static spawn agent into `OUT_DIR` and sets `cfg(static_spawn_agent)`.
fn static_agent() {
    println!("cargo:rerun-if-changed=agent/spawn_agent.c");
    println!("cargo:rerun-if-env-changed=CC");
    let target = (
        std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default(),
        std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default(),
    );
    if target != ("x86_64".to_string(), "linux".to_string()) {
        return;
    }
    let Ok(out) = std::env::var("OUT_DIR") else {
        return;
    };
    let exe = std::path::Path::new(&out).join("spawn_agent");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = std::process::Command::new(cc)
        .args([
            "-O2",
            "-static",
            "-nostdlib",
            "-fno-stack-protector",
            "-fno-builtin",
            "-fno-pie",
            "-no-pie",
            "-o",
        ])
        .arg(&exe)
        .arg("agent/spawn_agent.c")
        .status()
        .is_ok_and(|s| s.success());
    if built {
        println!("cargo:rustc-cfg=static_spawn_agent");
    } else {
        println!("cargo:warning=no C compiler for the static spawn agent: spawn host cells use the usermm binary");
    }
}
