//! Quantizing a GGUF file as `llama-quantize` does: the same file types
//! (`Q4_K_M`, `Q8_0`, …), the same per-tensor choices (which tensors stay as
//! they are, which get more bits, which fall back to a 32-wide block when
//! their rows do not fit a 256-wide one), the same tensor order and
//! metadata, and ggml's reference quantizers, so that the output is the
//! file llama.cpp would write (without an importance matrix).

use std::io::Write;

use rlx_gguf::{GgmlType, GgufError, GgufFile, GgufWriter, Value};

/// A file type: the default tensor type and llama.cpp's mix around it.
// llama.cpp's names, as users type them.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
}

impl FileType {
    pub const ALL: [FileType; 17] = [
        FileType::F32,
        FileType::F16,
        FileType::BF16,
        FileType::Q4_0,
        FileType::Q4_1,
        FileType::Q5_0,
        FileType::Q5_1,
        FileType::Q8_0,
        FileType::Q2_K,
        FileType::Q3_K_S,
        FileType::Q3_K_M,
        FileType::Q3_K_L,
        FileType::Q4_K_S,
        FileType::Q4_K_M,
        FileType::Q5_K_S,
        FileType::Q5_K_M,
        FileType::Q6_K,
    ];

    /// llama.cpp's name, as `llama-quantize` takes it.
    pub fn name(self) -> &'static str {
        use FileType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            BF16 => "BF16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q2_K => "Q2_K",
            Q3_K_S => "Q3_K_S",
            Q3_K_M => "Q3_K_M",
            Q3_K_L => "Q3_K_L",
            Q4_K_S => "Q4_K_S",
            Q4_K_M => "Q4_K_M",
            Q5_K_S => "Q5_K_S",
            Q5_K_M => "Q5_K_M",
            Q6_K => "Q6_K",
        }
    }

    /// By name, any case; `Q3_K`, `Q4_K` and `Q5_K` mean the `_M` mixes, as
    /// in llama-quantize.
    pub fn from_name(name: &str) -> Option<FileType> {
        let alias = match name.to_ascii_uppercase().as_str() {
            "Q3_K" => Some(FileType::Q3_K_M),
            "Q4_K" => Some(FileType::Q4_K_M),
            "Q5_K" => Some(FileType::Q5_K_M),
            _ => None,
        };
        alias.or_else(|| {
            FileType::ALL
                .into_iter()
                .find(|t| t.name().eq_ignore_ascii_case(name))
        })
    }

    /// The number `general.file_type` holds (llama.cpp's `llama_ftype`).
    pub fn id(self) -> u32 {
        use FileType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q8_0 => 7,
            Q5_0 => 8,
            Q5_1 => 9,
            Q2_K => 10,
            Q3_K_S => 11,
            Q3_K_M => 12,
            Q3_K_L => 13,
            Q4_K_S => 14,
            Q4_K_M => 15,
            Q5_K_S => 16,
            Q5_K_M => 17,
            Q6_K => 18,
            BF16 => 32,
        }
    }

    /// The type of tensors the mix does not single out.
    pub fn default_type(self) -> GgmlType {
        use FileType::*;
        match self {
            F32 => GgmlType::F32,
            F16 => GgmlType::F16,
            BF16 => GgmlType::BF16,
            Q4_0 => GgmlType::Q4_0,
            Q4_1 => GgmlType::Q4_1,
            Q5_0 => GgmlType::Q5_0,
            Q5_1 => GgmlType::Q5_1,
            Q8_0 => GgmlType::Q8_0,
            Q2_K => GgmlType::Q2_K,
            Q3_K_S | Q3_K_M | Q3_K_L => GgmlType::Q3_K,
            Q4_K_S | Q4_K_M => GgmlType::Q4_K,
            Q5_K_S | Q5_K_M => GgmlType::Q5_K,
            Q6_K => GgmlType::Q6_K,
        }
    }
}

impl std::fmt::Display for FileType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Debug)]
pub struct QuantizeOptions {
    pub file_type: FileType,
    /// Every quantizable tensor gets the default type (`--pure`), save the
    /// fallbacks its row length forces.
    pub pure: bool,
    /// Threads for quantizing rows (the output does not depend on it).
    pub threads: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{0}")]
    Model(String),
}

/// What happens to one tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorPlan {
    pub name: String,
    /// The dimensions written (`pad_rows` more rows than the file's).
    pub dims: Vec<u64>,
    pub from: GgmlType,
    pub to: GgmlType,
    /// Zero rows written after the file's: Gemma 3n's embedding tables
    /// padded to the vocabulary (image and audio token ids), as llama.cpp's
    /// converter pads them and its loader expects.
    pub pad_rows: u64,
}

