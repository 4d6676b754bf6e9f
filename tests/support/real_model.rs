//! Where the tests of every crate find the real Gemma 3 270M file
//! (included by path: one source for a helper no library should export).

use std::path::PathBuf;

/// `$RLX_TEST_MODEL`, else where scripts/fetch-model.sh puts it
/// (`$RLX_HOME`, else rlx's cache). `scripts/test.sh` fetches it; running
/// without it is a failure with instructions, not a skip.
pub fn real_model() -> PathBuf {
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
