//! `rlx pull` and `--pull` against a hub served in this process: a small
//! HTTP server that answers as the Hugging Face hub (file list, `resolve`
//! with ranges) and Ollama's registry (manifest, blob) do, with the tiny
//! models as files. It can cut a connection part way, serve corrupted
//! bytes and log every request, so resuming, the checksum check and what
//! was sent are seen from the outside. No network, no ~/.cache.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use serde_json::json;
use sha2::{Digest, Sha256};

const REPO: &str = "test-org/tiny-GGUF";

fn fixture(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny/gemma3-q")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What the hub answers on one path.
struct Route {
    status: u16,
    body: Vec<u8>,
    /// Honour `Range: bytes=N-` with a 206.
    ranges: bool,
    /// Close the connection after this many body bytes, once.
    cut_after: Option<usize>,
}

impl Route {
    fn ok(body: impl Into<Vec<u8>>) -> Route {
        Route {
            status: 200,
            body: body.into(),
            ranges: true,
            cut_after: None,
        }
    }

    fn status(status: u16) -> Route {
        Route {
            status,
            body: Vec::new(),
            ranges: false,
            cut_after: None,
        }
    }
}

/// A request the hub saw: its path and headers (names in lower case).
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    headers: HashMap<String, String>,
}

#[derive(Default)]
struct State {
    routes: HashMap<String, Route>,
    seen: Vec<Seen>,
}

/// The hub: Hugging Face's and Ollama's paths on one loopback port.
struct Hub {
    url: String,
    state: Arc<Mutex<State>>,
}

impl Hub {
    fn start() -> Hub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = shared.clone();
                std::thread::spawn(move || {
                    let _ = answer(stream, &state);
                });
            }
        });
        Hub { url, state }
    }

    fn route(&self, path: &str, route: Route) {
        self.state
            .lock()
            .unwrap()
            .routes
            .insert(path.to_owned(), route);
    }

    /// A repo's file list and each file's `resolve` path; `served`
    /// replaces what a file's path answers (its listing stays the true
    /// file's).
    fn hf_repo(&self, repo: &str, files: &[(&str, Vec<u8>)]) {
        let list: Vec<_> = files
            .iter()
            .map(|(name, bytes)| {
                json!({"type": "file", "path": name, "size": bytes.len(), "oid": "0123",
                       "lfs": {"oid": sha256(bytes), "size": bytes.len(), "pointerSize": 133}})
            })
            .chain([json!({"type": "file", "path": "README.md", "size": 12, "oid": "4567"})])
            .collect();
        self.route(
            &format!("/api/models/{repo}/tree/main"),
            Route::ok(serde_json::to_vec(&list).unwrap()),
        );
        for (name, bytes) in files {
            self.route(&hf_file(repo, name), Route::ok(bytes.clone()));
        }
    }

    /// An Ollama tag whose model layer is `bytes`; the blob's path.
    fn ollama_model(&self, namespace: &str, model: &str, tag: &str, bytes: &[u8]) -> String {
        let digest = format!("sha256:{}", sha256(bytes));
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:00", "size": 2},
            "layers": [
                {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:11", "size": 3},
                {"mediaType": "application/vnd.ollama.image.model", "digest": digest, "size": bytes.len()},
            ]
        });
        self.route(
            &format!("/v2/{namespace}/{model}/manifests/{tag}"),
            Route::ok(manifest.to_string()),
        );
        let blob = format!("/v2/{namespace}/{model}/blobs/{digest}");
        self.route(&blob, Route::ok(bytes.to_vec()));
        blob
    }

    /// The requests seen on `path`.
    fn seen(&self, path: &str) -> Vec<Seen> {
        let state = self.state.lock().unwrap();
        state
            .seen
            .iter()
            .filter(|s| s.path == path)
            .cloned()
            .collect()
    }
}

fn hf_file(repo: &str, name: &str) -> String {
    format!("/{repo}/resolve/main/{name}")
}

