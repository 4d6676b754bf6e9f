//! The op set. Kept small: every fused op says which simpler ops it stands
//! for, and the passes only introduce fused ops whose result equals that
//! composition within float rounding.

use std::fmt;

use crate::shape::Shape;

/// A weight handle: an index into the model's weight store. The graph never
/// holds weight data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WeightId(pub u32);

/// A KV-cache layer slot (the layer whose K/V are stored there).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheSlot(pub u32);

/// Which keys a query may see. Positions are absolute token positions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mask {
    /// Key position ≤ query position.
    Causal,
    /// Causal, and query − key < window.
    Sliding { window: usize },
    /// Every key (encoder style).
    Full,
    /// |query − key| ≤ half_width (symmetric local window).
    Symmetric { half_width: usize },
}

/// Where attention finds its keys and values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KvSource {
    /// From inputs 1 and 2: K and V of shape `[n_kv, kv_heads, head_dim]`,
    /// at positions `0..n_kv`.
    Inputs,
    /// From a KV-cache slot; input 1 is the `KvWrite` effect that must run
    /// first (or any earlier effect on the slot).
    Cache(CacheSlot),
}

/// Attention: `softmax(softcap(scale · q·kᵀ) + mask) · v` per query head,
/// query head `h` reading KV head `h / (q_heads / kv_heads)` (grouped-query
/// attention without repeating K/V).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpec {
    pub mask: Mask,
    pub scale: f32,
    /// `C · tanh(z / C)` on the scores before the mask, when set.
    pub softcap: Option<f32>,
    pub kv: KvSource,
    /// With a cache source, input 2 is an i32 `[n]` span id per query (the
    /// cache keeps the ids of its keys); a query and a key with the same
    /// non-zero span id see each other regardless of the mask (image tokens).
    pub bidirectional_spans: bool,
}

/// A rotary embedding frequency table: θ_i = p · freq_scale · base^(−2i/n_rot) / f_i.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeSpec {
    /// Leading dimensions of each head that rotate (NEOX pairing i ↔ i + n_rot/2).
    pub n_rot: usize,
    pub base: f32,
    pub freq_scale: f32,
    /// Input 2 is an f32 weight of n_rot/2 per-pair frequency divisors f_i.
    pub has_freq_factors: bool,
}

impl RopeSpec {
    /// The angle step of pair `i`: `freq_scale · base^(−2i/n_rot) / f_i`,
    /// computed as transformers does in float32 (`factors` are the f_i).
    pub fn inv_freqs(&self, factors: Option<&[f32]>) -> Vec<f32> {
        (0..self.n_rot / 2)
            .map(|i| {
                let inv = 1.0 / self.base.powf((2 * i) as f32 / self.n_rot as f32);
                let inv = inv * self.freq_scale;
                match factors {
                    Some(f) => inv / f[i],
                    None => inv,
                }
            })
            .collect()
    }
}

/// Where a narrowed range starts along its axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Start {
    FromStart(usize),
    /// Counted from the end: `FromEnd(1)` with len 1 takes the last row.
    FromEnd(usize),
}

/// An operation. Inputs are listed per variant.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A value supplied at run time by name.
    Input { name: String },
    /// A weight from the store. `shape` is `[rows, row_len]` for matrices
    /// (GGUF `ne` reversed) or `[len]` for vectors.
    Weight { id: WeightId, name: String },
    /// Rows of a weight table, dequantized to f32: inputs `[table, ids]`,
    /// `ids` i32 `[n]`, result `[n, row_len]`.
    Gather,
    /// `x · wᵀ` for each weight: inputs `[x, w₁, …, w_k]` with `x` `[…, K]`
    /// and each `wᵢ` `[Nᵢ, K]` in any weight type; the result `[…, ΣNᵢ]`
    /// concatenates the products along the last axis. With `norm` set,
    /// input 1 is the norm weight and `x` is first normalised:
    /// `MatMul{norm} = Concat(MatMul(RmsNorm(x, γ), wᵢ)…)`.
    MatMul { norm: Option<NormSpec> },
    /// Elementwise `a + b`; `b` broadcasts NumPy-style (aligned from the last
    /// axis, each dimension equal or 1).
    Add,
    /// Elementwise `a · b`, broadcasting like `Add`.
    Mul,
    /// Per-token product of activations: `[n, p, q] · [n, q, r] → [n, p, r]`.
    BatchMatMul,
    /// Per row: `x · rms(target) / sqrt(max(mean(x²), floor))`. Stands for
    /// two row means of squares, a clamp, a square root, a mul and a div.
    MatchRms { floor: f32 },
    /// Per row: `relu(x − (mean(x) + std_multiplier · std(x)))`, population
    /// std. Stands for row mean, row std, scale, sub and relu.
    GaussianTopK { std_multiplier: f32 },
    /// `x · factor`.
    Scale { factor: f32 },
    /// `x + value`.
    AddConst { value: f32 },
    /// `x / sqrt(mean(x²) + eps) · γ` over the last axis; inputs `[x]` or `[x, γ]`.
    RmsNorm(NormSpec),
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    Gelu,
    /// `Gelu(gate) · up`: inputs `[gate, up]`.
    GeGlu,
    /// `cap · tanh(x / cap)`.
    Softcap { cap: f32 },
    /// Rotary embedding of `x` `[n, heads, head_dim]` at positions (i32 `[n]`):
    /// inputs `[x, positions]` or `[x, positions, freq_factors]`.
    Rope(RopeSpec),
    /// Attention of `q` `[n, q_heads, head_dim]`; see [`AttentionSpec`].
    /// Result `[n, q_heads, v_head_dim]`.
    Attention(AttentionSpec),
    /// Appends `k`, `v` `[n, kv_heads, head_dim]` to a cache slot at the
    /// current positions: inputs `[k, v]` or `[k, v, span_ids]`, result an
    /// effect.
    KvWrite { slot: CacheSlot },
    /// Mixture-of-experts GeGLU FFN. Inputs `[u, router_logits, gate_up,
    /// down, expert_scale]`: `u` `[n, d]`, logits `[n, E]`, `gate_up` a weight
    /// `[E, 2·ff, d]` (gate rows, then up rows), `down` `[E, d, ff]`,
    /// `expert_scale` `[E]`. Per token: `π = softmax(logits)`, the `top_k`
    /// experts S, `w_e = π_e / Σ_S π · expert_scale_e`, and the result
    /// `Σ_S w_e · down_e(gelu(gate_e·u) ⊙ up_e·u)`. Stands for softmax, top-k,
    /// and per-token matmuls against expert slices.
    Moe { top_k: usize },
    /// Rows of an activation by index: inputs `[x, rows]` with `x` `[n, …]`
    /// and `rows` i32 `[m]`, result `[m, …]` (the rows of a batch whose
    /// logits are wanted).
    TakeRows,
    /// Rows `start .. start+len` along `axis`.
    Narrow {
        axis: usize,
        start: Start,
        len: usize,
    },
    /// Same data, new shape (equal element count).
    Reshape { shape: Shape },
    /// Concatenation of all inputs along `axis`.
    Concat { axis: usize },
}

