//! A model split between an accelerator and the CPU: which layers and
//! experts stay in host memory, chosen by the caller or fitted to the
//! accelerator's free memory, and the estimate of each device's share.
//!
//! As llama.cpp does, the accelerator takes the last layers and the LM
//! head; embedding lookups, per-layer input tables and the first layers
//! stay on the CPU, so activations cross once at the layer boundary (and
//! around each layer whose experts stay on the CPU).

use rlx_ir::{Graph, WeightId};
use rlx_runtime::{Device, KvChoice, KvPoolConfig, Placement, RunError, SlotSet, WeightStore};
use std::fmt;

use crate::config::GemmaConfig;

/// How many layers go to the accelerator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpuLayers {
    /// Every layer when the model fits in the device's free memory, else
    /// as many of the last layers as fit.
    #[default]
    Auto,
    /// The last `n` layers (and the LM head); `n` of at least the layer
    /// count is every layer, 0 none (the model runs on the CPU).
    Count(usize),
}

/// What to keep in host memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offload {
    pub gpu_layers: GpuLayers,
    /// The first this many layers keep their expert weights in host memory
    /// and run them on the CPU (`usize::MAX`: every layer).
    pub cpu_moe_layers: usize,
    /// Tokens of K/V (over all sequences) that fitting leaves room for.
    pub kv_tokens: usize,
    /// Their types.
    pub kv_types: KvChoice,
}

impl Default for Offload {
    fn default() -> Self {
        Offload {
            gpu_layers: GpuLayers::Auto,
            cpu_moe_layers: 0,
            kv_tokens: 4096,
            kv_types: KvChoice::default(),
        }
    }
}

/// Backend indices of a split: the accelerator first.
pub(crate) const GPU: usize = 0;
pub(crate) const CPU: usize = 1;

/// Where a model's layers run and what each device holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    pub device: Device,
    pub layers: usize,
    /// Layers on the accelerator: the last `gpu_layers`.
    pub gpu_layers: usize,
    /// Layers of those whose experts run on the CPU.
    pub cpu_moe_layers: usize,
    /// Estimated bytes on each device: `[accelerator, CPU]`.
    pub shares: [Share; 2],
}

/// One device's part of a split, estimated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Share {
    /// Weights copied to the device (on the CPU: read where mapped).
    pub weights: usize,
    pub kv: usize,
    /// Activations, products' scratch and the runtime's own.
    pub scratch: usize,
}

impl Share {
    pub fn total(&self) -> usize {
        self.weights + self.kv + self.scratch
    }
}

fn mib(b: usize) -> String {
    format!("{:.0} MiB", b as f64 / (1 << 20) as f64)
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [g, c] = &self.shares;
        write!(
            f,
            "{}: the last {} of {} layers and the LM head",
            self.device, self.gpu_layers, self.layers
        )?;
        if self.cpu_moe_layers > 0 {
            write!(
                f,
                " ({} of them with experts on the CPU)",
                self.cpu_moe_layers
            )?;
        }
        write!(
            f,
            ", {} (weights {}, K/V {}, scratch {}); cpu: {} layers and the embeddings, weights {} mapped, K/V {}",
            mib(g.total()),
            mib(g.weights),
            mib(g.kv),
            mib(g.scratch),
            self.layers - self.gpu_layers,
            mib(c.weights),
            mib(c.kv)
        )
    }
}

/// The layer a weight belongs to (`blk.N.…`).
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Whether a weight holds experts (`…_exps`).
fn is_experts(name: &str) -> bool {
    name.split('.').any(|part| part.ends_with("_exps"))
}

/// What runs after the last layer.
fn is_head(name: &str) -> bool {
    let base = name.strip_suffix(".weight").unwrap_or(name);
    matches!(base, "output" | "output_norm" | "altup_unembd_proj")
}

/// The placement of `gpu_layers` last layers (experts of the first
/// `cpu_moe_layers` on the CPU): the accelerator is backend 0, the CPU 1.
pub(crate) fn placement(
    config: &GemmaConfig,
    store: &WeightStore,
    gpu_layers: usize,
    cpu_moe_layers: usize,
) -> Placement {
    let n = config.layers.len();
    let first_gpu = n.saturating_sub(gpu_layers);
    let layer_dev = |l: usize| if l >= first_gpu { GPU } else { CPU };
    let weights = (0..store.len())
        .map(|i| {
            let name = &store.info(WeightId(i as u32)).name;
            match layer_of(name) {
                Some(l) if is_experts(name) && l < cpu_moe_layers => CPU,
                Some(l) => layer_dev(l),
                // The tied LM head multiplies by the token table (its
                // lookups are gathers, which stay on the CPU).
                None if is_head(name) || name == "token_embd.weight" => {
                    if gpu_layers > 0 {
                        GPU
                    } else {
                        CPU
                    }
                }
                None => CPU,
            }
        })
        .collect();
    let slots = config
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| layer_dev(l.kv_source.unwrap_or(i)))
        .collect();
    Placement {
        weights,
        gathers: CPU,
        slots,
    }
}

/// Bytes a weight takes in an accelerator's memory: matrices as stored,
/// vectors widened to f32.
fn device_bytes(store: &WeightStore, w: WeightId) -> usize {
    let info = store.info(w);
    if info.shape.len() == 1 {
        info.shape[0] * 4
    } else {
        store.bytes(w).len()
    }
}

/// The estimate of a split: weights each device's nodes of `graph` read,
/// the K/V rows of its layers for `kv`, and scratch on the accelerator.
pub(crate) fn estimate(
    graph: &Graph,
    store: &WeightStore,
    placement: &Placement,
    kv: &KvPoolConfig,
    scratch: usize,
) -> Result<[Share; 2], RunError> {
    let read = placement.weights_read(graph, 2, store.len())?;
    let mut shares = [Share::default(); 2];
    for (d, share) in shares.iter_mut().enumerate() {
        share.weights = read[d]
            .iter()
            .enumerate()
            .filter(|(_, r)| **r)
            .map(|(i, _)| {
                let w = WeightId(i as u32);
                if d == GPU {
                    device_bytes(store, w)
                } else {
                    store.bytes(w).len()
                }
            })
            .sum();
        share.kv = kv.slots_bytes(&SlotSet::Only(
            placement.slots.iter().map(|&s| s == d).collect(),
        ));
    }
    shares[GPU].scratch = scratch;
    Ok(shares)
}

/// Scratch an accelerator needs beside weights and K/V: a few plans'
/// activations, the largest matrix dequantized to bf16 for many-token
/// products, and room for the runtime and libraries (256 MiB).
pub(crate) fn scratch_bytes(store: &WeightStore, activations: usize) -> usize {
    let largest = (0..store.len())
        .map(|i| {
            let info = store.info(WeightId(i as u32));
            if info.shape.len() >= 2 {
                info.shape.iter().product::<usize>()
            } else {
                0
            }
        })
        .max()
        .unwrap_or(0);
    3 * activations + largest * 2 + (256 << 20)
}

/// Bytes every weight takes on an accelerator.
pub(crate) fn all_weights_bytes(store: &WeightStore) -> usize {
    (0..store.len())
        .map(|i| device_bytes(store, WeightId(i as u32)))
        .sum()
}