/// Answers one request and closes the connection.
fn answer(mut stream: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let target = line.split_whitespace().nth(1).unwrap_or("/");
    let path = target.split('?').next().unwrap_or(target).to_owned();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    let (status, extra, body, cut) = {
        let mut state = state.lock().unwrap();
        state.seen.push(Seen {
            path: path.clone(),
            headers: headers.clone(),
        });
        match state.routes.get_mut(&path) {
            None => (404, String::new(), Vec::new(), None),
            Some(route) => {
                let from = headers
                    .get("range")
                    .and_then(|r| r.strip_prefix("bytes="))
                    .and_then(|r| r.strip_suffix('-'))
                    .and_then(|n| n.parse::<usize>().ok())
                    .filter(|_| route.ranges && route.status == 200);
                let len = route.body.len();
                match from {
                    Some(n) if n >= len => (
                        416,
                        format!("Content-Range: bytes */{len}\r\n"),
                        Vec::new(),
                        None,
                    ),
                    Some(n) => (
                        206,
                        format!("Content-Range: bytes {n}-{}/{len}\r\n", len - 1),
                        route.body[n..].to_vec(),
                        route.cut_after.take(),
                    ),
                    None => (
                        route.status,
                        String::new(),
                        route.body.clone(),
                        route.cut_after.take(),
                    ),
                }
            }
        }
    };
    write!(
        stream,
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
        body.len()
    )?;
    stream.write_all(&body[..cut.unwrap_or(body.len()).min(body.len())])?;
    stream.flush()?;
    stream.shutdown(Shutdown::Both)
}

