//! A GGUF file of a Hugging Face repo, into the hub cache as
//! `huggingface_hub` lays it out, so that its tools (and llama.cpp, LM
//! Studio, …) find it: the main branch's commit
//! (`api/models/ORG/REPO/revision/main`), the files at that commit
//! (`api/models/ORG/REPO/tree/COMMIT`, each with its size and, stored in
//! LFS, its SHA-256), the one a quantization or path names and the repo's
//! image projector fetched from `ORG/REPO/resolve/COMMIT/PATH` into
//! `models--ORG--REPO/blobs/SHA256`, linked from `snapshots/COMMIT/PATH`,
//! and `refs/main` set to the commit.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use ureq::http::Response;
use ureq::{Agent, Body};

use super::download::{self, nothing_fetched, Blob, HttpStatus, Outcome};
use super::{Options, Pulled};
use crate::cmd::remote::{is_projector, matching_quant, quant_label, split_part};
use crate::cmd::stores::{self, Roots};

/// The quantization taken when the name gives none, as llama.cpp's `-hf`.
const DEFAULT_QUANT: &str = "Q4_K_M";
/// Pages of the file list followed at most (the hub sends 1,000 files a page).
const MAX_PAGES: usize = 100;
/// Projector precisions taken, best first, when none is the model's.
const PROJECTOR_PREFERENCE: [&str; 3] = ["F16", "BF16", "F32"];

/// One file the hub lists.
struct RepoFile {
    path: String,
    bytes: Option<u64>,
    /// The LFS object's SHA-256 (hex), which names its blob in the cache.
    sha256: Option<String>,
    /// The git blob id, which names the blob of a file not in LFS.
    git_oid: Option<String>,
}

impl RepoFile {
    /// The name of its blob in the hub cache, as `huggingface_hub` names it.
    fn blob_id(&self) -> Option<&str> {
        self.sha256.as_deref().or(self.git_oid.as_deref())
    }
}

/// Fetches the file of `repo` that `quant` or `file` names, and the repo's
/// projector with it (`named_by_host`: the name began with `hf.co/`, so it
/// was not meant for Ollama).
pub fn pull(
    agent: &Agent,
    opts: &Options,
    repo: &str,
    quant: Option<&str>,
    file: Option<&str>,
    named_by_host: bool,
) -> Result<Pulled> {
    let hub_cache = opts
        .hf_cache
        .as_deref()
        .context("no folder for the Hugging Face cache: set HF_HUB_CACHE (or HF_HOME, HOME)")?;
    let commit = main_commit(agent, opts, repo, named_by_host)?;
    let files = list_files(agent, opts, repo, &commit)
        .map_err(|e| nothing_fetched(e, "the Hugging Face hub"))?;
    let chosen = choose(repo, &files, quant, file)?;
    let projector = (!is_projector(&chosen.path))
        .then(|| choose_projector(repo, &files, chosen))
        .flatten();
    let cache = CachedRepo::new(hub_cache, repo);
    let (path, outcome) = fetch(agent, opts, repo, &commit, chosen, &cache)?;
    cache.set_main(&commit)?;
    let projector = match projector {
        Some(p) => Some(
            fetch(agent, opts, repo, &commit, p, &cache).with_context(|| {
                format!(
                    "{repo}: the model is in place ({}), its projector {} is not",
                    path.display(),
                    p.path
                )
            })?,
        ),
        None => None,
    };
    Ok(Pulled {
        name: pulled_name(hub_cache, repo, &chosen.path, &path, file.is_some()),
        path,
        projector: projector.map(|(p, _)| p),
        outcome,
    })
}

