//! Names of models to fetch: a Hugging Face repo (`hf.co/ORG/REPO[:QUANT]`,
//! as llama.cpp's `-hf` takes it) or a model in an Ollama registry
//! (`NAME[:TAG]`, `HOST/NAMESPACE/NAME[:TAG]`), as `ollama pull` takes it.

use std::fmt;

use anyhow::{bail, Result};

/// The Ollama registry's namespace of its own models.
pub const OLLAMA_LIBRARY: &str = "library";

/// A model on a hub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Remote {
    HuggingFace {
        /// `ORG/REPO`.
        repo: String,
        /// A quantization the file name has (`Q4_K_M`), case-insensitive.
        quant: Option<String>,
        /// A file path in the repo, given instead of a quantization.
        file: Option<String>,
    },
    Ollama {
        /// A registry other than Ollama's own (`HOST[:PORT]`), named
        /// before the namespace as Ollama names them.
        host: Option<String>,
        namespace: String,
        model: String,
        tag: String,
    },
}

/// How to read a name, for help and errors.
pub const NAME_RULE: &str = "hf.co/ORG/REPO[:QUANT], ORG/REPO[:QUANT] or ORG/REPO/FILE.gguf \
(a Hugging Face repo), ollama.com/[USER/]NAME[:TAG] or NAME[:TAG] (Ollama's registry), \
HOST/NAMESPACE/NAME[:TAG] (another Ollama registry)";

impl Remote {
    /// Reads a name. A host prefix (`hf.co/`, `huggingface.co/`,
    /// `ollama.com/`, `registry.ollama.ai/`) decides; without one a name
    /// with a slash is a Hugging Face repo and one without is an Ollama
    /// model, as llama.cpp's `-hf` and `ollama pull` read them; a first
    /// part that is a host (`127.0.0.1:5000`, `registry.example.com`)
    /// before `NAMESPACE/NAME` is another Ollama registry.
    pub fn parse(name: &str) -> Result<Remote> {
        let (hub, rest) = split_host(name.trim().trim_end_matches('/'));
        let parsed = match hub {
            Some(Hub::HuggingFace) => hugging_face(rest),
            Some(Hub::Ollama) => ollama(rest),
            None if registry_host(rest).is_some() => ollama(rest),
            None if rest.contains('/') => hugging_face(rest),
            None => ollama(rest),
        };
        match parsed {
            Some(remote) => Ok(remote),
            None => bail!("cannot read {name:?} as a model to fetch: give {NAME_RULE}"),
        }
    }

    /// The name without Hugging Face's or Ollama's host, as the local
    /// stores take it: `ORG/REPO[:QUANT]`, `ORG/REPO/FILE`, `NAME:TAG`,
    /// `USER/NAME:TAG`, `HOST/NAMESPACE/NAME:TAG`.
    pub fn short_name(&self) -> String {
        match self {
            Remote::HuggingFace {
                repo,
                file: Some(f),
                ..
            } => format!("{repo}/{f}"),
            Remote::HuggingFace {
                repo,
                quant: Some(q),
                ..
            } => format!("{repo}:{q}"),
            Remote::HuggingFace { repo, .. } => repo.clone(),
            Remote::Ollama {
                host,
                namespace,
                model,
                tag,
            } => ollama_name(host.as_deref(), namespace, model, tag),
        }
    }
}

impl fmt::Display for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Remote::HuggingFace { .. } => write!(f, "hf.co/{}", self.short_name()),
            Remote::Ollama { host: Some(_), .. } => write!(f, "{}", self.short_name()),
            Remote::Ollama {
                host: None,
                namespace,
                model,
                tag,
            } => write!(f, "ollama.com/{namespace}/{model}:{tag}"),
        }
    }
}

/// The host of Ollama's own registry, as its store's folders name it.
pub const OLLAMA_HOST: &str = "registry.ollama.ai";

