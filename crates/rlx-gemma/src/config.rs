//! Model configuration from GGUF metadata, resolved once into plain
//! per-layer structs. Builders read these facts; nothing downstream looks at
//! the architecture name again.

use rlx_gguf::{GgufFile, Value};

/// The Gemma generation a file declares in `general.architecture`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Gemma,
    Gemma2,
    Gemma3,
    Gemma3n,
    Gemma4,
}

impl Arch {
    pub fn from_name(name: &str) -> Option<Arch> {
        Some(match name {
            "gemma" => Arch::Gemma,
            "gemma2" => Arch::Gemma2,
            "gemma3" => Arch::Gemma3,
            "gemma3n" => Arch::Gemma3n,
            "gemma4" => Arch::Gemma4,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Gemma => "gemma",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
            Arch::Gemma3n => "gemma3n",
            Arch::Gemma4 => "gemma4",
        }
    }
}

/// What llama.cpp's converter calls a Gemma 4 assistant drafter.
pub const ASSISTANT_ARCH: &str = "gemma4-assistant";

/// Why a Gemma 4 assistant drafter is refused, whichever way it comes in.
pub const ASSISTANT_UNSUPPORTED: &str = "a Gemma 4 assistant drafter (it drafts for a Gemma 4 \
     target from the target's hidden states and K/V cache, and does not run on its own); \
     drafting with one";

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("general.architecture is {0:?}; supported: gemma, gemma2, gemma3, gemma3n, gemma4")]
    UnsupportedArch(String),
    #[error("metadata key {key:?} is missing")]
    Missing { key: String },
    #[error("metadata key {key:?}: {msg}")]
    Invalid { key: String, msg: String },
    #[error("tensor {name:?}: {msg}")]
    Tensor { name: String, msg: String },
    #[error("{arch}: {what} is not supported yet")]
    Unsupported { arch: &'static str, what: String },
}

/// Which keys a layer's queries may see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKind {
    Global,
    Sliding { window: usize },
}

/// Rotary embedding of one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    pub n_rot: usize,
    pub base: f32,
    pub freq_scale: f32,
    /// A tensor of per-pair frequency divisors (Gemma 4 proportional RoPE).
    pub freq_factors: Option<String>,
}

/// Every fact one layer needs, resolved from the metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerSpec {
    pub index: usize,
    pub attention: AttentionKind,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rope: RopeConfig,
    /// Multiplier of q·k before the softmax.
    pub query_scale: f32,
    /// `C · tanh(z / C)` on attention scores.
    pub attn_softcap: Option<f32>,
    /// Weighted RMS norm of each q and k head (Gemma 3 on).
    pub qk_norm: bool,
    /// Norms of the attention and FFN outputs before the residual add (Gemma 2 on).
    pub post_norms: bool,
    pub n_ff: usize,
    /// Read K/V of this earlier layer instead of computing them.
    pub kv_source: Option<usize>,
    /// Unweighted RMS norm of each v head (Gemma 3n and 4).
    pub v_norm: bool,
    /// V is the K projection before its norm (no `attn_v`; Gemma 4 global layers).
    pub k_eq_v: bool,
    /// Multiply the layer's output by `layer_output_scale` (Gemma 4).
    pub output_scale: bool,
    /// Add this layer's slice of the per-layer embeddings (Gemma 3n and 4).
    pub per_layer_input: bool,
    /// Routed experts beside the dense (shared-expert) FFN (Gemma 4 MoE).
    pub moe: Option<MoeSpec>,
    /// Low-rank residual branch on the attention input (Gemma 3n LAuReL).
    pub laurel: bool,
    /// Gaussian top-k sparsity of the FFN gate: the std multiplier
    /// Φ⁻¹(sparsity) (Gemma 3n's first layers).
    pub sparsity: Option<f32>,
}

/// A mixture-of-experts FFN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeSpec {
    pub experts: usize,
    pub top_k: usize,
    pub n_ff: usize,
}

/// The model as the builders see it.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmaConfig {
    pub arch: Arch,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub context_length: usize,
    pub rms_eps: f32,
    /// Token embeddings are multiplied by this (√d in f32, as llama.cpp).
    pub embed_scale: f32,
    pub final_softcap: Option<f32>,
    /// `output.weight` if present, else the tied `token_embd.weight`.
    pub lm_head: String,
    /// Width P of each layer's per-layer embedding (0: none).
    pub per_layer_input: usize,
    /// Number of AltUp streams (Gemma 3n; stream 0 is the active one).
    pub altup_streams: Option<usize>,
    pub layers: Vec<LayerSpec>,
}

