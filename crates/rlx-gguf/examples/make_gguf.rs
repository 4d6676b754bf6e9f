//! Writes Gemma 3 GGUF files for benchmarking, with rlx-gguf's own writer and
//! reference quantizers (byte-identical to ggml's).
//!
//! ```sh
//! # A Gemma 3 of the 270m, 1b, 4b or 12b shape with random weights:
//! make_gguf random --shape 1b --type q4_k_m --tokenizer-from REAL.gguf -o OUT.gguf
//! # Every weight matrix of an existing file dequantized and quantized again:
//! make_gguf requant --from IN.gguf --type q8_0 -o OUT.gguf
//! # Only the tokenizer keys of a file (a few MB), for `random` elsewhere:
//! make_gguf tokenizer --from REAL.gguf -o TOK.gguf
//! ```
//!
//! `--type` is a llama-quantize file type: `q8_0`, `q4_0` or `q4_k_m`, with
//! llama-quantize's per-tensor choices (see [`TypeChooser`]). Tensors are
//! written in llama-quantize's order, so a requantized file can be compared
//! byte for byte with `llama-quantize --allow-requantize IN OUT Q8_0`.
//! `-t N` sets the threads (default: all cores); `--seed S` the random seed.

use std::error::Error;
use std::sync::Mutex;
use std::time::Instant;

use rlx_gguf::{dequantize, quantize, Array, GgmlType, GgufFile, GgufWriter};

type Res<T> = Result<T, Box<dyn Error>>;

const USAGE: &str = "usage:
  make_gguf random --shape {270m,1b,4b,12b} --type {q8_0,q4_0,q4_k_m} --tokenizer-from REAL.gguf -o OUT.gguf [--seed S] [-t N]
  make_gguf requant --from IN.gguf --type {q8_0,q4_0,q4_k_m} -o OUT.gguf [-t N]
  make_gguf tokenizer --from IN.gguf -o OUT.gguf";

/// The text-model hyperparameters of one Gemma 3 size (HF configs of
/// google/gemma-3-{270m,1b,4b,12b}-pt).
struct Shape {
    name: &'static str,
    size_label: &'static str,
    embedding: u64,
    layers: u64,
    ffn: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    sliding_window: u32,
    context: u32,
    /// Linear RoPE scaling factor of the global layers.
    rope_linear_factor: Option<f32>,
}

const SHAPES: [Shape; 4] = [
    Shape {
        name: "270m",
        size_label: "270M",
        embedding: 640,
        layers: 18,
        ffn: 2048,
        heads: 4,
        kv_heads: 1,
        head_dim: 256,
        sliding_window: 512,
        context: 32768,
        rope_linear_factor: None,
    },
    Shape {
        name: "1b",
        size_label: "1B",
        embedding: 1152,
        layers: 26,
        ffn: 6912,
        heads: 4,
        kv_heads: 1,
        head_dim: 256,
        sliding_window: 512,
        context: 32768,
        rope_linear_factor: None,
    },
    Shape {
        name: "4b",
        size_label: "4B",
        embedding: 2560,
        layers: 34,
        ffn: 10240,
        heads: 8,
        kv_heads: 4,
        head_dim: 256,
        sliding_window: 1024,
        context: 131072,
        rope_linear_factor: Some(8.0),
    },
    Shape {
        name: "12b",
        size_label: "12B",
        embedding: 3840,
        layers: 48,
        ffn: 15360,
        heads: 16,
        kv_heads: 8,
        head_dim: 256,
        sliding_window: 1024,
        context: 131072,
        rope_linear_factor: Some(8.0),
    },
];

/// A llama-quantize file type (`llama_ftype`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mix {
    Q8_0,
    Q4_0,
    Q4KM,
}

impl Mix {
    fn parse(s: &str) -> Res<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "q8_0" => Mix::Q8_0,
            "q4_0" => Mix::Q4_0,
            "q4_k_m" => Mix::Q4KM,
            _ => return Err(format!("unknown --type {s:?} (q8_0, q4_0, q4_k_m)").into()),
        })
    }

    /// The `general.file_type` value (`LLAMA_FTYPE_MOSTLY_*`).
    fn file_type(self) -> u32 {
        match self {
            Mix::Q8_0 => 7,
            Mix::Q4_0 => 2,
            Mix::Q4KM => 15,
        }
    }

    /// `llama_ftype_get_default_type`.
    fn default_type(self) -> GgmlType {
        match self {
            Mix::Q8_0 => GgmlType::Q8_0,
            Mix::Q4_0 => GgmlType::Q4_0,
            Mix::Q4KM => GgmlType::Q4_K,
        }
    }
}

