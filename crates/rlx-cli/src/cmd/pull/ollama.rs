//! A model of an Ollama registry, into Ollama's store as `ollama pull`
//! lays it out, so that Ollama finds it too: the tag's manifest
//! (`v2/NAMESPACE/MODEL/manifests/TAG`) names a config and the layers (the
//! GGUF model, its template, parameters, license, …), each a blob fetched
//! by its digest, which is its SHA-256, into `blobs/sha256-HEX`; the
//! manifest goes to `manifests/HOST/NAMESPACE/MODEL/TAG` last, so a model
//! listed there is whole.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use ureq::Agent;

use super::download::{self, nothing_fetched, Blob, HttpStatus, Outcome};
use super::{Options, Pulled};
use crate::cmd::remote::ollama_name;

const MANIFEST_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
const MODEL_LAYER: &str = "application/vnd.ollama.image.model";
const PROJECTOR_LAYER: &str = "application/vnd.ollama.image.projector";
const OLLAMA_LAYER_PREFIX: &str = "application/vnd.ollama.image.";

/// A blob a manifest names.
#[derive(Debug, PartialEq, Eq)]
struct Layer {
    media_type: String,
    /// The digest's hex, its SHA-256.
    sha256: String,
    bytes: Option<u64>,
}

impl Layer {
    /// `model`, `template`, `config`, … for messages.
    fn kind(&self) -> &str {
        if self.media_type.contains("container.image") {
            return "config";
        }
        self.media_type
            .strip_prefix(OLLAMA_LAYER_PREFIX)
            .unwrap_or(&self.media_type)
    }

    fn blob(&self, store: &Path) -> PathBuf {
        store.join("blobs").join(format!("sha256-{}", self.sha256))
    }

    /// Where Ollama keeps a blob being downloaded.
    fn partial(&self, store: &Path) -> PathBuf {
        store
            .join("blobs")
            .join(format!("sha256-{}-partial", self.sha256))
    }
}

/// Fetches `[host/]namespace/model:tag` (`host` `None` for the registry
/// the options name) with every blob of its manifest.
pub fn pull(
    agent: &Agent,
    opts: &Options,
    host: Option<&str>,
    namespace: &str,
    model: &str,
    tag: &str,
) -> Result<Pulled> {
    let store = opts
        .ollama_models
        .as_deref()
        .context("no folder for Ollama's models: set OLLAMA_MODELS (or HOME)")?;
    let (registry, host) = registry(opts, host);
    let shown = ollama_name(Some(&host), namespace, model, tag);
    let url = format!("{registry}/v2/{namespace}/{model}/manifests/{tag}");
    let resp = download::get(agent, &url, None, &[("Accept", MANIFEST_TYPE)])
        .map_err(|e| nothing_fetched(e, "the Ollama registry"))?;
    match resp.status().as_u16() {
        200 => {}
        404 => bail!(
            "no Ollama model {shown} (the registry {registry} has no model {namespace}/{model} or no tag {tag} of it)"
        ),
        s @ (401 | 403) => bail!(
            "the registry {registry} refused {shown} (HTTP {s}): a private model needs Ollama's own sign-in; `ollama pull` fetches it"
        ),
        status => return Err(HttpStatus { url, status }.into()),
    }
    let text = resp
        .into_body()
        .read_to_string()
        .with_context(|| format!("cannot read the manifest of {shown}"))?;
    let layers = layers(&shown, &text)?;
    let model_layer = layers
        .iter()
        .find(|l| l.media_type == MODEL_LAYER)
        .with_context(|| format!("the manifest of {shown} has no model layer ({MODEL_LAYER})"))?;
    let mut outcome = Outcome::AlreadyThere;
    for (i, layer) in layers.iter().enumerate() {
        if layers[..i].iter().any(|l| l.sha256 == layer.sha256) {
            continue;
        }
        let blob = Blob {
            label: format!("{shown} {}", layer.kind()),
            url: format!(
                "{registry}/v2/{namespace}/{model}/blobs/sha256:{}",
                layer.sha256
            ),
            token: None,
            bytes: layer.bytes,
            sha256: Some(layer.sha256.clone()),
        };
        let done = download::download(
            agent,
            &blob,
            &layer.blob(store),
            &layer.partial(store),
            opts.progress,
        )
        .with_context(|| format!("cannot fetch {}", blob.label))?;
        if done == Outcome::Fetched {
            outcome = Outcome::Fetched;
        }
    }
    let manifest = manifest_path(store, &host, namespace, model, tag);
    write_manifest(&manifest, &text)?;
    Ok(Pulled {
        name: shown,
        path: model_layer.blob(store),
        projector: layers
            .iter()
            .find(|l| l.media_type == PROJECTOR_LAYER)
            .map(|l| l.blob(store)),
        outcome,
    })
}