/// What llama.cpp groups tensors into when choosing their types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    AttnQkv,
    AttnKvB,
    AttnV,
    AttnK,
    AttnQ,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

impl Category {
    fn of(name: &str) -> Category {
        use Category::*;
        if name == "output.weight" {
            return Output;
        }
        if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
            return TokenEmbd;
        }
        for (part, cat) in [
            ("attn_qkv.weight", AttnQkv),
            ("attn_kv_b.weight", AttnKvB),
            ("attn_v.weight", AttnV),
            ("attn_k.weight", AttnK),
            ("attn_q.weight", AttnQ),
            ("attn_output.weight", AttnOutput),
            ("ffn_up", FfnUp),
            ("ffn_gate", FfnGate),
            ("ffn_down", FfnDown),
        ] {
            if name.contains(part) {
                return cat;
            }
        }
        Other
    }

    fn is_attn_v(self) -> bool {
        matches!(
            self,
            Category::AttnV | Category::AttnQkv | Category::AttnKvB
        )
    }
}

/// Whether llama.cpp quantizes this tensor at all (the subset of its rules
/// that can name a Gemma tensor).
fn quantizable(name: &str, dims: &[u64]) -> bool {
    // ggml counts dimensions up to the last one larger than 1.
    dims.iter().skip(1).any(|&d| d > 1)
        && name.ends_with("weight")
        && !name.contains("_norm.weight")
        && !name.contains("ffn_gate_inp.weight")
        && !name.contains("altup")
        && !name.contains("laurel")
        && !name.contains("per_layer_model_proj")
}

/// The model facts the mix reads.
struct Facts {
    n_layer: i64,
    n_gqa: u64,
    n_expert: u64,
    tied: bool,
    n_attention_wv: i64,
}

impl Facts {
    fn read(file: &GgufFile, names: &[&str]) -> Result<Facts, QuantizeError> {
        let arch = file
            .get("general.architecture")
            .and_then(Value::as_str)
            .ok_or_else(|| QuantizeError::Model("general.architecture is missing".into()))?;
        let first = |key: &str| -> Option<u64> {
            let v = file.get(&format!("{arch}.{key}"))?;
            v.as_u64()
                .or_else(|| v.as_array().and_then(|a| a.to_u64s()?.first().copied()))
        };
        let n_layer = first("block_count")
            .ok_or_else(|| QuantizeError::Model(format!("{arch}.block_count is missing")))?;
        let heads = first("attention.head_count").unwrap_or(1);
        let kv_heads = first("attention.head_count_kv").unwrap_or(heads).max(1);
        Ok(Facts {
            n_layer: n_layer as i64,
            n_gqa: heads / kv_heads,
            n_expert: first("expert_count").unwrap_or(0),
            tied: !names.contains(&"output.weight"),
            n_attention_wv: names.iter().filter(|n| Category::of(n).is_attn_v()).count() as i64,
        })
    }
}

/// Counters llama.cpp advances as it walks the tensors.
#[derive(Default)]
struct Walk {
    i_attention_wv: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
}

fn use_more_bits(i: i64, n: i64) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The layer of a feed-forward tensor: its position among its kind, or with
/// experts (whose tensors are not in layer order everywhere) its name.
fn layer_of(counter: i64, facts: &Facts, name: &str) -> Result<i64, QuantizeError> {
    if facts.n_expert <= 1 {
        return Ok(counter);
    }
    name.strip_prefix("blk.")
        .and_then(|r| r.split('.').next())
        .and_then(|n| n.parse::<i64>().ok())
        .filter(|&l| (0..facts.n_layer).contains(&l))
        .ok_or_else(|| QuantizeError::Model(format!("cannot tell the layer of tensor {name}")))
}

