//! GGUF files where users already keep them: rlx's own cache, Ollama's
//! store (its manifests map `gemma3:270m` to a blob), LM Studio's models
//! folder and the Hugging Face hub cache (`rlx pull` writes into the last
//! two in their own layouts). Read only; nothing is fetched here.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use super::common::{DEFAULT_MODEL, INSTRUCT_MODEL};
use super::remote::{self, OLLAMA_HOST};

/// Where each store lives.
#[derive(Clone, Debug, Default)]
pub struct Roots {
    /// rlx's cache: `$RLX_HOME`, else `~/.cache/rlx/models`.
    pub rlx: Option<PathBuf>,
    /// Ollama's `models` folders: `$OLLAMA_MODELS`, else `~/.ollama/models`
    /// and the system service's `/usr/share/ollama/.ollama/models`.
    pub ollama: Vec<PathBuf>,
    /// LM Studio's models folders: `~/.lmstudio/models`, and the older
    /// `~/.cache/lm-studio/models`.
    pub lmstudio: Vec<PathBuf>,
    /// The Hugging Face hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`,
    /// else `~/.cache/huggingface/hub`.
    pub hf: Option<PathBuf>,
    /// Where a GPU backend keeps its compiled kernels: `~/.cache/rlx/kernels`.
    pub kernels: Option<PathBuf>,
}

impl Roots {
    /// The usual places, from the environment (the one place that reads it).
    pub fn from_env() -> Roots {
        let var = |k: &str| std::env::var_os(k).map(PathBuf::from);
        let home = var("HOME");
        let under_home = |rel: &str| home.as_ref().map(|h| h.join(rel));
        let ollama = match var("OLLAMA_MODELS") {
            Some(p) => vec![p],
            None => under_home(".ollama/models")
                .into_iter()
                .chain([PathBuf::from("/usr/share/ollama/.ollama/models")])
                .collect(),
        };
        Roots {
            rlx: var("RLX_HOME").or_else(|| under_home(".cache/rlx/models")),
            ollama,
            lmstudio: [".lmstudio/models", ".cache/lm-studio/models"]
                .iter()
                .filter_map(|r| under_home(r))
                .collect(),
            hf: var("HF_HUB_CACHE")
                .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
                .or_else(|| under_home(".cache/huggingface/hub")),
            kernels: under_home(".cache/rlx/kernels"),
        }
    }
}

/// One model found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The name `-m` takes.
    pub name: String,
    /// `rlx`, `ollama`, `lmstudio` or `huggingface`.
    pub store: &'static str,
    pub path: PathBuf,
    pub bytes: u64,
}

/// Every GGUF model in the stores (projector files for images left out).
pub fn list(roots: &Roots) -> Vec<Found> {
    let mut out = Vec::new();
    if let Some(dir) = &roots.rlx {
        for p in walk_gguf(dir, 3) {
            push(&mut out, rlx_name(dir, &p), "rlx", p);
        }
    }
    for root in &roots.ollama {
        for (name, blob) in ollama_models(root) {
            push(&mut out, name, "ollama", blob);
        }
    }
    for root in &roots.lmstudio {
        for p in walk_gguf(root, 3) {
            if let Ok(rel) = p.strip_prefix(root) {
                push(&mut out, slashed(rel), "lmstudio", p.clone());
            }
        }
    }
    if let Some(hub) = &roots.hf {
        for (repo, snapshot) in hf_repos(hub) {
            for p in walk_gguf(&snapshot, 2) {
                let file = p.strip_prefix(&snapshot).map(slashed).unwrap_or_default();
                push(&mut out, format!("{repo}/{file}"), "huggingface", p);
            }
        }
    }
    out
}

fn push(out: &mut Vec<Found>, name: String, store: &'static str, path: PathBuf) {
    let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
    out.push(Found {
        name,
        store,
        path,
        bytes,
    });
}

/// The name `-m` takes for a file in rlx's cache: its path there, without
/// `.gguf`.
fn rlx_name(cache: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(cache).unwrap_or(file);
    let name = slashed(rel);
    match name.len().checked_sub(".gguf".len()) {
        Some(cut) if name[cut..].eq_ignore_ascii_case(".gguf") => name[..cut].to_owned(),
        _ => name,
    }
}