/// A home of its own: rlx's cache in it, nothing of the machine's stores.
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

    fn cache(&self) -> PathBuf {
        self.dir.join("rlx")
    }

    fn rlx(&self, hub: &Hub) -> Command {
        let mut c = common::rlx();
        c.env("HOME", &self.dir)
            .env("RLX_HOME", self.cache())
            .env("OLLAMA_MODELS", self.dir.join("ollama"))
            .env("HF_ENDPOINT", &hub.url)
            .env("OLLAMA_REGISTRY", &hub.url);
        for k in [
            "HF_TOKEN",
            "HF_HOME",
            "HF_HUB_CACHE",
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

    /// `rlx run -m NAME` of one token, with more flags after.
    fn run(&self, hub: &Hub, name: &str, more: &[&str]) -> Output {
        self.rlx(hub)
            .args([
                "run", "-m", name, "-n", "1", "--temp", "0", "--raw", "Hello",
            ])
            .args(more)
            .output()
            .unwrap()
    }

    fn models(&self, hub: &Hub) -> String {
        let out = common::ok(self.rlx(hub).arg("models"));
        String::from_utf8_lossy(&out.stdout).into_owned()
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

/// No `.partial` file anywhere under `dir`.
fn no_partials(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        assert!(
            !p.to_string_lossy().ends_with(".partial"),
            "{} left",
            p.display()
        );
        if p.is_dir() {
            no_partials(&p);
        }
    }
}

fn tiny_repo(hub: &Hub) -> (Vec<u8>, Vec<u8>) {
    let (q4, q8) = (fixture("model-Q4_K_M.gguf"), fixture("model-Q8_0.gguf"));
    hub.hf_repo(
        REPO,
        &[
            ("mmproj-model-f16.gguf", b"not a model".to_vec()),
            ("model-Q4_K_M.gguf", q4.clone()),
            ("model-Q8_0.gguf", q8.clone()),
        ],
    );
    (q4, q8)
}

#[test]
fn a_hugging_face_repo_is_pulled_listed_and_run_by_its_name() {
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
    let name = format!("{REPO}/model-Q4_K_M");
    assert!(
        t.contains("taking model-Q4_K_M.gguf (of Q4_K_M, Q8_0"),
        "{t}"
    );
    assert!(t.contains("sha256 verified"), "{t}");
    assert!(
        t.contains(&format!("run it with: rlx run -m {name}")),
        "{t}"
    );
    let file = home.cache().join(REPO).join("model-Q4_K_M.gguf");
    assert_eq!(std::fs::read(&file).unwrap(), q4);
    no_partials(&home.cache());
    let fetched = hub.seen(&hf_file(REPO, "model-Q4_K_M.gguf"));
    assert_eq!(fetched.len(), 1);
    assert_eq!(fetched[0].headers["authorization"], "Bearer hf_secret");
    assert!(!fetched[0].headers.contains_key("range"));

    let list = home.models(&hub);
    let line = list
        .lines()
        .find(|l| l.starts_with(&format!("{name}\t")))
        .unwrap_or_else(|| panic!("{name} not listed:\n{list}"));
    assert!(line.contains("\trlx\t"), "{line}");
    // By the printed name, the name it was pulled by, and its short form;
    // found in the cache, so nothing is fetched again.
    for m in [name.as_str(), &format!("hf.co/{REPO}:Q4_K_M"), REPO] {
        succeeded(home.run(&hub, m, &["--pull"]));
    }
    let t = succeeded(home.pull(&hub, REPO));
    assert!(t.contains("already there"), "{t}");
    assert_eq!(hub.seen(&hf_file(REPO, "model-Q4_K_M.gguf")).len(), 1);

    // Another quantization, named in any case, beside it.
    succeeded(home.pull(&hub, &format!("{REPO}:q8_0")));
    assert_eq!(
        std::fs::read(home.cache().join(REPO).join("model-Q8_0.gguf")).unwrap(),
        q8
    );
    assert!(hub.seen(&hf_file(REPO, "mmproj-model-f16.gguf")).is_empty());
}

#[test]
fn an_ollama_model_is_pulled_listed_and_run_by_its_name() {
    let hub = Hub::start();
    let home = Home::new("ollama");
    let q8 = fixture("model-Q8_0.gguf");
    let blob = hub.ollama_model("library", "tiny", "q8", &q8);
    hub.ollama_model("someone", "tiny", "latest", &q8);

    let t = succeeded(home.pull(&hub, "tiny:q8"));
    assert!(t.contains("run it with: rlx run -m tiny-q8"), "{t}");
    assert!(t.contains("sha256 verified"), "{t}");
    assert_eq!(
        std::fs::read(home.cache().join("tiny-q8.gguf")).unwrap(),
        q8
    );
    let manifest = hub.seen("/v2/library/tiny/manifests/q8");
    assert_eq!(
        manifest[0].headers["accept"],
        "application/vnd.docker.distribution.manifest.v2+json"
    );
    assert_eq!(hub.seen(&blob).len(), 1);

    let t = succeeded(home.pull(&hub, "ollama.com/someone/tiny"));
    assert!(t.contains("rlx run -m someone/tiny-latest"), "{t}");

    let list = home.models(&hub);
    for name in ["tiny-q8", "someone/tiny-latest"] {
        assert!(
            list.lines()
                .any(|l| l.starts_with(&format!("{name}\trlx\t"))),
            "{name} not listed:\n{list}"
        );
    }
    for m in [
        "tiny-q8",
        "tiny:q8",
        "ollama.com/library/tiny:q8",
        "someone/tiny-latest",
    ] {
        succeeded(home.run(&hub, m, &[]));
    }
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
    assert_eq!(
        std::fs::read(home.cache().join(REPO).join("model-Q4_K_M.gguf")).unwrap(),
        q4
    );
    no_partials(&home.cache());
    let seen = hub.seen(&path);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(!seen[0].headers.contains_key("range"));
    assert_eq!(seen[1].headers["range"], "bytes=100000-");
}

#[test]
fn a_partial_file_left_before_is_continued_or_restarted() {
    let hub = Hub::start();
    let home = Home::new("partial");
    let (q4, _) = tiny_repo(&hub);
    let dir = home.cache().join(REPO);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("model-Q4_K_M.gguf.partial"), &q4[..50_000]).unwrap();

    let t = succeeded(home.pull(&hub, REPO));
    assert!(t.contains("continuing model-Q4_K_M.gguf from"), "{t}");
    assert_eq!(std::fs::read(dir.join("model-Q4_K_M.gguf")).unwrap(), q4);
    let seen = hub.seen(&hf_file(REPO, "model-Q4_K_M.gguf"));
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers["range"], "bytes=50000-");

    // A server that ignores ranges sends the whole file: taken from the start.
    let q8 = fixture("model-Q8_0.gguf");
    let blob = hub.ollama_model("library", "tiny", "q8", &q8);
    hub.route(
        &blob,
        Route {
            ranges: false,
            ..Route::ok(q8.clone())
        },
    );
    std::fs::write(home.cache().join("tiny-q8.gguf.partial"), &q8[..70_000]).unwrap();
    succeeded(home.pull(&hub, "tiny:q8"));
    assert_eq!(
        std::fs::read(home.cache().join("tiny-q8.gguf")).unwrap(),
        q8
    );
    assert_eq!(hub.seen(&blob)[0].headers["range"], "bytes=70000-");
    no_partials(&home.cache());
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
    assert!(t.contains("checksum mismatch"), "{t}");
    assert!(
        t.contains(&format!("expected sha256 {}", sha256(&q4))),
        "{t}"
    );
    assert!(t.contains(&format!("got sha256 {}", sha256(&bad))), "{t}");
    assert!(!home.cache().join(REPO).join("model-Q4_K_M.gguf").exists());
    no_partials(&home.cache());

    // The same through Ollama's registry: the digest is the checksum.
    let q8 = fixture("model-Q8_0.gguf");
    let blob = hub.ollama_model("library", "tiny", "q8", &q8);
    let mut bad = q8.clone();
    bad[1000] ^= 1;
    hub.route(&blob, Route::ok(bad));
    let t = failed(home.pull(&hub, "tiny:q8"));
    assert!(t.contains("checksum mismatch"), "{t}");
    assert!(!home.cache().join("tiny-q8.gguf").exists());
    no_partials(&home.cache());
}

