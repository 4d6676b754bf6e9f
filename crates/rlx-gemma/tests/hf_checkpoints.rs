//! Hugging Face checkpoints read directly (`Model::load(DIR)`): the tiny
//! models of every generation, as transformers saved them, against the f32
//! GGUFs llama.cpp converted from the same weights — the resolved config,
//! and the logits of every prompt (exact path); the tokenizer against
//! transformers' ids on the committed corpus, and the chat template against
//! `apply_chat_template` (both committed by scripts/tiny/hf_reference.py);
//! a checkpoint quantized to Q8_0 against llama-quantize's tensors.

mod common;

use common::{fixtures, rel_l2, ODD_SIZES, TINY_GENERATIONS};
use rlx_gemma::model::open_file;
use rlx_gemma::{GemmaConfig, Model, ModelOptions, Precision, SessionOptions};
use rlx_tokenizer::{ChatMessage, ChatOptions, ChatTemplate, EncodeOptions, Tokenizer};
use serde_json::Value;

fn jsonl(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .split('\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn exact(path: &std::path::Path) -> Model {
    Model::load(
        path,
        ModelOptions {
            precision: Precision::Exact,
            threads: 1,
            ..ModelOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// For each of the model's committed prompts, the relative L2 distance
/// between the logits `a` and `b` give.
/// The model's committed prompts (`prompts.json`): name and token ids.
fn prompts(dir: &std::path::Path) -> Vec<(String, Vec<u32>)> {
    let prompts: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).unwrap()).unwrap();
    prompts
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, ids)| {
            let ids = ids.as_array().unwrap().iter();
            (
                name.clone(),
                ids.map(|v| v.as_u64().unwrap() as u32).collect(),
            )
        })
        .collect()
}

fn prompt_distances(dir: &std::path::Path, a: &Model, b: &Model) -> Vec<(String, f64)> {
    prompts(dir)
        .into_iter()
        .map(|(name, ids)| {
            let score = |model: &Model| {
                let mut s = model.session(SessionOptions::default()).unwrap();
                s.score(&ids).unwrap()
            };
            (name, rel_l2(&score(a), &score(b)))
        })
        .collect()
}

#[test]
fn checkpoints_give_the_converted_files_config_and_logits() {
    for m in TINY_GENERATIONS {
        let dir = fixtures().join("tiny").join(m);
        let hf = dir.join("hf");
        let gguf = dir.join("model-f32.gguf");
        let a = GemmaConfig::from_gguf(&open_file(&hf).unwrap()).unwrap();
        let b = GemmaConfig::from_gguf(&open_file(&gguf).unwrap()).unwrap();
        assert_eq!(format!("{a:?}"), format!("{b:?}"), "{m}: configs differ");
        for (name, d) in prompt_distances(&dir, &exact(&hf), &exact(&gguf)) {
            assert!(d <= 1e-6, "{m} {name}: rel L2 {d:e}");
            eprintln!("{m} {name}: checkpoint against converted GGUF, rel L2 {d:e}");
        }
    }
}

#[test]
fn checkpoints_of_odd_sizes_match_transformers() {
    // The exact path against transformers' f32 logits: the same bound as
    // every f32 file (measured about 1e-6).
    for m in ODD_SIZES {
        let dir = fixtures().join("tiny").join(m);
        let model = exact(&dir.join("hf"));
        for (name, ids) in prompts(&dir) {
            let mut s = model
                .session(SessionOptions {
                    context: Some(ids.len()),
                    prefill_chunk: 7,
                    ..SessionOptions::default()
                })
                .unwrap();
            let ours = s.score(&ids).unwrap();
            let theirs = common::read_npy(&dir.join("hf-f32").join(format!("{name}.npy"))).f32s();
            let d = rel_l2(&ours, &theirs);
            eprintln!("{m} {name}: against transformers, rel L2 {d:e}");
            assert!(d < 1e-4, "{m} {name}: rel L2 {d:e}");
        }
    }
}

