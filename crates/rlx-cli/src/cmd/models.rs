//! `rlx models`: the cached models.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;

/// `$RLX_HOME`, else `~/.cache/rlx/models`.
pub fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("RLX_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rlx/models")))
}

pub fn run() -> Result<()> {
    let mut out = std::io::stdout().lock();
    let Some(dir) = cache_dir() else {
        writeln!(out, "no model cache (set RLX_HOME)")?;
        return Ok(());
    };
    let mut found = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "gguf") {
                let bytes = e.metadata().map(|m| m.len()).unwrap_or(0);
                found.push((p, bytes));
            }
        }
    }
    found.sort();
    if found.is_empty() {
        writeln!(
            out,
            "no models in {} (fetch the default one with scripts/fetch-model.sh)",
            dir.display()
        )?;
    }
    for (p, bytes) in found {
        let name = p
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        writeln!(
            out,
            "{name}\t{:.1} MiB\t{}",
            bytes as f64 / 1048576.0,
            p.display()
        )?;
    }
    Ok(())
}