/// Typed metadata access with key-naming errors.
struct Meta<'a> {
    file: &'a GgufFile,
    arch: &'static str,
}

impl Meta<'_> {
    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    fn get(&self, suffix: &str) -> Option<&Value> {
        self.file.get(&self.key(suffix))
    }

    fn usize_opt(&self, suffix: &str) -> Result<Option<usize>, ConfigError> {
        match self.get(suffix) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| ConfigError::Invalid {
                    key: self.key(suffix),
                    msg: format!(
                        "expected an unsigned integer, found {}",
                        v.type_description()
                    ),
                }),
        }
    }

    fn usize(&self, suffix: &str) -> Result<usize, ConfigError> {
        self.usize_opt(suffix)?.ok_or_else(|| ConfigError::Missing {
            key: self.key(suffix),
        })
    }

    fn f32_opt(&self, suffix: &str) -> Result<Option<f32>, ConfigError> {
        match self.get(suffix) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| ConfigError::Invalid {
                    key: self.key(suffix),
                    msg: format!("expected a number, found {}", v.type_description()),
                }),
        }
    }

    /// A value that is either one integer or one integer per layer.
    fn per_layer(&self, suffix: &str, n_layers: usize) -> Result<Option<Vec<usize>>, ConfigError> {
        match self.get(suffix) {
            None => Ok(None),
            Some(Value::Array(a)) => {
                let v = a.to_u64s().ok_or_else(|| ConfigError::Invalid {
                    key: self.key(suffix),
                    msg: "expected unsigned integers".into(),
                })?;
                if v.len() != n_layers {
                    return Err(ConfigError::Invalid {
                        key: self.key(suffix),
                        msg: format!("{} values for {n_layers} layers", v.len()),
                    });
                }
                Ok(Some(v.into_iter().map(|x| x as usize).collect()))
            }
            Some(_) => Ok(self.usize_opt(suffix)?.map(|n| vec![n; n_layers])),
        }
    }

    /// Which layers slide: a per-layer bool array, or a period n (a layer is
    /// local when `l mod n < n − 1`; n = 0 makes every layer local).
    fn sliding_pattern(
        &self,
        n_layers: usize,
        default_period: usize,
    ) -> Result<Vec<bool>, ConfigError> {
        let key = self.key("attention.sliding_window_pattern");
        match self.get("attention.sliding_window_pattern") {
            Some(Value::Array(rlx_gguf::Array::Bool(b))) => {
                if b.len() != n_layers {
                    return Err(ConfigError::Invalid {
                        key,
                        msg: format!("{} values for {n_layers} layers", b.len()),
                    });
                }
                Ok(b.clone())
            }
            Some(v) => {
                let n = v.as_u64().ok_or_else(|| ConfigError::Invalid {
                    key,
                    msg: format!(
                        "expected a period or a bool array, found {}",
                        v.type_description()
                    ),
                })? as usize;
                Ok(period_pattern(n, n_layers))
            }
            None => Ok(period_pattern(default_period, n_layers)),
        }
    }
}

fn period_pattern(n: usize, n_layers: usize) -> Vec<bool> {
    (0..n_layers)
        .map(|l| n == 0 || (n > 1 && l % n < n - 1))
        .collect()
}

