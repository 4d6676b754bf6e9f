//! `rlx pull` and `--pull` against a hub served in this process: a small
//! HTTP server that answers as the Hugging Face hub (main's commit, file
//! list, `resolve` with ranges) and Ollama's registry (manifest, blobs) do,
//! with the tiny models as files. It can cut a connection part way, serve
//! corrupted bytes and log every request, so resuming, the checksum check
//! and what was sent are seen from the outside. What lands is checked
//! against the layouts of the hub cache (`models--ORG--REPO/blobs`,
//! `snapshots/COMMIT`, `refs/main`) and of Ollama's store (`manifests/HOST/…`,
//! `blobs/sha256-HEX`). No network; every store in a temporary home.

#[path = "../common/mod.rs"]
mod common;
mod hub;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hub::{hf_file, sha256, Hub, OllamaModel, Route, COMMIT};

const REPO: &str = "test-org/tiny-GGUF";
const REPO_FOLDER: &str = "models--test-org--tiny-GGUF";

fn fixture(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny/gemma3-q")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A home of its own: every store in it, none of the machine's.
struct Home {
    dir: PathBuf,
}

impl Home {
    fn new(test: &str) -> Home {
        let dir = std::env::temp_dir().join(format!("rlx-pull-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Home { dir }
    }

    /// `HF_HUB_CACHE`.
    fn hub(&self) -> PathBuf {
        self.dir.join("hf-hub")
    }

    /// `models--ORG--REPO` of the tiny repo.
    fn repo(&self) -> PathBuf {
        self.hub().join(REPO_FOLDER)
    }

    /// `OLLAMA_MODELS`.
    fn ollama(&self) -> PathBuf {
        self.dir.join("ollama")
    }

    fn rlx(&self, hub: &Hub) -> Command {
        self.rlx_at(&hub.url, &hub.url)
    }

    fn rlx_at(&self, hf: &str, registry: &str) -> Command {
        let mut c = common::rlx();
        c.env("HOME", &self.dir)
            .env("RLX_HOME", self.dir.join("rlx"))
            .env("HF_HUB_CACHE", self.hub())
            .env("OLLAMA_MODELS", self.ollama())
            .env("HF_ENDPOINT", hf)
            .env("OLLAMA_REGISTRY", registry);
        for k in [
            "HF_TOKEN",
            "HF_HOME",
            "HF_TOKEN_PATH",
            "HUGGING_FACE_HUB_TOKEN",
        ] {
            c.env_remove(k);
        }
        c
    }

    fn pull(&self, hub: &Hub, name: &str) -> Output {
        self.rlx(hub).args(["pull", name]).output().unwrap()
    }

    /// `rlx run -m NAME` of two tokens, with more flags after.
    fn run(&self, hub: &Hub, name: &str, more: &[&str]) -> Output {
        self.rlx(hub)
            .args(["run", "-m", name, "-n", "2", "--temp", "0", "--raw", "hi"])
            .args(more)
            .output()
            .unwrap()
    }

    fn models(&self, hub: &Hub) -> String {
        let out = common::ok(self.rlx(hub).arg("models"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Every file under the home, as paths relative to it.
    fn files(&self) -> Vec<String> {
        fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() && !p.is_symlink() {
                    walk(&p, root, out);
                } else {
                    out.push(p.strip_prefix(root).unwrap().display().to_string());
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.dir, &self.dir, &mut out);
        out.sort();
        out
    }

    /// Asserts the hub cache holds `path` of the tiny repo as
    /// huggingface_hub lays it out: its bytes in `blobs/SHA256`, a relative
    /// link to that from `snapshots/COMMIT/PATH`, `refs/main` the commit.
    fn has_hf_file(&self, path: &str, bytes: &[u8]) -> PathBuf {
        let blob = self.repo().join("blobs").join(sha256(bytes));
        assert_eq!(std::fs::read(&blob).unwrap(), bytes, "{}", blob.display());
        let link = self.repo().join("snapshots").join(COMMIT).join(path);
        let up = "../".repeat(path.split('/').count() + 1);
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            PathBuf::from(format!("{up}blobs/{}", sha256(bytes))),
            "{}",
            link.display()
        );
        assert_eq!(std::fs::read(&link).unwrap(), bytes);
        assert_eq!(
            std::fs::read_to_string(self.repo().join("refs/main")).unwrap(),
            COMMIT
        );
        link
    }

    /// Asserts Ollama's store holds `model` as `ollama pull` lays it out:
    /// the manifest under `manifests/HOST/NAMESPACE/MODEL/TAG` and every
    /// blob it names under `blobs/sha256-HEX`.
    fn has_ollama_model(&self, host: &str, name: &str, model: &OllamaModel) {
        let (path, tag) = name.split_once(':').unwrap();
        let manifest = self
            .ollama()
            .join("manifests")
            .join(host)
            .join(path)
            .join(tag);
        assert_eq!(std::fs::read_to_string(&manifest).unwrap(), model.manifest);
        for b in &model.blobs {
            let blob = self
                .ollama()
                .join("blobs")
                .join(format!("sha256-{}", sha256(b)));
            assert_eq!(&std::fs::read(&blob).unwrap(), b, "{}", blob.display());
        }
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn succeeded(out: Output) -> String {
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    t
}

fn failed(out: Output) -> String {
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    t
}

/// No download left part way anywhere under `dir` (huggingface_hub's
/// `.incomplete`, Ollama's `-partial`).
fn no_partials(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = p.to_string_lossy();
        assert!(
            !name.ends_with(".incomplete") && !name.ends_with("-partial"),
            "{} left",
            p.display()
        );
        if p.is_dir() {
            no_partials(&p);
        }
    }
}

/// The tiny repo: two quantizations and two projectors, F16 and BF16.
fn tiny_repo(hub: &Hub) -> (Vec<u8>, Vec<u8>) {
    let (q4, q8) = (fixture("model-Q4_K_M.gguf"), fixture("model-Q8_0.gguf"));
    hub.hf_repo(
        REPO,
        &[
            ("mmproj-model-bf16.gguf", b"a bf16 projector".to_vec()),
            ("mmproj-model-f16.gguf", b"an f16 projector".to_vec()),
            ("model-Q4_K_M.gguf", q4.clone()),
            ("model-Q8_0.gguf", q8.clone()),
        ],
    );
    (q4, q8)
}

#[test]
fn a_hugging_face_repo_is_pulled_into_the_hub_cache_listed_and_run() {
    let hub = Hub::start();
    let home = Home::new("hf");
    let (q4, q8) = tiny_repo(&hub);

    let out = home
        .rlx(&hub)
        .env("HF_TOKEN", "hf_secret")
        .args(["pull", &format!("hf.co/{REPO}")])
        .output()
        .unwrap();
    let t = succeeded(out);
    assert!(
        t.contains("taking model-Q4_K_M.gguf (of Q4_K_M, Q8_0"),
        "{t}"
    );
    assert!(t.contains("sha256 verified"), "{t}");
    // The model is Q4_K_M: of the projectors, F16 is preferred.
    assert!(
        t.contains("taking projector mmproj-model-f16.gguf (of mmproj-model-bf16.gguf, mmproj-model-f16.gguf"),
        "{t}"
    );
    let link = home.has_hf_file("model-Q4_K_M.gguf", &q4);
    let projector = home.has_hf_file("mmproj-model-f16.gguf", b"an f16 projector");
    assert!(t.contains(&format!("saved: {}", link.display())), "{t}");
    assert!(
        t.contains(&format!("projector: {}", projector.display())),
        "{t}"
    );
    let name = format!("{REPO}:Q4_K_M");
    assert!(
        t.contains(&format!("run it with: rlx run -m {name}\n")),
        "{t}"
    );
    // Nothing else: the other quantization and projector stay on the hub.
    let blobs = std::fs::read_dir(home.repo().join("blobs"))
        .unwrap()
        .count();
    assert_eq!(blobs, 2);
    no_partials(&home.dir);
    for path in [
        format!("/api/models/{REPO}/revision/main"),
        hf_file(REPO, "model-Q4_K_M.gguf"),
    ] {
        let seen = hub.seen(&path);
        assert_eq!(seen.len(), 1, "{path}");
        assert_eq!(seen[0].headers["authorization"], "Bearer hf_secret");
        assert!(!seen[0].headers.contains_key("range"));
    }

    let list = home.models(&hub);
    let listed = format!("{REPO}/model-Q4_K_M.gguf\thuggingface\t");
    assert!(list.lines().any(|l| l.starts_with(&listed)), "{list}");
    assert!(!list.contains("mmproj"), "{list}");
    // By the printed name, the name it was pulled by, its path in the
    // repo and the repo's name; found, so nothing is fetched again.
    for m in [
        name.as_str(),
        &format!("hf.co/{REPO}:Q4_K_M"),
        &format!("{REPO}/model-Q4_K_M.gguf"),
        REPO,
    ] {
        succeeded(home.run(&hub, m, &["--pull"]));
    }
    let t = succeeded(home.pull(&hub, REPO));
    assert!(t.contains("already there"), "{t}");
    assert_eq!(hub.seen(&hf_file(REPO, "model-Q4_K_M.gguf")).len(), 1);
    assert_eq!(hub.seen(&hf_file(REPO, "mmproj-model-f16.gguf")).len(), 1);

    // Another quantization, named in any case, into the same snapshot.
    let t = succeeded(home.pull(&hub, &format!("{REPO}:q8_0")));
    home.has_hf_file("model-Q8_0.gguf", &q8);
    assert!(t.contains(&format!("rlx run -m {REPO}:Q8_0\n")), "{t}");
    succeeded(home.run(&hub, &format!("{REPO}:Q8_0"), &[]));
    assert!(hub
        .seen(&hf_file(REPO, "mmproj-model-bf16.gguf"))
        .is_empty());
}

#[test]
fn a_file_is_pulled_by_its_path_in_the_repo() {
    let hub = Hub::start();
    let home = Home::new("path");
    let q8 = fixture("model-Q8_0.gguf");
    hub.hf_repo(
        REPO,
        &[
            ("mmproj-F16.gguf", b"a projector".to_vec()),
            ("q4/model-Q4_K_M.gguf", fixture("model-Q4_K_M.gguf")),
            ("q8/model-Q8_0.gguf", q8.clone()),
        ],
    );
    let name = format!("{REPO}/q8/model-Q8_0.gguf");
    let t = succeeded(home.pull(&hub, &name));
    home.has_hf_file("q8/model-Q8_0.gguf", &q8);
    // The repo's one projector comes along, from the repo's root.
    let projector = home.has_hf_file("mmproj-F16.gguf", b"a projector");
    assert!(
        t.contains(&format!("projector: {}", projector.display())),
        "{t}"
    );
    assert!(t.contains(&format!("rlx run -m {name}\n")), "{t}");
    assert!(hub.seen(&hf_file(REPO, "q4/model-Q4_K_M.gguf")).is_empty());
    succeeded(home.run(&hub, &name, &[]));
    assert!(home.models(&hub).contains(&format!("{name}\thuggingface")));

    let t = failed(home.pull(&hub, &format!("{REPO}/q8/model-Q2_K.gguf")));
    assert!(
        t.contains(&format!(
            "{REPO} has no file q8/model-Q2_K.gguf; its GGUF files: mmproj-F16.gguf, q4/model-Q4_K_M.gguf, q8/model-Q8_0.gguf"
        )),
        "{t}"
    );
}

#[test]
fn an_ollama_model_is_pulled_into_ollamas_store_listed_and_run() {
    let hub = Hub::start();
    let home = Home::new("ollama");
    let q8 = fixture("model-Q8_0.gguf");
    let tiny = hub.ollama_model("library", "tiny", "q8", &q8);
    let someone = hub.ollama_model("someone", "tiny", "latest", &q8);

    let t = succeeded(home.pull(&hub, "tiny:q8"));
    // A registry other than Ollama's is named in the store by its host, as
    // Ollama does, and so in the name.
    let name = format!("{}/library/tiny:q8", hub.host());
    assert!(
        t.contains(&format!("run it with: rlx run -m {name}\n")),
        "{t}"
    );
    assert!(t.contains("tiny:q8 model"), "{t}");
    assert!(t.contains("sha256 verified"), "{t}");
    home.has_ollama_model(hub.host(), "library/tiny:q8", &tiny);
    let model_blob = home.ollama().join(format!("blobs/sha256-{}", sha256(&q8)));
    assert!(
        t.contains(&format!("saved: {}", model_blob.display())),
        "{t}"
    );
    let manifest = hub.seen("/v2/library/tiny/manifests/q8");
    assert_eq!(
        manifest[0].headers["accept"],
        "application/vnd.docker.distribution.manifest.v2+json"
    );
    assert_eq!(hub.seen(&tiny.model_blob).len(), 1);
    no_partials(&home.dir);

    let t = succeeded(home.pull(&hub, "ollama.com/someone/tiny"));
    let user_name = format!("{}/someone/tiny:latest", hub.host());
    assert!(t.contains(&format!("rlx run -m {user_name}\n")), "{t}");
    home.has_ollama_model(hub.host(), "someone/tiny:latest", &someone);

    let list = home.models(&hub);
    for n in [&name, &user_name] {
        let line = format!("{n}\tollama\t");
        assert!(list.lines().any(|l| l.starts_with(&line)), "{n}:\n{list}");
    }
    for m in [&name, &user_name] {
        succeeded(home.run(&hub, m, &[]));
    }
    // The printed name pulls too; the blobs are there already.
    let t = succeeded(home.pull(&hub, &name));
    assert!(t.contains("already there"), "{t}");
    assert_eq!(hub.seen(&tiny.model_blob).len(), 1);
}

#[test]
fn a_cut_connection_is_resumed_with_a_range_request() {
    let hub = Hub::start();
    let home = Home::new("cut");
    let (q4, _) = tiny_repo(&hub);
    let path = hf_file(REPO, "model-Q4_K_M.gguf");
    hub.route(
        &path,
        Route {
            cut_after: Some(100_000),
            ..Route::ok(q4.clone())
        },
    );

    let t = succeeded(home.pull(&hub, &format!("{REPO}:Q4_K_M")));
    assert!(t.contains("continuing from 97.7 KiB"), "{t}");
    home.has_hf_file("model-Q4_K_M.gguf", &q4);
    let seen = hub.seen(&path);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(!seen[0].headers.contains_key("range"));
    assert_eq!(seen[1].headers["range"], "bytes=100000-");

    // The same from Ollama's registry.
    let q8 = fixture("model-Q8_0.gguf");
    let tiny = hub.ollama_model("library", "tiny", "q8", &q8);
    hub.route(
        &tiny.model_blob,
        Route {
            cut_after: Some(70_000),
            ..Route::ok(q8.clone())
        },
    );
    succeeded(home.pull(&hub, "tiny:q8"));
    home.has_ollama_model(hub.host(), "library/tiny:q8", &tiny);
    let seen = hub.seen(&tiny.model_blob);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[1].headers["range"], "bytes=70000-");
    no_partials(&home.dir);
}

#[test]
fn a_partial_file_left_before_is_continued_or_restarted() {
    let hub = Hub::start();
    let home = Home::new("partial");
    let (q4, _) = tiny_repo(&hub);
    // Where huggingface_hub leaves a blob part way.
    let blobs = home.repo().join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(
        blobs.join(format!("{}.incomplete", sha256(&q4))),
        &q4[..50_000],
    )
    .unwrap();

    let t = succeeded(home.pull(&hub, REPO));
    assert!(t.contains("continuing model-Q4_K_M.gguf from"), "{t}");
    home.has_hf_file("model-Q4_K_M.gguf", &q4);
    let seen = hub.seen(&hf_file(REPO, "model-Q4_K_M.gguf"));
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers["range"], "bytes=50000-");

    // Where Ollama leaves one; a server that ignores ranges sends the
    // whole blob, taken from the start.
    let q8 = fixture("model-Q8_0.gguf");
    let tiny = hub.ollama_model("library", "tiny", "q8", &q8);
    hub.route(
        &tiny.model_blob,
        Route {
            ranges: false,
            ..Route::ok(q8.clone())
        },
    );
    let partial = home
        .ollama()
        .join(format!("blobs/sha256-{}-partial", sha256(&q8)));
    std::fs::create_dir_all(partial.parent().unwrap()).unwrap();
    std::fs::write(&partial, &q8[..70_000]).unwrap();
    succeeded(home.pull(&hub, "tiny:q8"));
    home.has_ollama_model(hub.host(), "library/tiny:q8", &tiny);
    assert_eq!(
        hub.seen(&tiny.model_blob)[0].headers["range"],
        "bytes=70000-"
    );
    no_partials(&home.dir);
}

#[test]
fn a_corrupted_download_is_refused_by_its_checksum() {
    let hub = Hub::start();
    let home = Home::new("corrupt");
    let (q4, _) = tiny_repo(&hub);
    let mut bad = q4.clone();
    bad[200_000] ^= 0xff;
    hub.route(&hf_file(REPO, "model-Q4_K_M.gguf"), Route::ok(bad.clone()));

    let t = failed(home.pull(&hub, REPO));
    assert!(t.contains("model-Q4_K_M.gguf: checksum mismatch"), "{t}");
    assert!(
        t.contains(&format!("expected sha256 {}", sha256(&q4))),
        "{t}"
    );
    assert!(t.contains(&format!("got sha256 {}", sha256(&bad))), "{t}");
    // No blob, no link, no ref: the cache has no trace of the model.
    assert!(!home.repo().join("blobs").join(sha256(&q4)).exists());
    assert!(!home.repo().join("snapshots").exists());
    assert!(!home.repo().join("refs/main").exists());
    no_partials(&home.dir);

    // The same through Ollama's registry: the digest is the checksum, and
    // no manifest names a model that is not there.
    let q8 = fixture("model-Q8_0.gguf");
    let tiny = hub.ollama_model("library", "tiny", "q8", &q8);
    let mut bad = q8.clone();
    bad[1000] ^= 1;
    hub.route(&tiny.model_blob, Route::ok(bad));
    let t = failed(home.pull(&hub, "tiny:q8"));
    assert!(t.contains("tiny:q8 model: checksum mismatch"), "{t}");
    assert!(!home
        .ollama()
        .join(format!("blobs/sha256-{}", sha256(&q8)))
        .exists());
    assert!(!home.ollama().join("manifests").exists());
    no_partials(&home.dir);
}

#[test]
fn what_is_missing_is_named() {
    let hub = Hub::start();
    let home = Home::new("missing");
    tiny_repo(&hub);
    hub.ollama_model("library", "tiny", "q8", &fixture("model-Q8_0.gguf"));
    hub.route(
        "/api/models/test-org/gated/revision/main",
        Route::status(401),
    );

    for (name, says) in [
        ("test-org/nothing", "no Hugging Face repo test-org/nothing"),
        (
            "hf.co/test-org/tiny-GGUF:Q5_K_S",
            "test-org/tiny-GGUF has no Q5_K_S file; it has: Q4_K_M, Q8_0",
        ),
        (
            "test-org/tiny-GGUF/model-Q5_K_S.gguf",
            "test-org/tiny-GGUF has no file model-Q5_K_S.gguf; its GGUF files: mmproj-model-bf16.gguf, mmproj-model-f16.gguf, model-Q4_K_M.gguf, model-Q8_0.gguf",
        ),
        ("tiny:999b", "/library/tiny:999b (the registry"),
        ("tiny:999b", "no tag 999b"),
        ("nothing", "no Ollama model"),
        ("test-org/gated", "set HF_TOKEN"),
        ("a/b/c", "ORG/REPO[:QUANT]"),
    ] {
        let t = failed(home.pull(&hub, name));
        assert!(t.contains(says), "{name}: {t}");
    }
    assert_eq!(home.files(), Vec::<String>::new());
}

#[test]
fn an_unreachable_hub_is_one_clear_line_and_nothing_is_fetched() {
    let home = Home::new("offline");
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    let url = format!("http://{closed}");
    for (name, hub) in [
        (REPO, "the Hugging Face hub"),
        ("tiny:q8", "the Ollama registry"),
    ] {
        let out = home
            .rlx_at(&url, &url)
            .args(["pull", name])
            .output()
            .unwrap();
        let t = failed(out.clone());
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = stderr.trim_end();
        assert!(!line.contains('\n'), "{t}");
        assert!(
            line.starts_with(&format!("error: cannot reach {hub} at {closed} (")),
            "{t}"
        );
        assert!(line.ends_with("; nothing was fetched"), "{t}");
    }
    // --pull says the same.
    let out = home
        .rlx_at(&url, &url)
        .args(["run", "-m", "tiny:q8", "--pull", "hi"])
        .output()
        .unwrap();
    let t = failed(out);
    assert!(t.contains("nothing was fetched"), "{t}");
    assert_eq!(home.files(), Vec::<String>::new());
}

#[test]
fn pull_flag_fetches_a_missing_model_then_runs() {
    let hub = Hub::start();
    let home = Home::new("flag");
    let q8 = fixture("model-Q8_0.gguf");
    let tiny = hub.ollama_model("library", "tiny", "q8", &q8);

    let t = failed(home.run(&hub, "tiny:q8", &[]));
    assert!(
        t.contains("not found") && t.contains("rlx pull tiny:q8"),
        "{t}"
    );
    assert!(hub.seen(&tiny.model_blob).is_empty());

    // Fetched, then run by the name that finds it (this registry's host
    // before it).
    let t = succeeded(home.run(&hub, "tiny:q8", &["--pull"]));
    assert!(t.contains("saved:") && t.contains("sha256-"), "{t}");
    home.has_ollama_model(hub.host(), "library/tiny:q8", &tiny);

    // Found now: nothing asked of the hub.
    let asked = hub.state.lock().unwrap().seen.len();
    let name = format!("{}/library/tiny:q8", hub.host());
    succeeded(home.run(&hub, &name, &["--pull"]));
    assert_eq!(hub.state.lock().unwrap().seen.len(), asked);

    // The same from Hugging Face.
    let (_, q8) = tiny_repo(&hub);
    let t = succeeded(home.run(&hub, &format!("{REPO}:Q8_0"), &["--pull"]));
    assert!(t.contains("saved:"), "{t}");
    home.has_hf_file("model-Q8_0.gguf", &q8);
    let asked = hub.state.lock().unwrap().seen.len();
    succeeded(home.run(&hub, &format!("{REPO}:Q8_0"), &["--pull"]));
    assert_eq!(hub.state.lock().unwrap().seen.len(), asked);
}
