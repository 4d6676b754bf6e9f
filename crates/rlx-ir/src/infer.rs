//! Shape and type inference, one function per op: what each op takes and
//! what it makes, checked when a node is added (`Graph::infer`).

use rlx_gguf::GgmlType;

use crate::graph::{broadcasts, Graph, IrError, Node, Result, SlotLayout};
use crate::op::{AttentionSpec, KvSource, NormSpec, Op, RopeSpec, Start};
use crate::shape::{Dim, Shape};
use crate::{DType, NodeId};

/// A node being added: its graph, id, op and inputs, and the checks every
/// op shares.
pub(crate) struct Infer<'g> {
    pub g: &'g Graph,
    pub id: NodeId,
    pub op: &'g Op,
    pub inputs: &'g [NodeId],
}

impl<'g> Infer<'g> {
    fn err(&self, msg: String) -> IrError {
        IrError {
            node: self.id,
            op: self.op.name(),
            name: None,
            msg,
        }
    }

    /// The node's type and shape, or what is wrong with its inputs.
    pub fn op_shape(&self) -> Result<(DType, Shape)> {
        match self.op {
            Op::Input { .. } | Op::Weight { .. } => {
                Err(self.err("leaf nodes are built with input()/weight()".into()))
            }
            Op::Gather => self.gather(),
            Op::TakeRows => self.take_rows(),
            Op::MatMul { norm } => self.matmul(norm),
            Op::Add | Op::Mul => self.broadcast(),
            Op::BatchMatMul => self.batch_matmul(),
            Op::MatchRms { .. } => self.match_rms(),
            Op::GaussianTopK { .. }
            | Op::Scale { .. }
            | Op::AddConst { .. }
            | Op::Gelu
            | Op::Softcap { .. } => self.same_shape(),
            Op::RmsNorm(n) => self.rms_norm(n),
            Op::GeGlu => self.geglu(),
            Op::Rope(r) => self.rope(r),
            Op::Attention(a) => self.attention(a),
            Op::KvWrite { .. } => self.kv_write(),
            Op::Moe { top_k } => self.moe(top_k),
            Op::Narrow { axis, start, len } => self.narrow(axis, start, len),
            Op::Reshape { shape } => self.reshape(shape),
            Op::Concat { axis } => self.concat(axis),
        }
    }

