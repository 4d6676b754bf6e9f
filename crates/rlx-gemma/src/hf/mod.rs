//! Hugging Face checkpoints read in place: a directory with `config.json`,
//! `*.safetensors` (sharded or not), the tokenizer files and the chat
//! template becomes a [`GgufFile`] with the metadata and tensor names
//! llama.cpp's converter would write, its matrices pointing into the
//! memory-mapped shards (nothing copied but the few tensors the conversion
//! changes: Gemma 1–3's norm weights, which GGUF stores as 1 + w, and the
//! vectors, norms and small matrices it keeps in f32 from a bf16 or f16
//! checkpoint).
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
    // An assistant keeps its target's settings as its text_config.
    if config.get("model_type").and_then(Json::as_str) == Some("gemma4_assistant") {
        return Err(HfError::Config {
            key: "model_type".into(),
            msg: format!(
                "\"gemma4_assistant\": {} is not supported yet",
                crate::config::ASSISTANT_UNSUPPORTED
            ),
        });
    }
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
        "gemma3n" | "gemma3n_text" => "gemma3n",
        "gemma4" | "gemma4_text" => "gemma4",
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
    let vocab_size = c.get("vocab_size").and_then(Json::as_u64).unwrap_or(0) as usize;
    let tokenizer = if arch == "gemma4" {
        bpe_tokenizer_metadata(dir, &read_json)?
    } else {
        tokenizer_metadata(dir, &read_json, vocab_size)?
    };
    let n_vocab = tokenizer.n_vocab;
    meta.extend(tokenizer.meta);

    let tied = config
        .get("tie_word_embeddings")
        .or_else(|| text_config.get("tie_word_embeddings"))
        .and_then(Json::as_bool)
        .unwrap_or(true);
    let mut tensors = tensors(dir, &read_json, arch, tied, n_vocab)?;
    if let Some(freqs) = c.rope_freqs()? {
        tensors.push(freqs);
    }
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

    fn list(&self, key: &str) -> Option<&Vec<Json>> {
        self.get(key).and_then(Json::as_array)
    }

    /// Which layers slide, from `layer_types`.
    fn sliding(&self, layers: u32) -> Result<Option<Vec<bool>>, HfError> {
        let Some(types) = self.list("layer_types") else {
            return Ok(None);
        };
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
        Ok(Some(sliding))
    }

    /// A Gemma 4 value for the global layers: the top-level key, else the
    /// first global layer's entry in `per_layer_config`.
    fn global(&self, top: &str, per_layer: &str) -> Option<u64> {
        if let Some(v) = self.get(top).and_then(Json::as_u64) {
            return Some(v);
        }
        let types = self.list("layer_types")?;
        let per = self.get("per_layer_config")?.as_object()?;
        let mut entries: Vec<(usize, &Json)> = per
            .iter()
            .filter_map(|(k, v)| Some((k.parse().ok()?, v)))
            .collect();
        entries.sort_by_key(|(i, _)| *i);
        entries.into_iter().find_map(|(i, v)| {
            (types.get(i)?.as_str() == Some("full_attention"))
                .then(|| v.get(per_layer)?.as_u64())
                .flatten()
        })
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
        let shared_kv = match self.get("num_kv_shared_layers") {
            Some(_) => self.uint("num_kv_shared_layers")?,
            None => 0,
        };
        let ff = match self.list("intermediate_size") {
            Some(per_layer) => {
                let v: Option<Vec<i32>> = per_layer
                    .iter()
                    .map(|x| x.as_u64().and_then(|n| i32::try_from(n).ok()))
                    .collect();
                Value::Array(Array::I32(v.ok_or_else(|| HfError::Config {
                    key: "intermediate_size".into(),
                    msg: "expected integers".into(),
                })?))
            }
            None => {
                let n = self.uint("intermediate_size")?;
                if self.get("use_double_wide_mlp").and_then(Json::as_bool) == Some(true) {
                    let first_shared = layers.saturating_sub(shared_kv);
                    let v = (0..layers)
                        .map(|l| if l < first_shared { n } else { 2 * n } as i32)
                        .collect();
                    Value::Array(Array::I32(v))
                } else {
                    Value::U32(n)
                }
            }
        };
        put("feed_forward_length", ff);
        put("attention.head_count", Value::U32(heads));
        let kv = match self.get("num_key_value_heads") {
            Some(_) => self.uint("num_key_value_heads")?,
            None => heads,
        };
        let sliding = self.sliding(layers)?;
        let kv_global = (a == "gemma4")
            .then(|| self.global("num_global_key_value_heads", "num_key_value_heads"))
            .flatten();
        match (kv_global, &sliding) {
            (Some(g), Some(sl)) => put(
                "attention.head_count_kv",
                Value::Array(Array::I32(
                    sl.iter()
                        .map(|&s| if s { kv } else { g as u32 } as i32)
                        .collect(),
                )),
            ),
            _ => put("attention.head_count_kv", Value::U32(kv)),
        }
        if matches!(a, "gemma3" | "gemma3n" | "gemma4") {
            let (global, local, scaling) = self.rope();
            if let Some((kind, factor)) = scaling.filter(|(k, _)| k != "proportional") {
                put("rope.scaling.type", Value::String(kind));
                put("rope.scaling.factor", Value::F32(factor));
            }
            put("rope.freq_base", Value::F32(global));
            put("rope.freq_base_swa", Value::F32(local));
        } else if let Some(theta) = self.float("rope_theta") {
            put("rope.freq_base", Value::F32(theta));
        }
        let eps = self.float("rms_norm_eps").ok_or_else(|| HfError::Config {
            key: "rms_norm_eps".into(),
            msg: "expected a number".into(),
        })?;
        put("attention.layer_norm_rms_epsilon", Value::F32(eps));
        if a == "gemma4" {
            if let Some(n) = self.get("num_experts").and_then(Json::as_u64) {
                put("expert_count", Value::U32(n as u32));
                if let Some(k) = self.get("top_k_experts").and_then(Json::as_u64) {
                    put("expert_used_count", Value::U32(k as u32));
                }
            }
        }
        let head_dim = match self.get("head_dim") {
            Some(_) => self.uint("head_dim")?,
            None => hidden / heads.max(1),
        };
        let head_dim_global = if a == "gemma4" {
            self.global("global_head_dim", "head_dim")
                .map_or(head_dim, |v| v as u32)
        } else {
            head_dim
        };
        put("attention.key_length", Value::U32(head_dim_global));
        put("attention.value_length", Value::U32(head_dim_global));
        if let Some(cap) = self.float("attn_logit_softcapping") {
            put("attn_logit_softcapping", Value::F32(cap));
        }
        if let Some(cap) = self.float("final_logit_softcapping").filter(|&c| c != 0.0) {
            put("final_logit_softcapping", Value::F32(cap));
        }
        if a != "gemma" {
            if let Some(w) = self.get("sliding_window").and_then(Json::as_u64) {
                put("attention.sliding_window", Value::U32(w as u32));
            }
        }
        if a == "gemma3n" {
            put(
                "altup.active_idx",
                Value::U32(self.uint("altup_active_idx")?),
            );
            put(
                "altup.num_inputs",
                Value::U32(self.uint("altup_num_inputs")?),
            );
        }
        if matches!(a, "gemma3n" | "gemma4") {
            put("attention.shared_kv_layers", Value::U32(shared_kv));
            let ple = self
                .get("hidden_size_per_layer_input")
                .and_then(Json::as_u64)
                .unwrap_or(0);
            put("embedding_length_per_layer_input", Value::U32(ple as u32));
        }
        if a == "gemma3n" {
            let pattern =
                self.list("activation_sparsity_pattern")
                    .ok_or_else(|| HfError::Config {
                        key: "activation_sparsity_pattern".into(),
                        msg: "missing".into(),
                    })?;
            let scales: Option<Vec<f32>> = pattern
                .iter()
                .map(|p| p.as_f64().map(|p| sparsity_scale(p as f32)))
                .collect();
            put(
                "activation_sparsity_scale",
                Value::Array(Array::F32(scales.ok_or_else(|| HfError::Config {
                    key: "activation_sparsity_pattern".into(),
                    msg: "expected numbers".into(),
                })?)),
            );
        }
        if let Some(sl) = sliding.filter(|_| a != "gemma2") {
            put(
                "attention.sliding_window_pattern",
                Value::Array(Array::Bool(sl)),
            );
        }
        if a == "gemma4" {
            put("attention.key_length_swa", Value::U32(head_dim));
            put("attention.value_length_swa", Value::U32(head_dim));
            if let Some(n) = self.get("moe_intermediate_size").and_then(Json::as_u64) {
                put("expert_feed_forward_length", Value::U32(n as u32));
            }
            let partial_swa = self
                .rope_params("sliding_attention")
                .and_then(|p| p.get("partial_rotary_factor"))
                .and_then(Json::as_f64)
                .unwrap_or(1.0);
            put("rope.dimension_count", Value::U32(head_dim_global));
            put(
                "rope.dimension_count_swa",
                Value::U32((f64::from(head_dim) * partial_swa) as u32),
            );
        }
        Ok(())
    }

    fn rope_params(&self, layer_type: &str) -> Option<&Json> {
        self.get("rope_parameters")?.get(layer_type)
    }

    /// Gemma 4's `rope_freqs`: the global layers rotate only the first
    /// `partial_rotary_factor` of each head ("proportional" RoPE), which
    /// llama.cpp expresses as a frequency factor of 1 for rotated pairs and
    /// 1e30 (no rotation) for the rest.
    fn rope_freqs(&self) -> Result<Option<TensorPart>, HfError> {
        let Some(full) = self.rope_params("full_attention") else {
            return Ok(None);
        };
        if self.arch != "gemma4"
            || full.get("rope_type").and_then(Json::as_str) != Some("proportional")
        {
            return Ok(None);
        }
        let head_dim = match self.get("head_dim") {
            Some(_) => u64::from(self.uint("head_dim")?),
            None => 0,
        };
        let hd = self
            .global("global_head_dim", "head_dim")
            .unwrap_or(head_dim);
        let factor = full
            .get("partial_rotary_factor")
            .and_then(Json::as_f64)
            .unwrap_or(1.0);
        let rotated = (hd as f64 * factor / 2.0) as usize;
        let pairs = (hd / 2) as usize;
        let values: Vec<u8> = (0..pairs)
            .flat_map(|i| if i < rotated { 1.0f32 } else { 1e30f32 }.to_le_bytes())
            .collect();
        Ok(Some((
            "rope_freqs.weight".into(),
            GgmlType::F32,
            vec![pairs as u64],
            TensorBytes::Owned(values),
        )))
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
    vocab_size: usize,
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
    let mut scores: Vec<f32> = pieces.iter().map(|p| p.score).collect();
    let mut types: Vec<i32> = pieces.iter().map(|p| p.kind).collect();
    // A model whose embedding has more rows than the tokenizer has pieces
    // gets unused placeholders, as the converter writes them.
    for i in tokens.len()..vocab_size {
        tokens.push(format!("[PAD{i}]"));
        scores.push(-1000.0);
        types.push(5);
    }
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
    let meta = vec![
        (
            "tokenizer.ggml.model".to_owned(),
            Value::String("llama".into()),
        ),
        (
            "tokenizer.ggml.pre".to_owned(),
            Value::String("default".into()),
        ),
    ];
    let vocab = Vocab {
        tokens,
        scores,
        types,
        special: &[
            ("bos_token", "bos_token_id"),
            ("eos_token", "eos_token_id"),
            ("pad_token", "padding_token_id"),
        ],
        // The converter writes the flag from tokenizer_config.json here.
        always_bos: false,
    };
    vocab.into_metadata(meta, dir, &tc)
}

