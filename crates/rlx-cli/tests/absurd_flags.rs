//! Absurd flags as a user might type them: a clear message, never a crash.

mod common;

use common::{rlx, tiny};

#[test]
fn more_threads_than_the_machine_has_are_clamped_with_a_warning() {
    let out = rlx()
        .args(["run", "-m"])
        .arg(tiny())
        .args(["-t", "1000000", "-n", "2", "--temp", "0", "--raw", "Hello"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("warning: --threads 1000000"), "{err}");
}

#[test]
fn a_context_beyond_memory_is_refused_before_allocating() {
    let out = rlx()
        .args(["run", "-m"])
        .arg(tiny())
        .args(["-c", "99999999999", "-n", "2", "--raw", "Hello"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("TiB") && err.contains("available on cpu"),
        "{err}"
    );
    assert!(
        !err.contains("panicked") && !err.contains("memory allocation"),
        "{err}"
    );
}

#[test]
fn serve_refuses_a_pool_beyond_memory_and_exits() {
    let out = rlx()
        .args(["serve", "-m"])
        .arg(tiny())
        // A request's share is capped at the model's context, so the pool
        // grows with the sequence count.
        .args([
            "--port",
            "0",
            "-c",
            "102400000000",
            "--parallel",
            "100000000",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("TiB") && err.contains("available on cpu"),
        "{err}"
    );
}
