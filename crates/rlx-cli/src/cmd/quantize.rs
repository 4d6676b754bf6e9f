//! `rlx quantize`: a GGUF file or a Hugging Face checkpoint quantized as
//! llama-quantize would write it; and quantizing at load (`--quantize`).

use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use rlx_gemma::quantize::{quantize_gguf, FileType, QuantizeOptions};
use rlx_gguf::GgufFile;

#[derive(clap::Args)]
pub struct QuantizeArgs {
    /// The GGUF file or Hugging Face checkpoint directory to read.
    pub input: PathBuf,
    /// The GGUF file to write.
    pub output: PathBuf,
    /// File type: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K_S,
    /// Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M or Q6_K (llama-quantize's
    /// mixes: some tensors get more bits, norms and small tensors stay).
    #[arg(long = "type", value_name = "TYPE")]
    pub file_type: String,
    /// Every quantizable tensor gets the type itself (llama-quantize --pure).
    #[arg(long)]
    pub pure: bool,
    /// Threads.
    #[arg(short = 't', long, default_value_t = default_threads())]
    pub threads: usize,
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn file_type(name: &str, flag: &str) -> Result<FileType> {
    FileType::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = FileType::ALL.iter().map(|t| t.name()).collect();
        anyhow::anyhow!("{flag} {name:?}: expected one of {}", names.join(", "))
    })
}

fn bar(total: usize) -> Option<ProgressBar> {
    std::io::stderr().is_terminal().then(|| {
        let b = ProgressBar::new(total as u64);
        b.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} tensors {msg}")
                .expect("valid template"),
        );
        b
    })
}

/// The model at `path` quantized in memory, with a progress bar.
pub fn quantized_in_memory(path: &std::path::Path, ty: &str, threads: usize) -> Result<GgufFile> {
    let file_type = file_type(ty, "--quantize")?;
    let file = rlx_gemma::model::open_file(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let opts = QuantizeOptions {
        file_type,
        pure: false,
        threads,
    };
    let bar = bar(file.tensors().len());
    let mut out = Vec::new();
    quantize_gguf(&file, &opts, &mut out, &mut |i, p| {
        if let Some(b) = &bar {
            b.set_position(i as u64);
            b.set_message(format!("{} -> {}", p.name, p.to));
        }
    })
    .with_context(|| format!("quantizing {} to {file_type}", path.display()))?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(GgufFile::from_bytes(out)?)
}

pub fn run(args: &QuantizeArgs) -> Result<()> {
    let file_type = file_type(&args.file_type, "--type")?;
    if args.input == args.output {
        bail!("the output would overwrite the input");
    }
    let file = rlx_gemma::model::open_file(&args.input)
        .with_context(|| format!("cannot read {}", args.input.display()))?;
    let opts = QuantizeOptions {
        file_type,
        pure: args.pure,
        threads: args.threads.max(1),
    };
    let out = std::fs::File::create(&args.output)
        .with_context(|| format!("cannot create {}", args.output.display()))?;
    let bar = bar(file.tensors().len());
    let start = Instant::now();
    let mut writer = BufWriter::new(out);
    let result = quantize_gguf(&file, &opts, &mut writer, &mut |i, p| {
        if let Some(b) = &bar {
            b.set_position(i as u64);
            b.set_message(format!("{} {} -> {}", p.name, p.from, p.to));
        }
    });
    let plan = match result.and_then(|p| {
        writer
            .flush()
            .map_err(|e| rlx_gemma::quantize::QuantizeError::Model(e.to_string()))?;
        Ok(p)
    }) {
        Ok(p) => p,
        Err(e) => {
            drop(writer);
            let _ = std::fs::remove_file(&args.output);
            return Err(e).with_context(|| format!("quantizing {}", args.input.display()));
        }
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let mut counts = std::collections::BTreeMap::new();
    for p in &plan {
        *counts.entry(p.to.name()).or_insert(0) += 1;
    }
    let mix: Vec<String> = counts.iter().map(|(t, n)| format!("{n} {t}")).collect();
    let size = std::fs::metadata(&args.output).map_or(0, |m| m.len());
    eprintln!(
        "{} -> {} ({file_type}{}): {} tensors ({}), {:.1} MiB in {:.1} s",
        args.input.display(),
        args.output.display(),
        if args.pure { ", pure" } else { "" },
        plan.len(),
        mix.join(", "),
        size as f64 / (1 << 20) as f64,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