/// Gemma 4's vocabulary from `tokenizer.json` (byte-fallback BPE): tokens
/// by id with the added ones, control for special tokens, byte pieces,
/// the tags its chat parser reads kept visible (user-defined), the merges.
fn bpe_tokenizer_metadata(
    dir: &Path,
    read_json: &dyn Fn(&str) -> Result<Option<Json>, HfError>,
) -> Result<Tokenizer, HfError> {
    const VISIBLE: [&str; 7] = [
        "<|channel>",
        "<channel|>",
        "<|tool_call>",
        "<tool_call|>",
        "<|tool_response>",
        "<tool_response|>",
        "<|\"|>",
    ];
    let path = dir.join("tokenizer.json");
    let bad = |msg: &str| HfError::File {
        path: path.clone(),
        msg: msg.to_owned(),
    };
    let tj = read_json("tokenizer.json")?
        .ok_or_else(|| bad("missing (Gemma 4 reads its vocabulary from it)"))?;
    let model = &tj["model"];
    if model["type"].as_str() != Some("BPE") {
        return Err(bad("the model is not BPE"));
    }
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| bad("no model.vocab"))?;
    let mut by_id: BTreeMap<usize, (String, i32)> = BTreeMap::new();
    for (text, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| bad("a vocabulary id is not a number"))? as usize;
        let is_byte = text.len() == 6 && text.starts_with("<0x") && text.ends_with('>');
        by_id.insert(id, (text.clone(), if is_byte { 6 } else { 1 }));
    }
    for t in tj["added_tokens"].as_array().into_iter().flatten() {
        let (Some(id), Some(text)) = (t["id"].as_u64(), t["content"].as_str()) else {
            continue;
        };
        let kind = if t["special"].as_bool() == Some(true) {
            3
        } else {
            4
        };
        by_id.insert(id as usize, (text.to_owned(), kind));
    }
    let n = by_id.keys().next_back().map_or(0, |&k| k + 1);
    if by_id.len() != n {
        return Err(bad("token ids have gaps"));
    }
    let mut tokens = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for (_, (text, kind)) in by_id {
        types.push(if VISIBLE.contains(&text.as_str()) {
            4
        } else {
            kind
        });
        tokens.push(text);
    }
    let merges: Option<Vec<String>> = model["merges"]
        .as_array()
        .ok_or_else(|| bad("no model.merges"))?
        .iter()
        .map(|m| match m {
            Json::String(s) => Some(s.clone()),
            Json::Array(p) => Some(format!("{} {}", p.first()?.as_str()?, p.get(1)?.as_str()?)),
            _ => None,
        })
        .collect();
    let merges = merges.ok_or_else(|| bad("a merge is neither \"a b\" nor [a, b]"))?;
    let tc = read_json("tokenizer_config.json")?.unwrap_or(Json::Null);
    let meta = vec![
        (
            "tokenizer.ggml.model".to_owned(),
            Value::String("gemma4".into()),
        ),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(Array::String(merges)),
        ),
    ];
    let vocab = Vocab {
        scores: vec![-1000.0; tokens.len()],
        tokens,
        types,
        special: &[
            ("bos_token", "bos_token_id"),
            ("eos_token", "eos_token_id"),
            ("unk_token", "unknown_token_id"),
            ("pad_token", "padding_token_id"),
            ("mask_token", "mask_token_id"),
        ],
        // Gemma 4 needs BOS whatever its tokenizer_config.json says.
        always_bos: true,
    };
    vocab.into_metadata(meta, dir, &tc)
}