/// llama.cpp's choice for one quantizable tensor under a mix.
fn mix_type(
    ft: FileType,
    facts: &Facts,
    walk: &mut Walk,
    name: &str,
    ne0: u64,
    mut t: GgmlType,
) -> Result<GgmlType, QuantizeError> {
    use FileType as F;
    use GgmlType as G;
    let cat = Category::of(name);
    if cat == Category::Output || (facts.tied && cat == Category::TokenEmbd) {
        if !ne0.is_multiple_of(t.block_elems() as u64) {
            t = G::Q8_0;
        } else if t != G::Q8_0 {
            t = G::Q6_K;
        }
    } else if cat == Category::TokenEmbd {
        // No rule for the mixes here.
    } else if cat.is_attn_v() {
        match ft {
            F::Q2_K => t = if facts.n_gqa >= 4 { G::Q4_K } else { G::Q3_K },
            F::Q3_K_M => {
                t = if walk.i_attention_wv < 2 {
                    G::Q5_K
                } else {
                    G::Q4_K
                }
            }
            F::Q3_K_L => t = G::Q5_K,
            F::Q4_K_M | F::Q5_K_M if use_more_bits(walk.i_attention_wv, facts.n_attention_wv) => {
                t = G::Q6_K
            }
            F::Q4_K_S if walk.i_attention_wv < 4 => t = G::Q5_K,
            _ => {}
        }
        if facts.n_expert == 8 {
            t = G::Q8_0;
        }
        walk.i_attention_wv += 1;
    } else if cat == Category::AttnK {
        if facts.n_expert == 8 {
            t = G::Q8_0;
        }
    } else if cat == Category::FfnDown {
        let l = layer_of(walk.i_ffn_down, facts, name)?;
        let n = facts.n_layer;
        match ft {
            F::Q2_K => t = G::Q3_K,
            F::Q3_K_M => t = if l < n / 16 { G::Q5_K } else { G::Q4_K },
            F::Q3_K_L => t = G::Q5_K,
            F::Q4_K_M if use_more_bits(l, n) => t = G::Q6_K,
            F::Q5_K_M if use_more_bits(l, n) => t = G::Q6_K,
            F::Q4_K_S if l < n / 8 => t = G::Q5_K,
            _ => {}
        }
        walk.i_ffn_down += 1;
    } else if cat == Category::AttnOutput {
        if facts.n_expert == 8 {
            if matches!(ft, F::Q2_K | F::Q3_K_S | F::Q3_K_M | F::Q4_K_S | F::Q4_K_M) {
                t = G::Q5_K;
            }
        } else {
            match ft {
                F::Q2_K => t = G::Q3_K,
                F::Q3_K_M => t = G::Q4_K,
                F::Q3_K_L => t = G::Q5_K,
                _ => {}
            }
        }
    } else if cat == Category::AttnQkv {
        match ft {
            F::Q3_K_M | F::Q3_K_L => t = G::Q4_K,
            F::Q4_K_M => t = G::Q5_K,
            F::Q5_K_M => t = G::Q6_K,
            _ => {}
        }
    } else if cat == Category::FfnGate {
        layer_of(walk.i_ffn_gate, facts, name)?;
        walk.i_ffn_gate += 1;
    } else if cat == Category::FfnUp {
        layer_of(walk.i_ffn_up, facts, name)?;
        walk.i_ffn_up += 1;
    }
    Ok(t)
}

/// A 32-wide block type for a row length a 256-wide one does not divide;
/// F16 if even that does not fit.
fn fallback(ne0: u64, t: GgmlType) -> GgmlType {
    if ne0.is_multiple_of(t.block_elems() as u64) {
        return t;
    }
    let smaller = match t {
        GgmlType::Q2_K | GgmlType::Q3_K => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        other => other,
    };
    if ne0.is_multiple_of(smaller.block_elems() as u64) {
        smaller
    } else {
        GgmlType::F16
    }
}

/// Tensors in the order llama.cpp writes them: by layer (those outside
/// blocks first), then by name.
fn llama_order(a: &str, b: &str) -> std::cmp::Ordering {
    let layer = |s: &str| -> i64 {
        s.strip_prefix("blk.")
            .and_then(|r| {
                let digits: String = r.chars().take_while(char::is_ascii_digit).collect();
                r[digits.len()..]
                    .starts_with('.')
                    .then(|| digits.parse().ok())?
            })
            .unwrap_or(-1)
    };
    layer(a).cmp(&layer(b)).then_with(|| a.cmp(b))
}

