//! Models found by name where users keep them: a fake Ollama store (a
//! manifest naming a blob), LM Studio folder and Hugging Face hub cache,
//! built here with the tiny models; `rlx models` lists them and `-m NAME`
//! runs each, and a name that fits several files says which.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{rlx, tiny};

fn tiny_q8() -> PathBuf {
    tiny().with_file_name("model-Q8_0.gguf")
}

struct Stores {
    home: PathBuf,
}

impl Stores {
    fn build() -> Stores {
        let home = std::env::temp_dir().join(format!("rlx-stores-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        let put = |rel: &str, from: &Path| {
            let p = home.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::copy(from, &p).unwrap();
        };
        let write = |rel: &str, text: &str| {
            let p = home.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        // Ollama: two tags and a namespaced model, blobs named by digest.
        let manifest = |digest: &str| {
            serde_json::json!({"schemaVersion": 2, "layers": [
                {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:0000", "size": 10},
                {"mediaType": "application/vnd.ollama.image.model", "digest": format!("sha256:{digest}"), "size": 1}
            ]})
            .to_string()
        };
        let (a, b) = ("a1b2c3", "d4e5f6");
        put(&format!(".ollama/models/blobs/sha256-{a}"), &tiny());
        put(&format!(".ollama/models/blobs/sha256-{b}"), &tiny_q8());
        write(
            ".ollama/models/manifests/registry.ollama.ai/library/gemma3/270m",
            &manifest(a),
        );
        write(
            ".ollama/models/manifests/registry.ollama.ai/library/gemma3/latest",
            &manifest(b),
        );
        write(
            ".ollama/models/manifests/registry.ollama.ai/someone/tiny/q8",
            &manifest(b),
        );
        // LM Studio: one repo with two quantizations and a projector.
        put(
            ".lmstudio/models/lmstudio-community/tiny-GGUF/tiny-F32.gguf",
            &tiny(),
        );
        put(
            ".lmstudio/models/lmstudio-community/tiny-GGUF/tiny-Q8_0.gguf",
            &tiny_q8(),
        );
        put(
            ".lmstudio/models/lmstudio-community/tiny-GGUF/mmproj-tiny-f16.gguf",
            &tiny(),
        );
        // The Hugging Face hub cache: refs/main picks the snapshot.
        write(
            ".cache/huggingface/hub/models--google--tiny-gemma/refs/main",
            "abc123\n",
        );
        put(".cache/huggingface/hub/models--google--tiny-gemma/snapshots/abc123/tiny-gemma-Q8_0.gguf", &tiny_q8());
        put(
            ".cache/huggingface/hub/models--google--tiny-gemma/snapshots/old999/stale.gguf",
            &tiny(),
        );
        // rlx's own cache.
        put(".cache/rlx/models/mine.gguf", &tiny());
        Stores { home }
    }

    fn rlx(&self) -> Command {
        let mut c = rlx();
        c.env("HOME", &self.home);
        for k in ["RLX_HOME", "HF_HOME", "HF_HUB_CACHE"] {
            c.env_remove(k);
        }
        // Ollama's store in this home only (unset, the system's
        // /usr/share/ollama is searched too).
        c.env("OLLAMA_MODELS", self.home.join(".ollama/models"));
        c
    }

    /// `rlx run -m NAME`: exit code and stderr.
    fn run(&self, name: &str) -> (Option<i32>, String) {
        let out = self
            .rlx()
            .args([
                "run", "-m", name, "-n", "2", "--temp", "0", "--raw", "Hello",
            ])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Drop for Stores {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

#[test]
fn names_resolve_in_every_store_and_are_listed() {
    let s = Stores::build();
    let out = s.rlx().arg("models").output().unwrap();
    assert!(out.status.success());
    let list = String::from_utf8_lossy(&out.stdout).into_owned();
    for (name, store, file) in [
        ("mine", "rlx", "mine.gguf"),
        ("gemma3:270m", "ollama", "sha256-a1b2c3"),
        ("gemma3:latest", "ollama", "sha256-d4e5f6"),
        ("someone/tiny:q8", "ollama", "sha256-d4e5f6"),
        (
            "lmstudio-community/tiny-GGUF/tiny-Q8_0.gguf",
            "lmstudio",
            "tiny-Q8_0.gguf",
        ),
        (
            "google/tiny-gemma/tiny-gemma-Q8_0.gguf",
            "huggingface",
            "abc123/tiny-gemma-Q8_0.gguf",
        ),
    ] {
        let line = list
            .lines()
            .find(|l| l.starts_with(&format!("{name}\t")))
            .unwrap_or_else(|| panic!("{name} not listed:\n{list}"));
        assert!(line.contains(store) && line.contains(file), "{line}");
    }
    assert!(!list.contains("mmproj"), "{list}");
    assert!(!list.contains("stale.gguf"), "{list}");

    for name in [
        "mine",
        "gemma3:270m",
        "gemma3",
        "someone/tiny:q8",
        "lmstudio-community/tiny-GGUF:Q8_0",
        "lmstudio-community/tiny-GGUF/tiny-F32.gguf",
        "google/tiny-gemma",
        "google/tiny-gemma:q8_0",
    ] {
        let (code, err) = s.run(name);
        assert_eq!(code, Some(0), "{name}: {err}");
    }
    // Two quantizations under one name: which to pick is the user's call.
    let (code, err) = s.run("lmstudio-community/tiny-GGUF");
    assert_eq!(code, Some(1));
    assert!(
        err.contains("2 files") && err.contains("tiny-F32.gguf") && err.contains("tiny-Q8_0.gguf"),
        "{err}"
    );
    let (code, err) = s.run("gemma3:999b");
    assert_eq!(code, Some(1));
    assert!(
        err.contains("not found") && err.contains("rlx models"),
        "{err}"
    );
}

#[test]
fn a_checkpoint_directory_works_with_every_command() {
    let dir = tiny().parent().unwrap().join("hf");
    let out = std::env::temp_dir().join(format!("rlx-hf-score-{}.npy", std::process::id()));
    let ok = |args: &[&std::ffi::OsStr]| {
        let o = rlx().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{args:?}: {err}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let d = dir.as_os_str();
    let s = |x: &'static str| std::ffi::OsStr::new(x);
    ok(&[
        s("run"),
        s("-m"),
        d,
        s("-n"),
        s("2"),
        s("--temp"),
        s("0"),
        s("--raw"),
        s("Hello"),
    ]);
    ok(&[
        s("run"),
        s("-m"),
        d,
        s("--quantize"),
        s("Q4_K"),
        s("-n"),
        s("2"),
        s("--raw"),
        s("Hello"),
    ]);
    ok(&[
        s("score"),
        s("-m"),
        d,
        s("--tokens"),
        s("2,5,6"),
        s("--out"),
        out.as_os_str(),
    ]);
    ok(&[
        s("bench"),
        s("-m"),
        d,
        s("-p"),
        s("8"),
        s("-n"),
        s("2"),
        s("-r"),
        s("1"),
    ]);
    let ids = ok(&[
        s("tokenize"),
        s("-m"),
        d,
        s("--text"),
        s("Hello world"),
        s("--ids"),
    ]);
    assert!(ids.trim().starts_with("2,"), "{ids}");
    let info = ok(&[s("info"), d]);
    assert!(info.contains("gemma3.block_count"), "{info}");
    let _ = std::fs::remove_file(out);
}

/// A first run on a machine without the default model says how to get it:
/// the fetch script of a checkout, or a real Hugging Face repo to pull.
#[test]
fn a_missing_default_model_says_how_to_get_one() {
    let home = std::env::temp_dir().join(format!("rlx-empty-home-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let rlx_in_empty_home = || {
        let mut c = rlx();
        c.env("HOME", &home)
            .env("OLLAMA_MODELS", home.join("ollama"));
        for k in ["RLX_HOME", "HF_HOME", "HF_HUB_CACHE"] {
            c.env_remove(k);
        }
        c
    };
    let out = rlx_in_empty_home().args(["run", "Hello"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    for hint in [
        "default model",
        "bash scripts/fetch-model.sh",
        "rlx pull unsloth/gemma-3-270m-it-GGUF",
        "rlx models",
    ] {
        assert!(err.contains(hint), "{hint:?} not in {err}");
    }
    // Not a name no hub has.
    assert!(!err.contains("rlx pull gemma-3-270m-q4_k_m"), "{err}");
    let out = rlx_in_empty_home().arg("models").output().unwrap();
    let list = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        list.contains("scripts/fetch-model.sh") && list.contains("rlx pull"),
        "{list}"
    );
    let _ = std::fs::remove_dir_all(&home);
}
