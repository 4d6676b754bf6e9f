//! Helpers shared by the CLI test files (each file uses a subset).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn rlx() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rlx"))
}

/// The tiny random Gemma 3 model committed under tests/fixtures.
pub fn tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny/gemma3/model-f32.gguf")
}

/// The real model: `$RLX_TEST_MODEL`, else the default cache location.
/// `scripts/test.sh` fetches it; running without it is a failure, not a skip.
pub fn real_model() -> PathBuf {
    // Where scripts/fetch-model.sh puts it: `$RLX_HOME`, else rlx's cache.
    let path = std::env::var_os("RLX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let dir = std::env::var_os("RLX_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    let home = std::env::var_os("HOME").expect("HOME is set");
                    PathBuf::from(home).join(".cache/rlx/models")
                });
            dir.join("gemma-3-270m-q4_k_m.gguf")
        });
    assert!(
        path.exists(),
        "{} is missing: run `bash scripts/fetch-model.sh` (or scripts/test.sh)",
        path.display()
    );
    path
}

/// Runs `cmd` and asserts it succeeded, showing its stderr if not.
pub fn ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Stdout parsed as JSON.
pub fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap()
}