/// A relative path with `/` between its parts.
fn slashed(p: &Path) -> String {
    p.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// The model a name means: a path; a name in rlx's cache (with or without
/// `.gguf`); an Ollama name (`gemma3:270m`, `gemma3` for `:latest`,
/// `user/model:tag`, `host/namespace/model:tag`); an LM Studio
/// `publisher/repo[/file.gguf]`; a Hugging Face `org/repo[/file.gguf]` or
/// `org/repo:QUANT` (the file whose name has QUANT). A hub's host before
/// the name (`hf.co/`, `ollama.com/`) is read past. A name that fits
/// several files is an error that lists them.
pub fn resolve(given: &Path, roots: &Roots) -> Result<PathBuf> {
    match find(given, roots)? {
        Some(path) => Ok(path),
        None if given == Path::new(DEFAULT_MODEL) => bail!(
            "the default model, {DEFAULT_MODEL} (Gemma 3 270M, a base model), is not in rlx's cache ({}). \
             Fetch it from a checkout of rlx with `bash scripts/fetch-model.sh`, or use another \
             model with -m: `rlx pull {INSTRUCT_MODEL}` fetches an instruction-tuned one from \
             Hugging Face, then `rlx run -m {INSTRUCT_MODEL} \"...\"`; `rlx models` lists the \
             models found",
            roots
                .rlx
                .as_ref()
                .map_or("neither RLX_HOME nor HOME is set".into(), |d| d.display().to_string())
        ),
        None => {
            let name = given.to_string_lossy();
            bail!(
                "model {name} not found: not a file, nor a model in rlx's cache, Ollama, LM Studio or the Hugging Face cache (`rlx models` lists them; `rlx pull {name}` or --pull fetches it; scripts/fetch-model.sh fetches the default one)"
            )
        }
    }
}

/// As `resolve`, `None` where no store has the name.
pub fn find(given: &Path, roots: &Roots) -> Result<Option<PathBuf>> {
    if given.exists() {
        return Ok(Some(given.to_owned()));
    }
    let given_name = given.to_string_lossy();
    let name = remote::without_host(&given_name);
    if let Some(dir) = &roots.rlx {
        for candidate in [dir.join(name), dir.join(format!("{name}.gguf"))] {
            if candidate.is_file() {
                return Ok(Some(candidate));
            }
        }
    }
    for root in &roots.ollama {
        if let Some(blob) = ollama_blob(root, name) {
            return Ok(Some(blob));
        }
    }
    let (base, quant) = match name.rsplit_once(':') {
        Some((b, q)) if !q.contains('/') => (b.to_owned(), Some(q)),
        _ => (name.to_owned(), None),
    };
    let mut matches: Vec<PathBuf> = Vec::new();
    for root in &roots.lmstudio {
        matches.extend(pick(&root.join(&base), 2, quant));
    }
    if let Some(hub) = &roots.hf {
        let mut parts = base.splitn(3, '/');
        if let (Some(org), Some(repo)) = (parts.next(), parts.next()) {
            let file = parts.next();
            if let Some(snapshot) = hf_snapshot(&hub.join(format!("models--{org}--{repo}"))) {
                match file {
                    Some(f) => {
                        let p = snapshot.join(f);
                        if p.is_file() {
                            matches.push(p);
                        }
                    }
                    None => matches.extend(pick(&snapshot, 2, quant)),
                }
            }
        }
    }
    one_of(&given_name, matches)
}

/// The one file of `matches`, `None` for none; several are an error that
/// lists them.
fn one_of(name: &str, mut matches: Vec<PathBuf>) -> Result<Option<PathBuf>> {
    match matches.len() {
        0 => Ok(None),
        1 => Ok(Some(matches.remove(0))),
        _ => {
            let list: Vec<String> = matches.iter().map(|p| p.display().to_string()).collect();
            bail!(
                "model {name} names {} files; give one (or a quantization, NAME:Q4_K_M):\n  {}",
                matches.len(),
                list.join("\n  ")
            )
        }
    }
}

/// The GGUF files `dir` names: itself if a file, else the model files in
/// it (to `depth` levels), narrowed to those whose name has `quant`.
fn pick(dir: &Path, depth: usize, quant: Option<&str>) -> Vec<PathBuf> {
    if dir.is_file() {
        return vec![dir.to_owned()];
    }
    let with_ext = dir.with_extension("gguf");
    if with_ext.is_file() {
        return vec![with_ext];
    }
    if !dir.is_dir() {
        return Vec::new();
    }
    let files = walk_gguf(dir, depth);
    let Some(q) = quant else {
        return files;
    };
    let names: Vec<String> = files
        .iter()
        .map(|p| {
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let chosen = remote::matching_quant(&refs, q);
    files
        .into_iter()
        .zip(&names)
        .filter(|(_, n)| chosen.contains(&n.as_str()))
        .map(|(p, _)| p)
        .collect()
}

/// Model `.gguf` files under `dir`, `depth` levels down at most, sorted;
/// image projector files (`mmproj…`) left out.
fn walk_gguf(dir: &Path, depth: usize) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if depth > 1 {
                out.extend(walk_gguf(&p, depth - 1));
            }
            continue;
        }
        // A hub cache link whose blob is gone is no model.
        if !p.is_file() {
            continue;
        }
        let name = e.file_name().to_string_lossy().to_ascii_lowercase();
        if name.ends_with(".gguf") && !name.starts_with("mmproj") {
            out.push(p);
        }
    }
    out.sort();
    out
}

