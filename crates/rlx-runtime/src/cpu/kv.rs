//! K/V storage in host memory: per owning layer, the rows of every block
//! of its group in one vector, in f32, f16, bf16 or one of ggml's 32-element
//! block formats (Q8_0, Q4_0).

use std::any::Any;

use half::{bf16, f16};
use rlx_gguf::GgmlType;

use crate::kv::{KvDType, KvError, KvPoolConfig, KvStorage, SlotSet, BLOCK_TOKENS};

pub(crate) enum Rows {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    /// Whole blocks of a block type; element `i` is in block `i / 32`.
    Blocks(GgmlType, Vec<u8>),
}

impl Rows {
    pub(crate) fn new(dtype: KvDType, n: usize) -> Self {
        match dtype {
            KvDType::F32 => Rows::F32(vec![0.0; n]),
            KvDType::F16 => Rows::F16(vec![f16::ZERO; n]),
            KvDType::BF16 => Rows::BF16(vec![bf16::ZERO; n]),
            KvDType::Q8_0 | KvDType::Q4_0 => {
                let ty = dtype.ggml();
                // Zero bytes are blocks of zeros (scale 0) in both formats.
                Rows::Blocks(ty, vec![0; dtype.row_bytes(n)])
            }
        }
    }

    /// Stores `src` from element `at` on (for block types both whole
    /// blocks: rows are whole blocks, as the pool's config checks).
    pub(crate) fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            Rows::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            Rows::F16(v) => v[at..at + src.len()]
                .iter_mut()
                .zip(src)
                .for_each(|(d, s)| *d = f16::from_f32(*s)),
            Rows::BF16(v) => v[at..at + src.len()]
                .iter_mut()
                .zip(src)
                .for_each(|(d, s)| *d = bf16::from_f32(*s)),
            Rows::Blocks(ty, v) => {
                let (be, bb) = (ty.block_elems(), ty.block_bytes());
                rlx_gguf::quantize(*ty, src, &mut v[at / be * bb..][..src.len() / be * bb])
                    .expect("whole blocks of a quantizable type");
            }
        }
    }

    pub(crate) fn view(&self) -> RowsView<'_> {
        match self {
            Rows::F32(v) => RowsView::F32(v),
            Rows::F16(v) => RowsView::F16(v),
            Rows::BF16(v) => RowsView::BF16(v),
            Rows::Blocks(ty, v) => RowsView::Blocks(*ty, v),
        }
    }

    /// Copies `len` elements from element `from` to element `to` (whole
    /// blocks of rows).
    fn copy_rows(&mut self, from: usize, to: usize, len: usize) {
        match self {
            Rows::F32(v) => v.copy_within(from..from + len, to),
            Rows::F16(v) => v.copy_within(from..from + len, to),
            Rows::BF16(v) => v.copy_within(from..from + len, to),
            Rows::Blocks(ty, v) => {
                let bytes = |e: usize| e / ty.block_elems() * ty.block_bytes();
                v.copy_within(bytes(from)..bytes(from + len), bytes(to))
            }
        }
    }

    /// The stored bytes, little-endian (the GPU's tests compare its storage).
    #[cfg(all(test, feature = "cuda"))]
    pub(crate) fn bytes_into(&self, out: &mut [u8]) {
        let raw: Vec<u8> = match self {
            Rows::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Rows::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Rows::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Rows::Blocks(_, v) => v.clone(),
        };
        out.copy_from_slice(&raw);
    }

    pub(crate) fn bytes(&self) -> usize {
        match self {
            Rows::F32(v) => v.len() * 4,
            Rows::F16(v) => v.len() * 2,
            Rows::BF16(v) => v.len() * 2,
            Rows::Blocks(_, v) => v.len(),
        }
    }
}

/// Borrowed K or V rows of one layer, in the cache's storage type.
#[derive(Clone, Copy)]
pub enum RowsView<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    Blocks(GgmlType, &'a [u8]),
}