/// llama-quantize's choice of type per tensor (`llama_tensor_get_type` in
/// src/llama-quant.cpp) for the mixes above, without an imatrix or overrides.
/// Feed it the tensors in [`llama_order`]: the attn_v and ffn_down rules
/// count tensors in that order.
struct TypeChooser {
    mix: Mix,
    /// No `output.weight`: the embedding is the LM head too.
    tied_embeddings: bool,
    n_layers: usize,
    n_attn_v: usize,
    i_attn_v: usize,
    i_ffn_down: usize,
}

impl TypeChooser {
    fn new(mix: Mix, names: &[&str], n_layers: usize) -> Self {
        TypeChooser {
            mix,
            tied_embeddings: !names.contains(&"output.weight"),
            n_layers,
            n_attn_v: names.iter().filter(|n| is_attn_v_like(n)).count(),
            i_attn_v: 0,
            i_ffn_down: 0,
        }
    }

    fn choose(&mut self, name: &str, dims: &[u64], current: GgmlType) -> GgmlType {
        if !allows_quantization(name, dims) {
            return current;
        }
        let default = self.mix.default_type();
        let row_len = dims[0];
        let more_bits = |i: usize, n: usize| {
            i < n / 8 || i >= 7 * n / 8 || (i as i64 - (n / 8) as i64) % 3 == 2
        };
        let is_embd = name == "token_embd.weight" || name == "per_layer_token_embd.weight";
        let mut ty = default;
        if name == "output.weight" || (self.tied_embeddings && is_embd) {
            // The LM head keeps more precision.
            ty = if !row_len.is_multiple_of(default.block_elems() as u64)
                || default == GgmlType::Q8_0
            {
                GgmlType::Q8_0
            } else {
                GgmlType::Q6_K
            };
        } else if is_attn_v_like(name) {
            if self.mix == Mix::Q4KM && more_bits(self.i_attn_v, self.n_attn_v) {
                ty = GgmlType::Q6_K;
            }
            self.i_attn_v += 1;
        } else if name.contains("ffn_down") {
            if self.mix == Mix::Q4KM && more_bits(self.i_ffn_down, self.n_layers) {
                ty = GgmlType::Q6_K;
            }
            self.i_ffn_down += 1;
        }
        type_fallback(ty, row_len)
    }
}

fn is_attn_v_like(name: &str) -> bool {
    ["attn_v.weight", "attn_qkv.weight", "attn_kv_b.weight"]
        .iter()
        .any(|s| name.contains(s))
}

/// `tensor_allows_quantization`, the part that can apply to Gemma files.
fn allows_quantization(name: &str, dims: &[u64]) -> bool {
    let n_dims = dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1);
    n_dims >= 2
        && name.ends_with("weight")
        && !name.contains("_norm.weight")
        && !name.contains("ffn_gate_inp.weight")
        && !name.contains("altup")
        && !name.contains("laurel")
        && !name.contains("per_layer_model_proj")
}

/// `tensor_type_fallback`: a type whose block does not divide the row length
/// is replaced by a 32-element one, and by F16 if even that does not fit.
fn type_fallback(ty: GgmlType, row_len: u64) -> GgmlType {
    use GgmlType::*;
    let fits = |t: GgmlType| row_len.is_multiple_of(t.block_elems() as u64);
    if fits(ty) {
        return ty;
    }
    let fallback = match ty {
        IQ1_S | IQ1_M | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => IQ4_NL,
        Q2_0 | Q2_K | Q3_K | TQ1_0 | TQ2_0 => Q4_0,
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        other => other,
    };
    if fits(fallback) {
        fallback
    } else {
        F16
    }
}

/// The order llama-quantize writes tensors in (`weight_name_comparer`):
/// by layer number (tensors outside `blk.N.` first), then by name.
fn llama_order(a: &str, b: &str) -> std::cmp::Ordering {
    let layer = |n: &str| -> i64 {
        n.strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(-1)
    };
    layer(a).cmp(&layer(b)).then_with(|| a.cmp(b))
}