impl GemmaConfig {
    /// Resolves the configuration of a Gemma GGUF and checks every fact
    /// against the tensors present and sane ranges.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ConfigError> {
        let arch_name = file
            .get("general.architecture")
            .and_then(Value::as_str)
            .ok_or_else(|| ConfigError::Missing {
                key: "general.architecture".into(),
            })?;
        if arch_name == ASSISTANT_ARCH {
            return Err(ConfigError::Unsupported {
                arch: ASSISTANT_ARCH,
                what: ASSISTANT_UNSUPPORTED.into(),
            });
        }
        let arch = Arch::from_name(arch_name)
            .ok_or_else(|| ConfigError::UnsupportedArch(arch_name.to_owned()))?;
        let m = Meta {
            file,
            arch: arch.name(),
        };
        // Facts other keys are read against come first, so that an error
        // names the key that is wrong rather than one that disagrees with it.
        check_block_count(file, &m, m.usize("block_count")?)?;
        if let Some(base) = m.f32_opt("rope.freq_base")? {
            positive(&m, "rope.freq_base", base)?;
        }
        let cfg = Self::resolve(file, &m, arch)?;
        validate(&m, &cfg)?;
        Ok(cfg)
    }

    /// Values that pass validation but no released Gemma has, worth a word
    /// on stderr (the CLI prints them when it loads a model).
    pub fn warnings(&self) -> Vec<String> {
        let arch = self.arch.name();
        let mut out = Vec::new();
        if self.rms_eps > 1e-3 {
            out.push(format!(
                "{arch}.attention.layer_norm_rms_epsilon is {}; Gemma models use 1e-6",
                self.rms_eps
            ));
        }
        if self.context_length > 1 << 24 {
            out.push(format!(
                "{arch}.context_length is {} tokens; the largest Gemma holds 131,072",
                self.context_length
            ));
        }
        if let Some(base) = self.layers.iter().map(|l| l.rope.base).find(|&b| b < 100.0) {
            out.push(format!(
                "{arch}.rope.freq_base is {base}; Gemma models use 10,000 to 1,000,000"
            ));
        }
        out
    }

    /// The configuration as the metadata states it.
    fn resolve(file: &GgufFile, m: &Meta, arch: Arch) -> Result<Self, ConfigError> {
        let n_embd = m.usize("embedding_length")?;
        let n_layers = m.usize("block_count")?;
        let context_length = m.usize("context_length")?;
        let rms_eps = m
            .f32_opt("attention.layer_norm_rms_epsilon")?
            .ok_or_else(|| ConfigError::Missing {
                key: m.key("attention.layer_norm_rms_epsilon"),
            })?;
        let n_head = m
            .per_layer("attention.head_count", n_layers)?
            .ok_or_else(|| ConfigError::Missing {
                key: m.key("attention.head_count"),
            })?;
        let n_head_kv = m
            .per_layer("attention.head_count_kv", n_layers)?
            .unwrap_or_else(|| n_head.clone());
        let n_ff = m
            .per_layer("feed_forward_length", n_layers)?
            .ok_or_else(|| ConfigError::Missing {
                key: m.key("feed_forward_length"),
            })?;
        let head_dim = match m.usize_opt("attention.key_length")? {
            Some(k) => k,
            None => n_embd / n_head[0].max(1),
        };
        if let Some(v) = m.usize_opt("attention.value_length")? {
            if v != head_dim {
                return Err(ConfigError::Invalid {
                    key: m.key("attention.value_length"),
                    msg: format!("{v} differs from key_length {head_dim}"),
                });
            }
        }
        let embd = file
            .tensor("token_embd.weight")
            .ok_or_else(|| ConfigError::Tensor {
                name: "token_embd.weight".into(),
                msg: "missing".into(),
            })?;
        if embd.dims.len() != 2 || embd.dims[0] as usize != n_embd {
            return Err(ConfigError::Tensor {
                name: "token_embd.weight".into(),
                msg: format!(
                    "shape {:?} does not match embedding_length {n_embd}",
                    embd.dims
                ),
            });
        }
        let n_vocab = embd.dims[1] as usize;
        let lm_head = if matches!(arch, Arch::Gemma3 | Arch::Gemma3n | Arch::Gemma4)
            && file.tensor("output.weight").is_some()
        {
            "output.weight".to_owned()
        } else {
            "token_embd.weight".to_owned()
        };

        let freq_base = m.f32_opt("rope.freq_base")?.unwrap_or(10000.0);
        let n_rot = m.usize_opt("rope.dimension_count")?.unwrap_or(head_dim);
        let linear_scale = match m.get("rope.scaling.type").and_then(Value::as_str) {
            None | Some("none") => m.f32_opt("rope.scale_linear")?.map_or(1.0, |f| 1.0 / f),
            Some("linear") => {
                let f = m
                    .f32_opt("rope.scaling.factor")?
                    .ok_or_else(|| ConfigError::Missing {
                        key: m.key("rope.scaling.factor"),
                    })?;
                1.0 / f
            }
            Some(other) => {
                return Err(ConfigError::Invalid {
                    key: m.key("rope.scaling.type"),
                    msg: format!("{other:?} scaling is not supported (only linear)"),
                })
            }
        };

        let (sliding, window, base_swa, attn_softcap, final_softcap, qk_norm, post_norms) =
            match arch {
                Arch::Gemma => (
                    vec![false; n_layers],
                    0,
                    freq_base,
                    None,
                    None,
                    false,
                    false,
                ),
                Arch::Gemma2 => {
                    let window = m.usize_opt("attention.sliding_window")?.unwrap_or(4096);
                    (
                        m.sliding_pattern(n_layers, 2)?,
                        window,
                        m.f32_opt("rope.freq_base_swa")?.unwrap_or(freq_base),
                        Some(m.f32_opt("attn_logit_softcapping")?.unwrap_or(50.0)),
                        Some(m.f32_opt("final_logit_softcapping")?.unwrap_or(30.0)),
                        false,
                        true,
                    )
                }
                Arch::Gemma3 => {
                    let window = m.usize_opt("attention.sliding_window")?.unwrap_or(0);
                    let pattern = if window == 0 {
                        vec![false; n_layers]
                    } else {
                        m.sliding_pattern(n_layers, 6)?
                    };
                    let cap = m.f32_opt("final_logit_softcapping")?.filter(|&c| c > 0.0);
                    (
                        pattern,
                        window,
                        m.f32_opt("rope.freq_base_swa")?.unwrap_or(10000.0),
                        None,
                        cap,
                        true,
                        true,
                    )
                }
                Arch::Gemma4 => {
                    return gemma4(
                        file,
                        m,
                        (n_embd, n_layers, context_length, n_vocab),
                        rms_eps,
                        (n_head, n_head_kv, n_ff),
                        lm_head,
                    )
                }
                Arch::Gemma3n => {
                    return gemma3n(
                        file,
                        m,
                        (n_embd, n_layers, context_length, n_vocab),
                        rms_eps,
                        (n_head, n_head_kv, n_ff),
                        head_dim,
                        lm_head,
                    )
                }
            };

        // Query scale: 1/√hd, except the 27B models, which llama.cpp
        // recognises by layer count and scales by 1/√(d/H).
        let big_27b = matches!((arch, n_layers), (Arch::Gemma2, 46) | (Arch::Gemma3, 62));
        let layers = (0..n_layers)
            .map(|l| {
                let is_sliding = sliding[l];
                let query_scale = if big_27b {
                    1.0 / ((n_embd / n_head[l]) as f32).sqrt()
                } else {
                    1.0 / (head_dim as f32).sqrt()
                };
                LayerSpec {
                    index: l,
                    attention: if is_sliding {
                        AttentionKind::Sliding { window }
                    } else {
                        AttentionKind::Global
                    },
                    n_head: n_head[l],
                    n_head_kv: n_head_kv[l],
                    head_dim,
                    rope: RopeConfig {
                        n_rot,
                        base: if is_sliding { base_swa } else { freq_base },
                        // Gemma 3's linear scaling applies to global layers only.
                        freq_scale: if is_sliding { 1.0 } else { linear_scale },
                        freq_factors: None,
                    },
                    query_scale,
                    attn_softcap,
                    qk_norm,
                    post_norms,
                    n_ff: n_ff[l],
                    kv_source: None,
                    v_norm: false,
                    k_eq_v: false,
                    output_scale: false,
                    per_layer_input: false,
                    moe: None,
                    laurel: false,
                    sparsity: None,
                }
            })
            .collect::<Vec<_>>();
        validate_layers(m, &layers)?;
        Ok(GemmaConfig {
            arch,
            n_embd,
            n_vocab,
            context_length,
            rms_eps,
            embed_scale: (n_embd as f32).sqrt(),
            final_softcap,
            lm_head,
            per_layer_input: 0,
            altup_streams: None,
            layers,
        })
    }
}