/// The commit the repo's main branch is at.
fn main_commit(agent: &Agent, opts: &Options, repo: &str, named_by_host: bool) -> Result<String> {
    let url = format!("{}/api/models/{repo}/revision/main", opts.hf_endpoint);
    let resp = download::get(agent, &url, opts.hf_token.as_deref(), &[])
        .map_err(|e| nothing_fetched(e, "the Hugging Face hub"))?;
    match resp.status().as_u16() {
        200 => {}
        404 => bail!(
            "no Hugging Face repo {repo} (at {}){}",
            opts.hf_endpoint,
            if named_by_host {
                ""
            } else {
                "; a user's Ollama model is named ollama.com/USER/NAME:TAG"
            }
        ),
        s @ (401 | 403) => return Err(token_needed(repo, s, opts.hf_token.is_some())),
        status => return Err(HttpStatus { url, status }.into()),
    }
    let info = read_json(resp, &format!("what the hub says of {repo}"))?;
    let sha = info["sha"].as_str().unwrap_or_default();
    // It names a folder of the cache.
    if sha.is_empty() || sha.len() > 64 || !sha.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!("the hub gave no commit for {repo}'s main branch (its \"sha\" is {sha:?})");
    }
    Ok(sha.to_ascii_lowercase())
}

/// A hub reply's JSON body (at most 64 MiB); `what` names it in errors.
fn read_json(resp: Response<Body>, what: &str) -> Result<Value> {
    let text = resp
        .into_body()
        .with_config()
        .limit(64 << 20)
        .read_to_string()
        .with_context(|| format!("cannot read {what}"))?;
    serde_json::from_str(&text).with_context(|| format!("{what} is not JSON"))
}

/// Every file of the repo at `commit`.
fn list_files(agent: &Agent, opts: &Options, repo: &str, commit: &str) -> Result<Vec<RepoFile>> {
    let mut url = format!(
        "{}/api/models/{repo}/tree/{commit}?recursive=true",
        opts.hf_endpoint
    );
    let mut files = Vec::new();
    for _ in 0..MAX_PAGES {
        let resp = download::get(agent, &url, opts.hf_token.as_deref(), &[])?;
        match resp.status().as_u16() {
            200 => {}
            s @ (401 | 403) => return Err(token_needed(repo, s, opts.hf_token.is_some())),
            status => return Err(HttpStatus { url, status }.into()),
        }
        let next = next_page(resp.headers());
        let list = read_json(resp, &format!("the file list of {repo}"))?;
        let entries = list
            .as_array()
            .with_context(|| format!("the file list of {repo} is not a JSON array"))?;
        files.extend(entries.iter().filter_map(repo_file));
        match next {
            Some(n) => url = n,
            None => return Ok(files),
        }
    }
    bail!("the file list of {repo} runs past {MAX_PAGES} pages")
}

/// A file entry (folders have `"type": "directory"`); one whose path
/// would leave the snapshot folder is no file of ours.
fn repo_file(entry: &Value) -> Option<RepoFile> {
    if entry["type"].as_str().is_some_and(|t| t != "file") {
        return None;
    }
    let path = entry["path"].as_str()?;
    if !path
        .split('/')
        .all(|p| !p.is_empty() && p != "." && p != ".." && !p.contains('\\'))
    {
        return None;
    }
    let hex = |v: &Value, len: usize| {
        v.as_str()
            .filter(|s| s.len() == len && s.chars().all(|c| c.is_ascii_hexdigit()))
            .map(str::to_ascii_lowercase)
    };
    let lfs = &entry["lfs"];
    Some(RepoFile {
        path: path.to_owned(),
        bytes: lfs["size"].as_u64().or_else(|| entry["size"].as_u64()),
        sha256: hex(&lfs["oid"], 64),
        git_oid: hex(&entry["oid"], 40),
    })
}

/// The `rel="next"` page of a `Link` header.
fn next_page(headers: &ureq::http::HeaderMap) -> Option<String> {
    let link = headers.get("link")?.to_str().ok()?;
    link.split(',').find_map(|part| {
        let (url, params) = part.split_once(';')?;
        params.contains("rel=\"next\"").then(|| {
            url.trim()
                .trim_start_matches('<')
                .trim_end_matches('>')
                .to_owned()
        })
    })
}

fn is_gguf(path: &str) -> bool {
    path.to_ascii_lowercase().ends_with(".gguf")
}