/// Converts f32 values into `ty`'s packed bytes.
fn encode(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    match ty {
        GgmlType::F32 => {
            for (x, b) in src.iter().zip(dst.chunks_exact_mut(4)) {
                b.copy_from_slice(&x.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
                b.copy_from_slice(&half::f16::from_f32(*x).to_le_bytes());
            }
        }
        _ => quantize(ty, src, dst).expect("lengths checked by the caller"),
    }
}

fn can_encode(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16) || rlx_gguf::quant::can_quantize(ty)
}

/// Rows converted per step of one thread: bounds the f32 scratch buffer.
const ROWS_PER_STEP: usize = 64;

/// Builds a `rows × row_len` tensor of type `ty`; `fill(first_row, out)`
/// writes the f32 values of `out.len() / row_len` rows from `first_row` on.
/// `threads` threads take steps of [`ROWS_PER_STEP`] rows from a shared queue
/// (which keeps both busy when one is preempted on a shared machine); only
/// the packed output and one step of f32 per thread are held.
fn build_tensor(
    ty: GgmlType,
    row_len: usize,
    rows: usize,
    threads: usize,
    fill: &(dyn Fn(usize, &mut [f32]) + Sync),
) -> Vec<u8> {
    let row_bytes = ty
        .bytes_for(row_len as u64)
        .expect("row length fits the type") as usize;
    let mut out = vec![0u8; rows * row_bytes];
    let steps = Mutex::new(out.chunks_mut(ROWS_PER_STEP * row_bytes).enumerate());
    let threads = threads.clamp(1, rows.div_ceil(ROWS_PER_STEP).max(1));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut buf = vec![0f32; ROWS_PER_STEP.min(rows) * row_len];
                loop {
                    let Some((step, dst)) = steps.lock().expect("no panics").next() else {
                        break;
                    };
                    let src = &mut buf[..dst.len() / row_bytes * row_len];
                    fill(step * ROWS_PER_STEP, src);
                    encode(ty, src, dst);
                }
            });
        }
    });
    out
}

/// xorshift64* seeded through splitmix64; normals by Marsaglia's polar
/// form of Box-Muller (no trigonometry).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    fn symmetric(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (2.0 / (1u64 << 53) as f64) - 1.0
    }

    /// Two independent N(0, 1) values.
    fn normal_pair(&mut self) -> (f64, f64) {
        loop {
            let (u, v) = (self.symmetric(), self.symmetric());
            let s = u * u + v * v;
            if s > 0.0 && s < 1.0 {
                let m = (-2.0 * s.ln() / s).sqrt();
                return (u * m, v * m);
            }
        }
    }

    /// Fills `out` with `mean + std · N(0, 1)`.
    fn fill_normal(&mut self, mean: f32, std: f32, out: &mut [f32]) {
        for pair in out.chunks_mut(2) {
            let (a, b) = self.normal_pair();
            pair[0] = mean + std * a as f32;
            if let Some(y) = pair.get_mut(1) {
                *y = mean + std * b as f32;
            }
        }
    }
}

/// Parsed command-line options.
struct Args {
    mode: String,
    shape: Option<String>,
    mix: Option<Mix>,
    tokenizer_from: Option<String>,
    from: Option<String>,
    out: Option<String>,
    seed: u64,
    threads: usize,
}

fn parse_args() -> Res<Args> {
    let mut it = std::env::args().skip(1);
    let mode = it.next().ok_or(USAGE)?;
    if mode == "-h" || mode == "--help" {
        println!("{USAGE}");
        std::process::exit(0);
    }
    let mut a = Args {
        mode,
        shape: None,
        mix: None,
        tokenizer_from: None,
        from: None,
        out: None,
        seed: 0,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--shape" => a.shape = Some(value()?),
            "--type" => a.mix = Some(Mix::parse(&value()?)?),
            "--tokenizer-from" => a.tokenizer_from = Some(value()?),
            "--from" => a.from = Some(value()?),
            "-o" | "--out" => a.out = Some(value()?),
            "--seed" => a.seed = value()?.parse()?,
            "-t" | "--threads" => a.threads = value()?.parse::<usize>()?.max(1),
            _ => return Err(format!("unknown argument {flag:?}\n{USAGE}").into()),
        }
    }
    Ok(a)
}