/// Parameters of an RMS norm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NormSpec {
    pub eps: f32,
    /// Whether a γ weight input follows `x`.
    pub has_gamma: bool,
}

impl Op {
    /// A short name for dumps and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Weight { .. } => "weight",
            Op::Gather => "gather",
            Op::MatMul { norm: None } => "matmul",
            Op::MatMul { norm: Some(_) } => "norm_matmul",
            Op::Add => "add",
            Op::Mul => "mul",
            Op::BatchMatMul => "batch_matmul",
            Op::MatchRms { .. } => "match_rms",
            Op::GaussianTopK { .. } => "gaussian_topk",
            Op::Scale { .. } => "scale",
            Op::AddConst { .. } => "add_const",
            Op::RmsNorm(_) => "rms_norm",
            Op::Gelu => "gelu",
            Op::GeGlu => "geglu",
            Op::Softcap { .. } => "softcap",
            Op::Rope(_) => "rope",
            Op::Attention(_) => "attention",
            Op::KvWrite { .. } => "kv_write",
            Op::Moe { .. } => "moe",
            Op::TakeRows => "take_rows",
            Op::Narrow { .. } => "narrow",
            Op::Reshape { .. } => "reshape",
            Op::Concat { .. } => "concat",
        }
    }

    /// Ops with an effect beyond their result; never removed or merged.
    pub fn has_effect(&self) -> bool {
        matches!(self, Op::KvWrite { .. })
    }

    /// A key equal for ops that compute the same function (used by CSE).
    pub(crate) fn cse_key(&self) -> Option<String> {
        match self {
            Op::Input { .. } | Op::KvWrite { .. } | Op::Attention(_) => None,
            op => Some(format!("{op:?}")),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Input { name } => write!(f, "input {name:?}"),
            Op::Weight { id, name } => write!(f, "weight #{} {name:?}", id.0),
            Op::MatMul { norm: Some(n) } => write!(f, "norm_matmul eps={}", n.eps),
            Op::Scale { factor } => write!(f, "scale {factor}"),
            Op::RmsNorm(n) => write!(f, "rms_norm eps={} gamma={}", n.eps, n.has_gamma),
            Op::Softcap { cap } => write!(f, "softcap {cap}"),
            Op::Rope(r) => write!(
                f,
                "rope n_rot={} base={} scale={}{}",
                r.n_rot,
                r.base,
                r.freq_scale,
                if r.has_freq_factors { " +factors" } else { "" }
            ),
            Op::Attention(a) => {
                write!(f, "attention {:?} scale={}", a.mask, a.scale)?;
                if let Some(c) = a.softcap {
                    write!(f, " softcap={c}")?;
                }
                match a.kv {
                    KvSource::Inputs => Ok(()),
                    KvSource::Cache(s) => write!(f, " cache={}", s.0),
                }
            }
            Op::KvWrite { slot } => write!(f, "kv_write cache={}", slot.0),
            Op::Moe { top_k } => write!(f, "moe top_k={top_k}"),
            Op::Narrow { axis, start, len } => write!(f, "narrow axis={axis} {start:?} len={len}"),
            Op::Reshape { shape } => write!(f, "reshape {shape}"),
            Op::Concat { axis } => write!(f, "concat axis={axis}"),
            op => f.write_str(op.name()),
        }
    }
}