#[test]
fn tokenizer_and_chat_template_are_transformers() {
    let corpus: std::collections::HashMap<String, String> =
        jsonl(&fixtures().join("tokenizer/corpus.jsonl"))
            .into_iter()
            .filter_map(|c| {
                Some((
                    c["name"].as_str()?.to_owned(),
                    c["text"].as_str()?.to_owned(),
                ))
            })
            .collect();
    for m in TINY_GENERATIONS {
        let dir = fixtures().join("tiny").join(m);
        let file = open_file(&dir.join("hf")).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let mut checked = 0;
        for case in jsonl(&dir.join("hf-tokens.jsonl")) {
            let name = case["name"].as_str().unwrap();
            let want: Vec<u32> = case["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let got = tok.encode(
                &corpus[name],
                EncodeOptions {
                    add_bos: false,
                    parse_special: true,
                },
            );
            assert_eq!(got, want, "{m} {name}: {:?}", corpus[name]);
            checked += 1;
        }
        assert!(checked > 400, "{m}: {checked} strings");
        let template = ChatTemplate::from_gguf(&file).unwrap();
        assert!(
            !template.is_builtin(),
            "{m}: the checkpoint's template was not read"
        );
        for case in jsonl(&dir.join("hf-chat.jsonl")) {
            let messages: Vec<ChatMessage> = case["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap())
                })
                .collect();
            let opts = ChatOptions {
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                enable_thinking: None,
            };
            let got = template.render(&messages, &opts).unwrap();
            assert_eq!(got, case["text"].as_str().unwrap(), "{m}");
        }
        eprintln!("{m}: {checked} corpus strings tokenized as transformers does");
    }
}

#[test]
fn a_checkpoint_quantizes_to_llama_quantizes_tensors() {
    use rlx_gemma::quantize::{quantize_gguf, FileType, QuantizeOptions};
    // Every model with a committed llama-quantize Q8_0 file (not 3n).
    for m in TINY_GENERATIONS.into_iter().filter(|m| *m != "gemma3n") {
        let dir = fixtures().join("tiny").join(m);
        let hf = open_file(&dir.join("hf")).unwrap();
        let mut out = Vec::new();
        let opts = QuantizeOptions {
            file_type: FileType::Q8_0,
            pure: true,
            threads: 2,
        };
        quantize_gguf(&hf, &opts, &mut out, &mut |_, _| {}).unwrap();
        let ours = rlx_gguf::GgufFile::from_bytes(out).unwrap();
        // llama.cpp's: convert_hf_to_gguf.py, then llama-quantize --pure.
        let theirs = rlx_gguf::GgufFile::open(dir.join("model-Q8_0.gguf")).unwrap();
        assert_eq!(ours.tensors().len(), theirs.tensors().len(), "{m}");
        for t in theirs.tensors() {
            let o = ours
                .tensor(&t.name)
                .unwrap_or_else(|| panic!("{m}: no {}", t.name));
            assert_eq!((o.ty, &o.dims), (t.ty, &t.dims), "{m} {}", t.name);
            assert!(
                ours.tensor_data(o) == theirs.tensor_data(t),
                "{m} {}: bytes differ",
                t.name
            );
        }
    }
}