/// `n_layers` against the `blk.N` tensors the file holds.
fn check_block_count(file: &GgufFile, m: &Meta, n_layers: usize) -> Result<(), ConfigError> {
    let mut blocks: Vec<usize> = file
        .tensors()
        .iter()
        .filter_map(|t| t.name.strip_prefix("blk.")?.split('.').next()?.parse().ok())
        .collect();
    blocks.sort_unstable();
    blocks.dedup();
    let in_file = blocks.last().map_or(0, |&b| b + 1);
    if n_layers == 0 || n_layers != in_file || blocks.len() != in_file {
        return Err(ConfigError::Invalid {
            key: m.key("block_count"),
            msg: format!(
                "{n_layers} layers, but the file holds tensors for blocks {}",
                match (blocks.first(), blocks.last()) {
                    (Some(a), Some(b)) if blocks.len() == b - a + 1 => format!("{a}..={b}"),
                    (Some(_), Some(_)) => format!("{blocks:?}"),
                    _ => "none".into(),
                }
            ),
        });
    }
    Ok(())
}

/// `v` must be a positive finite number.
fn positive(m: &Meta, suffix: &str, v: f32) -> Result<(), ConfigError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            key: m.key(suffix),
            msg: format!("{v}; expected a positive finite number"),
        })
    }
}

