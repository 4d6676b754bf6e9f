//! The Gemma graph: one layer function for every step (prefill chunks,
//! decode tokens of many sequences, or both, differ only in the `seq`
//! symbol's value), with each generation's features switched by the
//! resolved [`LayerSpec`].

use rlx_ir::{
    AttentionSpec, CacheSlot, DType, Dim, Graph, KvSource, Mask, NodeId, RopeSpec, Shape, Start,
    Sym,
};
use rlx_runtime::{WeightError, WeightStore};

use crate::altup;
use crate::config::{AttentionKind, GemmaConfig, LayerSpec};

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Weight(#[from] WeightError),
    #[error(transparent)]
    Graph(#[from] rlx_ir::IrError),
}

type Result<T> = std::result::Result<T, BuildError>;

fn seq() -> Dim {
    Dim::Sym(Sym::SEQ)
}

/// Per-graph state the layers share.
pub(crate) struct Ctx {
    pub(crate) pos: NodeId,
    /// The KV write of each layer that owns a cache, for layers sharing it.
    pub(crate) writes: Vec<Option<NodeId>>,
    /// Per-layer embeddings `[seq, layers, P]`, when the model has them.
    pub(crate) per_layer: Option<NodeId>,
}

/// Builds the model graph. Inputs: `tokens` and `pos` (i32 `[seq]`, the
/// step's rows) and `logit_rows` (i32 `[rows]`, the rows whose logits are
/// wanted); output `logits` `[rows, vocab]`. The final norm and the LM head
/// run only on those rows.
pub fn build_graph(cfg: &GemmaConfig, store: &WeightStore) -> Result<Graph> {
    let mut g = Graph::new();
    let tokens = g.input("tokens", DType::I32, Shape::new([seq()]));
    let pos = g.input("pos", DType::I32, Shape::new([seq()]));
    let logit_rows = g.input("logit_rows", DType::I32, Shape::new([Dim::Sym(Sym::ROWS)]));
    let embd = store.node(&mut g, "token_embd.weight")?;
    let x = g.gather(embd, tokens)?;
    let mut x = g.scale(x, cfg.embed_scale)?;
    g.set_name(x, "embd");
    let per_layer = if cfg.per_layer_input > 0 {
        Some(per_layer_inputs(&mut g, cfg, store, tokens, x)?)
    } else {
        None
    };
    let mut ctx = Ctx {
        pos,
        writes: vec![None; cfg.layers.len()],
        per_layer,
    };
    match cfg.altup_streams {
        None => {
            for spec in &cfg.layers {
                x = layer(&mut g, cfg, spec, store, x, &mut ctx)?;
            }
        }
        Some(n) => {
            let mut streams = altup::split(&mut g, cfg, store, x, n)?;
            for spec in &cfg.layers {
                streams = altup::layer(&mut g, cfg, spec, store, streams, n, &mut ctx)?;
            }
            x = altup::merge(&mut g, cfg, store, streams, n)?;
        }
    }
    x = g.take_rows(x, logit_rows)?;
    let norm = store.node(&mut g, "output_norm.weight")?;
    let h = g.rms_norm(x, Some(norm), cfg.rms_eps)?;
    g.set_name(h, "output_norm");
    let head = if cfg.lm_head == "token_embd.weight" {
        embd
    } else {
        store.node(&mut g, &cfg.lm_head)?
    };
    let mut out = g.matmul(h, head)?;
    if let Some(cap) = cfg.final_softcap {
        out = g.softcap(out, cap)?;
    }
    g.set_name(out, "logits");
    g.output("logits", out);
    Ok(g)
}

/// `P_l = (RMSNorm(W_plmp·e · d^(−1/2); γ) + T_l · √P) · 2^(−1/2)` for every
/// layer at once, as `[seq, layers, P]`; `T` rows are gathered lazily from
/// the mapped per-layer table.
pub(crate) fn per_layer_inputs(
    g: &mut Graph,
    cfg: &GemmaConfig,
    store: &WeightStore,
    tokens: NodeId,
    embd: NodeId,
) -> Result<NodeId> {
    let (n_layers, p) = (cfg.layers.len(), cfg.per_layer_input);
    let stacked =
        |g: &mut Graph, x: NodeId| g.reshape(x, Shape::new([seq(), n_layers.into(), p.into()]));
    let table = store.node(g, "per_layer_token_embd.weight")?;
    let t = g.gather(table, tokens)?;
    let t = g.scale(t, (p as f32).sqrt())?;
    let t = stacked(g, t)?;
    let proj_w = store.node(g, "per_layer_model_proj.weight")?;
    let c = g.matmul(embd, proj_w)?;
    let c = g.scale(c, 1.0 / (cfg.n_embd as f32).sqrt())?;
    let c = stacked(g, c)?;
    let norm = store.node(g, "per_layer_proj_norm.weight")?;
    let c = g.rms_norm(c, Some(norm), cfg.rms_eps)?;
    let sum = g.add(c, t)?;
    let out = g.scale(sum, std::f32::consts::FRAC_1_SQRT_2)?;
    g.set_name(out, "per_layer_inputs");
    Ok(out)
}

/// The routed-expert branch of a MoE layer: the router reads the unweighted
/// norm of the residual `a` times `ffn_gate_inp.scale` and `d^(−1/2)`; the
/// experts read `RMSNorm(a; pre_ffw_norm_2)`.
fn experts(
    g: &mut Graph,
    cfg: &GemmaConfig,
    spec: &LayerSpec,
    store: &WeightStore,
    a: NodeId,
    top_k: usize,
) -> Result<NodeId> {
    let l = spec.index;
    let t = |g: &mut Graph, name: &str| store.node(g, &format!("blk.{l}.{name}"));
    let eps = cfg.rms_eps;
    let r = g.rms_norm(a, None, eps)?;
    let router_scale = t(g, "ffn_gate_inp.scale")?;
    let r = g.mul(r, router_scale)?;
    let r = g.scale(r, 1.0 / (cfg.n_embd as f32).sqrt())?;
    let router = t(g, "ffn_gate_inp.weight")?;
    let logits = g.matmul(r, router)?;
    let pre = t(g, "pre_ffw_norm_2.weight")?;
    let u = g.rms_norm(a, Some(pre), eps)?;
    let gate_up = t(g, "ffn_gate_up_exps.weight")?;
    let down = t(g, "ffn_down_exps.weight")?;
    let expert_scale = t(g, "ffn_down_exps.scale")?;
    let y = g.moe(u, logits, gate_up, down, expert_scale, top_k)?;
    let post = t(g, "post_ffw_norm_2.weight")?;
    let y = g.rms_norm(y, Some(post), eps)?;
    g.set_name(y, format!("blk.{l}.moe_out"));
    Ok(y)
}

/// One transformer layer: attention and GeGLU FFN with the pre/post norms,
/// QK(V)-norms, softcaps, RoPE table, KV sharing, per-layer input and output
/// scale the spec calls for.
pub(crate) fn layer(
    g: &mut Graph,
    cfg: &GemmaConfig,
    spec: &LayerSpec,
    store: &WeightStore,
    x: NodeId,
    ctx: &mut Ctx,
) -> Result<NodeId> {
    let l = spec.index;
    let w = |g: &mut Graph, name: &str| store.node(g, &format!("blk.{l}.{name}.weight"));
    let eps = cfg.rms_eps;
    let (hq, hkv, hd) = (spec.n_head, spec.n_head_kv, spec.head_dim);
    let heads =
        |g: &mut Graph, t: NodeId, n: usize| g.reshape(t, Shape::new([seq(), n.into(), hd.into()]));

    // Attention.
    let attn_norm = w(g, "attn_norm")?;
    let h = g.rms_norm(x, Some(attn_norm), eps)?;
    // LAuReL: h + RMSNorm(W_R·(W_L·h)), joined with the attention residual below.
    let laurel = if spec.laurel {
        let (wl, wr) = (w(g, "laurel_l")?, w(g, "laurel_r")?);
        let lo = g.matmul(h, wl)?;
        let lo = g.matmul(lo, wr)?;
        let ln = w(g, "laurel_post_norm")?;
        let lo = g.rms_norm(lo, Some(ln), eps)?;
        Some(g.add(h, lo)?)
    } else {
        None
    };
    let wq = w(g, "attn_q")?;
    let q = g.matmul(h, wq)?;
    let mut q = heads(g, q, hq)?;
    let rope = RopeSpec {
        n_rot: spec.rope.n_rot,
        base: spec.rope.base,
        freq_scale: spec.rope.freq_scale,
        has_freq_factors: false,
    };
    let factors = match &spec.rope.freq_factors {
        Some(name) => Some(store.node(g, name)?),
        None => None,
    };
    if spec.qk_norm {
        let qn = w(g, "attn_q_norm")?;
        q = g.rms_norm(q, Some(qn), eps)?;
    }
    let q = g.rope(q, ctx.pos, rope, factors)?;
    let slot = CacheSlot(spec.kv_source.unwrap_or(l) as u32);
    let written = match spec.kv_source {
        Some(src) => ctx.writes[src].expect("sources precede the layers sharing them"),
        None => {
            let wk = w(g, "attn_k")?;
            let k_raw = g.matmul(h, wk)?;
            let v_raw = if spec.k_eq_v {
                k_raw
            } else {
                let wv = w(g, "attn_v")?;
                g.matmul(h, wv)?
            };
            let mut k = heads(g, k_raw, hkv)?;
            let mut v = heads(g, v_raw, hkv)?;
            if spec.qk_norm {
                let kn = w(g, "attn_k_norm")?;
                k = g.rms_norm(k, Some(kn), eps)?;
            }
            if spec.v_norm {
                v = g.rms_norm(v, None, eps)?;
            }
            let k = g.rope(k, ctx.pos, rope, factors)?;
            let written = g.kv_write(slot, k, v)?;
            ctx.writes[l] = Some(written);
            written
        }
    };
    let mask = match spec.attention {
        AttentionKind::Global => Mask::Causal,
        AttentionKind::Sliding { window } => Mask::Sliding { window },
    };
    let attn = AttentionSpec {
        mask,
        scale: spec.query_scale,
        softcap: spec.attn_softcap,
        kv: KvSource::Cache(slot),
        bidirectional_spans: false,
    };
    let a = g.attention_cached(q, written, slot, attn, None)?;
    let a = g.reshape(a, Shape::new([seq(), (hq * hd).into()]))?;
    let wo = w(g, "attn_output")?;
    let mut o = g.matmul(a, wo)?;
    if spec.post_norms {
        let pn = w(g, "post_attention_norm")?;
        o = g.rms_norm(o, Some(pn), eps)?;
    }
    g.set_name(o, format!("blk.{l}.attn_out"));
    let mut x = g.add(x, o)?;
    if let Some(lr) = laurel {
        let sum = g.add(x, lr)?;
        x = g.scale(sum, std::f32::consts::FRAC_1_SQRT_2)?;
    }

    // Feed-forward: down(gelu(gate(h)) · up(h)).
    let ffn_norm = w(g, "ffn_norm")?;
    let h = g.rms_norm(x, Some(ffn_norm), eps)?;
    let (wg, wu, wd) = (w(g, "ffn_gate")?, w(g, "ffn_up")?, w(g, "ffn_down")?);
    let mut gate = g.matmul(h, wg)?;
    if let Some(k) = spec.sparsity {
        gate = g.gaussian_topk(gate, k)?;
    }
    let up = g.matmul(h, wu)?;
    let act = g.gelu(gate)?;
    let m = g.mul(act, up)?;
    let mut f = g.matmul(m, wd)?;
    if let Some(moe) = spec.moe {
        // Shared expert and routed experts, each with its own post-norm.
        let n1 = w(g, "post_ffw_norm_1")?;
        let shared = g.rms_norm(f, Some(n1), eps)?;
        let routed = experts(g, cfg, spec, store, x, moe.top_k)?;
        f = g.add(shared, routed)?;
    }
    if spec.post_norms {
        let pn = w(g, "post_ffw_norm")?;
        f = g.rms_norm(f, Some(pn), eps)?;
    }
    g.set_name(f, format!("blk.{l}.ffn_out"));
    let mut out = g.add(x, f)?;

    // Per-layer input: out + RMSNorm(W_proj·(gelu(W_gate·out) ⊙ P_l)).
    // (With AltUp the per-layer input goes to the other streams instead.)
    if let (true, Some(all), None) = (spec.per_layer_input, ctx.per_layer, cfg.altup_streams) {
        let p = cfg.per_layer_input;
        let slice = g.narrow(all, 1, Start::FromStart(l), 1)?;
        let p_l = g.reshape(slice, Shape::new([seq(), p.into()]))?;
        let wg = w(g, "inp_gate")?;
        let gate = g.matmul(out, wg)?;
        let act = g.gelu(gate)?;
        let z = g.mul(act, p_l)?;
        let wp = w(g, "proj")?;
        let y = g.matmul(z, wp)?;
        let pn = w(g, "post_norm")?;
        let y = g.rms_norm(y, Some(pn), eps)?;
        out = g.add(out, y)?;
    }
    if spec.output_scale {
        let s = w(g, "layer_output_scale")?;
        out = g.mul(out, s)?;
    }
    g.set_name(out, format!("blk.{l}.out"));
    Ok(out)
}