#[test]
fn what_is_missing_is_named() {
    let hub = Hub::start();
    let home = Home::new("missing");
    tiny_repo(&hub);
    hub.ollama_model("library", "tiny", "q8", &fixture("model-Q8_0.gguf"));
    hub.route("/api/models/test-org/gated/tree/main", Route::status(401));

    for (name, says) in [
        ("test-org/nothing", "no Hugging Face repo test-org/nothing"),
        (
            "hf.co/test-org/tiny-GGUF:Q5_K_S",
            "test-org/tiny-GGUF has no Q5_K_S file; it has: Q4_K_M, Q8_0",
        ),
        ("tiny:999b", "no Ollama model tiny:999b"),
        ("nothing", "no Ollama model nothing:latest"),
        ("test-org/gated", "set HF_TOKEN"),
        ("a/b/c", "ORG/REPO[:QUANT]"),
    ] {
        let t = failed(home.pull(&hub, name));
        assert!(t.contains(says), "{name}: {t}");
    }
    assert!(!home.cache().join("test-org/nothing").exists());
    no_partials(&home.cache());
}

#[test]
fn pull_flag_fetches_a_missing_model_then_runs() {
    let hub = Hub::start();
    let home = Home::new("flag");
    let q8 = fixture("model-Q8_0.gguf");
    let blob = hub.ollama_model("library", "tiny", "q8", &q8);

    let t = failed(home.run(&hub, "tiny:q8", &[]));
    assert!(
        t.contains("not found") && t.contains("rlx pull tiny:q8"),
        "{t}"
    );
    assert!(hub.seen(&blob).is_empty());

    let out = home.run(&hub, "tiny:q8", &["--pull"]);
    let t = succeeded(out);
    assert!(t.contains("saved:") && t.contains("tiny-q8.gguf"), "{t}");
    assert_eq!(
        std::fs::read(home.cache().join("tiny-q8.gguf")).unwrap(),
        q8
    );

    // Found now: nothing asked of the hub.
    let asked = hub.state.lock().unwrap().seen.len();
    succeeded(home.run(&hub, "tiny:q8", &["--pull"]));
    assert_eq!(hub.state.lock().unwrap().seen.len(), asked);
}