/// The registry's URL and its host as the store's folders name it: the
/// registry the options name, or `https://HOST` for another host a name
/// gives.
fn registry(opts: &Options, host: Option<&str>) -> (String, String) {
    let configured = download::host_of(&opts.ollama_registry);
    match host {
        Some(h) if h != configured => (format!("https://{h}"), h.to_owned()),
        _ => (opts.ollama_registry.clone(), configured.to_owned()),
    }
}

/// `manifests/HOST/NAMESPACE/MODEL/TAG`.
fn manifest_path(store: &Path, host: &str, namespace: &str, model: &str, tag: &str) -> PathBuf {
    store
        .join("manifests")
        .join(host)
        .join(namespace)
        .join(model)
        .join(tag)
}

/// The manifest as the registry sent it, as Ollama keeps it.
fn write_manifest(path: &Path, text: &str) -> Result<()> {
    if std::fs::read_to_string(path).is_ok_and(|t| t == text) {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// The config and every layer of a manifest, each digest a SHA-256.
fn layers(shown: &str, text: &str) -> Result<Vec<Layer>> {
    let manifest: Value = serde_json::from_str(text)
        .with_context(|| format!("the manifest of {shown} is not JSON"))?;
    let listed = manifest["layers"]
        .as_array()
        .with_context(|| format!("the manifest of {shown} lists no layers"))?;
    let config = Some(&manifest["config"]).filter(|c| c.is_object());
    config
        .into_iter()
        .chain(listed)
        .map(|l| {
            let digest = l["digest"].as_str().unwrap_or_default();
            let sha256 = digest
                .strip_prefix("sha256:")
                .filter(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()))
                .ok_or_else(|| {
                    anyhow!(
                        "{shown}: the manifest's digest {digest:?} ({}) is not sha256:HEX",
                        l["mediaType"].as_str().unwrap_or("no media type")
                    )
                })?;
            Ok(Layer {
                media_type: l["mediaType"].as_str().unwrap_or_default().to_owned(),
                sha256: sha256.to_ascii_lowercase(),
                bytes: l["size"].as_u64(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(registry: &str) -> Options {
        Options {
            hf_cache: None,
            ollama_models: None,
            hf_endpoint: String::new(),
            hf_token: None,
            ollama_registry: registry.to_owned(),
            progress: false,
        }
    }

    #[test]
    fn ollamas_own_registry_is_stored_under_its_host() {
        let o = opts("https://registry.ollama.ai");
        let (url, host) = registry(&o, None);
        assert_eq!(
            (url.as_str(), host.as_str()),
            ("https://registry.ollama.ai", "registry.ollama.ai")
        );
        assert_eq!(
            manifest_path(Path::new("/m"), &host, "library", "gemma3", "4b"),
            Path::new("/m/manifests/registry.ollama.ai/library/gemma3/4b")
        );
        // The name `-m` takes, and `rlx models` lists, is Ollama's own.
        assert_eq!(
            ollama_name(Some(&host), "library", "gemma3", "4b"),
            "gemma3:4b"
        );
        let (url, host) = registry(&o, Some("models.example.com:5000"));
        assert_eq!(url, "https://models.example.com:5000");
        assert_eq!(
            ollama_name(Some(&host), "team", "m", "q8"),
            "models.example.com:5000/team/m:q8"
        );
        // Another registry the options name keeps its scheme.
        let o = opts("http://127.0.0.1:8080");
        assert_eq!(
            registry(&o, Some("127.0.0.1:8080")),
            ("http://127.0.0.1:8080".into(), "127.0.0.1:8080".into())
        );
    }

    #[test]
    fn a_manifest_names_its_config_and_layers() {
        let (a, b) = ("a".repeat(64), "B".repeat(64));
        let text = serde_json::json!({
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                       "digest": format!("sha256:{a}"), "size": 5},
            "layers": [{"mediaType": MODEL_LAYER, "digest": format!("sha256:{b}"), "size": 9}]
        })
        .to_string();
        let l = layers("m:t", &text).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!((l[0].kind(), l[1].kind()), ("config", "model"));
        assert_eq!(l[1].sha256, "b".repeat(64));
        assert_eq!(
            l[1].partial(Path::new("/m")),
            Path::new(&format!("/m/blobs/sha256-{}-partial", "b".repeat(64)))
        );
        let bad = text.replace(&format!("sha256:{b}"), "sha256:../x");
        let e = layers("m:t", &bad).unwrap_err().to_string();
        assert!(e.contains("not sha256:HEX"), "{e}");
    }
}
