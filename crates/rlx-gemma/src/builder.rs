//! The Gemma graph: one layer function for every phase (prefill chunks and
//! decode differ only in the `seq` symbol's value), with each generation's
//! features switched by the resolved [`LayerSpec`].

use rlx_ir::{
    AttentionSpec, CacheSlot, DType, Dim, Graph, KvSource, Mask, NodeId, RopeSpec, Shape, Start,
    Sym,
};
use rlx_runtime::{WeightError, WeightStore};

use crate::config::{AttentionKind, GemmaConfig, LayerSpec};

/// Which positions get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Every position (scoring, perplexity).
    All,
    /// Only the last position (generation).
    Last,
}

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

/// Builds the model graph. Inputs: `tokens` and `pos` (i32 `[seq]`); output
/// `logits` (`[seq, vocab]` or `[1, vocab]`).
pub fn build_graph(cfg: &GemmaConfig, store: &WeightStore, logits: Logits) -> Result<Graph> {
    let mut g = Graph::new();
    let tokens = g.input("tokens", DType::I32, Shape::new([seq()]));
    let pos = g.input("pos", DType::I32, Shape::new([seq()]));
    let embd = store.node(&mut g, "token_embd.weight")?;
    let x = g.gather(embd, tokens)?;
    let mut x = g.scale(x, cfg.embed_scale)?;
    g.set_name(x, "embd");
    for spec in &cfg.layers {
        x = layer(&mut g, cfg, spec, store, x, pos)?;
    }
    if logits == Logits::Last {
        x = g.narrow(x, 0, Start::FromEnd(1), 1)?;
    }
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

/// One transformer layer: attention and GeGLU FFN with the pre/post norms,
/// QK-norm, softcaps and RoPE table the spec calls for.
fn layer(
    g: &mut Graph,
    cfg: &GemmaConfig,
    spec: &LayerSpec,
    store: &WeightStore,
    x: NodeId,
    pos: NodeId,
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
    let wq = w(g, "attn_q")?;
    let q = g.matmul(h, wq)?;
    let mut q = heads(g, q, hq)?;
    let slot = CacheSlot(spec.kv_source.unwrap_or(l) as u32);
    let rope = RopeSpec {
        n_rot: spec.rope.n_rot,
        base: spec.rope.base,
        freq_scale: spec.rope.freq_scale,
        has_freq_factors: false,
    };
    if spec.qk_norm {
        let qn = w(g, "attn_q_norm")?;
        q = g.rms_norm(q, Some(qn), eps)?;
    }
    let q = g.rope(q, pos, rope, None)?;
    let (wk, wv) = (w(g, "attn_k")?, w(g, "attn_v")?);
    let k = g.matmul(h, wk)?;
    let v = g.matmul(h, wv)?;
    let mut k = heads(g, k, hkv)?;
    let v = heads(g, v, hkv)?;
    if spec.qk_norm {
        let kn = w(g, "attn_k_norm")?;
        k = g.rms_norm(k, Some(kn), eps)?;
    }
    let k = g.rope(k, pos, rope, None)?;
    let written = g.kv_write(slot, k, v)?;
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
    let x = g.add(x, o)?;

    // Feed-forward: down(gelu(gate(h)) · up(h)).
    let ffn_norm = w(g, "ffn_norm")?;
    let h = g.rms_norm(x, Some(ffn_norm), eps)?;
    let (wg, wu, wd) = (w(g, "ffn_gate")?, w(g, "ffn_up")?, w(g, "ffn_down")?);
    let gate = g.matmul(h, wg)?;
    let up = g.matmul(h, wu)?;
    let act = g.gelu(gate)?;
    let m = g.mul(act, up)?;
    let mut f = g.matmul(m, wd)?;
    if spec.post_norms {
        let pn = w(g, "post_ffw_norm")?;
        f = g.rms_norm(f, Some(pn), eps)?;
    }
    g.set_name(f, format!("blk.{l}.ffn_out"));
    let out = g.add(x, f)?;
    g.set_name(out, format!("blk.{l}.out"));
    Ok(out)
}