/// Each tensor's fate under `opts`, in the order it will be written.
pub fn plan(file: &GgufFile, opts: &QuantizeOptions) -> Result<Vec<TensorPlan>, QuantizeError> {
    let mut infos: Vec<_> = file.tensors().iter().collect();
    infos.sort_by(|a, b| llama_order(&a.name, &b.name));
    let names: Vec<&str> = infos.iter().map(|t| t.name.as_str()).collect();
    let facts = Facts::read(file, &names)?;
    let default = opts.file_type.default_type();
    let mut walk = Walk::default();
    let mut out = Vec::with_capacity(infos.len());
    let gemma3n = file.get("general.architecture").and_then(Value::as_str) == Some("gemma3n");
    let vocab = file
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .map_or(0, |a| a.len() as u64);
    for t in infos {
        let ne0 = t.dims[0];
        let to = if !quantizable(&t.name, &t.dims) {
            t.ty
        } else if !default.is_quantized() {
            default
        } else {
            let chosen = if opts.pure {
                default
            } else {
                mix_type(opts.file_type, &facts, &mut walk, &t.name, ne0, default)?
            };
            fallback(ne0, chosen)
        };
        if to != t.ty && !(rlx_gguf::quant::can_dequantize(t.ty) && can_write(to)) {
            return Err(QuantizeError::Model(format!(
                "tensor {}: cannot convert {} to {to}",
                t.name, t.ty
            )));
        }
        let table = matches!(
            t.name.as_str(),
            "token_embd.weight" | "per_layer_token_embd.weight"
        );
        let pad_rows = match t.dims.as_slice() {
            [_, rows] if gemma3n && table => vocab.saturating_sub(*rows),
            _ => 0,
        };
        let mut dims = t.dims.clone();
        if pad_rows > 0 {
            dims[1] += pad_rows;
        }
        out.push(TensorPlan {
            name: t.name.clone(),
            dims,
            from: t.ty,
            to,
            pad_rows,
        });
    }
    Ok(out)
}

fn can_write(t: GgmlType) -> bool {
    matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) || rlx_gguf::quant::can_quantize(t)
}

/// Writes `file` quantized under `opts` to `out`: its metadata (split keys
/// dropped, `general.quantization_version` and `general.file_type` set and
/// moved last, as llama.cpp does), then each tensor, converted where the
/// plan says. `progress` sees each tensor before it is written.
pub fn quantize_gguf(
    file: &GgufFile,
    opts: &QuantizeOptions,
    out: impl Write,
    progress: &mut dyn FnMut(usize, &TensorPlan),
) -> Result<Vec<TensorPlan>, QuantizeError> {
    let plan = plan(file, opts)?;
    let threads = opts.threads.max(1);
    write_planned(file, &plan, opts, out, &mut |i, p| {
        progress(i, p);
        let info = file.tensor(&p.name).ok_or_else(|| {
            GgufError::from(rlx_gguf::ErrorKind::Writer(format!(
                "tensor {} is gone",
                p.name
            )))
        })?;
        let src = file.tensor_data(info);
        let mut bytes = if p.from == p.to {
            src.to_vec()
        } else {
            let file_rows = TensorPlan {
                dims: info.dims.clone(),
                ..p.clone()
            };
            convert(src, &file_rows, threads).map_err(|e| {
                GgufError::from(rlx_gguf::ErrorKind::Writer(format!(
                    "tensor {}: {e}",
                    p.name
                )))
            })?
        };
        // Zero bytes are zeros in every type.
        let row = p.dims[0] as usize / p.to.block_elems() * p.to.block_bytes();
        bytes.resize(bytes.len() + p.pad_rows as usize * row, 0);
        Ok(bytes)
    })?;
    Ok(plan)
}

/// The bytes of tensor `i` of a plan, in its planned type.
pub type TensorSource<'a> = dyn FnMut(usize, &TensorPlan) -> Result<Vec<u8>, GgufError> + 'a;

/// Writes `file`'s metadata as [`quantize_gguf`] does, then the tensors of
/// `plan` in its types, tensor `i`'s bytes (of type `plan[i].to`) from
/// `tensor(i, &plan[i])`: the file's own converted, or any others of the
/// same shapes (random weights for benchmarks).
pub fn write_planned(
    file: &GgufFile,
    plan: &[TensorPlan],
    opts: &QuantizeOptions,
    out: impl Write,
    tensor: &mut TensorSource<'_>,
) -> Result<(), QuantizeError> {
    let mut w = GgufWriter::new();
    let moved = [
        "general.quantization_version",
        "general.file_type",
        "split.no",
        "split.count",
        "split.tensors.count",
    ];
    for (k, v) in file.metadata() {
        if !moved.contains(&k.as_str()) {
            w.add(k, v.clone())?;
        }
    }
    w.add("general.quantization_version", Value::U32(2))?;
    w.add("general.file_type", Value::U32(opts.file_type.id()))?;
    for p in plan {
        w.declare_tensor(&p.name, p.to, &p.dims)?;
    }
    w.write_streamed(out, |i| tensor(i, &plan[i]))?;
    Ok(())
}