/// The standard normal quantile of `p` the way the converter computes it
/// (PyTorch's `Normal.icdf` in f32: erfinv(2p − 1)·√2, each step rounded to
/// f32), so the GGUF value is matched to the bit.
fn sparsity_scale(p: f32) -> f32 {
    let x = 2.0 * p - 1.0;
    let erfinv = (normal_quantile((f64::from(x) + 1.0) / 2.0) / std::f64::consts::SQRT_2) as f32;
    erfinv * std::f32::consts::SQRT_2
}

/// The standard normal distribution's quantile (Acklam's approximation,
/// relative error below 1.2e-9: exact once rounded to f32 but for values
/// within that of a rounding boundary).
fn normal_quantile(p: f64) -> f64 {
    if p <= 0.0 {
        return f64::NEG_INFINITY;
    }
    if p >= 1.0 {
        return f64::INFINITY;
    }
    const A: [f64; 6] = [
        -3.969683028665376e1,
        2.209460984245205e2,
        -2.759285104469687e2,
        1.383_577_518_672_69e2,
        -3.066479806614716e1,
        2.506628277459239,
    ];
    const B: [f64; 5] = [
        -5.447609879822406e1,
        1.615858368580409e2,
        -1.556989798598866e2,
        6.680131188771972e1,
        -1.328068155288572e1,
    ];
    const C: [f64; 6] = [
        -7.784894002430293e-3,
        -3.223964580411365e-1,
        -2.400758277161838,
        -2.549732539343734,
        4.374664141464968,
        2.938163982698783,
    ];
    const D: [f64; 4] = [
        7.784695709041462e-3,
        3.224671290700398e-1,
        2.445134137142996,
        3.754408661907416,
    ];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// A vocabulary read from a checkpoint, before it becomes metadata.
struct Vocab<'a> {
    tokens: Vec<String>,
    scores: Vec<f32>,
    types: Vec<i32>,
    /// `tokenizer_config.json` keys of special tokens and their GGUF keys.
    special: &'a [(&'a str, &'a str)],
    /// BOS is added whatever `add_bos_token` says.
    always_bos: bool,
}

