//! KV cache: per-layer shapes, rings for sliding layers, sharing, storage
//! types and truncation.

use rlx_ir::CacheSlot;
use rlx_runtime::{KvCache, KvCacheConfig, KvDType, KvError, KvLayerSpec};

fn spec(kv_heads: usize, head_dim: usize, window: Option<usize>) -> KvLayerSpec {
    KvLayerSpec {
        kv_heads,
        head_dim,
        v_head_dim: head_dim,
        window,
        shares: None,
    }
}

fn config(dtype: KvDType) -> KvCacheConfig {
    KvCacheConfig {
        layers: vec![
            spec(1, 4, Some(3)),
            spec(2, 8, None),
            KvLayerSpec {
                shares: Some(CacheSlot(1)),
                ..spec(2, 8, None)
            },
        ],
        max_context: 64,
        max_chunk: 4,
        dtype,
    }
}

fn rows(n: usize, width: usize, base: f32) -> Vec<f32> {
    (0..n * width).map(|i| base + i as f32).collect()
}

fn append(c: &mut KvCache, n: usize) {
    let base = c.len() as f32 * 100.0;
    c.write(CacheSlot(0), &rows(n, 4, base), &rows(n, 4, -base), n, None)
        .unwrap();
    c.write(
        CacheSlot(1),
        &rows(n, 16, base),
        &rows(n, 16, -base),
        n,
        None,
    )
    .unwrap();
    c.commit(n);
}

#[test]
fn sliding_layers_keep_a_ring_and_full_layers_the_context() {
    let mut c = KvCache::new(config(KvDType::F32)).unwrap();
    assert_eq!(c.capacity(CacheSlot(0)).unwrap(), 3 + 4 - 1);
    assert_eq!(c.capacity(CacheSlot(1)).unwrap(), 64);
    // Shared layer: no storage of its own.
    assert_eq!(
        c.memory_bytes(),
        (6 * 4 * 2 + 64 * 16 * 2) * 4,
        "ring + full layer, nothing for the sharing layer"
    );
    for _ in 0..10 {
        append(&mut c, 3);
    }
    assert_eq!(c.len(), 30);
    let ring = c.view(CacheSlot(0)).unwrap();
    let mut held: Vec<i64> = ring.pos.iter().copied().filter(|&p| p >= 0).collect();
    held.sort();
    assert_eq!(held, (24..30).collect::<Vec<i64>>());
    // Row of position 29 holds what was written for it.
    let row = ring.pos.iter().position(|&p| p == 29).unwrap();
    let mut k = [0f32; 4];
    ring.k.read(row * 4, &mut k);
    assert_eq!(k, [2700.0 + 8.0, 2709.0, 2710.0, 2711.0]);
    // The sharing layer reads its source's rows.
    let shared = c.view(CacheSlot(2)).unwrap();
    let mut a = [0f32; 16];
    let mut b = [0f32; 16];
    shared.v.read(29 * 16, &mut a);
    c.view(CacheSlot(1)).unwrap().v.read(29 * 16, &mut b);
    assert_eq!(a, b);
    assert!(c
        .write(CacheSlot(2), &[0.0; 16], &[0.0; 16], 1, None)
        .is_err());
}

#[test]
fn half_precision_storage_rounds_each_value() {
    for (dtype, bytes) in [(KvDType::F16, 2), (KvDType::BF16, 2), (KvDType::F32, 4)] {
        let mut c = KvCache::new(config(dtype)).unwrap();
        assert_eq!(c.memory_bytes(), (6 * 4 * 2 + 64 * 16 * 2) * bytes);
        let k = vec![0.1f32; 16];
        c.write(CacheSlot(1), &k, &k, 1, None).unwrap();
        let mut got = [0f32; 16];
        c.view(CacheSlot(1)).unwrap().k.read(0, &mut got);
        let want = match dtype {
            KvDType::F16 => half::f16::from_f32(0.1).to_f32(),
            KvDType::BF16 => half::bf16::from_f32(0.1).to_f32(),
            KvDType::F32 => 0.1,
        };
        assert!(got.iter().all(|&g| g == want), "{dtype:?}");
    }
}

#[test]
fn truncation_forgets_later_tokens_and_refuses_lost_windows() {
    let mut c = KvCache::new(config(KvDType::F32)).unwrap();
    append(&mut c, 4);
    append(&mut c, 2);
    c.truncate(4).unwrap();
    assert_eq!(c.len(), 4);
    let full = c.view(CacheSlot(1)).unwrap();
    assert!(full.pos[..4].iter().all(|&p| p >= 0));
    assert!(full.pos[4..].iter().all(|&p| p < 0));
    append(&mut c, 4);
    append(&mut c, 4);
    append(&mut c, 4);
    // Ring holds 10..16; rewinding to 14 needs 12.. (window 3): fine.
    assert_eq!(c.len(), 16);
    c.truncate(14).unwrap();
    assert_eq!(c.len(), 14);
    // Rewinding to 10 would need positions 8..10, long overwritten.
    assert!(matches!(c.truncate(10), Err(KvError::RewindTooFar { .. })));
    c.clear();
    assert!(c.is_empty());
}

#[test]
fn limits_are_checked_before_writing() {
    let mut c = KvCache::new(config(KvDType::F32)).unwrap();
    assert!(matches!(
        c.check_append(5),
        Err(KvError::ChunkTooLong { .. })
    ));
    for _ in 0..16 {
        append(&mut c, 4);
    }
    assert!(matches!(c.check_append(1), Err(KvError::Full { .. })));
    let bad = KvCacheConfig {
        layers: vec![KvLayerSpec {
            shares: Some(CacheSlot(0)),
            ..spec(1, 4, None)
        }],
        ..config(KvDType::F32)
    };
    assert!(KvCache::new(bad).is_err());
}