const OLLAMA_MODEL_LAYER: &str = "application/vnd.ollama.image.model";

/// An Ollama name's manifest: `[host/][namespace/]model[:tag]`.
fn ollama_manifest(root: &Path, name: &str) -> Option<PathBuf> {
    let (path, tag) = match name.rsplit_once(':') {
        Some((p, t)) if !t.contains('/') && !t.is_empty() => (p, t),
        _ => (name, "latest"),
    };
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let (host, ns, model) = match parts.as_slice() {
        [m] => (OLLAMA_HOST, remote::OLLAMA_LIBRARY, *m),
        [n, m] => (OLLAMA_HOST, *n, *m),
        [h, n, m] => (*h, *n, *m),
        _ => return None,
    };
    if [host, ns, model, tag].iter().any(|p| p.contains("..")) {
        return None;
    }
    let manifest = root
        .join("manifests")
        .join(host)
        .join(ns)
        .join(model)
        .join(tag);
    manifest.is_file().then_some(manifest)
}

/// The GGUF blob of a manifest's model layer.
fn manifest_blob(root: &Path, manifest: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(manifest).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let layer = v["layers"]
        .as_array()?
        .iter()
        .find(|l| l["mediaType"] == OLLAMA_MODEL_LAYER)?;
    let digest = layer["digest"].as_str()?;
    let (algo, hex) = digest.split_once(':')?;
    if !hex.chars().all(|c| c.is_ascii_hexdigit())
        || !algo.chars().all(|c| c.is_ascii_alphanumeric())
    {
        return None;
    }
    let blob = root.join("blobs").join(format!("{algo}-{hex}"));
    blob.is_file().then_some(blob)
}

fn ollama_blob(root: &Path, name: &str) -> Option<PathBuf> {
    manifest_blob(root, &ollama_manifest(root, name)?)
}

/// Every Ollama model: its short name (`model:tag`, with the namespace
/// when not `library`, the host when not Ollama's) and its blob.
fn ollama_models(root: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let manifests = root.join("manifests");
    let dirs = |p: &Path| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(p)
            .map(|r| r.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    let file_name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    for host in dirs(&manifests) {
        for ns in dirs(&host) {
            for model in dirs(&ns) {
                for tag in dirs(&model).into_iter().filter(|t| t.is_file()) {
                    let Some(blob) = manifest_blob(root, &tag) else {
                        continue;
                    };
                    let (h, n, m, t) = (
                        file_name(&host).unwrap_or_default(),
                        file_name(&ns).unwrap_or_default(),
                        file_name(&model).unwrap_or_default(),
                        file_name(&tag).unwrap_or_default(),
                    );
                    out.push((remote::ollama_name(Some(&h), &n, &m, &t), blob));
                }
            }
        }
    }
    out
}

/// The snapshot `refs/main` points at in a hub cache repo folder, or the
/// only snapshot there is.
fn hf_snapshot(repo: &Path) -> Option<PathBuf> {
    let snapshots = repo.join("snapshots");
    if let Ok(rev) = std::fs::read_to_string(repo.join("refs/main")) {
        let rev = rev.trim();
        if !rev.is_empty() && rev.chars().all(|c| c.is_ascii_alphanumeric()) {
            let p = snapshots.join(rev);
            if p.is_dir() {
                return Some(p);
            }
        }
    }
    let mut all: Vec<PathBuf> = std::fs::read_dir(&snapshots)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    (all.len() == 1).then(|| all.remove(0))
}

/// Model repos in the hub cache: `org/name` and their current snapshot.
fn hf_repos(hub: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(hub) else {
        return out;
    };
    for e in entries.flatten() {
        let folder = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = folder.strip_prefix("models--") else {
            continue;
        };
        let Some((org, name)) = rest.split_once("--") else {
            continue;
        };
        if let Some(snapshot) = hf_snapshot(&e.path()) {
            out.push((format!("{org}/{name}"), snapshot));
        }
    }
    out.sort();
    out
}