/// The file a name means: the path given, the one `quant` names, else
/// Q4_K_M, else the first model file.
fn choose<'a>(
    repo: &str,
    files: &'a [RepoFile],
    quant: Option<&str>,
    file: Option<&str>,
) -> Result<&'a RepoFile> {
    let ggufs: Vec<&str> = files
        .iter()
        .map(|f| f.path.as_str())
        .filter(|p| is_gguf(p))
        .collect();
    let models: Vec<&str> = ggufs.iter().copied().filter(|p| !is_projector(p)).collect();
    let by_path = |p: &str| files.iter().find(|f| f.path == p);
    if let Some(f) = file {
        return by_path(f).with_context(|| {
            format!(
                "{repo} has no file {f}; its GGUF files: {}",
                if ggufs.is_empty() {
                    "none".to_owned()
                } else {
                    ggufs.join(", ")
                }
            )
        });
    }
    if models.is_empty() {
        bail!(
            "{repo} has no GGUF model file{}",
            if files.is_empty() {
                String::new()
            } else {
                format!(" (it has {} files, none a .gguf model)", files.len())
            }
        );
    }
    let labels = || {
        let set: BTreeSet<String> = models.iter().map(|m| quant_label(m)).collect();
        set.into_iter().collect::<Vec<_>>().join(", ")
    };
    let chosen = match quant {
        Some(q) => {
            let found = matching_quant(&models, q);
            let models_of: BTreeSet<&str> = found.iter().map(|f| split_stem(f)).collect();
            match (found.first(), models_of.len()) {
                (None, _) => bail!("{repo} has no {q} file; it has: {}", labels()),
                (Some(first), 1) => *first,
                _ => bail!(
                    "{repo}:{q} fits several files ({}); give its whole quantization, e.g. {repo}:{}",
                    found.join(", "),
                    quant_label(found[0])
                ),
            }
        }
        None => {
            let preferred = matching_quant(&models, DEFAULT_QUANT);
            let first = preferred.first().copied().unwrap_or(models[0]);
            if models.len() > 1 {
                eprintln!(
                    "{repo}: taking {first} (of {}; choose with {repo}:QUANT)",
                    labels()
                );
            }
            first
        }
    };
    if let Some((_, parts)) = split_part(chosen) {
        bail!(
            "{repo}: {chosen} is the first of {parts} parts of a split model; rlx reads a model from one file (join them with llama-gguf-split --merge and give -m the result)"
        );
    }
    by_path(chosen).context("a listed file")
}

