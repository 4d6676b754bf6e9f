//! Gemma 3n's AltUp: the hidden state travels as several streams `[seq, n, d]`;
//! each layer predicts all streams from the active one (stream 0), runs the
//! transformer layer on the active prediction, and corrects every stream with
//! the result.

use rlx_ir::{Dim, Graph, NodeId, Shape, Start, Sym};
use rlx_runtime::WeightStore;

use crate::builder::{layer as core_layer, BuildError, Ctx};
use crate::config::{GemmaConfig, LayerSpec};

type Result<T> = std::result::Result<T, BuildError>;

/// The floor on a stream's mean square when matching magnitudes.
const MAGNITUDE_FLOOR: f32 = 1e-5;

fn seq() -> Dim {
    Dim::Sym(Sym::SEQ)
}

fn rows(g: &mut Graph, x: NodeId, d: usize) -> Result<NodeId> {
    Ok(g.reshape(x, Shape::new([seq(), 1.into(), d.into()]))?)
}

/// Stream `i` of `[seq, n, d]` as `[seq, d]`.
fn stream(g: &mut Graph, s: NodeId, i: usize, d: usize) -> Result<NodeId> {
    let one = g.narrow(s, 1, Start::FromStart(i), 1)?;
    Ok(g.reshape(one, Shape::new([seq(), d.into()]))?)
}

/// Streams 1.. are `W_i·e` rescaled to the RMS of `e`; stream 0 is `e`.
pub(crate) fn split(
    g: &mut Graph,
    cfg: &GemmaConfig,
    store: &WeightStore,
    e: NodeId,
    n: usize,
) -> Result<NodeId> {
    let d = cfg.n_embd;
    let proj = store.node(g, "altup_proj.weight")?;
    let proj = g.reshape(proj, Shape::fixed(&[(n - 1) * d, d]))?;
    let all = g.matmul(e, proj)?;
    let mut parts = vec![rows(g, e, d)?];
    for i in 0..n - 1 {
        let t = g.narrow(all, 1, Start::FromStart(i * d), d)?;
        let t = g.match_rms(t, e, MAGNITUDE_FLOOR)?;
        parts.push(rows(g, t, d)?);
    }
    Ok(g.concat(&parts, 1)?)
}

/// `tanh(W_router · RMSNorm(x; router_norm) / d)`: per-token stream weights.
fn router(
    g: &mut Graph,
    cfg: &GemmaConfig,
    store: &WeightStore,
    l: usize,
    x: NodeId,
) -> Result<NodeId> {
    let norm = store.node(g, &format!("blk.{l}.altup_router_norm.weight"))?;
    let h = g.rms_norm(x, Some(norm), cfg.rms_eps)?;
    let h = g.scale(h, 1.0 / cfg.n_embd as f32)?;
    let w = store.node(g, &format!("blk.{l}.altup_router.weight"))?;
    let r = g.matmul(h, w)?;
    // softcap with cap 1 is exactly tanh.
    Ok(g.softcap(r, 1.0)?)
}

/// One layer on the streams: predict, run the layer, correct, and add the
/// per-layer input to the inactive streams.
pub(crate) fn layer(
    g: &mut Graph,
    cfg: &GemmaConfig,
    spec: &LayerSpec,
    store: &WeightStore,
    s: NodeId,
    n: usize,
    ctx: &mut Ctx,
) -> Result<NodeId> {
    let (l, d) = (spec.index, cfg.n_embd);
    let w = |g: &mut Graph, name: &str| store.node(g, &format!("blk.{l}.{name}.weight"));
    // Predict: pred_j = s_j + Σ_i C[j][i]·s_i, with C from the router.
    let s0 = stream(g, s, 0, d)?;
    let m = router(g, cfg, store, l, s0)?;
    let wp = w(g, "altup_predict_coef")?;
    let c = g.matmul(m, wp)?;
    let c = g.reshape(c, Shape::new([seq(), n.into(), n.into()]))?;
    let mixed = g.batch_matmul(c, s)?;
    let pred = g.add(s, mixed)?;
    let active = stream(g, pred, 0, d)?;

    let out = core_layer(g, cfg, spec, store, active, ctx)?;

    // Correct: corr_j = pred_j + (W_corr·m' + 1)_j · (out − pred_0).
    let m2 = router(g, cfg, store, l, out)?;
    let wc = w(g, "altup_correct_coef")?;
    let k = g.matmul(m2, wc)?;
    let k = g.add_const(k, 1.0)?;
    let k = g.reshape(k, Shape::new([seq(), n.into(), 1.into()]))?;
    let neg = g.scale(active, -1.0)?;
    let delta = g.add(out, neg)?;
    let delta = rows(g, delta, d)?;
    let step = g.batch_matmul(k, delta)?;
    let corr = g.add(pred, step)?;

    // Per-layer input: RMSNorm(W_proj·(gelu(W_gate·(corr_0 ⊙ scale)) ⊙ P_l)),
    // added to streams 1.. only.
    let mut first = stream(g, corr, 0, d)?;
    let Some(all) = ctx.per_layer else {
        return Ok(corr);
    };
    if store
        .id(&format!("blk.{l}.altup_correct_scale.weight"))
        .is_some()
    {
        let cs = w(g, "altup_correct_scale")?;
        first = g.mul(first, cs)?;
    }
    let p = cfg.per_layer_input;
    let slice = g.narrow(all, 1, Start::FromStart(l), 1)?;
    let p_l = g.reshape(slice, Shape::new([seq(), p.into()]))?;
    let wg = w(g, "inp_gate")?;
    let gate = g.matmul(first, wg)?;
    let act = g.gelu(gate)?;
    let z = g.mul(act, p_l)?;
    let wproj = w(g, "proj")?;
    let y = g.matmul(z, wproj)?;
    let pn = w(g, "post_norm")?;
    let y = g.rms_norm(y, Some(pn), cfg.rms_eps)?;
    let y = rows(g, y, d)?;
    let head = g.narrow(corr, 1, Start::FromStart(0), 1)?;
    let rest = g.narrow(corr, 1, Start::FromStart(1), n - 1)?;
    let rest = g.add(rest, y)?;
    let out = g.concat(&[head, rest], 1)?;
    g.set_name(out, format!("blk.{l}.streams"));
    Ok(out)
}

/// Back to one state: the mean of stream 0 and the unembedded streams 1..,
/// each rescaled to stream 0's RMS.
pub(crate) fn merge(
    g: &mut Graph,
    cfg: &GemmaConfig,
    store: &WeightStore,
    s: NodeId,
    n: usize,
) -> Result<NodeId> {
    let d = cfg.n_embd;
    let unembd = store.node(g, "altup_unembd_proj.weight")?;
    let unembd = g.reshape(unembd, Shape::fixed(&[(n - 1) * d, d]))?;
    let s0 = stream(g, s, 0, d)?;
    let mut sum = s0;
    for i in 1..n {
        let si = stream(g, s, i, d)?;
        // Only block i−1 of this product is used: one weight matrix per stream.
        let all = g.matmul(si, unembd)?;
        let u = g.narrow(all, 1, Start::FromStart((i - 1) * d), d)?;
        let u = g.match_rms(u, s0, MAGNITUDE_FLOOR)?;
        sum = g.add(sum, u)?;
    }
    Ok(g.scale(sum, 1.0 / n as f32)?)
}