/// The name Ollama gives a model: `model:tag`, with the namespace when not
/// its library, and the host before both when not its registry (`None`
/// for Ollama's own).
pub fn ollama_name(host: Option<&str>, namespace: &str, model: &str, tag: &str) -> String {
    match (host.filter(|h| *h != OLLAMA_HOST), namespace) {
        (Some(h), _) => format!("{h}/{namespace}/{model}:{tag}"),
        (None, OLLAMA_LIBRARY) => format!("{model}:{tag}"),
        (None, _) => format!("{namespace}/{model}:{tag}"),
    }
}

/// The registry host a name begins with, as Ollama reads one: a first
/// part with a `.` or `:` (or `localhost`) before two more, the last not a
/// `.gguf` file (which makes it a Hugging Face repo's file).
fn registry_host(name: &str) -> Option<&str> {
    let parts: Vec<&str> = name.split('/').collect();
    let host = parts[0];
    let is_host = host == "localhost" || host.contains('.') || host.contains(':');
    let last_is_file = parts
        .last()
        .is_some_and(|p| p.to_ascii_lowercase().ends_with(".gguf"));
    (parts.len() == 3 && is_host && !last_is_file).then_some(host)
}

/// A `HOST[:PORT]` that is safe as a folder name.
fn plain_host(host: &str) -> bool {
    let (name, port) = match host.rsplit_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (host, None),
    };
    plain(name) && port.is_none_or(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// The hub a name's host prefix names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hub {
    HuggingFace,
    Ollama,
}

/// The hub a name begins with (`hf.co/`, `huggingface.co/`, `ollama.com/`,
/// `registry.ollama.ai/`, after an optional `https://`) and the rest of it;
/// `None` and the whole name when it begins with none.
pub fn split_host(name: &str) -> (Option<Hub>, &str) {
    let bare = name
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    match bare.split_once('/') {
        Some(("hf.co" | "huggingface.co", rest)) => (Some(Hub::HuggingFace), rest),
        Some(("ollama.com" | "registry.ollama.ai", rest)) => (Some(Hub::Ollama), rest),
        _ => (None, name),
    }
}

/// `name` with a hub's host taken off the front (`hf.co/org/repo` →
/// `org/repo`, `ollama.com/library/gemma3` → `library/gemma3`), as the
/// local stores read names.
pub fn without_host(name: &str) -> &str {
    split_host(name).1
}