impl Vocab<'_> {
    /// `meta` with the tokens, scores, types, the special tokens' ids (each
    /// named as a string or an `AddedToken` object), the BOS/EOS flags, the
    /// chat template and no space prefix.
    fn into_metadata(
        self,
        mut meta: Vec<(String, Value)>,
        dir: &Path,
        tc: &Json,
    ) -> Result<Tokenizer, HfError> {
        let n_vocab = self.tokens.len();
        for (key, gguf) in self.special {
            let text = tc
                .get(*key)
                .and_then(|v| v.as_str().or_else(|| v.get("content")?.as_str()));
            let id = text.and_then(|t| self.tokens.iter().position(|x| x == t));
            if let Some(id) = id {
                meta.push((format!("tokenizer.ggml.{gguf}"), Value::U32(id as u32)));
            }
        }
        let flag = |k: &str, default: bool| tc.get(k).and_then(Json::as_bool).unwrap_or(default);
        let add_bos = self.always_bos || flag("add_bos_token", true);
        meta.extend([
            (
                "tokenizer.ggml.tokens".to_owned(),
                Value::Array(Array::String(self.tokens)),
            ),
            (
                "tokenizer.ggml.scores".to_owned(),
                Value::Array(Array::F32(self.scores)),
            ),
            (
                "tokenizer.ggml.token_type".to_owned(),
                Value::Array(Array::I32(self.types)),
            ),
            (
                "tokenizer.ggml.add_bos_token".to_owned(),
                Value::Bool(add_bos),
            ),
            (
                "tokenizer.ggml.add_eos_token".to_owned(),
                Value::Bool(flag("add_eos_token", false)),
            ),
            (
                "tokenizer.ggml.add_space_prefix".to_owned(),
                Value::Bool(false),
            ),
        ]);
        if let Some(t) = chat_template(dir, tc)? {
            meta.push(("tokenizer.chat_template".into(), Value::String(t)));
        }
        Ok(Tokenizer { meta, n_vocab })
    }
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
    let mut stacks: BTreeMap<&'static str, BTreeMap<usize, safetensors::Tensor>> = BTreeMap::new();
    for (hf_name, t) in all {
        let (name, shift) = match gguf_name(&hf_name, arch, tied)? {
            Target::Skip => continue,
            Target::Stack(name, i) => {
                stacks.entry(name).or_default().insert(i, t);
                continue;
            }
            Target::Tensor(name, shift) => (name, shift),
        };
        let dims: Vec<u64> = t.shape.iter().rev().copied().collect();
        if shift || (t.ty != GgmlType::F32 && converter_keeps_f32(&name, dims.len())) {
            // GGUF keeps these in f32 (and 1 + w for the shifted norms).
            let n = t.shape.iter().product::<u64>() as usize;
            let mut f = vec![0f32; n];
            rlx_gguf::dequantize(t.ty, t.bytes(), &mut f).map_err(|e| HfError::File {
                path: dir.to_owned(),
                msg: format!("tensor {hf_name}: {e}"),
            })?;
            let bytes: Vec<u8> = f
                .iter()
                .flat_map(|&x| if shift { x + 1.0 } else { x }.to_le_bytes())
                .collect();
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
    for (name, parts) in stacks {
        let first = parts
            .values()
            .next()
            .ok_or_else(|| HfError::Unsupported(format!("{name}: no matrices to stack")))?;
        let (ty, shape) = (first.ty, first.shape.clone());
        let complete = parts.keys().copied().eq(0..parts.len())
            && parts.values().all(|p| p.ty == ty && p.shape == shape);
        if !complete {
            return Err(HfError::Unsupported(format!(
                "{name}: the checkpoint's matrices are not 0..{} of one type and shape",
                parts.len()
            )));
        }
        let mut dims: Vec<u64> = shape.iter().rev().copied().collect();
        dims.push(parts.len() as u64);
        let bytes: Vec<u8> = parts
            .values()
            .flat_map(|p| p.bytes().iter().copied())
            .collect();
        out.push((name.to_owned(), ty, dims, TensorBytes::Owned(bytes)));
    }
    Ok(out)
}

/// Tensors llama.cpp's converter writes in f32 whatever the checkpoint's
/// type (its loader's kernels take only f32 for them): vectors, norms, the
/// MoE router, AltUp's coefficients, and anything not named `.weight`.
fn converter_keeps_f32(name: &str, n_dims: usize) -> bool {
    n_dims <= 1
        || name.ends_with("_norm.weight")
        || !name.ends_with(".weight")
        || [
            ".ffn_gate_inp.",
            ".altup_correct_coef.",
            ".altup_predict_coef.",
        ]
        .iter()
        .any(|part| name.contains(part))
}

/// Where a checkpoint tensor goes in the GGUF file.
enum Target {
    /// A tensor of this name; `true` when its values need the norm shift.
    Tensor(String, bool),
    /// The `index`-th matrix of a stacked tensor (Gemma 3n's AltUp
    /// projections, one HF tensor each, are one GGUF tensor).
    Stack(&'static str, usize),
    /// Not used by the language model.
    Skip,
}

/// The GGUF place of a checkpoint tensor.
fn gguf_name(hf: &str, arch: &str, tied: bool) -> Result<Target, HfError> {
    let skip = [
        "vision_tower.",
        "multi_modal_projector.",
        "audio_tower.",
        "embed_vision.",
        "embed_audio.",
        "model.vision_tower.",
        "model.multi_modal_projector.",
        "model.audio_tower.",
        "model.embed_vision.",
        "model.embed_audio.",
    ];
    if skip.iter().any(|s| hf.starts_with(s)) {
        return Ok(Target::Skip);
    }
    if hf == "lm_head.weight" {
        return Ok(if tied || arch == "gemma" {
            Target::Skip
        } else {
            Target::Tensor("output.weight".into(), false)
        });
    }
    let name = ["model.language_model.", "language_model.model.", "model."]
        .iter()
        .find_map(|p| hf.strip_prefix(p))
        .unwrap_or(hf);
    let unknown = || HfError::Unsupported(format!("tensor {hf} has no place in a {arch} model"));
    let norm_shift = matches!(arch, "gemma" | "gemma2" | "gemma3");
    let top = |g: &str, shift: bool| Ok(Target::Tensor(g.to_owned(), shift));
    match name {
        "embed_tokens.weight" => return top("token_embd.weight", false),
        "norm.weight" => return top("output_norm.weight", norm_shift),
        "embed_tokens_per_layer.weight" => return top("per_layer_token_embd.weight", false),
        "per_layer_model_projection.weight" => return top("per_layer_model_proj.weight", false),
        "per_layer_projection_norm.weight" => return top("per_layer_proj_norm.weight", false),
        _ => {}
    }
    for (prefix, stacked) in [
        ("altup_projections.", "altup_proj.weight"),
        ("altup_unembed_projections.", "altup_unembd_proj.weight"),
    ] {
        if let Some(rest) = name.strip_prefix(prefix) {
            let i = rest
                .strip_suffix(".weight")
                .and_then(|i| i.parse().ok())
                .ok_or_else(unknown)?;
            return Ok(Target::Stack(stacked, i));
        }
    }
    let rest = name.strip_prefix("layers.").ok_or_else(unknown)?;
    let (layer, part) = rest.split_once('.').ok_or_else(unknown)?;
    let layer: usize = layer.parse().map_err(|_| unknown())?;
    let post_attention = if arch == "gemma" {
        "ffn_norm.weight"
    } else {
        "post_attention_norm.weight"
    };
    let (gguf, shift) = match part {
        "input_layernorm.weight" => ("attn_norm.weight", norm_shift),
        "self_attn.q_proj.weight" => ("attn_q.weight", false),
        "self_attn.k_proj.weight" => ("attn_k.weight", false),
        "self_attn.v_proj.weight" => ("attn_v.weight", false),
        "self_attn.o_proj.weight" => ("attn_output.weight", false),
        "self_attn.q_norm.weight" => ("attn_q_norm.weight", norm_shift),
        "self_attn.k_norm.weight" => ("attn_k_norm.weight", norm_shift),
        "post_attention_layernorm.weight" => (post_attention, norm_shift),
        "pre_feedforward_layernorm.weight" => ("ffn_norm.weight", norm_shift),
        "post_feedforward_layernorm.weight" => ("post_ffw_norm.weight", norm_shift),
        "mlp.gate_proj.weight" => ("ffn_gate.weight", false),
        "mlp.up_proj.weight" => ("ffn_up.weight", false),
        "mlp.down_proj.weight" => ("ffn_down.weight", false),
        // Gemma 3n
        "altup.correct_output_scale" => ("altup_correct_scale.weight", false),
        "altup.correction_coefs.weight" => ("altup_correct_coef.weight", false),
        "altup.modality_router.weight" => ("altup_router.weight", false),
        "altup.prediction_coefs.weight" => ("altup_predict_coef.weight", false),
        "altup.router_norm.weight" => ("altup_router_norm.weight", false),
        "laurel.linear_left.weight" => ("laurel_l.weight", false),
        "laurel.linear_right.weight" => ("laurel_r.weight", false),
        "laurel.post_laurel_norm.weight" => ("laurel_post_norm.weight", false),
        "per_layer_input_gate.weight" => ("inp_gate.weight", false),
        "per_layer_projection.weight" => ("proj.weight", false),
        "post_per_layer_input_norm.weight" => ("post_norm.weight", false),
        // Gemma 4
        "layer_scalar" => ("layer_output_scale.weight", false),
        "experts.gate_up_proj" => ("ffn_gate_up_exps.weight", false),
        "experts.down_proj" => ("ffn_down_exps.weight", false),
        "router.proj.weight" => ("ffn_gate_inp.weight", false),
        "router.scale" => ("ffn_gate_inp.scale", false),
        "router.per_expert_scale" => ("ffn_down_exps.scale", false),
        "post_feedforward_layernorm_1.weight" => ("post_ffw_norm_1.weight", false),
        "post_feedforward_layernorm_2.weight" => ("post_ffw_norm_2.weight", false),
        "pre_feedforward_layernorm_2.weight" => ("pre_ffw_norm_2.weight", false),
        _ => return Err(unknown()),
    };
    Ok(Target::Tensor(format!("blk.{layer}.{gguf}"), shift))
}
