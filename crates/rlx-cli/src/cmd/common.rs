//! Options shared by the commands that run a model.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use rlx_gemma::{Device, GpuLayers, Model, ModelOptions, Offload};
use rlx_gguf::GgufFile;
use rlx_runtime::cpu::features::Isa;
use rlx_runtime::Precision;
use rlx_runtime::{KvChoice, KvDType, KvTypes};
use rlx_tokenizer::{ChatTemplate, Tuning, BUILTIN_TEMPLATES};

/// The model used when `-m` is not given (fetched by scripts/fetch-model.sh).
pub const DEFAULT_MODEL: &str = "gemma-3-270m-q4_k_m";

#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model: a GGUF path, a Hugging Face checkpoint directory, or a name
    /// (`rlx models` lists them).
    #[arg(short = 'm', long = "model", default_value = DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Fetch the model first when no store has it, as `rlx pull` does
    /// (`-m ORG/REPO[:QUANT]` from Hugging Face into its hub cache, `-m
    /// NAME[:TAG]` from Ollama's registry into Ollama's store).
    #[arg(long)]
    pub pull: bool,
    /// Quantize the weights as they load, with llama-quantize's mix for this
    /// file type (Q8_0, Q4_0, Q4_K_M, Q6_K, …; see `rlx quantize`): for a
    /// checkpoint of f32/f16/bf16 weights, or to requantize a GGUF.
    #[arg(long, value_name = "TYPE")]
    pub quantize: Option<String>,
    /// Threads (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Matmul arithmetic: `q8` (the fast path: activations quantized to 8
    /// bits and integer dot products, as llama.cpp does, on a CPU and for
    /// decode on a GPU, where products of many tokens run in bf16 on the
    /// tensor cores) or `exact`
    /// (f32 on the exactly dequantized weights: matches transformers to
    /// ~1e-6, for parity checks).
    #[arg(long, default_value = "q8", value_parser = ["exact", "q8"])]
    pub precision: String,
    /// Each sequence's logits do not depend on the others in a step (the
    /// same seed gives the same text whatever else runs): `q8` products take
    /// the row kernels at every batch size, at some cost to batched speed.
    #[arg(long)]
    pub batch_invariant: bool,
    /// The highest instruction set the CPU kernels may use: `auto` (the
    /// best this CPU has), or `avx512`, `avx2`, `neon`, `scalar` to compare
    /// paths on one machine (e.g. the AVX2-only path of a CPU with AVX-512).
    #[arg(long, default_value = "auto", value_parser = ["auto", "avx512", "avx2", "neon", "scalar"])]
    pub isa: String,
    /// The CPU's decode kernels per weight type: `measured` (the faster of
    /// its 256- and 512-bit kernels on this CPU, timed at start in about
    /// 10 ms; the same results) or `widest`. `rlx bench --json` names the
    /// choice under `backend`.
    #[arg(long, default_value = "measured", value_parser = ["measured", "widest"])]
    pub kernels: String,
    /// K/V cache type of keys and values: `f32`, `f16`, `bf16` (half the
    /// cache memory and bandwidth), `q8_0`, `q4_0` (ggml's blocks: about a
    /// quarter and an eighth of f32), or `auto`: f32 with `exact`, f16 with
    /// `q8` (what llama.cpp keeps).
    #[arg(long = "kv-type", default_value = "auto", value_parser = KV_TYPES)]
    pub kv_type: String,
    /// The keys' cache type, overriding `--kv-type` (also `-ctk`).
    #[arg(long = "cache-type-k", value_parser = KV_TYPES)]
    pub cache_type_k: Option<String>,
    /// The values' cache type, overriding `--kv-type` (also `-ctv`).
    #[arg(long = "cache-type-v", value_parser = KV_TYPES)]
    pub cache_type_v: Option<String>,
    /// Where to run: `cpu`, or `cuda` / `cuda:N` for GPU N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// With a GPU: how many layers run there (the last ones, with the LM
    /// head; the rest run on the CPU, their weights read where mapped), or
    /// `auto`: every layer when the model, its K/V and scratch fit in the
    /// GPU's free memory, else as many as fit. Also `-ngl` (llama.cpp's
    /// count includes the LM head: its `-ngl N+1` is rlx's `-ngl N`).
    #[arg(
        long = "gpu-layers",
        visible_alias = "n-gpu-layers",
        default_value = "auto"
    )]
    pub gpu_layers: String,
    /// With a GPU: keep every layer's experts in host memory and run them
    /// on the CPU (a mixture-of-experts model's bulk).
    #[arg(long = "cpu-moe")]
    pub cpu_moe: bool,
    /// With a GPU: keep the experts of the first N layers in host memory.
    #[arg(long = "n-cpu-moe", value_name = "N", conflicts_with = "cpu_moe")]
    pub n_cpu_moe: Option<usize>,
}

/// What the K/V type flags take.
const KV_TYPES: [&str; 6] = ["auto", "f32", "f16", "bf16", "q8_0", "q4_0"];

