//! Hugging Face checkpoints read in place: a directory with `config.json`,
//! `*.safetensors` (sharded or not), the tokenizer files and the chat
//! template becomes a [`GgufFile`] with the metadata and tensor names
//! llama.cpp's converter would write, its matrices pointing into the
//! memory-mapped shards (nothing copied but the few tensors the conversion
//! changes, such as Gemma 1–3's norm weights, which GGUF stores as 1 + w).
//! Everything after this (config, tokenizer, chat template, weights) is
//! the GGUF path.

mod safetensors;
mod spm;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rlx_gguf::{Array, GgmlType, GgufFile, TensorBytes, TensorPart, Value};
use serde_json::Value as Json;

#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("{}: {msg}", path.display())]
    File { path: PathBuf, msg: String },
    #[error("config.json: `{key}`: {msg}")]
    Config { key: String, msg: String },
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Gguf(#[from] rlx_gguf::GgufError),
}

/// Whether `path` is a checkpoint directory (it has a `config.json`).
pub fn is_checkpoint(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").is_file()
}

/// The checkpoint in `dir` as a GGUF file.
pub fn open(dir: &Path) -> Result<GgufFile, HfError> {
    let read_json = |name: &str| -> Result<Option<Json>, HfError> {
        let path = dir.join(name);
        if !path.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path).map_err(|e| HfError::File {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| HfError::File {
                path,
                msg: format!("not JSON: {e}"),
            })
    };
    let config = read_json("config.json")?.ok_or_else(|| HfError::File {
        path: dir.join("config.json"),
        msg: "missing".into(),
    })?;
    // Multimodal checkpoints keep the language model's settings apart.
    let text_config = config.get("text_config").unwrap_or(&config);
    let model_type = text_config
        .get("model_type")
        .or_else(|| config.get("model_type"))
        .and_then(Json::as_str)
        .unwrap_or_default();
    let arch = match model_type {
        "gemma" => "gemma",
        "gemma2" => "gemma2",
        "gemma3" | "gemma3_text" => "gemma3",
        "gemma3n" | "gemma3n_text" | "gemma4" | "gemma4_text" => {
            return Err(HfError::Unsupported(format!(
                "{}: {model_type} checkpoints are not read yet (convert with llama.cpp's convert_hf_to_gguf.py)",
                dir.display()
            )))
        }
        other => {
            return Err(HfError::Config {
                key: "model_type".into(),
                msg: format!("{other:?} is not a Gemma model"),
            })
        }
    };
    let c = Cfg {
        json: text_config,
        arch,
    };
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        ("general.type".into(), Value::String("model".into())),
    ];
    if let Some(name) = dir.file_name() {
        meta.push((
            "general.name".into(),
            Value::String(name.to_string_lossy().into_owned()),
        ));
    }
    c.model_metadata(&mut meta)?;
    let tokenizer = tokenizer_metadata(dir, &read_json)?;
    let n_vocab = tokenizer.n_vocab;
    meta.extend(tokenizer.meta);

    let tied = config
        .get("tie_word_embeddings")
        .or_else(|| text_config.get("tie_word_embeddings"))
        .and_then(Json::as_bool)
        .unwrap_or(true);
    let tensors = tensors(dir, &read_json, arch, tied, n_vocab)?;
    Ok(GgufFile::from_parts(Some(dir.to_owned()), meta, tensors)?)
}

/// `config.json`'s language-model settings.
struct Cfg<'a> {
    json: &'a Json,
    arch: &'static str,
}

