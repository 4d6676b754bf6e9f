//! A real tensor table (the tiny Gemma 3 and Gemma 4 fixtures) under
//! arbitrary metadata: the fuzzer picks keys and writes values of any type
//! into them. Resolving the config must return a config or an error, never
//! panic; a config it accepts must build a graph and compile a plan.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use rlx_gemma::{build_graph, GemmaConfig};
use rlx_gguf::{GgufFile, GgufWriter, Value};
use rlx_ir::{Bindings, Sym};
use rlx_runtime::cpu::{compile, CpuDevice};
use rlx_runtime::{CompileOptions, WeightStore};

fn sources() -> &'static [GgufFile] {
    static F: OnceLock<Vec<GgufFile>> = OnceLock::new();
    F.get_or_init(|| {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tiny");
        ["gemma3", "gemma4-ple", "gemma2"]
            .iter()
            .map(|m| GgufFile::open(format!("{root}/{m}/model-f32.gguf")).unwrap())
            .collect()
    })
}

/// A value of a type and size the input picks.
fn value(d: &[u8]) -> Value {
    let n = |i: usize| u32::from(*d.get(i).unwrap_or(&0));
    let word = n(1) | n(2) << 8 | n(3) << 16 | n(4) << 24;
    match d.first().copied().unwrap_or(0) % 6 {
        0 => Value::from(word),
        1 => Value::from(f32::from_bits(word)),
        2 => Value::from(word as i32),
        3 => Value::from(word & 1 == 1),
        4 => Value::from(
            (0..(word % 9))
                .map(|i| (word >> i) & 0xff)
                .collect::<Vec<u32>>(),
        ),
        _ => Value::from(String::from_utf8_lossy(&d[1.min(d.len())..]).as_ref()),
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let src = &sources()[data[0] as usize % sources().len()];
    let meta = src.metadata();
    // Edits of 6 bytes each: a key index, then the value.
    let edits: Vec<(usize, Value)> = data[1..]
        .chunks(6)
        .map(|c| (c[0] as usize % meta.len(), value(&c[1..])))
        .collect();
    let mut w = GgufWriter::new();
    for (i, (key, v)) in meta.iter().enumerate() {
        let v = edits.iter().rev().find(|e| e.0 == i).map_or(v, |e| &e.1);
        w.add(key, v.clone()).unwrap();
    }
    for t in src.tensors() {
        w.add_tensor(&t.name, t.ty, &t.dims, src.tensor_data(t).to_vec())
            .unwrap();
    }
    let Ok(file) = GgufFile::from_bytes(w.to_bytes()) else {
        return;
    };
    let Ok(cfg) = GemmaConfig::from_gguf(&file) else {
        return;
    };
    let store = Arc::new(WeightStore::new(Arc::new(file)));
    let Ok(graph) = build_graph(&cfg, &store) else {
        return;
    };
    let opts = CompileOptions::new(Bindings::new().with(Sym::SEQ, 4).with(Sym::ROWS, 1));
    let _ = compile(&graph, &store, &CpuDevice::new(1), &opts);
});
