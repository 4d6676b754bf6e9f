//! `rlx bench`: prompt-processing and generation speed, reported like
//! llama-bench (mean ± std of tokens/s over repetitions).

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Result};
use rlx_gemma::{Model, Session, SessionOptions};
use rlx_runtime::{KvTypes, RowReduce, StepProfile};
use serde_json::json;

use super::common::ModelArgs;
use super::sample_args::{draft_session, draft_source, load_draft, speculation, Spec};
use rlx_gemma::generate::{generate_with, GenerateStats, GenerationOptions, Speculation};
use rlx_gemma::sampling::{Sampler, SamplerConfig};
use rlx_tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt lengths to time (comma-separated); 0 skips.
    #[arg(
        short = 'p',
        long = "n-prompt",
        default_value = "512",
        value_delimiter = ','
    )]
    pub prompt: Vec<usize>,
    /// Generated lengths to time (comma-separated); 0 skips.
    #[arg(
        short = 'n',
        long = "n-gen",
        default_value = "128",
        value_delimiter = ','
    )]
    pub gen: Vec<usize>,
    /// Tokens already in the context before each test.
    #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
    pub depth: usize,
    /// Repetitions per test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Print a JSON array instead of a markdown table.
    #[arg(long)]
    pub json: bool,
    /// Sequences decoded together (comma-separated), as llama-batched-bench
    /// `-npl`: each of B sequences prefills its own `-p`-token prompt, then
    /// all decode `-n` tokens in steps of B; reports the aggregate speeds.
    #[arg(long = "batch", value_delimiter = ',')]
    pub batch: Vec<usize>,
    /// Bring every logit row back to the host whole, as llama-bench does,
    /// instead of reducing it on the device to its greedy choice as `rlx
    /// run` does (the same on a CPU).
    #[arg(long)]
    pub whole_rows: bool,
    /// Also time greedy generation of each `-n` length from a prompt that
    /// repeats itself, plain and with this kind of speculation
    /// (alternating), and report how many drafted tokens were kept.
    #[arg(long, value_enum)]
    pub spec: Option<Spec>,
    /// The most tokens a draft holds (as `rlx run --draft-max`).
    #[arg(long, default_value_t = 6)]
    pub draft_max: usize,
    /// As --spec, with drafts from this smaller model of the same
    /// vocabulary (as `rlx run --draft-model`): `tgN draft` rows.
    #[arg(long, value_name = "MODEL")]
    pub draft_model: Option<std::path::PathBuf>,
    /// After the timed runs, run each test once more with every kernel
    /// timed on its own (devices that can: CUDA), and print where a step's
    /// time goes, kernel by kernel. Kernels then run one at a time, without
    /// graphs, so these figures bound a step from above.
    #[arg(long)]
    pub profile: bool,
}

struct Row {
    test: String,
    tps: Vec<f64>,
    /// For speculative generation tests: tokens drafted and kept, and
    /// verification steps, summed over the repetitions.
    spec: Option<(usize, usize, usize)>,
    /// For generation tests: bytes read per token (weights + KV cache).
    bytes_per_token: Option<f64>,
    /// For generation tests: the probe's bandwidth right after each
    /// repetition, paired with `tps`.
    bandwidth: Vec<f64>,
}

impl Row {
    /// Fraction of the bandwidth roofline a generation test reaches: the
    /// mean over repetitions of tokens/s over (bandwidth / bytes per token),
    /// each repetition against the bandwidth measured next to it.
    fn roofline(&self) -> Option<f64> {
        let bytes = self.bytes_per_token?;
        let f: Vec<f64> = self
            .tps
            .iter()
            .zip(&self.bandwidth)
            .map(|(t, bw)| t * bytes / bw)
            .collect();
        (!f.is_empty()).then(|| mean_std(&f).0)
    }
}

/// A read-bandwidth probe: `threads` threads summing a buffer much larger
/// than the caches. Run next to each generation repetition, so that a shared
/// machine's drift in bandwidth shows in both the probe and the test.
struct BandwidthProbe {
    buf: Vec<u64>,
    threads: usize,
}

impl BandwidthProbe {
    const BYTES: usize = 512 << 20;

    fn new(threads: usize) -> Self {
        let buf = (0..Self::BYTES / 8).map(|i| i as u64).collect();
        Self { buf, threads }
    }