impl Cfg<'_> {
    fn get(&self, key: &str) -> Option<&Json> {
        self.json.get(key).filter(|v| !v.is_null())
    }

    fn uint(&self, key: &str) -> Result<u32, HfError> {
        self.get(key)
            .and_then(Json::as_u64)
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| HfError::Config {
                key: key.into(),
                msg: "expected a non-negative integer".into(),
            })
    }

    fn float(&self, key: &str) -> Option<f32> {
        self.get(key).and_then(Json::as_f64).map(|v| v as f32)
    }

    fn model_metadata(&self, meta: &mut Vec<(String, Value)>) -> Result<(), HfError> {
        let a = self.arch;
        let mut put = |k: &str, v: Value| meta.push((format!("{a}.{k}"), v));
        let layers = self.uint("num_hidden_layers")?;
        let heads = self.uint("num_attention_heads")?;
        let hidden = self.uint("hidden_size")?;
        put(
            "context_length",
            Value::U32(self.uint("max_position_embeddings")?),
        );
        put("embedding_length", Value::U32(hidden));
        put("block_count", Value::U32(layers));
        put(
            "feed_forward_length",
            Value::U32(self.uint("intermediate_size")?),
        );
        put("attention.head_count", Value::U32(heads));
        let kv = match self.get("num_key_value_heads") {
            Some(_) => self.uint("num_key_value_heads")?,
            None => heads,
        };
        put("attention.head_count_kv", Value::U32(kv));
        let eps = self.float("rms_norm_eps").ok_or_else(|| HfError::Config {
            key: "rms_norm_eps".into(),
            msg: "expected a number".into(),
        })?;
        put("attention.layer_norm_rms_epsilon", Value::F32(eps));
        let head_dim = match self.get("head_dim") {
            Some(_) => self.uint("head_dim")?,
            None => hidden / heads.max(1),
        };
        put("attention.key_length", Value::U32(head_dim));
        put("attention.value_length", Value::U32(head_dim));
        if let Some(cap) = self.float("attn_logit_softcapping") {
            put("attn_logit_softcapping", Value::F32(cap));
        }
        if let Some(cap) = self.float("final_logit_softcapping") {
            put("final_logit_softcapping", Value::F32(cap));
        }
        if self.arch != "gemma" {
            if let Some(w) = self.get("sliding_window").and_then(Json::as_u64) {
                put("attention.sliding_window", Value::U32(w as u32));
            }
        }
        if self.arch == "gemma3" {
            let (global, local, scaling) = self.rope();
            if let Some((kind, factor)) = scaling {
                put("rope.scaling.type", Value::String(kind));
                put("rope.scaling.factor", Value::F32(factor));
            }
            put("rope.freq_base", Value::F32(global));
            put("rope.freq_base_swa", Value::F32(local));
            if let Some(types) = self.get("layer_types").and_then(Json::as_array) {
                let sliding: Vec<bool> = types
                    .iter()
                    .map(|t| t.as_str() == Some("sliding_attention"))
                    .collect();
                if sliding.len() != layers as usize {
                    return Err(HfError::Config {
                        key: "layer_types".into(),
                        msg: format!("{} entries for {layers} layers", sliding.len()),
                    });
                }
                put(
                    "attention.sliding_window_pattern",
                    Value::Array(Array::Bool(sliding)),
                );
            }
        } else if let Some(theta) = self.float("rope_theta") {
            put("rope.freq_base", Value::F32(theta));
        }
        Ok(())
    }

    /// Global and local RoPE bases and the global layers' scaling, from
    /// transformers 5's `rope_parameters` per layer type or the older
    /// `rope_theta`, `rope_local_base_freq` and `rope_scaling`.
    fn rope(&self) -> (f32, f32, Option<(String, f32)>) {
        let params = self.get("rope_parameters");
        let per_type = |t: &str| params.and_then(|p| p.get(t));
        let global = per_type("full_attention");
        let theta = |v: Option<&Json>| v.and_then(|g| g.get("rope_theta")).and_then(Json::as_f64);
        let base_global = theta(global)
            .or_else(|| theta(params))
            .map(|v| v as f32)
            .or_else(|| self.float("rope_theta"))
            .unwrap_or(1_000_000.0);
        let base_local = theta(per_type("sliding_attention"))
            .map(|v| v as f32)
            .or_else(|| self.float("rope_local_base_freq"))
            .unwrap_or(10_000.0);
        let scaling = global.or_else(|| self.get("rope_scaling")).and_then(|s| {
            let kind = s.get("rope_type").or_else(|| s.get("type"))?.as_str()?;
            let factor = s.get("factor")?.as_f64()? as f32;
            (kind != "default").then(|| (kind.to_owned(), factor))
        });
        (base_global, base_local, scaling)
    }
}

struct Tokenizer {
    meta: Vec<(String, Value)>,
    n_vocab: usize,
}

