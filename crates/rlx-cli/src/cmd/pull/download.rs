//! One file over HTTP: written to a partial file beside where it goes,
//! continued with a `Range` request after a cut connection or an earlier
//! run, its SHA-256 checked before it takes its name.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use ureq::config::RedirectAuthHeaders;
use ureq::http::Response;
use ureq::{Agent, Body};

use crate::cmd::common::human_bytes;

/// Tries in a row that bring no new byte before a download gives up.
const TRIES: u32 = 5;
/// A connection that sends nothing for this long counts as cut.
const STALL: Duration = Duration::from_secs(60);
const CHUNK_BYTES: usize = 1 << 20;

/// The HTTP client every request of a pull goes through.
pub fn agent() -> Agent {
    Agent::config_builder()
        // Statuses are read here, to say what a 404 or a 401 means.
        .http_status_as_error(false)
        .user_agent(concat!("rlx/", env!("CARGO_PKG_VERSION")))
        // A token goes to the hub, not to the storage it redirects to.
        .redirect_auth_headers(RedirectAuthHeaders::SameHost)
        .timeout_resolve(Some(Duration::from_secs(30)))
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_per_read(Some(STALL))
        .build()
        .into()
}

/// A GET, with a bearer token when given. A server that cannot be reached
/// is an `Unreachable`.
pub fn get(
    agent: &Agent,
    url: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
) -> Result<Response<Body>> {
    let mut req = agent.get(url);
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.call().map_err(|e| match unreachable_because(&e) {
        Some(why) => Unreachable {
            host: host_of(url).to_owned(),
            why,
        }
        .into(),
        None => anyhow::Error::new(e).context(format!("GET {url}")),
    })
}

/// A server that did not answer: no address for its name, no connection,
/// or no reply in time.
#[derive(Debug)]
pub struct Unreachable {
    /// `HOST[:PORT]`.
    pub host: String,
    pub why: String,
}

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot reach {} ({})", self.host, self.why)
    }
}

impl std::error::Error for Unreachable {}

/// An `Unreachable` as the one line a pull that stops before its first
/// download says: which hub, and that nothing was fetched.
pub fn nothing_fetched(e: anyhow::Error, hub: &str) -> anyhow::Error {
    match e.downcast_ref::<Unreachable>() {
        Some(u) => anyhow::anyhow!(
            "cannot reach {hub} at {} ({}); nothing was fetched",
            u.host,
            u.why
        ),
        None => e,
    }
}

/// Why a request failed before any reply, when that is the network's doing.
fn unreachable_because(e: &ureq::Error) -> Option<String> {
    match e {
        ureq::Error::HostNotFound => Some("no address for that name".to_owned()),
        ureq::Error::ConnectionFailed => Some("no connection".to_owned()),
        ureq::Error::Timeout(t) => Some(format!("timed out: {t}")),
        // Refused, reset, unreachable network, a failed name lookup.
        ureq::Error::Io(io) => Some(io.to_string()),
        _ => None,
    }
}

/// `HOST[:PORT]` of a URL.
pub fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    authority.rsplit('@').next().unwrap_or(authority)
}

/// A reply whose status was not a success: callers turn the ones they can
/// explain (404, 401) into what they mean.
#[derive(Debug)]
pub struct HttpStatus {
    pub url: String,
    pub status: u16,
}

impl fmt::Display for HttpStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GET {}: HTTP {}", self.url, self.status)
    }
}

impl std::error::Error for HttpStatus {}

/// The status of an error from `get` or `download`, when a server sent one.
pub fn status_of(e: &anyhow::Error) -> Option<u16> {
    e.downcast_ref::<HttpStatus>().map(|s| s.status)
}

/// What to fetch and what it must be.
pub struct Blob<'a> {
    /// What messages and the bar call it (the file's name in the repo, the
    /// model and layer), where the file itself is named by its hash.
    pub label: String,
    pub url: String,
    pub token: Option<&'a str>,
    /// The size the hub lists, when it does.
    pub bytes: Option<u64>,
    /// The SHA-256 the hub lists (hex), when it does.
    pub sha256: Option<String>,
}

