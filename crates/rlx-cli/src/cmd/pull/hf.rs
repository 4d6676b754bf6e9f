//! A GGUF file of a Hugging Face repo: the repo's files from the hub API
//! (`api/models/ORG/REPO/tree/main`, each with its size and, stored in
//! LFS, its SHA-256), the one a quantization names, fetched from
//! `ORG/REPO/resolve/main/PATH`.

use std::collections::BTreeSet;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use ureq::Agent;

use super::download::{self, Blob, HttpStatus};
use super::{Options, Pulled};
use crate::cmd::remote::{is_projector, matching_quant, quant_label, split_part, Remote};
use crate::cmd::stores::rlx_name;

/// The quantization taken when the name gives none, as llama.cpp's `-hf`.
const DEFAULT_QUANT: &str = "Q4_K_M";
/// Pages of the file list followed at most (the hub sends 1,000 files a page).
const MAX_PAGES: usize = 100;

/// One file the hub lists.
struct RepoFile {
    path: String,
    bytes: Option<u64>,
    sha256: Option<String>,
}

/// Fetches the file of `repo` that `quant` or `file` names (`named_by_host`:
/// the name began with `hf.co/`, so it was not meant for Ollama).
pub fn pull(
    agent: &Agent,
    opts: &Options,
    repo: &str,
    quant: Option<&str>,
    file: Option<&str>,
    named_by_host: bool,
) -> Result<Pulled> {
    let files = list_files(agent, opts, repo, named_by_host)?;
    let chosen = choose(repo, &files, quant, file)?;
    let base = chosen.path.rsplit('/').next().unwrap_or(&chosen.path);
    let dest = Remote::hf_folder(&opts.cache, repo).join(base);
    let blob = Blob {
        url: format!(
            "{}/{repo}/resolve/main/{}",
            opts.hf_endpoint,
            url_path(&chosen.path)
        ),
        token: opts.hf_token.as_deref(),
        bytes: chosen.bytes,
        sha256: chosen.sha256.clone(),
    };
    let outcome = download::download(agent, &blob, &dest, opts.progress).map_err(|e| {
        match download::status_of(&e) {
            Some(s @ (401 | 403)) => token_needed(repo, s, opts.hf_token.is_some()),
            Some(404) => anyhow!("{repo} has no file {} (its list named it)", chosen.path),
            _ => e,
        }
    })?;
    Ok(Pulled {
        name: rlx_name(&opts.cache, &dest),
        path: dest,
        outcome,
    })
}

/// Every file of the repo's main branch.
fn list_files(
    agent: &Agent,
    opts: &Options,
    repo: &str,
    named_by_host: bool,
) -> Result<Vec<RepoFile>> {
    let mut url = format!(
        "{}/api/models/{repo}/tree/main?recursive=true",
        opts.hf_endpoint
    );
    let mut files = Vec::new();
    for _ in 0..MAX_PAGES {
        let resp = download::get(agent, &url, opts.hf_token.as_deref(), &[])?;
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
        let next = next_page(resp.headers());
        let text = resp
            .into_body()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .with_context(|| format!("cannot read the file list of {repo}"))?;
        let list: Value = serde_json::from_str(&text)
            .with_context(|| format!("the file list of {repo} is not JSON"))?;
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

/// A file entry (folders have `"type": "directory"`).
fn repo_file(entry: &Value) -> Option<RepoFile> {
    if entry["type"].as_str().is_some_and(|t| t != "file") {
        return None;
    }
    let lfs = &entry["lfs"];
    let sha256 = lfs["oid"]
        .as_str()
        .filter(|s| s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit()))
        .map(str::to_ascii_lowercase);
    Some(RepoFile {
        path: entry["path"].as_str()?.to_owned(),
        bytes: lfs["size"].as_u64().or_else(|| entry["size"].as_u64()),
        sha256,
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
        .filter(|p| p.to_ascii_lowercase().ends_with(".gguf"))
        .collect();
    let models: Vec<&str> = ggufs.iter().copied().filter(|p| !is_projector(p)).collect();
    let by_path = |p: &str| files.iter().find(|f| f.path == p);
    if let Some(f) = file {
        return by_path(f).with_context(|| {
            format!(
                "{repo} has no file {f}; its GGUF files: {}",
                ggufs.join(", ")
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

/// The name of the model a file belongs to (a split file's parts share one).
fn split_stem(file: &str) -> &str {
    split_part(file).map_or(file, |(stem, _)| stem)
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