/// `values` (whole rows of `p.dims[0]`) stored as `p.to`, as [`quantize_gguf`]
/// stores a converted f32 tensor, a share of the rows per thread.
pub fn encode_f32(
    values: &[f32],
    p: &TensorPlan,
    threads: usize,
) -> Result<Vec<u8>, rlx_gguf::QuantError> {
    let ne0 = p.dims[0] as usize;
    let dst_row = ne0 / p.to.block_elems() * p.to.block_bytes();
    let rows = values.len() / ne0;
    in_shares(values, ne0, rows * dst_row, dst_row, threads, &|f, d| {
        store_f32(f, p.to, d)
    })
}

/// One tensor's rows converted, a share of the rows per thread (the bytes
/// do not depend on how they are shared).
fn convert(src: &[u8], p: &TensorPlan, threads: usize) -> Result<Vec<u8>, rlx_gguf::QuantError> {
    let ne0 = p.dims[0] as usize;
    let rows: usize = p.dims[1..].iter().product::<u64>() as usize;
    let src_row = ne0 / p.from.block_elems() * p.from.block_bytes();
    let dst_row = ne0 / p.to.block_elems() * p.to.block_bytes();
    in_shares(
        src,
        src_row,
        rows * dst_row,
        dst_row,
        threads,
        &|from, to| convert_rows(from, to, p.from, p.to, ne0),
    )
}

/// `dst_len` output bytes made from `src` by `f`, rows (`src_row` items in,
/// `dst_row` bytes out) split evenly among `threads` threads.
fn in_shares<S, F>(
    src: &[S],
    src_row: usize,
    dst_len: usize,
    dst_row: usize,
    threads: usize,
    f: &F,
) -> Result<Vec<u8>, rlx_gguf::QuantError>
where
    S: Sync,
    F: Fn(&[S], &mut [u8]) -> Result<(), rlx_gguf::QuantError> + Sync,
{
    let mut dst = vec![0u8; dst_len];
    let per = (dst_len / dst_row.max(1)).div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let jobs: Vec<_> = src
            .chunks(per * src_row)
            .zip(dst.chunks_mut(per * dst_row))
            .map(|(from, to)| s.spawn(move || f(from, to)))
            .collect();
        jobs.into_iter()
            .try_for_each(|j| j.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
    })?;
    Ok(dst)
}

/// Rows converted through an f32 buffer of at most this many values, so a
/// large tensor (an embedding table) never needs its whole f32 copy.
const STEP_ELEMS: usize = 1 << 16;

fn convert_rows(
    src: &[u8],
    dst: &mut [u8],
    from: GgmlType,
    to: GgmlType,
    ne0: usize,
) -> Result<(), rlx_gguf::QuantError> {
    let src_row = ne0 / from.block_elems() * from.block_bytes();
    let dst_row = ne0 / to.block_elems() * to.block_bytes();
    let rows_per_step = (STEP_ELEMS / ne0).max(1);
    let mut f = vec![0f32; rows_per_step * ne0];
    for (s, d) in src
        .chunks(rows_per_step * src_row)
        .zip(dst.chunks_mut(rows_per_step * dst_row))
    {
        let f = &mut f[..s.len() / src_row * ne0];
        rlx_gguf::dequantize(from, s, f)?;
        store_f32(f, to, d)?;
    }
    Ok(())
}

/// f32 values stored as `to` into `d` (whole rows).
fn store_f32(f: &[f32], to: GgmlType, d: &mut [u8]) -> Result<(), rlx_gguf::QuantError> {
    match to {
        GgmlType::F32 => {
            for (d, x) in d.chunks_exact_mut(4).zip(f) {
                d.copy_from_slice(&x.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (d, x) in d.chunks_exact_mut(2).zip(f) {
                d.copy_from_slice(&half::f16::from_f32(*x).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (d, x) in d.chunks_exact_mut(2).zip(f) {
                d.copy_from_slice(&bf16_bits(*x).to_le_bytes());
            }
        }
        _ => rlx_gguf::quantize(to, f, d)?,
    }
    Ok(())
}

/// ggml's f32 to bf16: round to nearest even, NaNs kept quiet.
fn bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_llamas() {
        let mut names = vec![
            "blk.10.attn_q.weight",
            "blk.2.ffn_down.weight",
            "token_embd.weight",
            "blk.2.attn_k.weight",
            "output_norm.weight",
        ];
        names.sort_by(|a, b| llama_order(a, b));
        assert_eq!(
            names,
            [
                "output_norm.weight",
                "token_embd.weight",
                "blk.2.attn_k.weight",
                "blk.2.ffn_down.weight",
                "blk.10.attn_q.weight"
            ]
        );
    }

    #[test]
    fn names_round_trip() {
        for t in FileType::ALL {
            assert_eq!(FileType::from_name(&t.name().to_lowercase()), Some(t));
        }
    }
}
