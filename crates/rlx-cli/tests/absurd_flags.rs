//! Absurd flags as a user might type them: a clear message, never a crash.

mod common;

use common::{rlx, tiny};

/// `rlx COMMAND -m TINY ARGS…`: exit code and stderr.
fn run(command: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = rlx()
        .args([command, "-m"])
        .arg(tiny())
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !err.contains("panicked") && !err.contains("memory allocation"),
        "{err}"
    );
    (out.status.code(), err)
}

#[test]
fn more_threads_than_the_machine_has_are_clamped_with_a_warning() {
    let (code, err) = run(
        "run",
        &["-t", "1000000", "-n", "2", "--temp", "0", "--raw", "Hello"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("warning: --threads 1000000"), "{err}");
}

#[test]
fn a_context_beyond_memory_is_refused_before_allocating() {
    let (code, err) = run("run", &["-c", "99999999999", "-n", "2", "--raw", "Hello"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("TiB") && err.contains("available on cpu"),
        "{err}"
    );
}

#[test]
fn serve_refuses_a_pool_beyond_memory_and_exits() {
    // A request's share is capped at the model's context, so the pool grows
    // with the sequence count.
    let args = [
        "--port",
        "0",
        "-c",
        "102400000000",
        "--parallel",
        "100000000",
    ];
    let (code, err) = run("serve", &args);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("TiB") && err.contains("available on cpu"),
        "{err}"
    );
}