/// The size a key gives against the tensors that have that size on an axis:
/// each of `tensors` present in the file must have `want` on `axis`, or the
/// error names the key, its value and the tensor.
fn sizes_match(
    file: &GgufFile,
    m: &Meta,
    suffix: &str,
    value: usize,
    want: usize,
    tensors: &[(String, usize)],
) -> Result<(), ConfigError> {
    for (name, axis) in tensors {
        let Some(t) = file.tensor(name) else { continue };
        let got = t.dims.get(*axis).map(|&d| d as usize);
        if got != Some(want) {
            return Err(ConfigError::Invalid {
                key: m.key(suffix),
                msg: format!(
                    "{value}, but tensor {name} has shape {:?} (expected {want} on axis {axis})",
                    t.dims
                ),
            });
        }
    }
    Ok(())
}

/// The per-layer-input width against `per_layer_token_embd.weight` and each
/// layer's input gate and projection (Gemma 3n and 4): zero means the file
/// has none of those tensors.
fn check_per_layer_input(
    file: &GgufFile,
    m: &Meta,
    n_layers: usize,
    width: usize,
) -> Result<(), ConfigError> {
    let suffix = "embedding_length_per_layer_input";
    let table = "per_layer_token_embd.weight";
    if width == 0 {
        if file.tensor(table).is_some() {
            return Err(ConfigError::Invalid {
                key: m.key(suffix),
                msg: format!("0, but the file holds {table}"),
            });
        }
        return Ok(());
    }
    if file.tensor(table).is_none() {
        return Err(ConfigError::Invalid {
            key: m.key(suffix),
            msg: format!("{width}, but the file has no {table}"),
        });
    }
    let mut tensors = vec![(table.to_owned(), 0)];
    let per_layer = |l: usize, t: &str, axis: usize| (format!("blk.{l}.{t}.weight"), axis);
    for l in 0..n_layers {
        tensors.push(per_layer(l, "inp_gate", 1));
        tensors.push(per_layer(l, "proj", 0));
    }
    sizes_match(file, m, suffix, width, width * n_layers, &tensors[..1])?;
    sizes_match(file, m, suffix, width, width, &tensors[1..])
}

/// Checks what every generation's resolved config must satisfy: a context,
/// positive finite epsilons, RoPE bases and scales, softcaps, windows and
/// sizes. Errors name the key, the value and what was expected.
fn validate(m: &Meta, cfg: &GemmaConfig) -> Result<(), ConfigError> {
    let invalid = |suffix: &str, msg: String| ConfigError::Invalid {
        key: m.key(suffix),
        msg,
    };
    let positive = |suffix: &str, v: f32| positive(m, suffix, v);
    if cfg.context_length == 0 {
        return Err(invalid("context_length", "0; expected at least 1".into()));
    }
    positive("attention.layer_norm_rms_epsilon", cfg.rms_eps)?;
    if let Some(c) = cfg.final_softcap {
        positive("final_logit_softcapping", c)?;
    }
    for s in &cfg.layers {
        let base_key = match s.attention {
            AttentionKind::Sliding { .. } => "rope.freq_base_swa",
            AttentionKind::Global => "rope.freq_base",
        };
        positive(base_key, s.rope.base)?;
        positive("rope.scaling.factor", s.rope.freq_scale)?;
        if let Some(c) = s.attn_softcap {
            positive("attn_logit_softcapping", c)?;
        }
        if let AttentionKind::Sliding { window: 0 } = s.attention {
            return Err(invalid(
                "attention.sliding_window",
                format!("0 for sliding layer {}; expected at least 1", s.index),
            ));
        }
        if s.n_ff == 0 || s.head_dim == 0 {
            let (key, v) = if s.n_ff == 0 {
                ("feed_forward_length", s.n_ff)
            } else {
                ("attention.key_length", s.head_dim)
            };
            return Err(invalid(
                key,
                format!("{v} for layer {}; expected at least 1", s.index),
            ));
        }
        if let Some(src) = s.kv_source {
            if src >= s.index {
                return Err(invalid(
                    "attention.shared_kv_layers",
                    format!("layer {} would read K/V of later layer {src}", s.index),
                ));
            }
        }
    }
    Ok(())
}

fn validate_layers(m: &Meta, layers: &[LayerSpec]) -> Result<(), ConfigError> {
    for s in layers {
        let head_dim = s.head_dim;
        if s.n_head == 0 {
            return Err(ConfigError::Invalid {
                key: m.key("attention.head_count"),
                msg: format!("0 for layer {}; expected at least 1", s.index),
            });
        }
        if s.n_head_kv == 0 || s.n_head % s.n_head_kv != 0 {
            return Err(ConfigError::Invalid {
                key: m.key("attention.head_count_kv"),
                msg: format!(
                    "layer {}: {} query heads are not a multiple of {} kv heads",
                    s.index, s.n_head, s.n_head_kv
                ),
            });
        }
        if s.rope.n_rot > head_dim || s.rope.n_rot % 2 == 1 {
            return Err(ConfigError::Invalid {
                key: m.key("rope.dimension_count"),
                msg: format!(
                    "{} must be even and at most the head size {head_dim}",
                    s.rope.n_rot
                ),
            });
        }
    }
    Ok(())
}