/// The repo's image projector (`mmproj*.gguf`) for `model`, when it has
/// one: of several, one in the model's folder first, then the one of the
/// model's precision, else F16, BF16, F32, else the first listed.
fn choose_projector<'a>(
    repo: &str,
    files: &'a [RepoFile],
    model: &RepoFile,
) -> Option<&'a RepoFile> {
    let projectors: Vec<&RepoFile> = files
        .iter()
        .filter(|f| is_gguf(&f.path) && is_projector(&f.path))
        .collect();
    fn folder(p: &str) -> &str {
        p.rsplit_once('/').map_or("", |(dir, _)| dir)
    }
    let model_label = quant_label(&model.path);
    let precision_rank = |label: &str| {
        if label == model_label {
            0
        } else {
            PROJECTOR_PREFERENCE
                .iter()
                .position(|p| *p == label)
                .map_or(PROJECTOR_PREFERENCE.len() + 1, |i| i + 1)
        }
    };
    let chosen = *projectors.iter().min_by_key(|f| {
        (
            folder(&f.path) != folder(&model.path),
            precision_rank(&quant_label(&f.path)),
        )
    })?;
    if projectors.len() > 1 {
        let label = quant_label(&chosen.path);
        let why = if label == model_label {
            "the model's precision"
        } else if PROJECTOR_PREFERENCE.contains(&label.as_str()) {
            "none is the model's; F16, BF16, F32 preferred in that order"
        } else {
            "none is the model's nor F16, BF16 or F32: the first"
        };
        eprintln!(
            "{repo}: taking projector {} (of {}: {why})",
            chosen.path,
            projectors
                .iter()
                .map(|p| p.path.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Some(chosen)
}

/// The name of the model a file belongs to (a split file's parts share one).
fn split_stem(file: &str) -> &str {
    split_part(file).map_or(file, |(stem, _)| stem)
}

/// A repo's folder in the hub cache.
struct CachedRepo {
    dir: PathBuf,
}

impl CachedRepo {
    fn new(hub_cache: &Path, repo: &str) -> CachedRepo {
        CachedRepo {
            dir: hub_cache.join(repo_folder(repo)),
        }
    }

    fn blob(&self, id: &str) -> PathBuf {
        self.dir.join("blobs").join(id)
    }

    /// Where `huggingface_hub` keeps a blob being downloaded (so either
    /// continues the other's).
    fn incomplete(&self, id: &str) -> PathBuf {
        self.dir.join("blobs").join(format!("{id}.incomplete"))
    }

    /// Links `snapshots/COMMIT/PATH` to the blob `id`; the link's path.
    fn link(&self, commit: &str, path: &str, id: &str) -> Result<PathBuf> {
        let link = self.dir.join("snapshots").join(commit).join(path);
        let target = link_target(path, id);
        if std::fs::read_link(&link).is_ok_and(|t| t == target) {
            return Ok(link);
        }
        if let Some(dir) = link.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        if std::fs::symlink_metadata(&link).is_ok() {
            std::fs::remove_file(&link)
                .with_context(|| format!("cannot replace {}", link.display()))?;
        }
        make_link(&target, &self.blob(id), &link)
            .with_context(|| format!("cannot link {} to {}", link.display(), target.display()))?;
        Ok(link)
    }

    /// `refs/main`: the commit whose snapshot readers of the cache take.
    fn set_main(&self, commit: &str) -> Result<()> {
        let path = self.dir.join("refs").join("main");
        if std::fs::read_to_string(&path).is_ok_and(|c| c.trim() == commit) {
            return Ok(());
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        std::fs::write(&path, commit).with_context(|| format!("cannot write {}", path.display()))
    }
}

/// `models--ORG--REPO`, as the hub cache names a model repo's folder.
fn repo_folder(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// The relative path from `snapshots/COMMIT/PATH` to `blobs/ID`.
fn link_target(path: &str, id: &str) -> PathBuf {
    let up = path.split('/').count() + 1;
    PathBuf::from(format!("{}blobs/{id}", "../".repeat(up)))
}

#[cfg(unix)]
fn make_link(target: &Path, _blob: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

/// Where links need privileges, `huggingface_hub` keeps a copy in the
/// snapshot instead; so does this.
#[cfg(not(unix))]
fn make_link(_target: &Path, blob: &Path, link: &Path) -> std::io::Result<()> {
    std::fs::copy(blob, link).map(|_| ())
}

/// Fetches one listed file into its blob and links it into the snapshot;
/// the link's path.
fn fetch(
    agent: &Agent,
    opts: &Options,
    repo: &str,
    commit: &str,
    file: &RepoFile,
    cache: &CachedRepo,
) -> Result<(PathBuf, Outcome)> {
    let id = file.blob_id().with_context(|| {
        format!(
            "{repo}: the hub lists {} with neither an LFS SHA-256 nor a git blob id",
            file.path
        )
    })?;
    let blob = Blob {
        label: file
            .path
            .rsplit('/')
            .next()
            .unwrap_or(&file.path)
            .to_owned(),
        url: format!(
            "{}/{repo}/resolve/{commit}/{}",
            opts.hf_endpoint,
            url_path(&file.path)
        ),
        token: opts.hf_token.as_deref(),
        bytes: file.bytes,
        sha256: file.sha256.clone(),
    };
    let outcome = download::download(
        agent,
        &blob,
        &cache.blob(id),
        &cache.incomplete(id),
        opts.progress,
    )
    .map_err(|e| match download::status_of(&e) {
        Some(s @ (401 | 403)) => token_needed(repo, s, opts.hf_token.is_some()),
        Some(404) => anyhow!(
            "{repo} has no file {} at commit {commit} (its list named it)",
            file.path
        ),
        _ => e,
    })?;
    Ok((cache.link(commit, &file.path, id)?, outcome))
}

/// The name `-m` takes for the file linked at `link`: `ORG/REPO:QUANT`
/// where that finds it and nothing else, else `ORG/REPO/PATH` (also when a
/// path was what the user named).
fn pulled_name(hub_cache: &Path, repo: &str, path: &str, link: &Path, named: bool) -> String {
    let by_path = format!("{repo}/{path}");
    if named {
        return by_path;
    }
    let by_quant = format!("{repo}:{}", quant_label(path));
    let roots = Roots {
        hf: Some(hub_cache.to_owned()),
        ..Roots::default()
    };
    match stores::find(Path::new(&by_quant), &roots) {
        Ok(Some(found)) if found == link => by_quant,
        _ => by_path,
    }
}

/// Why a 401 or 403 came back.
fn token_needed(repo: &str, status: u16, has_token: bool) -> anyhow::Error {
    if has_token {
        anyhow!(
            "Hugging Face refused HF_TOKEN for {repo} (HTTP {status}): a gated repo needs its terms accepted on its page, and the token read access to it"
        )
    } else {
        anyhow!(
            "{repo} needs a Hugging Face token (HTTP {status}: a gated or private repo, or none of that name): set HF_TOKEN to a token that can read it"
        )
    }
}

/// A repo path as a URL path: each part percent-encoded where it must be.
fn url_path(path: &str) -> String {
    path.split('/')
        .map(|part| {
            part.bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                        (b as char).to_string()
                    }
                    _ => format!("%{b:02X}"),
                })
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> RepoFile {
        RepoFile {
            path: path.to_owned(),
            bytes: None,
            sha256: None,
            git_oid: None,
        }
    }

    #[test]
    fn the_cache_layout_is_huggingface_hubs() {
        assert_eq!(
            repo_folder("ggml-org/gemma-3-1b-it-GGUF"),
            "models--ggml-org--gemma-3-1b-it-GGUF"
        );
        assert_eq!(
            link_target("m-Q4_0.gguf", "ab12"),
            Path::new("../../blobs/ab12")
        );
        assert_eq!(
            link_target("sub/dir/m.gguf", "ab12"),
            Path::new("../../../../blobs/ab12")
        );
    }

    #[test]
    fn listed_files_name_their_blobs_and_stay_in_the_snapshot() {
        let sha = "A".repeat(64);
        let lfs = repo_file(
            &serde_json::json!({"type": "file", "path": "m.gguf", "size": 133,
            "oid": "1".repeat(40), "lfs": {"oid": sha, "size": 5000}}),
        )
        .unwrap();
        assert_eq!(lfs.blob_id(), Some("a".repeat(64).as_str()));
        assert_eq!(lfs.bytes, Some(5000));
        let plain = repo_file(&serde_json::json!({"type": "file", "path": "README.md",
            "size": 12, "oid": "2".repeat(40)}))
        .unwrap();
        assert_eq!(plain.blob_id(), Some("2".repeat(40).as_str()));
        assert!(plain.sha256.is_none());
        for bad in ["../x.gguf", "a//b.gguf", "./x.gguf", "a\\..\\b.gguf"] {
            assert!(
                repo_file(&serde_json::json!({"type": "file", "path": bad})).is_none(),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_projector_follows_the_models_folder_and_precision() {
        let pick = |paths: &[&str], model: &str| {
            let files: Vec<RepoFile> = paths.iter().map(|p| file(p)).collect();
            choose_projector("r", &files, &file(model)).map(|f| f.path.clone())
        };
        let all = [
            "mmproj-BF16.gguf",
            "mmproj-F32.gguf",
            "mmproj-F16.gguf",
            "m-F16.gguf",
            "m-BF16.gguf",
        ];
        assert_eq!(pick(&all, "m-BF16.gguf").unwrap(), "mmproj-BF16.gguf");
        assert_eq!(pick(&all, "m-Q4_K_M.gguf").unwrap(), "mmproj-F16.gguf");
        assert_eq!(
            pick(&["mmproj-x.gguf", "mmproj-y.gguf"], "m-Q8_0.gguf").unwrap(),
            "mmproj-x.gguf"
        );
        assert_eq!(
            pick(
                &["mmproj-F16.gguf", "q8/mmproj-Q8_0.gguf"],
                "q8/m-Q8_0.gguf"
            )
            .unwrap(),
            "q8/mmproj-Q8_0.gguf"
        );
        assert_eq!(pick(&["m-F16.gguf", "README.md"], "m-F16.gguf"), None);
    }
}