impl ModelArgs {
    /// The keys' and values' cache types the flags ask for, each `None`
    /// where it is `auto`.
    fn kv_choice(&self) -> KvChoice {
        let flag = |f: &Option<String>| KvDType::parse(f.as_deref().unwrap_or(&self.kv_type));
        KvChoice {
            k: flag(&self.cache_type_k),
            v: flag(&self.cache_type_v),
        }
    }

    /// The cache types for `model`: what the flags ask for, the device's
    /// default for the precision where they say `auto`; `None` when both
    /// are `auto`.
    pub fn kv_types(&self, model: &Model) -> Option<KvTypes> {
        let choice = self.kv_choice();
        (choice != KvChoice::default()).then(|| choice.resolve(model.default_kv_dtype()))
    }

    /// The instruction-set cap `--isa` names (`None` for `auto`); one this
    /// CPU lacks is an error.
    pub fn isa(&self) -> Result<Option<Isa>> {
        let isa = match self.isa.as_str() {
            "auto" => return Ok(None),
            "avx512" => Isa::Avx512,
            "avx2" => Isa::Avx2,
            "neon" => Isa::Neon,
            _ => Isa::Scalar,
        };
        let arm = cfg!(target_arch = "aarch64");
        let this_arch = isa == Isa::Scalar || (isa == Isa::Neon) == arm;
        if !this_arch || isa > Isa::detect() {
            bail!(
                "--isa {isa}: this CPU's kernels go up to {} (choose from {})",
                Isa::detect(),
                Isa::supported()
                    .iter()
                    .map(|i| i.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        Ok(Some(isa))
    }

    /// The device `--device` names.
    pub fn device(&self) -> Result<Device> {
        Device::parse(&self.device).map_err(|e| anyhow::anyhow!("--device: {e}"))
    }

    /// The arithmetic that runs (`--precision`).
    pub fn precision_name(&self) -> &str {
        &self.precision
    }

    /// The model, fitted (on a GPU) for 4,096 tokens of K/V.
    pub fn load(&self) -> Result<Model> {
        self.load_for(None)
    }

    /// The model; on a GPU fitted for `kv_tokens` tokens of K/V over all
    /// sequences (4,096 when `None`), with a line on stderr saying how it
    /// was split when it was.
    pub fn load_for(&self, kv_tokens: Option<usize>) -> Result<Model> {
        let path = resolve_model(&self.model)?;
        let mut opts = ModelOptions::default();
        if let Some(t) = self.threads {
            if t == 0 {
                bail!("--threads must be at least 1");
            }
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            opts.threads = if t > cores {
                eprintln!("warning: --threads {t} is more than the {cores} this machine has; using {cores}");
                cores
            } else {
                t
            };
        }
        opts.device = self.device()?;
        opts.precision = match self.precision.as_str() {
            "q8" => Precision::Quantized,
            _ => Precision::Exact,
        };
        opts.batch_invariant = self.batch_invariant;
        opts.isa = self.isa()?;
        opts.measure_kernels = self.kernels == "measured";
        opts.offload = self.offload(kv_tokens, opts.device)?;
        // NVRTC takes tens of seconds over the GPU kernels at every start
        // without a cache.
        opts.kernel_cache = super::stores::Roots::from_env().kernels;
        let model = match &self.quantize {
            None => Model::load(&path, opts),
            Some(ty) => {
                let file = super::quantize::quantized_in_memory(&path, ty, opts.threads)?;
                Model::from_file(file, opts)
            }
        }
        .with_context(|| format!("cannot load {}", path.display()))?;
        let choice = self.kv_choice();
        let readable = model.backend().kv_dtypes();
        if let Some(kv) = [choice.k, choice.v]
            .into_iter()
            .flatten()
            .find(|kv| !readable.contains(kv))
        {
            bail!(
                "K/V type {}: {} keeps K/V as {:?}",
                kv.name(),
                model.device(),
                readable.iter().map(|t| t.name()).collect::<Vec<_>>()
            );
        }
        for w in model.config().warnings() {
            eprintln!("warning: {}: {w}", path.display());
        }
        if let Some(split) = model.split() {
            eprintln!("split: {split}");
        }
        Ok(model)
    }

    /// What `--gpu-layers`, `--cpu-moe` and `--n-cpu-moe` ask for.
    fn offload(&self, kv_tokens: Option<usize>, device: Device) -> Result<Offload> {
        let gpu_layers = match self.gpu_layers.as_str() {
            "auto" => GpuLayers::Auto,
            n => GpuLayers::Count(
                n.parse()
                    .with_context(|| format!("--gpu-layers {n:?}: a number of layers or `auto`"))?,
            ),
        };
        let cpu_moe_layers = match (self.cpu_moe, self.n_cpu_moe) {
            (true, _) => usize::MAX,
            (false, n) => n.unwrap_or(0),
        };
        if device == Device::Cpu && (gpu_layers != GpuLayers::Auto || cpu_moe_layers > 0) {
            bail!("--gpu-layers, --cpu-moe and --n-cpu-moe need a GPU (--device cuda)");
        }
        Ok(Offload {
            gpu_layers,
            cpu_moe_layers,
            kv_tokens: kv_tokens.unwrap_or(Offload::default().kv_tokens),
            kv_types: self.kv_choice(),
        })
    }
}

/// `n` bytes in the largest binary unit that keeps a whole number before
/// the point, with `decimals` after it (`394.2 KiB`; `15 B`).
pub fn human_bytes(n: u64, decimals: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = n as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{x:.decimals$} {}", UNITS[u])
    }
}

/// `--chat-template`, on the commands that wrap prompts in a chat template.
#[derive(clap::Args, Clone, Debug)]
pub struct TemplateArgs {
    /// The chat template, instead of the file's own or the one guessed
    /// from its vocabulary: a Jinja file (as Hugging Face's
    /// `chat_template.jinja`: `messages`, `add_generation_prompt`,
    /// `bos_token`), or a built-in format by name: `gemma` (Gemma 1 to 3n
    /// turns) or `gemma4` (Gemma 4 turns, without tools). A name comes
    /// before a file of that name (write `./gemma` for the file).
    #[arg(long = "chat-template", value_name = "FILE|NAME")]
    pub chat_template: Option<String>,
}

impl TemplateArgs {
    /// The template asked for, checked before any model loads: a built-in
    /// format, or a Jinja file read and compiled.
    pub fn chosen(&self) -> Result<Option<ChatTemplate>> {
        let Some(value) = &self.chat_template else {
            return Ok(None);
        };
        if let Some(t) = ChatTemplate::builtin(value) {
            return Ok(Some(t));
        }
        if !std::path::Path::new(value).is_file() {
            bail!(
                "--chat-template {value}: no such file, nor a built-in template (the built-in ones: {})",
                BUILTIN_TEMPLATES.join(", ")
            );
        }
        let source = std::fs::read_to_string(value)
            .with_context(|| format!("--chat-template: cannot read {value}"))?;
        // BOS and EOS are the model's, set once it is loaded.
        Ok(Some(ChatTemplate::from_jinja_named(
            value, &source, "<bos>", "<eos>",
        )?))
    }
}

/// The template chat turns are rendered with: the one `--chat-template`
/// chose (with the file's BOS and EOS), else the file's own, else Gemma's
/// built-in format for its vocabulary.
pub fn chat_template(chosen: Option<ChatTemplate>, file: &GgufFile) -> Result<ChatTemplate> {
    Ok(match chosen {
        Some(t) => t.with_special_tokens_of(file),
        None => ChatTemplate::from_gguf(file)?,
    })
}

/// A line for chat, the server and `rlx run` (where it applies `template`)
/// when the file's model was not tuned for chat, or its template was
/// guessed; `None` when the file carries its own template or
/// `--chat-template` chose one (`chosen`) for an instruction-tuned model.
pub fn tuning_note(
    file: &GgufFile,
    given: &std::path::Path,
    template: &ChatTemplate,
    chosen: bool,
) -> Option<String> {
    let name = given.display();
    let guessed = format!(
        "built-in `{}` template, guessed from its vocabulary, wraps the turns \
         (--chat-template FILE|NAME overrides it)",
        template.name()
    );
    match Tuning::of(file) {
        Tuning::Chat => None,
        Tuning::InstructWithoutTemplate if chosen => None,
        Tuning::InstructWithoutTemplate => {
            Some(format!("note: {name} has no chat template: the {guessed}"))
        }
        Tuning::Base => Some(format!(
            "note: {name} is a base model (no chat template, and nothing in its name says \
             instruction-tuned): it continues text rather than following instructions, and a \
             system prompt does not change that. Continue a text with `rlx run --raw \"...\"`, \
             or use an instruction-tuned model: `rlx models` lists those found, \
             `rlx pull {INSTRUCT_MODEL}` fetches one, then `-m {INSTRUCT_MODEL}`.{}",
            if chosen {
                String::new()
            } else {
                format!(" The {guessed}.")
            }
        )),
    }
}

/// An instruction-tuned Gemma 3 270M (Q4_K_M by default) on Hugging Face,
/// suggested where the default base model cannot follow instructions.
pub const INSTRUCT_MODEL: &str = "unsloth/gemma-3-270m-it-GGUF";

/// A path as given, or the model a name means (`super::stores::resolve`).
pub fn resolve_model(given: &std::path::Path) -> Result<PathBuf> {
    super::stores::resolve(given, &super::stores::Roots::from_env())
}

/// Parses `2,818,5279` into token ids.
pub fn parse_tokens(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .map(|t| {
            t.trim()
                .parse::<u32>()
                .with_context(|| format!("bad token id {t:?} in --tokens"))
        })
        .collect()
}