/// The vocabulary as llama.cpp's converter writes it for Gemma 1–3: the
/// SentencePiece pieces, scores and types, tokens `tokenizer_config.json`
/// adds marked control (special) or user-defined, the special ids, the
/// BOS/EOS flags and the chat template.
fn tokenizer_metadata(
    dir: &Path,
    read_json: &dyn Fn(&str) -> Result<Option<Json>, HfError>,
) -> Result<Tokenizer, HfError> {
    let model_path = dir.join("tokenizer.model");
    let bytes = std::fs::read(&model_path).map_err(|e| HfError::File {
        path: model_path.clone(),
        msg: format!("{e} (Gemma 1–3 checkpoints carry a SentencePiece tokenizer.model)"),
    })?;
    let pieces = spm::pieces(&bytes).ok_or_else(|| HfError::File {
        path: model_path.clone(),
        msg: "not a SentencePiece model".into(),
    })?;
    let mut tokens: Vec<String> = pieces.iter().map(|p| p.text.clone()).collect();
    let scores: Vec<f32> = pieces.iter().map(|p| p.score).collect();
    let mut types: Vec<i32> = pieces.iter().map(|p| p.kind).collect();
    let tc = read_json("tokenizer_config.json")?.unwrap_or(Json::Null);
    if let Some(added) = tc.get("added_tokens_decoder").and_then(Json::as_object) {
        for (id, t) in added {
            let (Ok(id), Some(content)) = (id.parse::<usize>(), t["content"].as_str()) else {
                continue;
            };
            if id >= tokens.len() {
                continue;
            }
            if t["special"].as_bool() == Some(true) {
                types[id] = 3;
            } else {
                types[id] = 4;
                tokens[id] = content.replace('\u{2581}', " ");
            }
        }
    }
    let id_of = |key: &str| -> Option<u32> {
        let v = tc.get(key)?;
        let text = v.as_str().or_else(|| v.get("content")?.as_str())?;
        tokens.iter().position(|t| t == text).map(|i| i as u32)
    };
    let mut meta = vec![
        (
            "tokenizer.ggml.model".to_owned(),
            Value::String("llama".into()),
        ),
        (
            "tokenizer.ggml.pre".to_owned(),
            Value::String("default".into()),
        ),
    ];
    let n_vocab = tokens.len();
    meta.push((
        "tokenizer.ggml.tokens".into(),
        Value::Array(Array::String(tokens.clone())),
    ));
    meta.push((
        "tokenizer.ggml.scores".into(),
        Value::Array(Array::F32(scores)),
    ));
    meta.push((
        "tokenizer.ggml.token_type".into(),
        Value::Array(Array::I32(types)),
    ));
    for (key, gguf) in [
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("pad_token", "padding_token_id"),
    ] {
        if let Some(id) = id_of(key) {
            meta.push((format!("tokenizer.ggml.{gguf}"), Value::U32(id)));
        }
    }
    let flag = |k: &str, default: bool| tc.get(k).and_then(Json::as_bool).unwrap_or(default);
    meta.push((
        "tokenizer.ggml.add_bos_token".into(),
        Value::Bool(flag("add_bos_token", true)),
    ));
    meta.push((
        "tokenizer.ggml.add_eos_token".into(),
        Value::Bool(flag("add_eos_token", false)),
    ));
    if let Some(t) = chat_template(dir, &tc)? {
        meta.push(("tokenizer.chat_template".into(), Value::String(t)));
    }
    meta.push(("tokenizer.ggml.add_space_prefix".into(), Value::Bool(false)));
    Ok(Tokenizer { meta, n_vocab })
}

/// `chat_template.jinja`, else `tokenizer_config.json`'s `chat_template`
/// (a string, or named templates of which `default` is taken).
fn chat_template(dir: &Path, tc: &Json) -> Result<Option<String>, HfError> {
    let file = dir.join("chat_template.jinja");
    if file.is_file() {
        return std::fs::read_to_string(&file)
            .map(Some)
            .map_err(|e| HfError::File {
                path: file,
                msg: e.to_string(),
            });
    }
    Ok(match tc.get("chat_template") {
        Some(Json::String(s)) => Some(s.clone()),
        Some(Json::Array(named)) => named
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(str::to_owned),
        _ => None,
    })
}