fn required<T: Clone>(v: &Option<T>, flag: &str) -> Res<T> {
    v.clone()
        .ok_or_else(|| format!("missing {flag}\n{USAGE}").into())
}

/// One tensor of the output and where its values come from.
struct Planned {
    name: String,
    dims: Vec<u64>,
    source: Source,
}

enum Source {
    /// `mean + std · N(0, 1)`, seeded per row.
    Random { seed: u64, mean: f32, std: f32 },
    /// The tensor of this index in the input file.
    Input(usize),
}

/// Tensor count and bytes per output type, in order of first use.
type Totals = Vec<(GgmlType, usize, u64)>;

/// Adds `planned` (already in [`llama_order`]) to `w` with the types `mix`
/// picks; `input` is the file that [`Source::Input`] indexes.
fn add_tensors(
    w: &mut GgufWriter,
    planned: &[Planned],
    mix: Mix,
    n_layers: usize,
    input: Option<&GgufFile>,
    threads: usize,
) -> Res<Totals> {
    let names: Vec<&str> = planned.iter().map(|p| p.name.as_str()).collect();
    let mut chooser = TypeChooser::new(mix, &names, n_layers);
    let mut totals = Totals::new();
    for p in planned {
        let input_tensor = match p.source {
            Source::Input(i) => Some((input.expect("input tensors come with their file"), i)),
            Source::Random { .. } => None,
        };
        let current = input_tensor.map_or(GgmlType::F32, |(g, i)| g.tensors()[i].ty);
        let ty = chooser.choose(&p.name, &p.dims, current);
        if ty != current && !can_encode(ty) {
            return Err(format!("{}: no quantizer for {ty}", p.name).into());
        }
        let row_len = p.dims[0] as usize;
        let rows = p.dims.iter().skip(1).product::<u64>() as usize;
        let data = match (&p.source, input_tensor) {
            (_, Some((g, i))) if ty == current => g.tensor_data(&g.tensors()[i]).to_vec(),
            (_, Some((g, i))) => {
                let info = &g.tensors()[i];
                if !rlx_gguf::quant::can_dequantize(info.ty) {
                    return Err(format!("{}: cannot dequantize {}", p.name, info.ty).into());
                }
                let src = g.tensor_data(info);
                let src_row = info.row_bytes() as usize;
                build_tensor(ty, row_len, rows, threads, &|first, out: &mut [f32]| {
                    let n = out.len() / row_len;
                    dequantize(info.ty, &src[first * src_row..(first + n) * src_row], out)
                        .expect("row sizes match the tensor table");
                })
            }
            (&Source::Random { seed, mean, std }, None) => {
                build_tensor(ty, row_len, rows, threads, &|first, out: &mut [f32]| {
                    for (r, row) in out.chunks_exact_mut(row_len).enumerate() {
                        let row_seed = seed ^ ((first + r) as u64).wrapping_mul(0x9e37_79b9);
                        Rng::new(row_seed).fill_normal(mean, std, row);
                    }
                })
            }
            (Source::Input(_), None) => unreachable!(),
        };
        match totals.iter_mut().find(|t| t.0 == ty) {
            Some(t) => {
                t.1 += 1;
                t.2 += data.len() as u64;
            }
            None => totals.push((ty, 1, data.len() as u64)),
        }
        w.add_tensor(&p.name, ty, &p.dims, data)
            .map_err(|e| format!("{}: {e}", p.name))?;
    }
    Ok(totals)
}

