//! One method per op of a step: its launch, over the step context.

use super::*;
use rlx_ir::{RopeSpec, Start};

use crate::cuda::Kernels;

impl Cx<'_> {
    fn kernels(&self) -> &Kernels {
        &self.plan.device.kernels
    }

    fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    fn launch(&self, f: &CudaFunction, cfg: LaunchConfig, args: &[Arg]) -> Result<(), CudaError> {
        self.plan.launch(f, cfg, args)
    }

    pub(super) fn kv_write(
        &self,
        slot: &rlx_ir::CacheSlot,
        kv: Option<&KvCtx>,
    ) -> Result<(), CudaError> {
        let k = self.kernels();
        let kv = kv.ok_or(RunError::NoCache)?;
        let (group, l) = kv.layer(*slot)?;
        let rows = self.in_dims(0)[0];
        self.launch(
            &k.kv_write,
            linear(rows * (l.k_width.div_ceil(32) + l.v_width.div_ceil(32))),
            &[
                Arg::Ptr(self.inp(0)),
                Arg::Ptr(self.inp(1)),
                Arg::Ptr(l.k),
                Arg::Ptr(l.v),
                Arg::Ptr(self.plan.meta_addr(self.plan.meta_layout.write_rows(group))),
                Arg::I32(rows as i32),
                Arg::I32(l.k_width as i32),
                Arg::I32(l.v_width as i32),
                Arg::I32(kv_code(l.types.k) as i32),
                Arg::I32(kv_code(l.types.v) as i32),
            ],
        )?;
        Ok(())
    }

    pub(super) fn gather(&self) -> Result<(), CudaError> {
        let k = self.kernels();
        let (code, table) = weight_of(self.g, &self.plan.weights, self.n.inputs[0])?;
        let width = self.in_dims(0)[1];
        let rows = self.dims[0];
        self.launch(
            &k.gather[code as usize],
            linear(rows * width.div_ceil(32)),
            &[
                Arg::Ptr(table),
                Arg::Ptr(self.inp(1)),
                Arg::Ptr(self.out),
                Arg::I32(rows as i32),
                Arg::I32(width as i32),
            ],
        )?;
        Ok(())
    }

    /// A residual add between two norms folded into the product after it
    /// (`Prologue::AddNorm`): the sum, and the second norm as the
    /// product's input (8-bit blocks or bf16).
    pub(super) fn add_norm(&self) -> Result<(), CudaError> {
        let k = self.kernels();
        let numel = self.numel();
        let operand = self.folded.expect("checked");
        let kernel = operand.pick(&k.add_norm_q8, &k.add_norm_bf16);
        let mm = self.plan.folded[&self.id];
        let Some(Prologue::AddNorm { norm, .. }) = self.plan.prologues.get(&mm).copied() else {
            unreachable!("an add folds only into an AddNorm")
        };
        let Op::MatMul { norm: Some(spec2) } = &self.g.node(mm).op else {
            unreachable!("an AddNorm's product has a norm")
        };
        let gamma2 = if spec2.has_gamma {
            self.plan.addr(self.g.node(mm).inputs[1])
        } else {
            0
        };
        // The sum of x and a, where a is the norm's input if one
        // is folded in.
        let (a, x, gamma1, eps1) = match norm {
            Some(r) => {
                let other = self.n.inputs.iter().copied().find(|&i| i != r).unwrap_or(r);
                let Op::RmsNorm(spec1) = &self.g.node(r).op else {
                    unreachable!("a folded norm")
                };
                let gamma1 = if spec1.has_gamma {
                    self.plan.addr(self.g.node(r).inputs[1])
                } else {
                    0
                };
                (
                    self.plan.addr(self.g.node(r).inputs[0]),
                    self.plan.addr(other),
                    gamma1,
                    spec1.eps,
                )
            }
            None => (self.inp(1), self.inp(0), 0, 0.0),
        };
        let d = *self.dims.last().expect("rank");
        let head = [
            Arg::Ptr(x),
            Arg::Ptr(a),
            Arg::Ptr(gamma1),
            Arg::F32(eps1),
            Arg::I32(i32::from(norm.is_some())),
            Arg::Ptr(self.out),
            Arg::Ptr(gamma2),
            Arg::F32(spec2.eps),
        ];
        let args = [&head[..], &operand.args(), &[Arg::I32(d as i32)]].concat();
        self.launch(kernel, norm_rows(numel / d, d), &args)?;
        Ok(())
    }

    pub(super) fn binary(&self) -> Result<(), CudaError> {
        let k = self.kernels();
        let numel = self.numel();
        // Output and `a` as [d0, d1, d2, d3]; `b` aligned from the end.
        let bd = self.in_dims(1);
        if self.dims.len() > 4 || bd.len() > self.dims.len() {
            return Err(node_err(self.g, self.id, "broadcast of more than 4 dimensions").into());
        }
        let mut od = [1usize; 4];
        od[4 - self.dims.len()..].copy_from_slice(self.dims);
        let mut bdims = [1usize; 4];
        bdims[4 - bd.len()..].copy_from_slice(&bd);
        let mut strides = [0i64; 4];
        let mut acc = 1i64;
        for a in (0..4).rev() {
            strides[a] = if bdims[a] == 1 { 0 } else { acc };
            acc *= bdims[a] as i64;
        }
        let op = if matches!(self.n.op, Op::Add) { 0 } else { 1 };
        self.launch(
            &k.binary,
            linear(numel),
            &[
                Arg::Ptr(self.inp(0)),
                Arg::Ptr(self.inp(1)),
                Arg::Ptr(self.out),
                Arg::I64(numel as i64),
                Arg::I32(od[1] as i32),
                Arg::I32(od[2] as i32),
                Arg::I32(od[3] as i32),
                Arg::I64(strides[0]),
                Arg::I64(strides[1]),
                Arg::I64(strides[2]),
                Arg::I64(strides[3]),
                Arg::I32(op),
            ],
        )?;
        Ok(())
    }

    pub(super) fn unary(&self) -> Result<(), CudaError> {
        let k = self.kernels();
        let numel = self.numel();
        let (op, c) = match self.n.op {
            Op::Scale { factor } => (0, factor),
            Op::AddConst { value } => (1, value),
            Op::Gelu => (2, 0.0),
            Op::Softcap { cap } => (3, cap),
            _ => unreachable!(),
        };
        self.launch(
            &k.unary,
            linear(numel),
            &[
                Arg::Ptr(self.inp(0)),
                Arg::Ptr(self.out),
                Arg::I64(numel as i64),
                Arg::I32(op),
                Arg::F32(c),
            ],
        )?;
        Ok(())
    }

    pub(super) fn rms_norm_rope(&self, spec: &NormSpec) -> Result<(), CudaError> {
        let b = self.b;
        let k = self.kernels();
        let numel = self.numel();
        let rope = self.plan.norm_ropes[&self.id];
        let Op::Rope(rspec) = &self.g.node(rope).op else {
            unreachable!("found as a rope")
        };
        let rdims = self.g.node(rope).shape.resolve(b).expect("bound");
        let d = rdims[2];
        let gamma = if spec.has_gamma { self.inp(1) } else { 0 };
        self.launch(
            &k.rms_norm_rope,
            norm_rows(numel / d, d),
            &[
                Arg::Ptr(self.inp(0)),
                Arg::Ptr(gamma),
                Arg::Ptr(self.plan.addr(rope)),
                Arg::I32(d as i32),
                Arg::F32(spec.eps),
                Arg::Ptr(self.plan.addr(self.g.node(rope).inputs[1])),
                Arg::Ptr(self.plan.device.ptr(&self.plan.rope_tables[&rope])),
                Arg::I32(rdims[1] as i32),
                Arg::I32(rspec.n_rot as i32),
            ],
        )?;
        Ok(())
    }

    pub(super) fn rms_norm(&self, spec: &NormSpec) -> Result<(), CudaError> {
        let k = self.kernels();
        let numel = self.numel();
        let d = *self.dims.last().expect("rank");
        let gamma = if spec.has_gamma { self.inp(1) } else { 0 };
        self.launch(
            &k.rms_norm,
            norm_rows(numel / d, d),
            &[
                Arg::Ptr(self.inp(0)),
                Arg::Ptr(gamma),
                Arg::Ptr(self.out),
                Arg::I32(d as i32),
                Arg::F32(spec.eps),
            ],
        )?;
        Ok(())
    }

    pub(super) fn rope(&self, spec: &RopeSpec) -> Result<(), CudaError> {
        let k = self.kernels();
        let numel = self.numel();
        let table = self.plan.device.ptr(&self.plan.rope_tables[&self.id]);
        self.launch(
            &k.rope,
            linear(numel),
            &[
                Arg::Ptr(self.inp(0)),
                Arg::Ptr(self.inp(1)),
                Arg::Ptr(table),
                Arg::Ptr(self.out),
                Arg::I32(self.dims[0] as i32),
                Arg::I32(self.dims[1] as i32),
                Arg::I32(self.dims[2] as i32),
                Arg::I32(spec.n_rot as i32),
            ],
        )?;
        Ok(())
    }

    pub(super) fn take_rows(&self) -> Result<(), CudaError> {
        let k = self.kernels();
        let numel = self.numel();
        let width: usize = self.dims[1..].iter().product();
        self.launch(
            &k.take_rows,
            linear(numel),
            &[
                Arg::Ptr(self.inp(0)),
                Arg::Ptr(self.inp(1)),
                Arg::Ptr(self.out),
                Arg::I64(self.dims[0] as i64),
                Arg::I64(width as i64),
            ],
        )?;
        Ok(())
    }

    pub(super) fn narrow(&self, axis: usize, s: Start, len: usize) -> Result<(), CudaError> {
        let k = self.kernels();
        let numel = self.numel();
        let xd = self.in_dims(0);
        let from = narrow_from(s, xd[axis], len).map_err(|msg| node_err(self.g, self.id, msg))?;
        let outer: usize = xd[..axis].iter().product();
        let inner: usize = xd[axis + 1..].iter().product();
        self.launch(
            &k.narrow,
            linear(numel),
            &[
                Arg::Ptr(self.inp(0)),
                Arg::Ptr(self.out),
                Arg::I64(outer as i64),
                Arg::I64(xd[axis] as i64),
                Arg::I64(from as i64),
                Arg::I64(len as i64),
                Arg::I64(inner as i64),
            ],
        )?;
        Ok(())
    }

    pub(super) fn concat(&self, axis: usize) -> Result<(), CudaError> {
        let k = self.kernels();
        let outer: usize = self.dims[..axis].iter().product();
        let inner: usize = self.dims[axis + 1..].iter().product();
        let mut off = 0;
        for i in 0..self.n.inputs.len() {
            let len = self.in_dims(i)[axis];
            self.launch(
                &k.concat_part,
                linear(outer * len * inner),
                &[
                    Arg::Ptr(self.inp(i)),
                    Arg::Ptr(self.out),
                    Arg::I64(outer as i64),
                    Arg::I64(len as i64),
                    Arg::I64(self.dims[axis] as i64),
                    Arg::I64(off as i64),
                    Arg::I64(inner as i64),
                ],
            )?;
            off += len;
        }
        Ok(())
    }

    pub(super) fn match_rms(&self, floor: f32) -> Result<(), CudaError> {
        let k = self.kernels();
        let numel = self.numel();
        let d = *self.dims.last().expect("rank");
        self.launch(
            &k.match_rms,
            grid(numel / d, 1, 256),
            &[
                Arg::Ptr(self.inp(0)),
                Arg::Ptr(self.inp(1)),
                Arg::Ptr(self.out),
                Arg::I32(d as i32),
                Arg::F32(floor),
            ],
        )?;
        Ok(())
    }

    pub(super) fn gaussian_topk(&self, std_multiplier: f32) -> Result<(), CudaError> {
        let k = self.kernels();
        let numel = self.numel();
        let d = *self.dims.last().expect("rank");
        self.launch(
            &k.gaussian_topk,
            grid(numel / d, 1, 256),
            &[
                Arg::Ptr(self.inp(0)),
                Arg::Ptr(self.out),
                Arg::I32(d as i32),
                Arg::F32(std_multiplier),
            ],
        )?;
        Ok(())
    }

    pub(super) fn batch_matmul(&self) -> Result<(), CudaError> {
        let k = self.kernels();
        let numel = self.numel();
        let ad = self.in_dims(0);
        self.launch(
            &k.batch_matmul,
            linear(numel),
            &[
                Arg::Ptr(self.inp(0)),
                Arg::Ptr(self.inp(1)),
                Arg::Ptr(self.out),
                Arg::I64(ad[0] as i64),
                Arg::I32(ad[1] as i32),
                Arg::I32(ad[2] as i32),
                Arg::I32(self.dims[2] as i32),
            ],
        )?;
        Ok(())
    }

    pub(super) fn geglu(&self) -> Result<(), CudaError> {
        let k = self.kernels();
        let numel = self.numel();
        let (a, b) = (Arg::Ptr(self.inp(0)), Arg::Ptr(self.inp(1)));
        // Rows of gate and up as they are read (in place in a batched
        // step's product output, rows of both apart).
        let width = self.dims.last().copied().unwrap_or(1).max(1);
        let stride =
            |i: usize| Arg::I64(self.plan.row_stride(self.n.inputs[i]).unwrap_or(width) as i64);
        let shape = [
            Arg::I64(numel as i64),
            Arg::I64(width as i64),
            stride(0),
            stride(1),
        ];
        let (kernel, out) = match self.folded {
            Some(o) => (o.pick(&k.geglu_q8, &k.geglu_bf16), o.args()),
            None => (&k.geglu, vec![Arg::Ptr(self.out)]),
        };
        self.launch(kernel, linear(numel), &[&[a, b][..], &out, &shape].concat())
    }
}