/// A part of a name that is safe as a folder or file name.
fn plain(part: &str) -> bool {
    !part.is_empty()
        && !part.starts_with('.')
        && part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// `ORG/REPO[:QUANT]` or `ORG/REPO/PATH.gguf`.
fn hugging_face(rest: &str) -> Option<Remote> {
    let (path, quant) = match rest.rsplit_once(':') {
        Some((p, q)) if plain(q) => (p, Some(q.to_owned())),
        Some(_) => return None,
        None => (rest, None),
    };
    let mut parts = path.splitn(3, '/');
    let (org, name) = (parts.next()?, parts.next()?);
    if !plain(org) || !plain(name) {
        return None;
    }
    let file = match parts.next() {
        Some(f) if quant.is_none() && f.to_ascii_lowercase().ends_with(".gguf") => {
            if !f.split('/').all(plain) {
                return None;
            }
            Some(f.to_owned())
        }
        Some(_) => return None,
        None => None,
    };
    Some(Remote::HuggingFace {
        repo: format!("{org}/{name}"),
        quant,
        file,
    })
}

/// `[HOST/][NAMESPACE/]MODEL[:TAG]`.
fn ollama(rest: &str) -> Option<Remote> {
    let host = registry_host(rest);
    let rest = match host {
        Some(h) => &rest[h.len() + 1..],
        None => rest,
    };
    let (path, tag) = match rest.rsplit_once(':') {
        Some((p, t)) => (p, t),
        None => (rest, "latest"),
    };
    let (namespace, model) = match path.split_once('/') {
        Some((n, m)) => (n, m),
        None => (OLLAMA_LIBRARY, path),
    };
    let host_ok = host.is_none_or(plain_host);
    (host_ok && [namespace, model, tag].iter().all(|p| plain(p))).then(|| Remote::Ollama {
        host: host.filter(|h| *h != OLLAMA_HOST).map(str::to_owned),
        namespace: namespace.to_owned(),
        model: model.to_owned(),
        tag: tag.to_owned(),
    })
}

/// A GGUF file name's quantization, as repos name their files
/// (`gemma-3-1b-it-Q4_K_M.gguf` → `Q4_K_M`, `model.f16.gguf` → `F16`): the
/// last `-`/`.` separated part that looks like one, else the file's stem.
pub fn quant_label(file: &str) -> String {
    let base = file.rsplit('/').next().unwrap_or(file);
    let stem = base
        .strip_suffix(".gguf")
        .or_else(|| base.strip_suffix(".GGUF"))
        .unwrap_or(base);
    let stem = split_part(stem).map_or(stem, |(head, _)| head);
    let looks_like_quant = |p: &&str| {
        let u = p.to_ascii_uppercase();
        let digit_after = |prefix: &str| {
            u.strip_prefix(prefix)
                .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        };
        digit_after("Q")
            || digit_after("IQ")
            || digit_after("TQ")
            || ["F32", "F16", "BF16"].contains(&u.as_str())
    };
    stem.rsplit(['-', '.'])
        .find(looks_like_quant)
        .unwrap_or(stem)
        .to_ascii_uppercase()
}

/// `(stem, N)` for the parts of a split model (`…-00001-of-00003`).
pub fn split_part(stem: &str) -> Option<(&str, u32)> {
    let stem = stem.strip_suffix(".gguf").unwrap_or(stem);
    let (head, of) = stem.rsplit_once("-of-")?;
    let (head, part) = head.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.chars().all(|c| c.is_ascii_digit());
    (digits(part) && digits(of)).then(|| (head, of.parse().unwrap_or(0)))
}

/// The files `quant` names: those whose quantization label it is, else
/// those whose name holds it (case-insensitive). Image projectors
/// (`mmproj…`) never match.
pub fn matching_quant<'a>(files: &[&'a str], quant: &str) -> Vec<&'a str> {
    let models: Vec<&str> = files.iter().copied().filter(|f| !is_projector(f)).collect();
    let exact: Vec<&str> = models
        .iter()
        .copied()
        .filter(|f| quant_label(f).eq_ignore_ascii_case(quant))
        .collect();
    if !exact.is_empty() {
        return exact;
    }
    let q = quant.to_ascii_lowercase();
    models
        .into_iter()
        .filter(|f| {
            let base = f.rsplit('/').next().unwrap_or(f);
            base.to_ascii_lowercase().contains(&q)
        })
        .collect()
}

