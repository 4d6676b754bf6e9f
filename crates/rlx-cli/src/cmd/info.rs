//! `rlx info`: what is inside a GGUF file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use rlx_gguf::{Array, GgmlType, GgufFile, Value};
use serde_json::{json, Map, Value as Json};

use super::common::human_bytes;

/// Arrays longer than this are summarised (length and first items).
const ARRAY_SUMMARY_LEN: usize = 16;
/// Items shown of a summarised array.
const ARRAY_HEAD: usize = 8;

#[derive(clap::Args)]
pub struct InfoArgs {
    /// Path to the GGUF file (or a Hugging Face checkpoint directory, shown
    /// as the GGUF it reads as).
    pub model: PathBuf,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &InfoArgs) -> Result<()> {
    let file = rlx_gemma::model::open_file(&args.model)
        .with_context(|| format!("cannot read {}", args.model.display()))?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &to_json(&file))?;
        writeln!(out)?;
    } else {
        print_text(&file, &mut out)?;
    }
    Ok(())
}

fn scalar_json(v: &Value) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::F32(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Array(a) => array_json(a),
    }
}

fn array_items(a: &Array, n: usize) -> Vec<Json> {
    (0..n.min(a.len()))
        .map(|i| scalar_json(&a.get(i).expect("index in range")))
        .collect()
}

fn array_json(a: &Array) -> Json {
    if a.len() > ARRAY_SUMMARY_LEN {
        json!({
            "type": a.elem_type().name(),
            "len": a.len(),
            "head": array_items(a, ARRAY_HEAD),
        })
    } else {
        Json::Array(array_items(a, a.len()))
    }
}

fn to_json(file: &GgufFile) -> Json {
    let metadata: Map<String, Json> = file
        .metadata()
        .iter()
        .map(|(k, v)| (k.clone(), scalar_json(v)))
        .collect();
    let tensors: Vec<Json> = file
        .tensors()
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ty.name(),
                "shape": t.dims,
                "offset": t.offset,
                "bytes": t.n_bytes,
            })
        })
        .collect();
    json!({
        "version": file.version(),
        "alignment": file.alignment(),
        "data_offset": file.data_offset(),
        "file_bytes": file.file_len(),
        "metadata": metadata,
        "tensors": tensors,
    })
}

fn value_text(v: &Value) -> String {
    match v {
        Value::Array(a) if a.len() > ARRAY_SUMMARY_LEN => {
            let head: Vec<String> = (0..ARRAY_HEAD)
                .map(|i| a.get(i).expect("index in range").to_string())
                .collect();
            format!("[{}, ...] ({} items)", head.join(", "), a.len())
        }
        Value::String(s) if s.chars().count() > 120 => {
            let short: String = s.chars().take(117).collect();
            format!("{short:?}... ({} bytes)", s.len())
        }
        v => v.to_string(),
    }
}

fn print_text(file: &GgufFile, out: &mut impl Write) -> Result<()> {
    if let Some(p) = file.path() {
        writeln!(out, "file:        {}", p.display())?;
    }
    writeln!(out, "GGUF version {}", file.version())?;
    writeln!(
        out,
        "size:        {} ({} bytes)",
        human_bytes(file.file_len(), 2),
        file.file_len()
    )?;
    writeln!(out, "alignment:   {}", file.alignment())?;
    writeln!(out, "data offset: {}", file.data_offset())?;
    writeln!(out, "metadata:    {} keys", file.metadata().len())?;
    writeln!(out, "tensors:     {}", file.tensors().len())?;

    writeln!(out, "\nmetadata:")?;
    let key_width = file
        .metadata()
        .iter()
        .map(|(k, _)| k.len())
        .max()
        .unwrap_or(0);
    for (k, v) in file.metadata() {
        writeln!(
            out,
            "  {k:key_width$}  {:<14} {}",
            v.type_description(),
            value_text(v)
        )?;
    }

    writeln!(out, "\ntensors:")?;
    let name_width = file
        .tensors()
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    writeln!(
        out,
        "  {:name_width$}  {:<8} {:<24} {:>12}",
        "name", "type", "shape", "bytes"
    )?;
    let mut totals: BTreeMap<GgmlType, (usize, u64, u64)> = BTreeMap::new();
    for t in file.tensors() {
        let shape = format!("{:?}", t.dims);
        writeln!(
            out,
            "  {:name_width$}  {:<8} {:<24} {:>12}",
            t.name,
            t.ty.name(),
            shape,
            t.n_bytes
        )?;
        let e = totals.entry(t.ty).or_default();
        e.0 += 1;
        e.1 += t.n_elements;
        e.2 += t.n_bytes;
    }

    writeln!(out, "\ntotals by type:")?;
    writeln!(
        out,
        "  {:<8} {:>7} {:>14} {:>12}",
        "type", "tensors", "elements", "bytes"
    )?;
    let (mut n, mut elems, mut bytes) = (0, 0, 0);
    for (ty, (count, e, b)) in &totals {
        writeln!(
            out,
            "  {:<8} {count:>7} {e:>14} {b:>12}  ({})",
            ty.name(),
            human_bytes(*b, 2)
        )?;
        n += count;
        elems += e;
        bytes += b;
    }
    writeln!(
        out,
        "  {:<8} {n:>7} {elems:>14} {bytes:>12}  ({})",
        "all",
        human_bytes(bytes, 2)
    )?;
    Ok(())
}