impl RowsView<'_> {
    /// Element `i` as f32.
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            RowsView::F32(v) => v[i],
            RowsView::F16(v) => v[i].to_f32(),
            RowsView::BF16(v) => v[i].to_f32(),
            RowsView::Blocks(ty, _) => {
                // Blocks are at most QK_K elements.
                let be = ty.block_elems();
                let mut block = [0f32; rlx_gguf::QK_K];
                self.read(i / be * be, &mut block[..be]);
                block[i % be]
            }
        }
    }

    /// The `buf.len()` elements at `start` as f32: borrowed in place for f32
    /// storage, converted into `buf` otherwise.
    #[inline]
    pub fn row<'b>(&'b self, start: usize, buf: &'b mut [f32]) -> &'b [f32] {
        match self {
            RowsView::F32(v) => &v[start..start + buf.len()],
            _ => {
                self.read(start, buf);
                buf
            }
        }
    }

    /// Copies `out.len()` elements starting at `start` into `out` as f32
    /// (whole blocks for block types).
    #[inline]
    pub fn read(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match self {
            RowsView::F32(v) => out.copy_from_slice(&v[start..end]),
            RowsView::F16(v) => out
                .iter_mut()
                .zip(&v[start..end])
                .for_each(|(o, s)| *o = s.to_f32()),
            RowsView::BF16(v) => out
                .iter_mut()
                .zip(&v[start..end])
                .for_each(|(o, s)| *o = s.to_f32()),
            RowsView::Blocks(ty, v) => {
                let bytes = |e: usize| e / ty.block_elems() * ty.block_bytes();
                rlx_gguf::dequantize(*ty, &v[bytes(start)..bytes(end)], out)
                    .expect("whole blocks of a known type");
            }
        }
    }
}

/// One owning layer's keys and values.
pub(crate) struct LayerRows {
    pub k: Rows,
    pub v: Rows,
    /// Elements per row of `k` and `v`.
    pub k_width: usize,
    pub v_width: usize,
}

/// The K/V rows of a pool on the CPU.
pub struct CpuKvStorage {
    /// Per slot; `None` for layers that share another's K/V.
    pub(crate) layers: Vec<Option<LayerRows>>,
    /// The owning slots of each group.
    groups: Vec<Vec<usize>>,
}

impl CpuKvStorage {
    /// Zeroed rows for the owning layers of `config` that `slots` keeps.
    pub fn new(config: &KvPoolConfig, slots: &SlotSet) -> Result<Self, KvError> {
        config.validate()?;
        let layers = config.alloc_layers(slots, |l| {
            Ok::<_, KvError>(LayerRows {
                k: Rows::new(config.types.k, l.rows * l.k_width),
                v: Rows::new(config.types.v, l.rows * l.v_width),
                k_width: l.k_width,
                v_width: l.v_width,
            })
        })?;
        Ok(CpuKvStorage {
            layers,
            groups: config.group_slots(slots),
        })
    }

    /// Writes K/V rows `[n, width]` of an owning slot to physical rows `rows`.
    pub(crate) fn write(
        &mut self,
        slot: usize,
        k: &[f32],
        v: &[f32],
        rows: &[u32],
    ) -> Result<(), KvError> {
        let l = self
            .layers
            .get_mut(slot)
            .and_then(|l| l.as_mut())
            .ok_or_else(|| KvError::Layout {
                slot: slot as u32,
                what: "layer shares another layer's K/V and cannot be written".into(),
            })?;
        let n = rows.len();
        if k.len() != n * l.k_width || v.len() != n * l.v_width {
            return Err(KvError::Layout {
                slot: slot as u32,
                what: format!(
                    "expected k {n}×{} and v {n}×{} values, got {} and {}",
                    l.k_width,
                    l.v_width,
                    k.len(),
                    v.len()
                ),
            });
        }
        for (t, &row) in rows.iter().enumerate() {
            let row = row as usize;
            l.k.write(row * l.k_width, &k[t * l.k_width..][..l.k_width]);
            l.v.write(row * l.v_width, &v[t * l.v_width..][..l.v_width]);
        }
        Ok(())
    }

    /// The keys and values of an owning slot.
    pub(crate) fn view(&self, slot: usize) -> Option<(RowsView<'_>, RowsView<'_>)> {
        let l = self.layers.get(slot)?.as_ref()?;
        Some((l.k.view(), l.v.view()))
    }
}

impl KvStorage for CpuKvStorage {
    fn copy_block(&mut self, group: usize, from: u32, to: u32) -> Result<(), KvError> {
        let (from, to) = (from as usize * BLOCK_TOKENS, to as usize * BLOCK_TOKENS);
        for &slot in &self.groups[group] {
            let l = self.layers[slot].as_mut().expect("owners have storage");
            let (kw, vw) = (l.k_width, l.v_width);
            l.k.copy_rows(from * kw, to * kw, BLOCK_TOKENS * kw);
            l.v.copy_rows(from * vw, to * vw, BLOCK_TOKENS * vw);
        }
        Ok(())
    }

    fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|l| l.k.bytes() + l.v.bytes())
            .sum()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