/// An image projector file, which is not a model to run.
pub fn is_projector(file: &str) -> bool {
    let base = file.rsplit('/').next().unwrap_or(file);
    base.to_ascii_lowercase().starts_with("mmproj")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hf(repo: &str, quant: Option<&str>, file: Option<&str>) -> Remote {
        Remote::HuggingFace {
            repo: repo.into(),
            quant: quant.map(Into::into),
            file: file.map(Into::into),
        }
    }

    fn ol(namespace: &str, model: &str, tag: &str) -> Remote {
        ol_at(None, namespace, model, tag)
    }

    fn ol_at(host: Option<&str>, namespace: &str, model: &str, tag: &str) -> Remote {
        Remote::Ollama {
            host: host.map(Into::into),
            namespace: namespace.into(),
            model: model.into(),
            tag: tag.into(),
        }
    }

    #[test]
    fn host_prefix_then_slash_decides_the_hub() {
        for (name, want) in [
            (
                "hf.co/google/gemma-3-GGUF:Q4_K_M",
                hf("google/gemma-3-GGUF", Some("Q4_K_M"), None),
            ),
            (
                "https://huggingface.co/google/gemma-3-GGUF",
                hf("google/gemma-3-GGUF", None, None),
            ),
            (
                "unsloth/gemma-3-1b-it-GGUF:q8_0",
                hf("unsloth/gemma-3-1b-it-GGUF", Some("q8_0"), None),
            ),
            (
                "org/repo/sub/model-Q4_0.gguf",
                hf("org/repo", None, Some("sub/model-Q4_0.gguf")),
            ),
            ("gemma3:270m", ol("library", "gemma3", "270m")),
            ("gemma3", ol("library", "gemma3", "latest")),
            (
                "ollama.com/library/gemma3:1b",
                ol("library", "gemma3", "1b"),
            ),
            ("ollama.com/someone/tiny:q8", ol("someone", "tiny", "q8")),
            (
                "registry.ollama.ai/someone/tiny",
                ol("someone", "tiny", "latest"),
            ),
            (
                "127.0.0.1:5000/library/tiny:q8",
                ol_at(Some("127.0.0.1:5000"), "library", "tiny", "q8"),
            ),
            (
                "models.example.com/team/tiny",
                ol_at(Some("models.example.com"), "team", "tiny", "latest"),
            ),
            (
                "org.name/repo/model-Q4_0.gguf",
                hf("org.name/repo", None, Some("model-Q4_0.gguf")),
            ),
        ] {
            assert_eq!(Remote::parse(name).unwrap(), want, "{name}");
        }
    }

    #[test]
    fn names_that_are_no_model_are_refused_with_the_rule() {
        for name in [
            "",
            "../x",
            "org/..",
            "a/b/c",
            "a/b:x/y",
            "gemma3:",
            "org/repo/f.gguf:Q4_0",
            "x y",
            "127.0.0.1:x/library/tiny",
            "../library/tiny",
        ] {
            let e = Remote::parse(name).unwrap_err().to_string();
            assert!(e.contains("ORG/REPO"), "{name}: {e}");
        }
    }

    #[test]
    fn short_names_drop_the_host() {
        for (name, short) in [
            ("hf.co/google/x-GGUF:Q8_0", "google/x-GGUF:Q8_0"),
            ("ollama.com/library/gemma3:1b", "gemma3:1b"),
            ("ollama.com/someone/tiny", "someone/tiny:latest"),
            (
                "localhost:5000/library/tiny:q8",
                "localhost:5000/library/tiny:q8",
            ),
            ("registry.ollama.ai/library/tiny:q8", "tiny:q8"),
        ] {
            assert_eq!(Remote::parse(name).unwrap().short_name(), short);
        }
    }

    #[test]
    fn quant_labels_come_from_file_names() {
        for (file, label) in [
            ("gemma-3-1b-it-Q4_K_M.gguf", "Q4_K_M"),
            ("gemma-3-1b-it-UD-Q4_K_XL.gguf", "Q4_K_XL"),
            ("model.f16.gguf", "F16"),
            ("sub/gemma-3-27b-it-IQ4_XS.gguf", "IQ4_XS"),
            ("big-Q8_0-00001-of-00002.gguf", "Q8_0"),
            ("weights.gguf", "WEIGHTS"),
        ] {
            assert_eq!(quant_label(file), label, "{file}");
        }
        assert_eq!(
            split_part("big-Q8_0-00001-of-00002.gguf"),
            Some(("big-Q8_0", 2))
        );
        assert_eq!(split_part("gemma-3-1b-it-Q4_K_M.gguf"), None);
    }

    #[test]
    fn a_quant_names_its_file_not_its_prefix_or_projector() {
        let files = [
            "m-Q4_0.gguf",
            "m-Q4_0_4_4.gguf",
            "m-Q4_K_M.gguf",
            "m-Q4_K_S.gguf",
            "mmproj-m-Q4_0.gguf",
        ];
        assert_eq!(matching_quant(&files, "q4_0"), ["m-Q4_0.gguf"]);
        assert_eq!(
            matching_quant(&files, "Q4_K"),
            ["m-Q4_K_M.gguf", "m-Q4_K_S.gguf"]
        );
        assert!(matching_quant(&files, "Q5_K_S").is_empty());
    }
}