fn random(a: &Args) -> Res<(GgufWriter, Totals)> {
    let shape_name = required(&a.shape, "--shape")?;
    let shape = SHAPES
        .iter()
        .find(|s| s.name == shape_name.to_ascii_lowercase())
        .ok_or_else(|| format!("unknown --shape {shape_name:?} (270m, 1b, 4b, 12b)"))?;
    let mix = required(&a.mix, "--type")?;
    let tok_path = required(&a.tokenizer_from, "--tokenizer-from")?;
    let tok = GgufFile::open(&tok_path)?;
    let vocab = tok
        .get_array("tokenizer.ggml.tokens")
        .map_err(|e| format!("{tok_path}: {e}"))?
        .len() as u64;

    let mut w = GgufWriter::new();
    // The keys and their order of the real Gemma 3 270M file.
    w.add("general.architecture", "gemma3")?;
    w.add("general.type", "model")?;
    w.add(
        "general.name",
        format!("Gemma 3 {} random", shape.name).as_str(),
    )?;
    w.add("general.basename", "gemma-3")?;
    w.add("general.size_label", shape.size_label)?;
    w.add("general.license", "gemma")?;
    let tags = ["gemma3", "gemma", "google", "text-generation"];
    w.add(
        "general.tags",
        Array::String(tags.map(String::from).to_vec()),
    )?;
    w.add("gemma3.context_length", shape.context)?;
    w.add("gemma3.embedding_length", shape.embedding as u32)?;
    w.add("gemma3.block_count", shape.layers as u32)?;
    w.add("gemma3.feed_forward_length", shape.ffn as u32)?;
    w.add("gemma3.attention.head_count", shape.heads as u32)?;
    w.add("gemma3.attention.layer_norm_rms_epsilon", 1e-6f32)?;
    w.add("gemma3.attention.key_length", shape.head_dim as u32)?;
    w.add("gemma3.attention.value_length", shape.head_dim as u32)?;
    // Global layers; the local ones use the default 10000 (no freq_base_swa
    // key, as in the real file).
    w.add("gemma3.rope.freq_base", 1e6f32)?;
    w.add("gemma3.attention.sliding_window", shape.sliding_window)?;
    w.add("gemma3.attention.head_count_kv", shape.kv_heads as u32)?;
    if let Some(factor) = shape.rope_linear_factor {
        w.add("gemma3.rope.scaling.type", "linear")?;
        w.add("gemma3.rope.scaling.factor", factor)?;
    }
    for (k, v) in tok
        .metadata()
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
    {
        w.add(k, v.clone())?;
    }
    w.add("general.quantization_version", 2u32)?;
    w.add("general.file_type", mix.file_type())?;

    // Matrices N(0, 0.02); norm weights (stored with Gemma's +1 folded in)
    // 1 + N(0, 0.02), so every norm is close to a plain RMS normalisation.
    // The real 270M file's norms (means 1.5 to 300, up to 1657) only make
    // sense with its trained matrices; near 1, every activation and logit
    // of the random model stays of order 1.
    let (d, hd) = (shape.embedding, shape.head_dim);
    let (q, kv) = (shape.heads * hd, shape.kv_heads * hd);
    let mut tensors: Vec<(String, Vec<u64>)> = vec![
        ("token_embd.weight".into(), vec![d, vocab]),
        ("output_norm.weight".into(), vec![d]),
    ];
    for l in 0..shape.layers {
        let per_layer: [(&str, Vec<u64>); 13] = [
            ("attn_norm", vec![d]),
            ("attn_q", vec![d, q]),
            ("attn_k", vec![d, kv]),
            ("attn_v", vec![d, kv]),
            ("attn_q_norm", vec![hd]),
            ("attn_k_norm", vec![hd]),
            ("attn_output", vec![q, d]),
            ("post_attention_norm", vec![d]),
            ("ffn_norm", vec![d]),
            ("ffn_gate", vec![d, shape.ffn]),
            ("ffn_up", vec![d, shape.ffn]),
            ("ffn_down", vec![shape.ffn, d]),
            ("post_ffw_norm", vec![d]),
        ];
        tensors.extend(
            per_layer
                .into_iter()
                .map(|(n, dims)| (format!("blk.{l}.{n}.weight"), dims)),
        );
    }
    tensors.sort_by(|a, b| llama_order(&a.0, &b.0));
    let planned: Vec<Planned> = tensors
        .into_iter()
        .enumerate()
        .map(|(i, (name, dims))| {
            let is_norm = name.ends_with("norm.weight");
            let seed = Rng::new(a.seed).next_u64() ^ ((i as u64) << 40);
            Planned {
                source: Source::Random {
                    seed,
                    mean: if is_norm { 1.0 } else { 0.0 },
                    std: 0.02,
                },
                name,
                dims,
            }
        })
        .collect();
    let totals = add_tensors(
        &mut w,
        &planned,
        mix,
        shape.layers as usize,
        None,
        a.threads,
    )?;
    Ok((w, totals))
}