    /// Bytes/s: the better of two passes (the first may still fault pages
    /// in or share the bus with the test that just ended).
    fn measure(&self) -> f64 {
        let mut best = 0f64;
        for _ in 0..2 {
            let start = Instant::now();
            let sum: u64 = std::thread::scope(|s| {
                let chunk = self.buf.len().div_ceil(self.threads);
                let handles: Vec<_> = self
                    .buf
                    .chunks(chunk)
                    .map(|c| s.spawn(move || sum_lanes(c)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or(0))
                    .fold(0, u64::wrapping_add)
            });
            std::hint::black_box(sum);
            best = best.max(Self::BYTES as f64 / start.elapsed().as_secs_f64());
        }
        best
    }
}

/// A sum the compiler vectorises (eight independent lanes), so the loop is
/// bound by memory, not by a dependency chain.
fn sum_lanes(c: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    for block in c.chunks_exact(8) {
        for (l, &v) in lanes.iter_mut().zip(block) {
            *l = l.wrapping_add(v);
        }
    }
    lanes.iter().fold(0, |a, &b| a.wrapping_add(b))
}

/// Bytes a decode step reads: every weight once (the per-layer embedding
/// table is gathered by rows, so it does not count), plus K/V of the context.
fn decode_bytes(model: &Model, kv: KvTypes, context: usize) -> f64 {
    let weights: u64 = model
        .file()
        .tensors()
        .iter()
        .filter(|t| t.name != "per_layer_token_embd.weight")
        .map(|t| t.n_bytes)
        .sum();
    let kv: usize = model
        .config()
        .layers
        .iter()
        .filter(|l| l.kv_source.is_none())
        .map(|l| {
            let rows = match l.attention {
                rlx_gemma::AttentionKind::Sliding { window } => context.min(window),
                rlx_gemma::AttentionKind::Global => context,
            };
            rows * (kv.k.row_bytes(l.n_head_kv * l.head_dim)
                + kv.v.row_bytes(l.n_head_kv * l.head_dim))
        })
        .sum();
    weights as f64 + kv as f64
}

pub(super) fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Deterministic token ids spread over the vocabulary (BOS first).
pub(super) fn tokens(model: &Model, n: usize, salt: usize) -> Vec<u32> {
    let vocab = model.config().n_vocab;
    (0..n)
        .map(|i| {
            if i == 0 && salt == 0 {
                2
            } else {
                ((i * 7919 + salt * 104_729) % (vocab - 16) + 16) as u32
            }
        })
        .collect()
}

/// Tokens of the prompt that speculative generation tests start from.
const SPEC_PROMPT: usize = 96;

/// A prompt that repeats a 24-token phrase, so that prompt lookup finds
/// drafts from the start.
fn spec_prompt(model: &Model) -> Vec<u32> {
    let phrase = tokens(model, 24, 3);
    let mut p = vec![2];
    p.extend(phrase.iter().cycle().take(SPEC_PROMPT - 1));
    p
}

/// Tokens per second of greedy generation of `n` tokens after `depth`
/// tokens of context and [`spec_prompt`] (the prompt untimed), with
/// `spec` or without, and what speculation drafted and kept.
fn time_generation(
    s: &mut Session,
    draft: Option<&mut Session>,
    depth: usize,
    n: usize,
    spec: Option<Speculation>,
) -> Result<(f64, GenerateStats)> {
    let model = s.model();
    let mut prompt = tokens(model, depth, 0);
    prompt.extend(spec_prompt(model));
    s.reset();
    let sampler = Sampler::new(SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    })?;
    let opts = GenerationOptions {
        max_tokens: n,
        speculation: spec,
        ..Default::default()
    };
    let (out, _, stats) = generate_with(s, draft, &prompt, sampler, opts)?;
    // The first token comes from the prompt's step, as in `rlx run`.
    let steps = out.len().saturating_sub(1);
    Ok((steps as f64 / stats.decode_secs.max(1e-9), stats))
}

/// One test's session: its plans are compiled, and on a GPU its step
/// graphs captured, by the untimed warm-up run, so the timed runs measure
/// steps as a long-running program sees them.
fn test_session(
    model: &Model,
    kv: KvTypes,
    depth: usize,
    prompt: usize,
    gen: usize,
) -> Result<Session<'_>> {
    Ok(model.session(SessionOptions {
        context: Some(depth + prompt + gen + 1),
        prefill_chunk: prompt.max(512),
        kv_types: Some(kv),
        ..Default::default()
    })?)
}

