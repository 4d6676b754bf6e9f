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

#[test]
fn quantize_writes_a_loadable_file_and_refuses_what_it_cannot_do() {
    let dir = std::env::temp_dir().join(format!("rlx-quantize-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("q4km.gguf");
    let q = |args: &[&std::ffi::OsStr]| {
        let o = rlx().arg("quantize").args(args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!err.contains("panicked"), "{err}");
        (o.status.code(), err)
    };
    let tiny = tiny();
    let (code, err) = q(&[
        tiny.as_os_str(),
        out.as_os_str(),
        "--type".as_ref(),
        "Q4_K_M".as_ref(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("Q4_K_M") && err.contains("tensors"), "{err}");
    let (code, err) = run_model(&out, &["-n", "2", "--temp", "0", "--raw", "Hello"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = q(&[
        tiny.as_os_str(),
        out.as_os_str(),
        "--type".as_ref(),
        "Q9_K".as_ref(),
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("Q9_K") && err.contains("Q4_K_M"), "{err}");
    let (code, err) = q(&[
        tiny.as_os_str(),
        tiny.as_os_str(),
        "--type".as_ref(),
        "Q8_0".as_ref(),
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("overwrite"), "{err}");
    let missing = dir.join("missing.gguf");
    let (code, err) = q(&[
        missing.as_os_str(),
        out.as_os_str(),
        "--type".as_ref(),
        "Q8_0".as_ref(),
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("missing.gguf"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `rlx run -m MODEL ARGS…`: exit code and stderr.
fn run_model(model: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let out = rlx()
        .args(["run", "-m"])
        .arg(model)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_instruction_set_cap_is_taken_or_refused_by_name() {
    // The portable kernels run anywhere, and the bench says which ran.
    let out = rlx()
        .args(["bench", "-m"])
        .arg(tiny())
        .args(["-p", "0", "-n", "2", "-r", "1", "--json", "--isa", "scalar"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let backend = json[0]["backend"].as_str().unwrap();
    assert_eq!(backend.split(", ").nth(1), Some("scalar"), "{backend}");
    // Nothing to choose between below AVX-512: the widest decode kernels.
    assert!(backend.ends_with("decode kernels: widest"), "{backend}");
    // Another architecture's set is an error naming what this CPU has.
    let other = if cfg!(target_arch = "aarch64") {
        "avx2"
    } else {
        "neon"
    };
    let (code, err) = run("run", &["-n", "2", "--raw", "--isa", other, "Hello"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!("--isa {other}")) && err.contains("choose from scalar"),
        "{err}"
    );
}
