//! The hub the pull tests talk to: one loopback port that answers as the
//! Hugging Face hub and Ollama's registry do, one connection a request,
//! every request logged.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::json;
use sha2::{Digest, Sha256};

/// The commit the hub says the repos' main branch is at.
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

pub fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What the hub answers on one path.
pub struct Route {
    pub status: u16,
    pub body: Vec<u8>,
    /// Honour `Range: bytes=N-` with a 206.
    pub ranges: bool,
    /// Close the connection after this many body bytes, once.
    pub cut_after: Option<usize>,
}

impl Route {
    pub fn ok(body: impl Into<Vec<u8>>) -> Route {
        Route {
            status: 200,
            body: body.into(),
            ranges: true,
            cut_after: None,
        }
    }

    pub fn status(status: u16) -> Route {
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
pub struct Seen {
    pub path: String,
    pub headers: HashMap<String, String>,
}

/// What the hub serves and what it was asked.
#[derive(Default)]
pub struct State {
    pub routes: HashMap<String, Route>,
    pub seen: Vec<Seen>,
}

/// The hub: Hugging Face's and Ollama's paths on one loopback port.
pub struct Hub {
    pub url: String,
    pub state: Arc<Mutex<State>>,
}

impl Hub {
    pub fn start() -> Hub {
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

    pub fn route(&self, path: &str, route: Route) {
        self.state
            .lock()
            .unwrap()
            .routes
            .insert(path.to_owned(), route);
    }

    /// `host:port`, as Ollama names this registry in its store.
    pub fn host(&self) -> &str {
        self.url.trim_start_matches("http://")
    }

    /// A repo at `COMMIT` with these files (each in LFS) and a README (in
    /// git): main's commit, the file list and each file's `resolve` path.
    pub fn hf_repo(&self, repo: &str, files: &[(&str, Vec<u8>)]) {
        let list: Vec<_> = files
            .iter()
            .map(|(name, bytes)| {
                json!({"type": "file", "path": name, "size": 133, "oid": "1".repeat(40),
                       "lfs": {"oid": sha256(bytes), "size": bytes.len(), "pointerSize": 133}})
            })
            .chain([
                json!({"type": "file", "path": "README.md", "size": 12, "oid": "4".repeat(40)}),
            ])
            .collect();
        self.route(
            &format!("/api/models/{repo}/revision/main"),
            Route::ok(json!({"id": repo, "sha": COMMIT, "siblings": []}).to_string()),
        );
        self.route(
            &format!("/api/models/{repo}/tree/{COMMIT}"),
            Route::ok(serde_json::to_vec(&list).unwrap()),
        );
        for (name, bytes) in files {
            self.route(&hf_file(repo, name), Route::ok(bytes.clone()));
        }
    }

    /// An Ollama tag whose model layer is `bytes`, with a config, template,
    /// params and license as Ollama's models have them.
    pub fn ollama_model(
        &self,
        namespace: &str,
        model: &str,
        tag: &str,
        bytes: &[u8],
    ) -> OllamaModel {
        let config = json!({"model_format": "gguf", "model_family": "gemma3"}).to_string();
        let blobs: Vec<(&str, Vec<u8>)> = vec![
            (
                "application/vnd.docker.container.image.v1+json",
                config.into_bytes(),
            ),
            ("application/vnd.ollama.image.model", bytes.to_vec()),
            (
                "application/vnd.ollama.image.template",
                b"{{ .Prompt }}".to_vec(),
            ),
            (
                "application/vnd.ollama.image.params",
                br#"{"stop":["<end_of_turn>"]}"#.to_vec(),
            ),
            (
                "application/vnd.ollama.image.license",
                b"a license".to_vec(),
            ),
        ];
        let entry = |(media, b): &(&str, Vec<u8>)| json!({"mediaType": media, "digest": format!("sha256:{}", sha256(b)), "size": b.len()});
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": entry(&blobs[0]),
            "layers": blobs[1..].iter().map(entry).collect::<Vec<_>>(),
        })
        .to_string();
        self.route(
            &format!("/v2/{namespace}/{model}/manifests/{tag}"),
            Route::ok(manifest.clone()),
        );
        for (_, b) in &blobs {
            self.route(
                &format!("/v2/{namespace}/{model}/blobs/sha256:{}", sha256(b)),
                Route::ok(b.clone()),
            );
        }
        OllamaModel {
            manifest,
            model_blob: format!("/v2/{namespace}/{model}/blobs/sha256:{}", sha256(bytes)),
            blobs: blobs.into_iter().map(|(_, b)| b).collect(),
        }
    }

    /// The requests seen on `path`.
    pub fn seen(&self, path: &str) -> Vec<Seen> {
        let state = self.state.lock().unwrap();
        state
            .seen
            .iter()
            .filter(|s| s.path == path)
            .cloned()
            .collect()
    }
}

/// What the registry serves for one tag.
pub struct OllamaModel {
    pub manifest: String,
    /// The model layer's path on the registry.
    pub model_blob: String,
    /// The config's and every layer's bytes.
    pub blobs: Vec<Vec<u8>>,
}

pub fn hf_file(repo: &str, name: &str) -> String {
    format!("/{repo}/resolve/{COMMIT}/{name}")
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