/// Tokens per second of one run on `s`, from an empty context: `depth`
/// tokens untimed, then a prompt of `prompt` tokens or `gen` single tokens.
fn time_one(
    s: &mut Session,
    depth: usize,
    prompt: usize,
    gen: usize,
    whole_rows: bool,
) -> Result<f64> {
    let model = s.model();
    let (context, timed) = if prompt > 0 {
        (tokens(model, depth, 0), tokens(model, prompt, 1 + depth))
    } else {
        (tokens(model, depth, 0), tokens(model, gen, 2 + depth))
    };
    s.reset();
    if depth > 0 {
        s.feed(&context)?;
    }
    // The last row reduced to its greedy choice, as `rlx run --temp 0`
    // asks (on a GPU the logits stay there).
    let greedy = RowReduce::top(1);
    let feed = |s: &mut Session, tokens: &[u32]| -> Result<()> {
        if whole_rows {
            s.feed(tokens)?;
        } else {
            s.feed_reduced(tokens, &greedy)?;
        }
        Ok(())
    };
    let start = Instant::now();
    if prompt > 0 {
        feed(s, &timed)?;
    } else {
        for &t in &timed {
            feed(s, &[t])?;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok((prompt + if prompt > 0 { 0 } else { gen }) as f64 / secs)
}

pub fn run(args: &BenchArgs) -> Result<()> {
    if args.reps == 0 {
        bail!("-r must be at least 1");
    }
    // Room for the longest test's K/V, for every sequence of a batch.
    let longest = args
        .prompt
        .iter()
        .chain(&args.gen)
        .max()
        .copied()
        .unwrap_or(0)
        + args.depth;
    let seqs = args.batch.iter().max().copied().unwrap_or(1);
    let model = args.model.load_for(Some(longest * seqs))?;
    let kv = args
        .model
        .kv_types(&model)
        .unwrap_or_else(|| KvTypes::both(model.default_kv_dtype()));
    // Asked before any test runs (turning it off says whether it can).
    if args.profile && !model.backend().set_profiling(false) {
        bail!(
            "--profile: the {} backend cannot time its kernels one by one",
            model.backend().kind()
        );
    }
    if !args.batch.is_empty() {
        return super::bench_batch::run(args, &model, kv);
    }
    let threads = args
        .model
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut rows = Vec::new();
    let suffix = |name: String| {
        if args.depth > 0 {
            format!("{name} @ d{}", args.depth)
        } else {
            name
        }
    };
    for &p in args.prompt.iter().filter(|&&p| p > 0) {
        // One untimed warm-up run, as llama-bench does.
        let mut s = test_session(&model, kv, args.depth, p, 0)?;
        time_one(&mut s, args.depth, p, 0, args.whole_rows)?;
        let tps = (0..args.reps)
            .map(|_| time_one(&mut s, args.depth, p, 0, args.whole_rows))
            .collect::<Result<Vec<_>>>()?;
        rows.push(Row {
            test: suffix(format!("pp{p}")),
            tps,
            spec: None,
            bytes_per_token: None,
            bandwidth: Vec::new(),
        });
    }
    let gen: Vec<usize> = args.gen.iter().copied().filter(|&n| n > 0).collect();
    // The roofline is of host memory: a GPU run has none.
    let gpu = model.device() != rlx_gemma::Device::Cpu;
    let probe = (!gen.is_empty() && !gpu).then(|| BandwidthProbe::new(threads));
    for n in gen {
        let mut s = test_session(&model, kv, args.depth, 0, n)?;
        time_one(&mut s, args.depth, 0, n.min(8), args.whole_rows)?;
        let mut tps = Vec::with_capacity(args.reps);
        let mut bandwidth = Vec::with_capacity(args.reps);
        for _ in 0..args.reps {
            tps.push(time_one(&mut s, args.depth, 0, n, args.whole_rows)?);
            if let Some(p) = &probe {
                bandwidth.push(p.measure());
            }
        }
        rows.push(Row {
            test: suffix(format!("tg{n}")),
            tps,
            spec: None,
            bytes_per_token: probe
                .is_some()
                .then(|| decode_bytes(&model, kv, args.depth + n / 2)),
            bandwidth,
        });
    }
    let mut profiles = Vec::new();
    if args.profile {
        for &p in args.prompt.iter().filter(|&&p| p > 0) {
            let mut s = test_session(&model, kv, args.depth, p, 0)?;
            profiles.extend(profiled(&model, &suffix(format!("pp{p}")), || {
                time_one(&mut s, args.depth, p, 0, args.whole_rows).map(drop)
            })?);
        }
        for &n in args.gen.iter().filter(|&&n| n > 0) {
            let mut s = test_session(&model, kv, args.depth, 0, n)?;
            profiles.extend(profiled(&model, &suffix(format!("tg{n}")), || {
                time_one(&mut s, args.depth, 0, n, args.whole_rows).map(drop)
            })?);
        }
    }
    let source = draft_source(args.spec.unwrap_or(Spec::None), args.draft_model.is_some())?;
    let spec = speculation(source, args.draft_max, 1, args.model.batch_invariant, gpu)?;
    let draft = match &args.draft_model {
        Some(path) => {
            let tok = Tokenizer::from_gguf(model.file())?;
            Some(load_draft(path, &args.model, &tok, Some(longest * seqs))?)
        }
        None => None,
    };
    if let Some(spec) = spec {
        let label = if draft.is_some() { "draft" } else { "ngram" };
        for n in args.gen.iter().copied().filter(|&n| n > 0) {
            // Plain and speculative runs alternate, after one untimed
            // run of each.
            let context = args.depth + n + SPEC_PROMPT;
            let mut s = test_session(&model, kv, args.depth, 0, n + SPEC_PROMPT)?;
            let mut d = draft_session(draft.as_ref(), Some(context), &args.model)?;
            let mut plain = Vec::new();
            let mut drafted = Vec::new();
            let mut sums = (0, 0, 0);
            for rep in 0..=args.reps {
                let (tps, _) = time_generation(&mut s, None, args.depth, n, None)?;
                let (spec_tps, st) =
                    time_generation(&mut s, d.as_mut(), args.depth, n, Some(spec))?;
                if rep > 0 {
                    plain.push(tps);
                    drafted.push(spec_tps);
                    sums = (
                        sums.0 + st.drafted,
                        sums.1 + st.accepted,
                        sums.2 + st.verify_steps,
                    );
                }
            }
            for (name, tps, spec) in [("greedy", plain, None), (label, drafted, Some(sums))] {
                rows.push(Row {
                    test: suffix(format!("tg{n} {name}")),
                    tps,
                    spec,
                    bytes_per_token: None,
                    bandwidth: Vec::new(),
                });
            }
        }
    }
    let all_bw: Vec<f64> = rows
        .iter()
        .flat_map(|r| r.bandwidth.iter().copied())
        .collect();
    let bandwidth = if all_bw.is_empty() {
        0.0
    } else {
        mean_std(&all_bw).0
    };
    let mut out = std::io::stdout().lock();
    let file_bytes = model.file().file_len();
    let name = args.model.model.display().to_string();
    if args.json {
        let arr: Vec<_> = rows
            .iter()
            .map(|r| {
                let (mean, std) = mean_std(&r.tps);
                json!({
                    "model": name,
                    "test": r.test,
                    "tokens_per_second": mean,
                    "stddev": std,
                    "samples": r.tps,
                    "threads": threads,
                    "repetitions": r.tps.len(),
                    "precision": args.model.precision_name(),
                    "device": args.model.device,
                    "backend": model.backend().describe(),
                    "cpu": cpu_name(),
                    "kv_type": kv.to_string(),
                    "model_bytes": file_bytes,
                    "bytes_per_token": r.bytes_per_token,
                    "memory_bandwidth_bytes_per_s": (!r.bandwidth.is_empty()).then(|| mean_std(&r.bandwidth).0),
                    "memory_bandwidth_samples": r.bandwidth,
                    "roofline_fraction": r.roofline(),
                    "speculation": r.spec.map(|(drafted, kept, steps)| json!({
                        "drafted": drafted,
                        "kept": kept,
                        "verify_steps": steps,
                        "acceptance_rate": kept as f64 / drafted.max(1) as f64,
                        "mean_kept_per_step": kept as f64 / steps.max(1) as f64,
                    })),
                })
            })
            .collect();
        serde_json::to_writer_pretty(&mut out, &arr)?;
        writeln!(out)?;
        print_profiles(&mut std::io::stderr().lock(), &profiles)?;
    } else {
        writeln!(
            out,
            "| model | size | backend | threads | precision | test | t/s | roofline |"
        )?;
        writeln!(
            out,
            "| --- | ---: | --- | ---: | --- | ---: | ---: | ---: |"
        )?;
        for r in &rows {
            let (mean, std) = mean_std(&r.tps);
            writeln!(
                out,
                "| {name} | {:.2} MiB | {} | {threads} | {} | {} | {mean:.2} ± {std:.2} | {} |",
                file_bytes as f64 / (1024.0 * 1024.0),
                if gpu { "CUDA" } else { "CPU" },
                args.model.precision_name(),
                r.test,
                r.roofline()
                    .map_or(String::new(), |f| format!("{:.0} %", f * 100.0))
            )?;
        }
        for r in &rows {
            if let Some((drafted, kept, steps)) = r.spec {
                writeln!(
                    out,
                    "\n{}: {kept} of {drafted} drafted tokens kept ({:.0} %), {:.2} a verification step over {steps} steps",
                    r.test,
                    100.0 * kept as f64 / drafted.max(1) as f64,
                    kept as f64 / steps.max(1) as f64
                )?;
            }
        }
        writeln!(
            out,
            "\nbackend: {}; cpu: {}",
            model.backend().describe(),
            cpu_name().unwrap_or_else(|| "unknown".into())
        )?;
        print_profiles(&mut out, &profiles)?;
        if bandwidth > 0.0 {
            writeln!(
                out,
                "\nroofline: read bandwidth {:.1} GB/s with {threads} threads (mean of probes run after each generation repetition; each repetition is set against its own probe); a generated token reads every weight and the K/V of its context once",
                bandwidth / 1e9
            )?;
        }
    }
    Ok(())
}

/// Runs `f` (one untimed run of a test) with every kernel of the model's
/// device timed; its steps' profiles, labelled `test`.
pub(super) fn profiled(
    model: &Model,
    test: &str,
    f: impl FnOnce() -> Result<()>,
) -> Result<Vec<(String, StepProfile)>> {
    let backend = model.backend();
    if !backend.set_profiling(true) {
        bail!(
            "--profile: the {} backend cannot time its kernels one by one",
            backend.kind()
        );
    }
    backend.take_profile();
    let run = f();
    backend.set_profiling(false);
    run?;
    Ok(backend
        .take_profile()
        .into_iter()
        .map(|p| (test.to_string(), p))
        .collect())
}

/// One table per profiled step size: each kernel's launches and time a
/// step, its share, and for products the weights read and at what rate.
pub(super) fn print_profiles(
    out: &mut impl Write,
    profiles: &[(String, StepProfile)],
) -> Result<()> {
    for (test, p) in profiles {
        let steps = p.steps.max(1) as f64;
        let total: f64 = p.kernels.iter().map(|k| k.seconds).sum();
        writeln!(
            out,
            "\n{test}: steps of {} row{} ({} steps), kernels one at a time: {:.1} µs a step",
            p.rows,
            if p.rows == 1 { "" } else { "s" },
            p.steps,
            total / steps * 1e6
        )?;
        writeln!(
            out,
            "\n| kernel | launches a step | µs a step | share | weights MB a step | TB/s |"
        )?;
        writeln!(out, "| --- | ---: | ---: | ---: | ---: | ---: |")?;
        for k in &p.kernels {
            let (mb, rate) = match k.weight_bytes {
                0 => (String::new(), String::new()),
                b => (
                    format!("{:.1}", b as f64 / steps / 1e6),
                    format!("{:.2}", b as f64 / k.seconds.max(1e-12) / 1e12),
                ),
            };
            writeln!(
                out,
                "| `{}` | {:.1} | {:.1} | {:.1} % | {mb} | {rate} |",
                k.name,
                k.launches as f64 / steps,
                k.seconds / steps * 1e6,
                100.0 * k.seconds / total.max(1e-12),
            )?;
        }
    }
    Ok(())
}

/// The CPU's model name, as Linux reports it.
fn cpu_name() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map(|(_, name)| name.trim().to_string())
}
