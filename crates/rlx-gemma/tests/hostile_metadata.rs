//! Valid GGUF containers whose model metadata is nonsense: every tiny model
//! of every generation, one key at a time set to a value no model has or
//! one its tensors contradict (expert counts, AltUp streams, per-layer
//! input widths). Each
//! must be refused with an error naming the key (and nothing may panic);
//! the untouched files must still load.

mod common;

use std::path::Path;

use common::fixtures;
use rlx_gemma::{ConfigError, GemmaConfig};
use rlx_gguf::{GgufFile, GgufWriter, Value};

/// `src` with the metadata `changes` applied (`None` removes a key).
fn rewrite(src: &Path, changes: &[(String, Option<Value>)]) -> GgufFile {
    let f = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in f.metadata() {
        match changes.iter().find(|(k, _)| k == key) {
            Some((_, Some(v))) => w.add(key, v.clone()).unwrap(),
            Some((_, None)) => continue,
            None => w.add(key, value.clone()).unwrap(),
        };
    }
    for (key, value) in changes {
        if let (Some(v), None) = (value, f.get(key)) {
            w.add(key, v.clone()).unwrap();
        }
    }
    for t in f.tensors() {
        w.add_tensor(&t.name, t.ty, &t.dims, f.tensor_data(t).to_vec())
            .unwrap();
    }
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

const MODELS: [(&str, &str); 7] = [
    ("gemma", "gemma"),
    ("gemma2", "gemma2"),
    ("gemma3", "gemma3"),
    ("gemma3n", "gemma3n"),
    ("gemma4-dense", "gemma4"),
    ("gemma4-ple", "gemma4"),
    ("gemma4-moe", "gemma4"),
];

#[test]
fn the_untouched_files_load() {
    for (dir, _) in MODELS {
        let path = fixtures().join("tiny").join(dir).join("model-f32.gguf");
        GemmaConfig::from_gguf(&GgufFile::open(&path).unwrap())
            .unwrap_or_else(|e| panic!("{dir}: {e}"));
    }
}

#[test]
fn odd_but_harmless_values_load_with_a_warning() {
    let path = fixtures().join("tiny/gemma3/model-f32.gguf");
    let clean = GemmaConfig::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    assert!(clean.warnings().is_empty(), "{:?}", clean.warnings());
    for (key, value, says) in [
        (
            "gemma3.attention.layer_norm_rms_epsilon",
            Value::from(0.1f32),
            "1e-6",
        ),
        ("gemma3.context_length", Value::from(1u32 << 30), "131,072"),
        ("gemma3.rope.freq_base", Value::from(2f32), "10,000"),
    ] {
        let file = rewrite(&path, &[(key.to_owned(), Some(value))]);
        let cfg = GemmaConfig::from_gguf(&file).unwrap_or_else(|e| panic!("{key}: {e}"));
        let w = cfg.warnings();
        assert!(
            w.iter().any(|w| w.contains(key) && w.contains(says)),
            "{key}: {w:?}"
        );
    }
}

#[test]
fn nonsense_metadata_is_refused_by_key() {
    let mut failures = Vec::new();
    for (dir, arch) in MODELS {
        let path = fixtures().join("tiny").join(dir).join("model-f32.gguf");
        let layers = GemmaConfig::from_gguf(&GgufFile::open(&path).unwrap())
            .unwrap()
            .layers
            .len() as u32;
        let k = |s: &str| format!("{arch}.{s}");
        let mut cases: Vec<(String, Value)> = vec![
            (k("block_count"), 0u32.into()),
            (k("block_count"), (layers + 1).into()),
            (k("block_count"), (layers - 1).into()),
            (k("context_length"), 0u32.into()),
            (k("attention.layer_norm_rms_epsilon"), 0f32.into()),
            (k("attention.layer_norm_rms_epsilon"), f32::NAN.into()),
            (k("attention.layer_norm_rms_epsilon"), (-1e-6f32).into()),
            (k("rope.freq_base"), 0f32.into()),
            (k("rope.freq_base"), f32::INFINITY.into()),
            (k("rope.freq_base"), (-10000f32).into()),
            (k("attention.head_count"), 0u32.into()),
            (k("feed_forward_length"), 0u32.into()),
        ];
        if arch == "gemma2" {
            cases.push((k("attention.sliding_window"), 0u32.into()));
            cases.push((k("final_logit_softcapping"), (-30f32).into()));
            cases.push((k("attn_logit_softcapping"), f32::NAN.into()));
        }
        if arch != "gemma" {
            cases.push((k("rope.freq_base_swa"), 0f32.into()));
        }
        // Sizes of one generation's own parts, against its tensors.
        if dir == "gemma3n" {
            for v in [0u32, 1, 3, 5, 99] {
                cases.push((k("altup.num_inputs"), v.into()));
            }
            cases.push((k("altup.active_idx"), 2u32.into()));
        }
        if dir == "gemma3n" || dir == "gemma4-ple" {
            for v in [0u32, 1, 255, 4096] {
                cases.push((k("embedding_length_per_layer_input"), v.into()));
            }
        }
        if dir == "gemma4-dense" {
            cases.push((k("embedding_length_per_layer_input"), 16u32.into()));
        }
        if dir == "gemma4-moe" {
            for v in [0u32, 3, 5, 1000] {
                cases.push((k("expert_count"), v.into()));
            }
            cases.push((k("expert_used_count"), 0u32.into()));
            cases.push((k("expert_used_count"), 5u32.into()));
            for v in [0u32, 16, 64] {
                cases.push((k("expert_feed_forward_length"), v.into()));
            }
        }
        for (key, value) in cases {
            let shown = format!("{value:?}");
            let file = rewrite(&path, &[(key.clone(), Some(value))]);
            let result = std::panic::catch_unwind(|| GemmaConfig::from_gguf(&file));
            match result {
                Err(_) => failures.push(format!("{dir}: {key} = {shown}: panicked")),
                Ok(Ok(_)) => failures.push(format!("{dir}: {key} = {shown}: accepted")),
                Ok(Err(e)) => {
                    let named = match &e {
                        ConfigError::Invalid { key: k, .. } | ConfigError::Missing { key: k } => {
                            k == &key
                        }
                        _ => false,
                    };
                    if !named {
                        failures.push(format!(
                            "{dir}: {key} = {shown}: error {e} names another key"
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn an_assistant_drafter_is_refused_as_one() {
    let dir = fixtures().join("tiny/gemma4-assistant");
    let file = GgufFile::open(dir.join("model-f32.gguf")).unwrap();
    let e = GemmaConfig::from_gguf(&file).unwrap_err();
    assert!(
        matches!(
            e,
            ConfigError::Unsupported {
                arch: "gemma4-assistant",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("assistant drafter"), "{e}");
    let e = rlx_gemma::hf::open(&dir.join("hf"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("gemma4_assistant") && e.contains("not supported yet"),
        "{e}"
    );
}