/// Gemma 4: per-layer head sizes and KV heads, proportional RoPE on global
/// layers, K = V layers, KV sharing, per-layer embeddings, output scales.
fn gemma4(
    file: &GgufFile,
    m: &Meta,
    (n_embd, n_layers, context_length, n_vocab): (usize, usize, usize, usize),
    rms_eps: f32,
    (n_head, n_head_kv, n_ff): (Vec<usize>, Vec<usize>, Vec<usize>),
    lm_head: String,
) -> Result<GemmaConfig, ConfigError> {
    let key = |s: &str| m.key(s);
    if m.get("attention.sliding_window_pattern").is_none() {
        return Err(ConfigError::Missing {
            key: key("attention.sliding_window_pattern"),
        });
    }
    let sliding = m.sliding_pattern(n_layers, 0)?;
    let window = m.usize("attention.sliding_window")?;
    let hd_global = m.usize("attention.key_length")?;
    let hd_local = m
        .usize_opt("attention.key_length_swa")?
        .unwrap_or(hd_global);
    for (k, v) in [
        ("attention.value_length", hd_global),
        ("attention.value_length_swa", hd_local),
    ] {
        if let Some(x) = m.usize_opt(k)? {
            if x != v {
                return Err(ConfigError::Invalid {
                    key: key(k),
                    msg: format!("{x} differs from the key length {v}"),
                });
            }
        }
    }
    let rot_global = m.usize_opt("rope.dimension_count")?.unwrap_or(hd_global);
    let rot_local = m
        .usize_opt("rope.dimension_count_swa")?
        .unwrap_or(rot_global);
    let base_global = m.f32_opt("rope.freq_base")?.unwrap_or(10000.0);
    let base_local = m.f32_opt("rope.freq_base_swa")?.unwrap_or(10000.0);
    let n_shared = m.usize_opt("attention.shared_kv_layers")?.unwrap_or(0);
    let sources = kv_sources(m, &sliding, n_shared)?;
    let per_layer_input = m
        .usize_opt("embedding_length_per_layer_input")?
        .unwrap_or(0);
    let experts = m.usize_opt("expert_count")?.unwrap_or(0);
    let moe = if experts > 0 {
        let top_k = m.usize("expert_used_count")?;
        if top_k == 0 || top_k > experts {
            return Err(ConfigError::Invalid {
                key: key("expert_used_count"),
                msg: format!("{top_k} of {experts} experts"),
            });
        }
        let n_ff = m.usize("expert_feed_forward_length")?;
        if n_ff == 0 {
            return Err(ConfigError::Invalid {
                key: key("expert_feed_forward_length"),
                msg: "0; expected at least 1".into(),
            });
        }
        let per_layer = |t: &str, axis: usize| -> Vec<(String, usize)> {
            (0..n_layers)
                .map(|l| (format!("blk.{l}.{t}"), axis))
                .collect()
        };
        let mut by_expert = per_layer("ffn_gate_up_exps.weight", 2);
        by_expert.extend(per_layer("ffn_down_exps.weight", 2));
        by_expert.extend(per_layer("ffn_gate_inp.weight", 1));
        sizes_match(file, m, "expert_count", experts, experts, &by_expert)?;
        let mut by_width = per_layer("ffn_gate_up_exps.weight", 1)
            .into_iter()
            .map(|(t, a)| (t, a, 2 * n_ff))
            .collect::<Vec<_>>();
        by_width.extend(
            per_layer("ffn_down_exps.weight", 0)
                .into_iter()
                .map(|(t, a)| (t, a, n_ff)),
        );
        for (t, a, want) in by_width {
            sizes_match(file, m, "expert_feed_forward_length", n_ff, want, &[(t, a)])?;
        }
        Some(MoeSpec {
            experts,
            top_k,
            n_ff,
        })
    } else {
        if let Some(t) = (0..n_layers)
            .map(|l| format!("blk.{l}.ffn_gate_inp.weight"))
            .find(|t| file.tensor(t).is_some())
        {
            return Err(ConfigError::Invalid {
                key: key("expert_count"),
                msg: format!("0 or missing, but the file holds the router {t}"),
            });
        }
        None
    };
    check_per_layer_input(file, m, n_layers, per_layer_input)?;
    let freq_factors = file
        .tensor("rope_freqs.weight")
        .map(|_| "rope_freqs.weight".to_owned());
    let has = |l: usize, t: &str| file.tensor(&format!("blk.{l}.{t}.weight")).is_some();
    let mut layers: Vec<LayerSpec> = Vec::with_capacity(n_layers);
    for l in 0..n_layers {
        let local = sliding[l];
        let kv_source = sources[l];
        let base = NormedLayer {
            index: l,
            window: local.then_some(window),
            n_head: n_head[l],
            // A sharing layer has its source's KV heads.
            n_head_kv: kv_source.map_or(n_head_kv[l], |s| layers[s].n_head_kv),
            head_dim: if local { hd_local } else { hd_global },
            rope: RopeConfig {
                n_rot: if local { rot_local } else { rot_global },
                base: if local { base_local } else { base_global },
                freq_scale: 1.0,
                // Proportional RoPE: the factors apply to global layers only.
                freq_factors: if local { None } else { freq_factors.clone() },
            },
            n_ff: n_ff[l],
            kv_source,
            per_layer_input: per_layer_input > 0,
        };
        layers.push(LayerSpec {
            k_eq_v: kv_source.is_none() && !has(l, "attn_v"),
            output_scale: has(l, "layer_output_scale"),
            moe: moe.filter(|_| has(l, "ffn_gate_inp")),
            ..base.spec()
        });
    }
    normed_config(
        Arch::Gemma4,
        m,
        (n_embd, n_vocab, context_length),
        rms_eps,
        lm_head,
        per_layer_input,
        None,
        layers,
    )
}