/// What `download` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Fetched,
    /// The file was there already, whole.
    AlreadyThere,
}

/// Fetches `blob` to `dest` through `partial`, continuing what an earlier
/// run left there; a bar on stderr when `progress`.
pub fn download(
    agent: &Agent,
    blob: &Blob,
    dest: &Path,
    partial: &Path,
    progress: bool,
) -> Result<Outcome> {
    if let Ok(meta) = std::fs::metadata(dest) {
        if meta.is_file() && blob.bytes.is_none_or(|b| b == meta.len()) {
            return Ok(Outcome::AlreadyThere);
        }
    }
    if let Some(dir) = dest.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut part = Partial::open(partial)?;
    if part.bytes > 0 {
        eprintln!(
            "continuing {} from {}",
            blob.label,
            human_bytes(part.bytes, 1)
        );
    }
    let bar = bar(progress, blob.bytes, &blob.label);
    bar.set_position(part.bytes);
    let mut total = blob.bytes;
    let mut tries_without_bytes = 0;
    let started = Instant::now();
    while total != Some(part.bytes) {
        if total.is_some_and(|t| part.bytes > t) {
            part.restart()?;
        }
        let from = part.bytes;
        let range = format!("bytes={from}-");
        let headers: &[(&str, &str)] = if from > 0 { &[("Range", &range)] } else { &[] };
        // Why this request ended before the file did, if it did.
        let broke: Option<String> = match get(agent, &blob.url, blob.token, headers) {
            Ok(resp) => match resp.status().as_u16() {
                206 if from > 0 && content_range_start(&resp) == Some(from) => {
                    part.fill(resp.into_body(), &bar)?
                }
                // 200 is the whole file: a server that ignores ranges.
                200 => {
                    part.restart()?;
                    bar.set_position(0);
                    if total.is_none() {
                        total = resp.body().content_length();
                        if let Some(t) = total {
                            bar.set_length(t);
                        }
                    }
                    part.fill(resp.into_body(), &bar)?
                }
                // The part kept is not a prefix the server knows: anew.
                206 | 416 => {
                    part.restart()?;
                    Some(format!("the server did not continue at byte {from}"))
                }
                status => {
                    bar.finish_and_clear();
                    part.discard_if_empty();
                    return Err(HttpStatus {
                        url: blob.url.clone(),
                        status,
                    }
                    .into());
                }
            },
            Err(e) => Some(format!("{e:#}")),
        };
        let complete = total.map_or(broke.is_none(), |t| part.bytes >= t);
        if complete {
            break;
        }
        let why = broke.unwrap_or_else(|| "the connection closed early".to_owned());
        tries_without_bytes = if part.bytes > from {
            1
        } else {
            tries_without_bytes + 1
        };
        if tries_without_bytes > TRIES {
            bar.finish_and_clear();
            part.discard_if_empty();
            bail!(
                "{} stopped at {} of {} after {TRIES} tries ({why}); run again to continue from there",
                blob.label,
                human_bytes(part.bytes, 1),
                total.map_or("?".into(), |t| human_bytes(t, 1))
            );
        }
        bar.suspend(|| {
            eprintln!(
                "{}: {why}; continuing from {}",
                blob.label,
                human_bytes(part.bytes, 1)
            )
        });
        std::thread::sleep(Duration::from_millis(200 * u64::from(tries_without_bytes)));
    }
    bar.finish_and_clear();
    let (bytes, actual) = part.finish()?;
    if let Some(want) = blob.bytes.filter(|&w| w != bytes) {
        let _ = std::fs::remove_file(partial);
        bail!(
            "{}: {bytes} bytes, but the hub lists {want}; the download was deleted",
            blob.label
        );
    }
    if let Some(want) = &blob.sha256 {
        if !want.eq_ignore_ascii_case(&actual) {
            let _ = std::fs::remove_file(partial);
            bail!(
                "{}: checksum mismatch: expected sha256 {want}, got sha256 {actual}; the download was deleted (run again to fetch it anew)",
                blob.label
            );
        }
    }
    std::fs::rename(partial, dest)
        .with_context(|| format!("cannot rename {} to {}", partial.display(), dest.display()))?;
    eprintln!(
        "fetched {} ({}) in {:.1} s{}",
        blob.label,
        human_bytes(bytes, 1),
        started.elapsed().as_secs_f64(),
        if blob.sha256.is_some() {
            ", sha256 verified"
        } else {
            ""
        }
    );
    Ok(Outcome::Fetched)
}

