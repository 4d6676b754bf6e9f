//! `rlx models`: the GGUF models rlx can find by name.

use std::io::Write;

use anyhow::Result;

use super::common::INSTRUCT_MODEL;
use super::stores::{list, Roots};

pub fn run() -> Result<()> {
    let roots = Roots::from_env();
    let found = list(&roots);
    let mut out = std::io::stdout().lock();
    if found.is_empty() {
        writeln!(
            out,
            "no models in rlx's cache ({}), Ollama, LM Studio or the Hugging Face cache (fetch the default one from a checkout of rlx with `bash scripts/fetch-model.sh`, others with `rlx pull ORG/REPO`, e.g. `rlx pull {INSTRUCT_MODEL}`)",
            roots
                .rlx
                .as_ref()
                .map_or("RLX_HOME unset".into(), |d| d.display().to_string())
        )?;
    }
    for f in found {
        writeln!(
            out,
            "{}\t{}\t{:.1} MiB\t{}",
            f.name,
            f.store,
            f.bytes as f64 / 1048576.0,
            f.path.display()
        )?;
    }
    Ok(())
}