/// What differs between layers of the QK-normed generations (3n, 4).
struct NormedLayer {
    index: usize,
    window: Option<usize>,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    rope: RopeConfig,
    n_ff: usize,
    kv_source: Option<usize>,
    per_layer_input: bool,
}

impl NormedLayer {
    /// QK- and V-norms in place of a query scale, sandwich norms, no
    /// attention softcap; generation-specific features off.
    fn spec(self) -> LayerSpec {
        LayerSpec {
            index: self.index,
            attention: match self.window {
                Some(window) => AttentionKind::Sliding { window },
                None => AttentionKind::Global,
            },
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.head_dim,
            rope: self.rope,
            query_scale: 1.0,
            attn_softcap: None,
            qk_norm: true,
            post_norms: true,
            n_ff: self.n_ff,
            kv_source: self.kv_source,
            v_norm: true,
            k_eq_v: false,
            output_scale: false,
            per_layer_input: self.per_layer_input,
            moe: None,
            laurel: false,
            sparsity: None,
        }
    }
}

/// The config of the QK-normed generations (3n, 4), whose final softcap is 30
/// when the key is absent.
#[allow(clippy::too_many_arguments)]
fn normed_config(
    arch: Arch,
    m: &Meta,
    (n_embd, n_vocab, context_length): (usize, usize, usize),
    rms_eps: f32,
    lm_head: String,
    per_layer_input: usize,
    altup_streams: Option<usize>,
    layers: Vec<LayerSpec>,
) -> Result<GemmaConfig, ConfigError> {
    validate_layers(m, &layers)?;
    let final_softcap =
        Some(m.f32_opt("final_logit_softcapping")?.unwrap_or(30.0)).filter(|&c| c > 0.0);
    Ok(GemmaConfig {
        arch,
        n_embd,
        n_vocab,
        context_length,
        rms_eps,
        embed_scale: (n_embd as f32).sqrt(),
        final_softcap,
        lm_head,
        per_layer_input,
        altup_streams,
        layers,
    })
}

/// The layers that own a KV cache are the first `L − n_shared`; each later
/// layer reads the last owning layer of its own type.
fn kv_sources(
    m: &Meta,
    sliding: &[bool],
    n_shared: usize,
) -> Result<Vec<Option<usize>>, ConfigError> {
    let n_layers = sliding.len();
    if n_shared >= n_layers {
        return Err(ConfigError::Invalid {
            key: m.key("attention.shared_kv_layers"),
            msg: format!("{n_shared} shared layers of {n_layers}"),
        });
    }
    let first_shared = n_layers - n_shared;
    (0..n_layers)
        .map(|l| {
            if l < first_shared {
                return Ok(None);
            }
            (0..first_shared)
                .rev()
                .find(|&j| sliding[j] == sliding[l])
                .map(Some)
                .ok_or_else(|| ConfigError::Invalid {
                    key: m.key("attention.shared_kv_layers"),
                    msg: format!("layer {l} has no earlier layer of its type to share K/V with"),
                })
        })
        .collect()
}

