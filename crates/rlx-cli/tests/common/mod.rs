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

#[path = "../../../../tests/support/real_model.rs"]
mod real_model;
// Not every test binary that includes this module reads the real file.
#[allow(unused_imports)]
pub use real_model::real_model;

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

/// Runs `cmd` with `input` as its stdin, capturing its output.
pub fn with_stdin(cmd: &mut Command, input: &[u8]) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// Stdout parsed as JSON.
pub fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap()
}