fn requant(a: &Args) -> Res<(GgufWriter, Totals)> {
    let from = required(&a.from, "--from")?;
    let mix = required(&a.mix, "--type")?;
    let g = GgufFile::open(&from)?;
    let arch = g.get_str("general.architecture")?.to_owned();
    let n_layers = g.get_u64(&format!("{arch}.block_count"))? as usize;

    let mut w = GgufWriter::new();
    // As llama-quantize: every key copied, the two quantization keys moved
    // to the end with the new values.
    for (k, v) in g.metadata() {
        if k != "general.quantization_version" && k != "general.file_type" {
            w.add(k, v.clone())?;
        }
    }
    w.add("general.quantization_version", 2u32)?;
    w.add("general.file_type", mix.file_type())?;

    let mut order: Vec<usize> = (0..g.tensors().len()).collect();
    order.sort_by(|&i, &j| llama_order(&g.tensors()[i].name, &g.tensors()[j].name));
    let planned: Vec<Planned> = order
        .into_iter()
        .map(|index| {
            let t = &g.tensors()[index];
            Planned {
                name: t.name.clone(),
                dims: t.dims.clone(),
                source: Source::Input(index),
            }
        })
        .collect();
    let totals = add_tensors(&mut w, &planned, mix, n_layers, Some(&g), a.threads)?;
    Ok((w, totals))
}

/// The `tokenizer.*` keys of a file, and no tensors.
fn tokenizer(a: &Args) -> Res<(GgufWriter, Totals)> {
    let from = required(&a.from, "--from")?;
    let g = GgufFile::open(&from)?;
    let mut w = GgufWriter::new();
    for (k, v) in g
        .metadata()
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
    {
        w.add(k, v.clone())?;
    }
    Ok((w, Totals::default()))
}

fn run() -> Res<()> {
    let a = parse_args()?;
    let out = required(&a.out, "-o")?;
    let start = Instant::now();
    let (w, totals) = match a.mode.as_str() {
        "random" => random(&a)?,
        "requant" => requant(&a)?,
        "tokenizer" => tokenizer(&a)?,
        other => return Err(format!("unknown mode {other:?}\n{USAGE}").into()),
    };
    let built_s = start.elapsed().as_secs_f64();
    w.write_file(&out)?;
    let bytes = std::fs::metadata(&out)?.len();
    eprintln!(
        "{out}: {:.1} MiB, built in {built_s:.1} s, written in {:.1} s",
        bytes as f64 / (1 << 20) as f64,
        start.elapsed().as_secs_f64() - built_s
    );
    for (ty, n, b) in totals {
        eprintln!(
            "  {:<5} {n:>4} tensors {:>10.2} MiB",
            ty.name(),
            b as f64 / (1 << 20) as f64
        );
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("make_gguf: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The type counts llama-quantize gives Gemma 3 270M in Q4_K_M (the
    /// published gemma-3-270m Q4_K_M file: 81 Q5_0, 27 Q4_K, 10 Q8_0, 9 Q6_K).
    #[test]
    fn q4_k_m_of_the_270m_shape_matches_llama_quantize() {
        let s = &SHAPES[0];
        let mut names: Vec<(String, Vec<u64>)> =
            vec![("token_embd.weight".into(), vec![640, 262144])];
        for l in 0..s.layers {
            for (n, dims) in [
                ("attn_q", vec![640, 1024]),
                ("attn_k", vec![640, 256]),
                ("attn_v", vec![640, 256]),
                ("attn_output", vec![1024, 640]),
                ("ffn_gate", vec![640, 2048]),
                ("ffn_up", vec![640, 2048]),
                ("ffn_down", vec![2048, 640]),
                ("attn_norm", vec![640]),
            ] {
                names.push((format!("blk.{l}.{n}.weight"), dims));
            }
        }
        names.sort_by(|a, b| llama_order(&a.0, &b.0));
        let refs: Vec<&str> = names.iter().map(|n| n.0.as_str()).collect();
        let mut c = TypeChooser::new(Mix::Q4KM, &refs, 18);
        let mut count = std::collections::BTreeMap::new();
        for (n, dims) in &names {
            *count
                .entry(c.choose(n, dims, GgmlType::F32).name())
                .or_insert(0) += 1;
        }
        let want = [
            ("F32", 18),
            ("Q4_K", 27),
            ("Q5_0", 81),
            ("Q6_K", 9),
            ("Q8_0", 10),
        ];
        assert_eq!(count.into_iter().collect::<Vec<_>>(), want);
    }
}