/// Gemma 3n: AltUp streams, LAuReL, Gaussian top-k FFN sparsity,
/// per-layer embeddings and KV sharing.
#[allow(clippy::too_many_arguments)]
fn gemma3n(
    file: &GgufFile,
    m: &Meta,
    (n_embd, n_layers, context_length, n_vocab): (usize, usize, usize, usize),
    rms_eps: f32,
    (n_head, n_head_kv, n_ff): (Vec<usize>, Vec<usize>, Vec<usize>),
    head_dim: usize,
    lm_head: String,
) -> Result<GemmaConfig, ConfigError> {
    let key = |s: &str| m.key(s);
    let sliding = m.sliding_pattern(n_layers, 5)?;
    let window = m.usize("attention.sliding_window")?;
    let base_global = m.f32_opt("rope.freq_base")?.unwrap_or(1_000_000.0);
    let base_local = m.f32_opt("rope.freq_base_swa")?.unwrap_or(10000.0);
    let n_shared = m.usize_opt("attention.shared_kv_layers")?.unwrap_or(0);
    let sources = kv_sources(m, &sliding, n_shared)?;
    let per_layer_input = m
        .usize_opt("embedding_length_per_layer_input")?
        .unwrap_or(256);
    let streams = m.usize_opt("altup.num_inputs")?.unwrap_or(4);
    if streams < 2 {
        return Err(ConfigError::Invalid {
            key: key("altup.num_inputs"),
            msg: format!("{streams}; expected at least 2 streams"),
        });
    }
    let mut by_stream = vec![
        ("altup_proj.weight".to_owned(), 2, streams - 1),
        ("altup_unembd_proj.weight".to_owned(), 2, streams - 1),
    ];
    for l in 0..n_layers {
        by_stream.push((format!("blk.{l}.altup_router.weight"), 1, streams));
        by_stream.push((format!("blk.{l}.altup_correct_coef.weight"), 1, streams));
        by_stream.push((
            format!("blk.{l}.altup_predict_coef.weight"),
            1,
            streams * streams,
        ));
    }
    for (t, axis, want) in by_stream {
        sizes_match(file, m, "altup.num_inputs", streams, want, &[(t, axis)])?;
    }
    check_per_layer_input(file, m, n_layers, per_layer_input)?;
    if m.usize_opt("altup.active_idx")?.unwrap_or(0) != 0 {
        return Err(ConfigError::Invalid {
            key: key("altup.active_idx"),
            msg: "only stream 0 as the active stream is supported".into(),
        });
    }
    let sparsity: Vec<Option<f32>> = match m.get("activation_sparsity_scale") {
        None => vec![None; n_layers],
        Some(v) => {
            let a = v
                .as_array()
                .and_then(|a| a.as_f32s())
                .ok_or_else(|| ConfigError::Invalid {
                    key: key("activation_sparsity_scale"),
                    msg: "expected an f32 array".into(),
                })?;
            if a.len() != n_layers {
                return Err(ConfigError::Invalid {
                    key: key("activation_sparsity_scale"),
                    msg: format!("{} values for {n_layers} layers", a.len()),
                });
            }
            // Dense layers hold −∞ (Φ⁻¹(0)); they get no sparsity at all.
            a.iter().map(|&k| k.is_finite().then_some(k)).collect()
        }
    };
    let has = |l: usize, t: &str| file.tensor(&format!("blk.{l}.{t}.weight")).is_some();
    let mut layers: Vec<LayerSpec> = Vec::with_capacity(n_layers);
    for l in 0..n_layers {
        let local = sliding[l];
        let kv_source = sources[l];
        let base = NormedLayer {
            index: l,
            window: local.then_some(window),
            n_head: n_head[l],
            n_head_kv: kv_source.map_or(n_head_kv[l], |s| layers[s].n_head_kv),
            head_dim,
            rope: RopeConfig {
                n_rot: head_dim,
                base: if local { base_local } else { base_global },
                freq_scale: 1.0,
                freq_factors: None,
            },
            n_ff: n_ff[l],
            kv_source,
            per_layer_input: per_layer_input > 0,
        };
        layers.push(LayerSpec {
            laurel: has(l, "laurel_l"),
            sparsity: sparsity[l],
            ..base.spec()
        });
    }
    normed_config(
        Arch::Gemma3n,
        m,
        (n_embd, n_vocab, context_length),
        rms_eps,
        lm_head,
        per_layer_input,
        Some(streams),
        layers,
    )
}