    fn node(&self, i: usize) -> Result<&'g Node> {
        self.inputs
            .get(i)
            .map(|&n| self.g.node(n))
            .ok_or_else(|| self.err(format!("missing input {i}")))
    }

    fn f32_in(&self, i: usize) -> Result<&'g Node> {
        let n = self.node(i)?;
        if n.dtype != DType::F32 {
            return Err(self.err(format!("input {i} must be f32, is {}", n.dtype)));
        }
        Ok(n)
    }

    fn arity(&self, n: usize) -> Result<()> {
        if self.inputs.len() != n {
            return Err(self.err(format!("takes {n} inputs, got {}", self.inputs.len())));
        }
        Ok(())
    }

    fn weight_in<'a>(&self, n: &'a Node) -> Result<&'a Node> {
        match n.dtype {
            DType::Ggml(_) => Ok(n),
            d => Err(self.err(format!("expected a weight, got {d}"))),
        }
    }

    /// Vectors such as norm weights may be weights of a float type or f32 values.
    fn weight_or_f32<'a>(&self, n: &'a Node) -> Result<&'a Node> {
        match n.dtype {
            DType::F32 | DType::Ggml(GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) => Ok(n),
            d => Err(self.err(format!("expected f32/f16/bf16 values, got {d}"))),
        }
    }

    fn check_positions(&self, p: &Node, n: Dim) -> Result<()> {
        if p.dtype != DType::I32 || p.shape != Shape::new([n]) {
            return Err(self.err(format!(
                "positions must be i32 [{n}], are {} {}",
                p.dtype, p.shape
            )));
        }
        Ok(())
    }

    /// Rows of a weight table by i32 ids.
    fn gather(&self) -> Result<(DType, Shape)> {
        self.arity(2)?;
        let table = self.weight_in(self.node(0)?)?;
        let ids = self.node(1)?;
        if ids.dtype != DType::I32 || ids.shape.rank() != 1 {
            return Err(self.err(format!(
                "ids must be i32 [n], are {} {}",
                ids.dtype, ids.shape
            )));
        }
        if table.shape.rank() != 2 {
            return Err(self.err(format!("table must be 2-D, is {}", table.shape)));
        }
        Ok((DType::F32, Shape::new([ids.shape.0[0], table.shape.0[1]])))
    }

    /// Rows of an f32 value by i32 row numbers.
    fn take_rows(&self) -> Result<(DType, Shape)> {
        self.arity(2)?;
        let x = self.f32_in(0)?;
        let rows = self.node(1)?;
        if rows.dtype != DType::I32 || rows.shape.rank() != 1 {
            return Err(self.err(format!(
                "rows must be i32 [m], are {} {}",
                rows.dtype, rows.shape
            )));
        }
        if x.shape.rank() == 0 {
            return Err(self.err("x must have at least one axis".into()));
        }
        let mut dims = x.shape.0.clone();
        dims[0] = rows.shape.0[0];
        Ok((DType::F32, Shape(dims)))
    }

    /// Products with one or more weights (their rows concatenated), after an optional norm.
    fn matmul(&self, norm: &Option<NormSpec>) -> Result<(DType, Shape)> {
        let x = self.f32_in(0)?;
        let k = x
            .shape
            .last()
            .ok_or_else(|| self.err("x must have at least one axis".into()))?;
        let mut first_w = 1;
        if let Some(n) = norm {
            if n.has_gamma {
                let g = self.weight_or_f32(self.node(1)?)?;
                if g.shape != Shape::new([k]) {
                    return Err(self.err(format!("norm weight {} must be [{k}]", g.shape)));
                }
                first_w = 2;
            }
        }
        if self.inputs.len() <= first_w {
            return Err(self.err("needs at least one weight".into()));
        }
        let mut total = 0usize;
        for i in first_w..self.inputs.len() {
            let w = self.weight_in(self.node(i)?)?;
            let (rows, cols) = match w.shape.0[..] {
                [Dim::Fixed(r), c] => (r, c),
                _ => return Err(self.err(format!("weight {} must be [rows, K]", w.shape))),
            };
            if cols != k {
                return Err(self.err(format!(
                    "x has {k} columns but weight {:?} rows are {cols} long",
                    w.name.as_deref().unwrap_or("?")
                )));
            }
            total += rows;
        }
        let mut shape = x.shape.clone();
        *shape.0.last_mut().expect("rank ≥ 1") = Dim::Fixed(total);
        Ok((DType::F32, shape))
    }

    /// Elementwise ops whose second operand broadcasts onto the first.
    fn broadcast(&self) -> Result<(DType, Shape)> {
        self.arity(2)?;
        let a = self.f32_in(0)?;
        let b = self.weight_or_f32(self.node(1)?)?;
        if !broadcasts(&b.shape, &a.shape) {
            return Err(self.err(format!("cannot broadcast {} onto {}", b.shape, a.shape)));
        }
        Ok((DType::F32, a.shape.clone()))
    }

    /// `[n, p, q] × [n, q, r]`.
    fn batch_matmul(&self) -> Result<(DType, Shape)> {
        self.arity(2)?;
        let (a, b) = (self.f32_in(0)?, self.f32_in(1)?);
        match (&a.shape.0[..], &b.shape.0[..]) {
            ([n, p, q], [m, q2, Dim::Fixed(r)]) if n == m && q == q2 => {
                Ok((DType::F32, Shape::new([*n, *p, Dim::Fixed(*r)])))
            }
            _ => Err(self.err(format!(
                "expects [n, p, q] and [n, q, r], got {} and {}",
                a.shape, b.shape
            ))),
        }
    }

    /// `x` scaled to the RMS of a target of its shape.
    fn match_rms(&self) -> Result<(DType, Shape)> {
        self.arity(2)?;
        let (x, t) = (self.f32_in(0)?, self.f32_in(1)?);
        if x.shape != t.shape {
            return Err(self.err(format!("x {} and target {} differ", x.shape, t.shape)));
        }
        Ok((DType::F32, x.shape.clone()))
    }

    /// One f32 operand, the result of its shape.
    fn same_shape(&self) -> Result<(DType, Shape)> {
        self.arity(1)?;
        Ok((DType::F32, self.f32_in(0)?.shape.clone()))
    }

    /// RMS norm over the last axis, with an optional weight of that length.
    fn rms_norm(&self, n: &NormSpec) -> Result<(DType, Shape)> {
        self.arity(1 + usize::from(n.has_gamma))?;
        let x = self.f32_in(0)?;
        if n.has_gamma {
            let g = self.weight_or_f32(self.node(1)?)?;
            let last = x
                .shape
                .last()
                .ok_or_else(|| self.err("x has no axes".into()))?;
            if g.shape != Shape::new([last]) {
                return Err(self.err(format!(
                    "norm weight {} does not match the last axis of {}",
                    g.shape, x.shape
                )));
            }
        }
        Ok((DType::F32, x.shape.clone()))
    }

    /// Gate and up of one shape.
    fn geglu(&self) -> Result<(DType, Shape)> {
        self.arity(2)?;
        let (g, u) = (self.f32_in(0)?, self.f32_in(1)?);
        if g.shape != u.shape {
            return Err(self.err(format!("gate {} and up {} differ", g.shape, u.shape)));
        }
        Ok((DType::F32, g.shape.clone()))
    }

    /// Rotary embedding of `[n, heads, head_dim]` at i32 positions.
    fn rope(&self, r: &RopeSpec) -> Result<(DType, Shape)> {
        self.arity(2 + usize::from(r.has_freq_factors))?;
        let x = self.f32_in(0)?;
        let hd = match x.shape.0[..] {
            [_, Dim::Fixed(_), Dim::Fixed(hd)] => hd,
            _ => return Err(self.err(format!("x must be [n, heads, head_dim], is {}", x.shape))),
        };
        if r.n_rot == 0 || r.n_rot % 2 == 1 || r.n_rot > hd {
            return Err(self.err(format!(
                "n_rot {} must be even and ≤ head_dim {hd}",
                r.n_rot
            )));
        }
        self.check_positions(self.node(1)?, x.shape.0[0])?;
        if r.has_freq_factors {
            let f = self.weight_or_f32(self.node(2)?)?;
            if f.shape.fixed_numel() != Some(r.n_rot / 2) {
                return Err(self.err(format!(
                    "freq factors {} must hold n_rot/2 = {} values",
                    f.shape,
                    r.n_rot / 2
                )));
            }
        }
        Ok((DType::F32, x.shape.clone()))
    }

    /// Attention of `[n, heads, head_dim]` queries over K/V inputs or a cache slot.
    fn attention(&self, a: &AttentionSpec) -> Result<(DType, Shape)> {
        let q = self.f32_in(0)?;
        let (n, hq, hd) = match q.shape.0[..] {
            [n, Dim::Fixed(h), Dim::Fixed(d)] => (n, h, d),
            _ => return Err(self.err(format!("q must be [n, heads, head_dim], is {}", q.shape))),
        };
        let layout = match a.kv {
            KvSource::Inputs => {
                self.arity(3)?;
                let (k, v) = (self.f32_in(1)?, self.f32_in(2)?);
                let layout = match (&k.shape.0[..], &v.shape.0[..]) {
                    (
                        [m1, Dim::Fixed(hk), Dim::Fixed(dk)],
                        [m2, Dim::Fixed(hv), Dim::Fixed(dv)],
                    ) if m1 == m2 && hk == hv => SlotLayout {
                        kv_heads: *hk,
                        head_dim: *dk,
                        v_head_dim: *dv,
                    },
                    _ => {
                        return Err(self.err(format!(
                            "k {} and v {} must be [m, kv_heads, dim] with equal m and heads",
                            k.shape, v.shape
                        )))
                    }
                };
                layout
            }
            KvSource::Cache(slot) => {
                self.arity(2 + usize::from(a.bidirectional_spans))?;
                let w = self.node(1)?;
                if a.bidirectional_spans {
                    self.check_positions(self.node(2)?, n)?;
                }
                match (&w.op, w.dtype) {
                    // The write may be another slot's: a layer that
                    // shares KV reads the source layer's cache after
                    // its write.
                    (Op::KvWrite { slot: written }, _) => {
                        if *written != slot {
                            return Err(self.err(format!(
                                "reads cache {} but is ordered after a write to cache {}",
                                slot.0, written.0
                            )));
                        }
                        self.g.slot_layout_of(w)
                    }
                    // A write done by an earlier plan of the same step
                    // (a graph split over devices).
                    (Op::Input { .. }, DType::Effect) => match w.shape.0[..] {
                        [Dim::Fixed(kv_heads), Dim::Fixed(head_dim), Dim::Fixed(v_head_dim)] => {
                            SlotLayout {
                                kv_heads,
                                head_dim,
                                v_head_dim,
                            }
                        }
                        _ => {
                            return Err(self.err(format!(
                                "an effect input must have the slot's shape [kv_heads, head_dim, v_head_dim], not {}",
                                w.shape
                            )))
                        }
                    },
                    _ => {
                        return Err(self.err(
                            "input 1 must be a kv_write or an effect input".into(),
                        ))
                    }
                }
            }
        };
        if layout.head_dim != hd {
            return Err(self.err(format!(
                "q head_dim {hd} differs from the keys' {}",
                layout.head_dim
            )));
        }
        if layout.kv_heads == 0 || hq % layout.kv_heads != 0 {
            return Err(self.err(format!(
                "{hq} query heads are not a multiple of {} kv heads",
                layout.kv_heads
            )));
        }
        Ok((
            DType::F32,
            Shape::new([n, Dim::Fixed(hq), Dim::Fixed(layout.v_head_dim)]),
        ))
    }

    /// K and V rows written into a cache slot.
    fn kv_write(&self) -> Result<(DType, Shape)> {
        if !(2..=3).contains(&self.inputs.len()) {
            return Err(self.err(format!(
                "takes 2 or 3 self.inputs, got {}",
                self.inputs.len()
            )));
        }
        let (k, v) = (self.f32_in(0)?, self.f32_in(1)?);
        if self.inputs.len() == 3 {
            self.check_positions(self.node(2)?, k.shape.0[0])?;
        }
        match (&k.shape.0[..], &v.shape.0[..]) {
            ([n1, Dim::Fixed(h1), Dim::Fixed(_)], [n2, Dim::Fixed(h2), Dim::Fixed(_)])
                if n1 == n2 && h1 == h2 => {}
            _ => {
                return Err(self.err(format!(
                    "k {} and v {} must be [n, kv_heads, dim] with equal n and heads",
                    k.shape, v.shape
                )))
            }
        }
        Ok((DType::Effect, Shape::default()))
    }

    /// A mixture of experts: router logits, stacked gate/up and down weights, expert scales.
    fn moe(&self, top_k: &usize) -> Result<(DType, Shape)> {
        self.arity(5)?;
        let (u, logits) = (self.f32_in(0)?, self.f32_in(1)?);
        let gu = self.weight_in(self.node(2)?)?;
        let dn = self.weight_in(self.node(3)?)?;
        let sc = self.weight_or_f32(self.node(4)?)?;
        let (n, d) = match u.shape.0[..] {
            [n, Dim::Fixed(d)] => (n, d),
            _ => return Err(self.err(format!("u must be [n, d], is {}", u.shape))),
        };
        let e = match logits.shape.0[..] {
            [m, Dim::Fixed(e)] if m == n => e,
            _ => {
                return Err(self.err(format!(
                    "router logits {} must be [n, experts]",
                    logits.shape
                )))
            }
        };
        let ff = match gu.shape.0[..] {
            [Dim::Fixed(e2), Dim::Fixed(two_ff), Dim::Fixed(d2)]
                if e2 == e && d2 == d && two_ff % 2 == 0 =>
            {
                two_ff / 2
            }
            _ => return Err(self.err(format!("gate_up {} must be [{e}, 2·ff, {d}]", gu.shape))),
        };
        if dn.shape != Shape::fixed(&[e, d, ff]) {
            return Err(self.err(format!("down {} must be [{e}, {d}, {ff}]", dn.shape)));
        }
        if sc.shape.fixed_numel() != Some(e) {
            return Err(self.err(format!("expert scale {} must hold {e} values", sc.shape)));
        }
        if *top_k == 0 || *top_k > e {
            return Err(self.err(format!("top_k {top_k} must be in 1..={e}")));
        }
        Ok((DType::F32, u.shape.clone()))
    }

    /// A range of one axis.
    fn narrow(&self, axis: &usize, start: &Start, len: &usize) -> Result<(DType, Shape)> {
        self.arity(1)?;
        let x = self.node(0)?;
        let d = *x
            .shape
            .0
            .get(*axis)
            .ok_or_else(|| self.err(format!("axis {axis} out of range for {}", x.shape)))?;
        let off = match start {
            Start::FromStart(s) => *s + len,
            Start::FromEnd(e) => {
                if len > e {
                    return Err(self.err(format!("len {len} runs past the end (from end {e})")));
                }
                *e
            }
        };
        if let Dim::Fixed(n) = d {
            if off > n {
                return Err(self.err(format!("range needs {off} rows, axis has {n}")));
            }
        }
        let mut shape = x.shape.clone();
        shape.0[*axis] = Dim::Fixed(*len);
        Ok((x.dtype, shape))
    }

    /// The same elements in another shape.
    fn reshape(&self, shape: &Shape) -> Result<(DType, Shape)> {
        self.arity(1)?;
        let x = self.node(0)?;
        if !same_numel(&x.shape, shape) {
            return Err(self.err(format!("cannot reshape {} to {shape}", x.shape)));
        }
        Ok((x.dtype, shape.clone()))
    }

    /// f32 values joined along one axis.
    fn concat(&self, axis: &usize) -> Result<(DType, Shape)> {
        if self.inputs.is_empty() {
            return Err(self.err("needs at least one input".into()));
        }
        let first = self.f32_in(0)?;
        let rank = first.shape.rank();
        if *axis >= rank {
            return Err(self.err(format!("axis {axis} out of range for {}", first.shape)));
        }
        let mut total = 0;
        for i in 0..self.inputs.len() {
            let x = self.f32_in(i)?;
            let same_rest = x.shape.rank() == rank
                && (0..rank).all(|a| a == *axis || x.shape.0[a] == first.shape.0[a]);
            if !same_rest {
                return Err(self.err(format!(
                    "input {i} {} does not match {}",
                    x.shape, first.shape
                )));
            }
            total += x.shape.0[*axis]
                .fixed()
                .ok_or_else(|| self.err("concat axis must be fixed".into()))?;
        }
        let mut shape = first.shape.clone();
        shape.0[*axis] = Dim::Fixed(total);
        Ok((DType::F32, shape))
    }
}

fn same_numel(a: &Shape, b: &Shape) -> bool {
    let fixed = |s: &Shape| -> usize { s.0.iter().filter_map(|d| d.fixed()).product() };
    let mut sa: Vec<_> = a.syms().collect();
    let mut sb: Vec<_> = b.syms().collect();
    sa.sort();
    sb.sort();
    fixed(a) == fixed(b) && sa == sb
}