/// The checkpoint's tensors under GGUF names, converted where GGUF differs.
fn tensors(
    dir: &Path,
    read_json: &dyn Fn(&str) -> Result<Option<Json>, HfError>,
    arch: &str,
    tied: bool,
    n_vocab: usize,
) -> Result<Vec<TensorPart>, HfError> {
    let mut files: Vec<PathBuf> = match read_json("model.safetensors.index.json")? {
        Some(index) => {
            let map = index["weight_map"]
                .as_object()
                .ok_or_else(|| HfError::File {
                    path: dir.join("model.safetensors.index.json"),
                    msg: "no weight_map".into(),
                })?;
            let mut names: Vec<&str> = map.values().filter_map(Json::as_str).collect();
            names.sort_unstable();
            names.dedup();
            names.iter().map(|n| dir.join(n)).collect()
        }
        None => std::fs::read_dir(dir)
            .map_err(|e| HfError::File {
                path: dir.to_owned(),
                msg: e.to_string(),
            })?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect(),
    };
    files.sort();
    if files.is_empty() {
        return Err(HfError::File {
            path: dir.to_owned(),
            msg: "no .safetensors files".into(),
        });
    }
    let mut all = BTreeMap::new();
    for f in &files {
        all.extend(safetensors::read(f)?);
    }
    let mut out = Vec::with_capacity(all.len());
    for (hf_name, t) in all {
        let Some((name, shift)) = gguf_name(&hf_name, arch, tied)? else {
            continue;
        };
        let dims: Vec<u64> = t.shape.iter().rev().copied().collect();
        if shift {
            // GGUF keeps 1 + w for these norms, in f32.
            let n = t.shape.iter().product::<u64>() as usize;
            let mut f = vec![0f32; n];
            rlx_gguf::dequantize(t.ty, t.bytes(), &mut f).map_err(|e| HfError::File {
                path: dir.to_owned(),
                msg: format!("tensor {hf_name}: {e}"),
            })?;
            let bytes: Vec<u8> = f.iter().flat_map(|x| (x + 1.0).to_le_bytes()).collect();
            out.push((name, GgmlType::F32, dims, TensorBytes::Owned(bytes)));
            continue;
        }
        let mut dims = dims;
        let mut len = t.len;
        if name == "token_embd.weight" && dims.len() == 2 && dims[1] as usize > n_vocab {
            // Padding rows past the tokenizer's vocabulary are dropped, as
            // the converter does.
            len = len / dims[1] as usize * n_vocab;
            dims[1] = n_vocab as u64;
        }
        out.push((
            name,
            t.ty,
            dims,
            TensorBytes::Mapped {
                map: t.map,
                start: t.start,
                len,
            },
        ));
    }
    Ok(out)
}

/// The GGUF name of a checkpoint tensor, and whether its values need the
/// norm shift; `None` for tensors the language model does not use.
fn gguf_name(hf: &str, arch: &str, tied: bool) -> Result<Option<(String, bool)>, HfError> {
    let skip = [
        "vision_tower.",
        "multi_modal_projector.",
        "model.vision_tower.",
        "model.multi_modal_projector.",
    ];
    if skip.iter().any(|s| hf.starts_with(s)) {
        return Ok(None);
    }
    if hf == "lm_head.weight" {
        return Ok((!tied).then(|| ("output.weight".into(), false)));
    }
    let name = ["model.language_model.", "language_model.model.", "model."]
        .iter()
        .find_map(|p| hf.strip_prefix(p))
        .unwrap_or(hf);
    let unknown = || HfError::Unsupported(format!("tensor {hf} has no place in a {arch} model"));
    let norm_shift = matches!(arch, "gemma" | "gemma2" | "gemma3");
    match name {
        "embed_tokens.weight" => return Ok(Some(("token_embd.weight".into(), false))),
        "norm.weight" => return Ok(Some(("output_norm.weight".into(), norm_shift))),
        _ => {}
    }
    let rest = name.strip_prefix("layers.").ok_or_else(unknown)?;
    let (layer, part) = rest.split_once('.').ok_or_else(unknown)?;
    let layer: usize = layer.parse().map_err(|_| unknown())?;
    let post_attention = if arch == "gemma" {
        "ffn_norm"
    } else {
        "post_attention_norm"
    };
    let (gguf, shift) = match part {
        "input_layernorm.weight" => ("attn_norm", norm_shift),
        "self_attn.q_proj.weight" => ("attn_q", false),
        "self_attn.k_proj.weight" => ("attn_k", false),
        "self_attn.v_proj.weight" => ("attn_v", false),
        "self_attn.o_proj.weight" => ("attn_output", false),
        "self_attn.q_norm.weight" => ("attn_q_norm", norm_shift),
        "self_attn.k_norm.weight" => ("attn_k_norm", norm_shift),
        "post_attention_layernorm.weight" => (post_attention, norm_shift),
        "pre_feedforward_layernorm.weight" => ("ffn_norm", norm_shift),
        "post_feedforward_layernorm.weight" => ("post_ffw_norm", norm_shift),
        "mlp.gate_proj.weight" => ("ffn_gate", false),
        "mlp.up_proj.weight" => ("ffn_up", false),
        "mlp.down_proj.weight" => ("ffn_down", false),
        _ => return Err(unknown()),
    };
    Ok(Some((format!("blk.{layer}.{gguf}.weight"), shift)))
}