#[test]
fn gemma3n_tables_are_padded_to_the_vocabulary_as_the_converter_pads_them() {
    // The released Gemma 3n checkpoints have 262,144 rows of per-layer
    // embeddings for a vocabulary of 262,400 (image and audio tokens);
    // llama.cpp's converter pads the tables with zero rows, and its loader
    // wants them. The tiny 3n checkpoint told its vocabulary is 400 (the
    // tokenizer is padded to it) has 384 rows in both tables.
    use rlx_gemma::quantize::{quantize_gguf, FileType, QuantizeOptions};
    let dir = edited_checkpoint("gemma3n", "vocab-400", |d| {
        let p = d.join("config.json");
        let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        c["vocab_size"] = Value::from(400);
        std::fs::write(&p, c.to_string()).unwrap();
    });
    let hf = open_file(&dir).unwrap();
    let opts = QuantizeOptions {
        file_type: FileType::Q8_0,
        pure: true,
        threads: 2,
    };
    let mut out = Vec::new();
    quantize_gguf(&hf, &opts, &mut out, &mut |_, _| {}).unwrap();
    let ours = rlx_gguf::GgufFile::from_bytes(out).unwrap();
    for name in ["token_embd.weight", "per_layer_token_embd.weight"] {
        let (before, after) = (hf.tensor(name).unwrap(), ours.tensor(name).unwrap());
        assert_eq!(before.dims[1], 384, "{name}");
        assert_eq!(after.dims, [before.dims[0], 400], "{name}");
        let values = rlx_gguf::dequantize_to_vec(after.ty, ours.tensor_data(after)).unwrap();
        let row = before.dims[0] as usize;
        let kept = rlx_gguf::dequantize_to_vec(before.ty, hf.tensor_data(before)).unwrap();
        let q = rlx_gguf::quantize_to_vec(after.ty, &kept).unwrap();
        let requant = rlx_gguf::dequantize_to_vec(after.ty, &q).unwrap();
        assert_eq!(
            &values[..384 * row],
            &requant[..],
            "{name}: the file's rows"
        );
        assert!(
            values[384 * row..].iter().all(|&v| v == 0.0),
            "{name}: padding"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The tiny `model`'s checkpoint rewritten in a new directory: its
/// matrices stored as `dtype` (`"F32"`, or `"BF16"` / `"F16"` rounded to
/// nearest even; vectors kept in f32), the tensors dealt round-robin into
/// `shards` files named as transformers names them, with the index file
/// when there are several.
fn rewritten_checkpoint(model: &str, dtype: &str, shards: usize) -> std::path::PathBuf {
    rewrite(model, dtype, shards, false)
}

/// [`rewritten_checkpoint`], with the vectors of `dtype` too when
/// `vectors` (as the released bf16 checkpoints store them).
fn rewrite(model: &str, dtype: &str, shards: usize, vectors: bool) -> std::path::PathBuf {
    let src = fixtures().join("tiny").join(model).join("hf");
    let dst = std::env::temp_dir().join(format!(
        "rlx-hf-{model}-{dtype}-{shards}-{vectors}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        if e.file_name() != "model.safetensors" {
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut files: Vec<(serde_json::Map<String, Value>, Vec<u8>)> =
        vec![(serde_json::Map::new(), Vec::new()); shards];
    let name_of = |i: usize| {
        if shards == 1 {
            "model.safetensors".to_owned()
        } else {
            format!("model-{:05}-of-{shards:05}.safetensors", i + 1)
        }
    };
    let mut weight_map = serde_json::Map::new();
    for (k, (name, t)) in header
        .iter()
        .filter(|(n, _)| *n != "__metadata__")
        .enumerate()
    {
        let (out_header, out_data) = &mut files[k % shards];
        let shape = t["shape"].as_array().unwrap().clone();
        let off = t["data_offsets"].as_array().unwrap();
        let (a, b) = (
            off[0].as_u64().unwrap() as usize,
            off[1].as_u64().unwrap() as usize,
        );
        let start = out_data.len();
        let ty = if shape.len() >= 2 || vectors {
            dtype
        } else {
            "F32"
        };
        for c in data[a..b].chunks_exact(4) {
            let x = f32::from_le_bytes(c.try_into().unwrap());
            match ty {
                "BF16" => out_data.extend(half::bf16::from_f32(x).to_le_bytes()),
                "F16" => out_data.extend(half::f16::from_f32(x).to_le_bytes()),
                _ => out_data.extend(x.to_le_bytes()),
            }
        }
        out_header.insert(
            name.clone(),
            serde_json::json!({"dtype": ty, "shape": shape, "data_offsets": [start, out_data.len()]}),
        );
        weight_map.insert(name.clone(), Value::String(name_of(k % shards)));
    }
    for (i, (h, d)) in files.into_iter().enumerate() {
        let h = Value::Object(h).to_string().into_bytes();
        let mut file = (h.len() as u64).to_le_bytes().to_vec();
        file.extend(h);
        file.extend(d);
        std::fs::write(dst.join(name_of(i)), file).unwrap();
    }
    if shards > 1 {
        let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
        std::fs::write(dst.join("model.safetensors.index.json"), index.to_string()).unwrap();
    }
    dst
}

#[test]
fn half_checkpoints_keep_in_f32_what_the_converter_keeps_in_f32() {
    // A checkpoint stored wholly in bf16, vectors included, as released:
    // llama.cpp's converter writes vectors, norms, the MoE router and
    // AltUp's coefficients in f32 (its kernels take only f32 there), and
    // so does rlx's reading of it; the values are the bf16 ones, widened.
    for m in TINY_GENERATIONS {
        let hf = rewrite(m, "BF16", 1, true);
        let file = open_file(&hf).unwrap();
        let mut kept = 0;
        for t in file.tensors() {
            let f32_names = [
                ".ffn_gate_inp.",
                ".altup_correct_coef.",
                ".altup_predict_coef.",
            ];
            let forced = t.dims.len() <= 1
                || t.name.ends_with("_norm.weight")
                || f32_names.iter().any(|p| t.name.contains(p));
            if forced {
                assert_eq!(t.ty, rlx_gguf::GgmlType::F32, "{m} {}", t.name);
                // The bf16 values widened (Gemma 1–3's norms are 1 + w;
                // Gemma 4's rope_freqs come from the config).
                let shifted =
                    matches!(m, "gemma" | "gemma2" | "gemma3") && t.name.ends_with("norm.weight");
                if !shifted && t.name != "rope_freqs.weight" {
                    let data = file.tensor_data(t);
                    assert!(
                        data.chunks_exact(4).all(|c| c[0] == 0 && c[1] == 0),
                        "{m} {}: not bf16 values",
                        t.name
                    );
                }
                kept += 1;
            } else if t.dims.len() == 2 && t.name != "rope_freqs.weight" {
                assert_eq!(t.ty, rlx_gguf::GgmlType::BF16, "{m} {}", t.name);
            }
        }
        assert!(kept > 3, "{m}: {kept} f32 tensors");
        std::fs::remove_dir_all(&hf).unwrap();
    }
}

#[test]
fn a_sharded_checkpoint_reads_as_the_single_file_one() {
    let dir = fixtures().join("tiny/gemma3");
    let hf = rewritten_checkpoint("gemma3", "F32", 3);
    assert!(hf.join("model-00003-of-00003.safetensors").is_file());
    for (name, d) in prompt_distances(&dir, &exact(&hf), &exact(&dir.join("model-f32.gguf"))) {
        assert!(d == 0.0, "{name}: rel L2 {d:e}");
    }
    std::fs::remove_dir_all(&hf).unwrap();
}

#[test]
fn bf16_and_f16_checkpoints_give_the_converted_half_files_logits() {
    let dir = fixtures().join("tiny/gemma");
    for (dtype, gguf) in [("BF16", "model-bf16.gguf"), ("F16", "model-f16.gguf")] {
        let hf = rewritten_checkpoint("gemma", dtype, 1);
        for (name, d) in prompt_distances(&dir, &exact(&hf), &exact(&dir.join(gguf))) {
            assert!(d <= 1e-6, "{dtype} {name}: rel L2 {d:e}");
        }
        std::fs::remove_dir_all(&hf).unwrap();
    }
}

/// A copy of the tiny Gemma 3 checkpoint with `edit` applied to it.
fn broken_checkpoint(tag: &str, edit: impl FnOnce(&std::path::Path)) -> std::path::PathBuf {
    edited_checkpoint("gemma3", tag, edit)
}

/// A copy of the tiny `model`'s checkpoint with `edit` applied to it.
fn edited_checkpoint(
    model: &str,
    tag: &str,
    edit: impl FnOnce(&std::path::Path),
) -> std::path::PathBuf {
    let src = fixtures().join("tiny").join(model).join("hf");
    let dst = std::env::temp_dir().join(format!("rlx-hf-{model}-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    edit(&dst);
    dst
}

#[test]
fn broken_checkpoints_are_errors_that_say_what_is_wrong() {
    let set_config = |key: &str, value: Value| {
        let key = key.to_owned();
        move |d: &std::path::Path| {
            let p = d.join("config.json");
            let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            c[key.as_str()] = value;
            std::fs::write(p, c.to_string()).unwrap();
        }
    };
    /// What the directory gets, and a word its error must contain.
    type Edit = Box<dyn FnOnce(&std::path::Path)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "json",
            Box::new(|d: &std::path::Path| std::fs::write(d.join("config.json"), "{oops").unwrap()),
            "config.json",
        ),
        (
            "type",
            Box::new(set_config("model_type", "llama".into())),
            "model_type",
        ),
        (
            "layers",
            Box::new(set_config("num_hidden_layers", "six".into())),
            "num_hidden_layers",
        ),
        (
            "blocks",
            Box::new(|d: &std::path::Path| {
                let p = d.join("config.json");
                let mut c: Value =
                    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
                c["num_hidden_layers"] = 64.into();
                c.as_object_mut().unwrap().remove("layer_types");
                std::fs::write(p, c.to_string()).unwrap();
            }),
            "block_count",
        ),
        (
            "types",
            Box::new(set_config(
                "layer_types",
                serde_json::json!(["full_attention"]),
            )),
            "layer_types",
        ),
        (
            "truncated",
            Box::new(|d: &std::path::Path| {
                let p = d.join("model.safetensors");
                let b = std::fs::read(&p).unwrap();
                std::fs::write(&p, &b[..b.len() / 2]).unwrap();
            }),
            "model.safetensors",
        ),
        (
            "header",
            Box::new(|d: &std::path::Path| {
                let p = d.join("model.safetensors");
                std::fs::write(&p, (u64::MAX).to_le_bytes()).unwrap();
            }),
            "header",
        ),
        (
            "dtype",
            Box::new(|d: &std::path::Path| {
                let p = d.join("model.safetensors");
                let b = std::fs::read(&p).unwrap();
                let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
                let h = String::from_utf8(b[8..8 + n].to_vec()).unwrap();
                let h = h.replacen("\"F32\"", "\"I64\"", 1);
                let mut out = (h.len() as u64).to_le_bytes().to_vec();
                out.extend(h.into_bytes());
                out.extend(&b[8 + n..]);
                std::fs::write(&p, out).unwrap();
            }),
            "I64",
        ),
        (
            "tokenizer",
            Box::new(|d: &std::path::Path| {
                std::fs::remove_file(d.join("tokenizer.model")).unwrap()
            }),
            "tokenizer.model",
        ),
        (
            "spm",
            Box::new(|d: &std::path::Path| {
                std::fs::write(d.join("tokenizer.model"), [0xffu8; 7]).unwrap()
            }),
            "SentencePiece",
        ),
        (
            "weights",
            Box::new(|d: &std::path::Path| {
                std::fs::remove_file(d.join("model.safetensors")).unwrap()
            }),
            "safetensors",
        ),
    ];
    for (tag, edit, says) in cases {
        let dir = broken_checkpoint(tag, edit);
        let err = match Model::load(&dir, ModelOptions::default()) {
            Ok(_) => panic!("{tag}: the broken checkpoint loaded"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains(says),
            "{tag}: {err:?} does not mention {says:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
