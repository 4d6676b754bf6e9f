//! A model of Ollama's registry: the tag's manifest
//! (`v2/NAMESPACE/MODEL/manifests/TAG`) names the GGUF as its model layer,
//! a blob fetched by its digest, which is its SHA-256.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use ureq::Agent;

use super::download::{self, Blob, HttpStatus};
use super::{Options, Pulled};
use crate::cmd::remote::Remote;
use crate::cmd::stores::rlx_name;

const MANIFEST_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
const MODEL_LAYER: &str = "application/vnd.ollama.image.model";

/// Fetches `namespace/model:tag`'s GGUF.
pub fn pull(
    agent: &Agent,
    opts: &Options,
    namespace: &str,
    model: &str,
    tag: &str,
) -> Result<Pulled> {
    let shown = Remote::Ollama {
        namespace: namespace.into(),
        model: model.into(),
        tag: tag.into(),
    }
    .short_name();
    let registry = &opts.ollama_registry;
    let url = format!("{registry}/v2/{namespace}/{model}/manifests/{tag}");
    let resp = download::get(agent, &url, None, &[("Accept", MANIFEST_TYPE)])?;
    match resp.status().as_u16() {
        200 => {}
        404 => bail!(
            "no Ollama model {shown} (the registry {registry} has no model {namespace}/{model} or no tag {tag} of it)"
        ),
        status => return Err(HttpStatus { url, status }.into()),
    }
    let text = resp
        .into_body()
        .read_to_string()
        .with_context(|| format!("cannot read the manifest of {shown}"))?;
    let manifest: Value = serde_json::from_str(&text)
        .with_context(|| format!("the manifest of {shown} is not JSON"))?;
    let layer = manifest["layers"]
        .as_array()
        .and_then(|layers| layers.iter().find(|l| l["mediaType"] == MODEL_LAYER))
        .with_context(|| format!("the manifest of {shown} has no model layer ({MODEL_LAYER})"))?;
    let digest = layer["digest"].as_str().unwrap_or_default();
    let sha256 = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()))
        .with_context(|| {
            format!("{shown}: its model layer's digest {digest:?} is not sha256:HEX")
        })?;
    let dest = Remote::ollama_file(&opts.cache, namespace, model, tag);
    let blob = Blob {
        url: format!("{registry}/v2/{namespace}/{model}/blobs/{digest}"),
        token: None,
        bytes: layer["size"].as_u64(),
        sha256: Some(sha256.to_ascii_lowercase()),
    };
    let outcome = download::download(agent, &blob, &dest, opts.progress)
        .with_context(|| format!("cannot fetch {shown}"))?;
    Ok(Pulled {
        name: rlx_name(&opts.cache, &dest),
        path: dest,
        outcome,
    })
}