/// The file being written, and the hash of what it holds so far.
struct Partial {
    path: PathBuf,
    file: File,
    hash: Sha256,
    bytes: u64,
}

impl Partial {
    /// Opens `path` to append, hashing what an earlier run left in it.
    fn open(path: &Path) -> Result<Partial> {
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; CHUNK_BYTES];
        let mut bytes = 0u64;
        loop {
            let n = file
                .read(&mut buf)
                .with_context(|| format!("cannot read {}", path.display()))?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            bytes += n as u64;
        }
        Ok(Partial {
            path: path.to_owned(),
            file,
            hash,
            bytes,
        })
    }

    /// Leaves no empty file behind a download that never started.
    fn discard_if_empty(&self) {
        if self.bytes == 0 {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    fn restart(&mut self) -> Result<()> {
        self.file
            .set_len(0)
            .with_context(|| format!("cannot truncate {}", self.path.display()))?;
        self.hash = Sha256::new();
        self.bytes = 0;
        Ok(())
    }

    /// Appends the body until it ends, or breaks: then why (what arrived
    /// stays). A file that cannot be written is the error.
    fn fill(&mut self, body: Body, bar: &ProgressBar) -> Result<Option<String>> {
        let mut reader = body.into_reader();
        let mut buf = vec![0u8; CHUNK_BYTES];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => return Ok(None),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Ok(Some(format!("the connection broke: {e}"))),
            };
            self.file
                .write_all(&buf[..n])
                .with_context(|| format!("cannot write {}", self.path.display()))?;
            self.hash.update(&buf[..n]);
            self.bytes += n as u64;
            bar.set_position(self.bytes);
        }
    }

    /// Flushes the file; its size and SHA-256 (hex).
    fn finish(self) -> Result<(u64, String)> {
        self.file
            .sync_all()
            .with_context(|| format!("cannot write {}", self.path.display()))?;
        let digest = self.hash.finalize();
        let hex = digest.iter().map(|b| format!("{b:02x}")).collect();
        Ok((self.bytes, hex))
    }
}

/// The first byte a 206 reply holds (`Content-Range: bytes N-M/T`).
fn content_range_start(resp: &Response<Body>) -> Option<u64> {
    let v = resp.headers().get("content-range")?.to_str().ok()?;
    let range = v.strip_prefix("bytes ")?;
    range.split('-').next()?.trim().parse().ok()
}

fn bar(progress: bool, bytes: Option<u64>, label: &str) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(bytes.unwrap_or(0));
    bar.set_style(
        // The bar takes what the line leaves, so it never wraps.
        ProgressStyle::with_template(
            "{msg} {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
        )
        .expect("valid template"),
    );
    bar.set_message(label.to_owned());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_come_from_urls() {
        for (url, host) in [
            ("https://huggingface.co/api/models/a/b", "huggingface.co"),
            (
                "http://127.0.0.1:8080/v2/library/x/manifests/y",
                "127.0.0.1:8080",
            ),
            ("https://user@hub.example.com?x=1", "hub.example.com"),
            ("hub.example.com/x", "hub.example.com"),
        ] {
            assert_eq!(host_of(url), host, "{url}");
        }
    }

    #[test]
    fn a_closed_port_is_unreachable_not_a_transport_chain() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let e = get(&agent(), &format!("http://127.0.0.1:{port}/x"), None, &[]).unwrap_err();
        let u = e.downcast_ref::<Unreachable>().expect("Unreachable");
        assert_eq!(u.host, format!("127.0.0.1:{port}"));
        assert!(e.to_string().starts_with("cannot reach 127.0.0.1:"), "{e}");
    }
}
