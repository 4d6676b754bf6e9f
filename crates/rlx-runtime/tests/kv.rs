//! The paged K/V pool: groups by window, blocks that slide out of a window
//! returned, forks sharing blocks, truncation, and errors before anything is
//! taken; the prefix cache (blocks kept by content, taken over by later
//! sequences, evicted under pressure). A property test drives random
//! add/fork/step/truncate/free/publish/add-cached sequences and checks the
//! bookkeeping after every operation.

use proptest::prelude::*;
use rlx_ir::CacheSlot;
use rlx_runtime::cpu::CpuKvStorage;
use rlx_runtime::{
    Batch, KvDType, KvError, KvLayerSpec, KvPool, KvPoolConfig, KvTypes, SeqId, SlotSet,
};

const B: usize = rlx_runtime::BLOCK_TOKENS;

fn spec(kv_heads: usize, head_dim: usize, window: Option<usize>) -> KvLayerSpec {
    KvLayerSpec {
        kv_heads,
        head_dim,
        v_head_dim: head_dim,
        window,
        shares: None,
    }
}

/// A sliding layer (window 40), a full layer and a layer sharing the full one.
fn config(tokens: usize, max_seqs: usize, max_chunk: usize) -> KvPoolConfig {
    KvPoolConfig {
        layers: vec![
            spec(1, 4, Some(40)),
            spec(2, 8, None),
            KvLayerSpec {
                shares: Some(CacheSlot(1)),
                ..spec(2, 8, None)
            },
        ],
        types: KvTypes::both(KvDType::F32),
        tokens,
        max_seqs,
        max_chunk,
    }
}

fn pool(c: KvPoolConfig) -> KvPool {
    let storage = CpuKvStorage::new(&c, &SlotSet::All).unwrap();
    KvPool::new(c, Box::new(storage)).unwrap()
}

/// Appends `n` tokens to `seq` (bookkeeping only: what a step does before
/// and after its kernels).
fn append(p: &mut KvPool, seq: SeqId, n: usize) -> Result<(), KvError> {
    let start = p.len(seq)?;
    let mut b = Batch::new();
    b.push_run(seq, start, &vec![1; n], |_| false);
    let layout = p.prepare(&b)?;
    p.commit(&layout);
    Ok(())
}

#[test]
fn groups_size_sliding_layers_by_their_window() {
    let c = config(1024, 4, 16);
    let groups = c.groups();
    assert_eq!(groups.len(), 2);
    assert_eq!((groups[0].window, groups[0].blocks), (None, 1024 / B));
    // Window 40 and chunks of 16: 55 rows span at most 3 blocks.
    assert_eq!((groups[1].window, groups[1].blocks), (Some(40), 4 * 3));
    assert_eq!(c.slot_groups(), vec![1, 0, 0]);
    let p = pool(c.clone());
    let row_bytes_full = 2 * 8 * 2 * 4;
    let row_bytes_sliding = 4 * 2 * 4;
    assert_eq!(
        p.memory_bytes(),
        1024 * row_bytes_full + 12 * B * row_bytes_sliding,
        "nothing for the sharing layer"
    );
    assert_eq!(c.memory_bytes(), p.memory_bytes());
}

#[test]
fn sliding_layers_return_blocks_that_left_the_window() {
    let mut p = pool(config(1024, 1, 16));
    let s = p.add_sequence();
    for _ in 0..20 {
        append(&mut p, s, 16).unwrap();
        p.check_invariants().unwrap();
    }
    assert_eq!(p.len(s).unwrap(), 320);
    let free = p.free_blocks();
    assert_eq!(
        free[0],
        1024 / B - 10,
        "the full layers hold all 320 tokens"
    );
    // 320 tokens went through a sliding group of 3 blocks in all, which
    // still holds the window the next query needs.
    assert_eq!(p.config().groups()[1].blocks, 3);
    let sliding = p.rows(1);
    for pos in 320 - 40..320 {
        assert!(
            sliding.pos.contains(&pos),
            "position {pos} left the window early"
        );
    }
    assert!(free[1] <= 1);
    // Rows of the full group hold their positions.
    let rows = p.rows(0);
    let mut held: Vec<i64> = rows.pos.iter().copied().filter(|&x| x >= 0).collect();
    held.sort();
    assert_eq!(held, (0..320).collect::<Vec<i64>>());
    // Rewinding within the window works; past it is refused, unchanged.
    p.truncate(s, 300).unwrap();
    assert_eq!(p.len(s).unwrap(), 300);
    let e = p.truncate(s, 200).unwrap_err();
    assert!(matches!(e, KvError::RewindTooFar { .. }), "{e}");
    assert_eq!(p.len(s).unwrap(), 300);
    p.check_invariants().unwrap();
    p.free(s).unwrap();
    assert_eq!(p.free_blocks(), vec![1024 / B, 3]);
}

#[test]
fn forks_share_blocks_and_copy_only_what_they_write() {
    let mut p = pool(config(1024, 4, 16));
    let a = p.add_sequence();
    append(&mut p, a, 16).unwrap();
    append(&mut p, a, 16).unwrap();
    append(&mut p, a, 8).unwrap(); // 40 tokens: block 1 is partly filled
    let before = p.free_blocks()[0];
    let b = p.fork(a).unwrap();
    assert_eq!(p.free_blocks()[0], before, "a fork copies nothing");
    append(&mut p, b, 1).unwrap();
    assert_eq!(
        p.free_blocks()[0],
        before - 1,
        "writing into the shared partial block copies it"
    );
    append(&mut p, a, 1).unwrap();
    assert_eq!(
        p.free_blocks()[0],
        before - 1,
        "the other holder now owns the original alone"
    );
    p.check_invariants().unwrap();
    // Truncating a fork leaves its sibling's rows alone.
    p.truncate(b, 35).unwrap();
    p.check_invariants().unwrap();
    assert_eq!(p.len(a).unwrap(), 41);
    p.free(a).unwrap();
    p.free(b).unwrap();
    p.check_invariants().unwrap();
    assert_eq!(p.free_blocks()[0], 1024 / B);
}

#[test]
fn bad_steps_are_refused_before_anything_is_taken() {
    let mut p = pool(config(64, 2, 16));
    let a = p.add_sequence();
    let mut b = Batch::new();
    b.push_run(a, 3, &[1, 2], |_| false);
    assert!(matches!(
        p.prepare(&b).unwrap_err(),
        KvError::Position { len: 0, pos: 3, .. }
    ));
    let mut b = Batch::new();
    b.push_run(a, 0, &[1; 17], |_| false);
    assert!(matches!(
        p.prepare(&b).unwrap_err(),
        KvError::ChunkTooLong { n: 17, .. }
    ));
    let mut b = Batch::new();
    b.push(a, 0, 1, false);
    b.push(a, 0, 1, false);
    assert!(p.prepare(&b).is_err(), "a repeated position");
    let mut b = Batch::new();
    b.push(SeqId(99), 0, 1, false);
    assert!(matches!(
        p.prepare(&b).unwrap_err(),
        KvError::UnknownSeq(SeqId(99))
    ));
    // 64 tokens: both blocks of the full layers.
    for _ in 0..4 {
        append(&mut p, a, 16).unwrap();
    }
    let c = p.add_sequence();
    let free = p.free_blocks();
    let e = append(&mut p, c, 16).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, KvError::Full { seq, needed: 1, free: 0, .. } if seq == c),
        "{msg}"
    );
    assert!(msg.contains("sequence"), "{msg}");
    assert_eq!(p.free_blocks(), free, "nothing taken");
    p.check_invariants().unwrap();
}

#[derive(Clone, Debug)]
enum Op {
    Add,
    Fork(usize),
    Step(Vec<(usize, usize)>),
    Truncate(usize, usize),
    Free(usize),
    Publish(usize),
    /// A sequence from the cache for `len` tokens of stream `v`.
    AddCached(u32, usize),
}

/// Token `pos` of stream `v`: two streams that share their first 70 tokens.
fn tok(v: u32, pos: usize) -> u32 {
    if pos < 70 {
        (pos % 5) as u32
    } else {
        v * 100 + (pos % 7) as u32
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => Just(Op::Add),
        1 => (0..8usize).prop_map(Op::Fork),
        4 => proptest::collection::vec((0..8usize, 1..20usize), 1..4).prop_map(Op::Step),
        1 => (0..8usize, 0..200usize).prop_map(|(s, l)| Op::Truncate(s, l)),
        1 => (0..8usize).prop_map(Op::Free),
        2 => (0..8usize).prop_map(Op::Publish),
        1 => (0..2u32, 0..200usize).prop_map(|(v, l)| Op::AddCached(v, l)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the interleaving, every block's count matches the tables
    /// that hold it, no free block is held, each sequence's rows hold its
    /// positions, and freeing everything returns every block.
    #[test]
    fn bookkeeping_holds_under_any_interleaving(ops in proptest::collection::vec(op(), 1..40)) {
        let mut p = pool(config(2048, 8, 24));
        let mut live: Vec<SeqId> = Vec::new();
        // Each sequence's stream.
        let mut stream: std::collections::HashMap<SeqId, u32> = Default::default();
        let tokens = |p: &KvPool, s: SeqId, v: u32| -> Vec<u32> {
            (0..p.len(s).unwrap()).map(|i| tok(v, i)).collect()
        };
        for op in ops {
            match op {
                Op::Add if live.len() < 8 => {
                    let s = p.add_sequence();
                    stream.insert(s, live.len() as u32 % 2);
                    live.push(s);
                }
                Op::Fork(i) if !live.is_empty() && live.len() < 8 => {
                    let src = live[i % live.len()];
                    let s = p.fork(src).unwrap();
                    stream.insert(s, stream[&src]);
                    live.push(s);
                }
                Op::Publish(i) if !live.is_empty() => {
                    let s = live[i % live.len()];
                    let t = tokens(&p, s, stream[&s]);
                    p.publish(s, &t).unwrap();
                }
                Op::AddCached(v, len) if live.len() < 8 => {
                    let want: Vec<u32> = (0..len).map(|i| tok(v, i)).collect();
                    let (s, n) = p.add_cached(&want);
                    prop_assert!(n <= len && n % B == 0);
                    prop_assert_eq!(p.len(s).unwrap(), n);
                    stream.insert(s, v);
                    live.push(s);
                }
                Op::Step(parts) if !live.is_empty() => {
                    let mut b = Batch::new();
                    let mut used = Vec::new();
                    for (i, n) in parts {
                        let s = live[i % live.len()];
                        if used.contains(&s) {
                            continue;
                        }
                        used.push(s);
                        let start = p.len(s).unwrap();
                        let t: Vec<u32> = (start..start + n).map(|i| tok(stream[&s], i)).collect();
                        b.push_run(s, start, &t, |_| false);
                    }
                    match p.prepare(&b) {
                        Ok(layout) => p.commit(&layout),
                        Err(KvError::Full { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                Op::Truncate(i, len) if !live.is_empty() => {
                    let s = live[i % live.len()];
                    let before = p.len(s).unwrap();
                    match p.truncate(s, len) {
                        Ok(()) => prop_assert_eq!(p.len(s).unwrap(), len.min(before)),
                        Err(KvError::RewindTooFar { .. }) => {
                            prop_assert_eq!(p.len(s).unwrap(), before)
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let s = live.remove(i % live.len());
                    p.free(s).unwrap();
                }
                _ => {}
            }
            if let Err(e) = p.check_invariants() {
                prop_assert!(false, "{}", e);
            }
        }
        for s in live {
            p.free(s).unwrap();
        }
        p.clear_cache();
        prop_assert_eq!(p.cached_blocks(), 0);
        let total: Vec<usize> = p.config().groups().iter().map(|g| g.blocks).collect();
        prop_assert_eq!(p.free_blocks(), total);
    }
}

#[test]
fn a_published_prefix_is_taken_over_by_a_later_sequence() {
    let mut p = pool(config(1024, 4, 128));
    let t: Vec<u32> = (0..100).map(|i| i as u32 % 11).collect();
    let a = p.add_sequence();
    append(&mut p, a, 100).unwrap();
    p.publish(a, &t).unwrap();
    assert_eq!(p.cached_blocks(), 3, "three full blocks of 100 tokens");
    p.free(a).unwrap();
    p.check_invariants().unwrap();
    let free = p.free_blocks();
    // The same start, another ending: three blocks come from the cache.
    let mut u = t[..96].to_vec();
    u.extend([500, 501, 502]);
    assert_eq!(p.cached_prefix(&u), 96);
    let (b, n) = p.add_cached(&u);
    assert_eq!((n, p.len(b).unwrap()), (96, 96));
    assert_eq!(p.free_blocks(), free, "nothing taken for the shared blocks");
    append(&mut p, b, 3).unwrap();
    p.check_invariants().unwrap();
    // A token differing inside the second block stops the match there.
    let mut w = t.clone();
    w[40] = 999;
    assert_eq!(p.cached_prefix(&w), B);
    // Too short for a whole block: nothing.
    assert_eq!(p.cached_prefix(&t[..B - 1]), 0);
    p.free(b).unwrap();
    p.clear_cache();
    let total: Vec<usize> = p.config().groups().iter().map(|g| g.blocks).collect();
    assert_eq!(p.free_blocks(), total);
}

#[test]
fn a_prefix_whose_window_blocks_are_gone_is_not_taken() {
    // The sliding layer (window 40) drops blocks as a sequence grows; blocks
    // published after that have no sliding part, and a sequence can only
    // start after a block whose window the cache still holds.
    let mut p = pool(config(1024, 4, 64));
    let t: Vec<u32> = (0..200).map(|i| i as u32 % 13).collect();
    let a = p.add_sequence();
    append(&mut p, a, 64).unwrap();
    append(&mut p, a, 64).unwrap();
    append(&mut p, a, 64).unwrap();
    // Published at 192 tokens: blocks 0..3 of the sliding layer are gone.
    p.publish(a, &t[..192]).unwrap();
    assert_eq!(p.cached_blocks(), 6);
    // After 6 blocks a query sees positions 153.., blocks 4 and 5: held.
    assert_eq!(p.cached_prefix(&t), 6 * B);
    // After 2 blocks it would need blocks 0 and 1, which are gone.
    assert_eq!(p.cached_prefix(&t[..2 * B + 5]), 0);
    p.check_invariants().unwrap();
}

#[test]
fn cached_blocks_are_evicted_least_recently_used_when_a_step_needs_them() {
    // 8 blocks a group: two published sequences of 3 blocks fill 6.
    let mut p = pool(config(8 * B, 4, 4 * B));
    let old: Vec<u32> = (0..96).map(|i| i as u32).collect();
    let new: Vec<u32> = (0..96).map(|i| 1000 + i as u32).collect();
    for t in [&old, &new] {
        let s = p.add_sequence();
        append(&mut p, s, 96).unwrap();
        p.publish(s, t).unwrap();
        p.free(s).unwrap();
    }
    assert_eq!(p.cached_blocks(), 6);
    // A sequence of 4 blocks needs 2 of the cached ones: the older chain's
    // deepest go first.
    let s = p.add_sequence();
    append(&mut p, s, 4 * B).unwrap();
    p.check_invariants().unwrap();
    assert_eq!(p.cached_prefix(&new), 96, "the recent chain is whole");
    assert_eq!(p.cached_prefix(&old), B, "the old chain lost its tail");
    // Blocks a live sequence holds are never evicted: a pool this full
    // reports it, naming the sequence.
    let (c, n) = p.add_cached(&new);
    assert_eq!(n, 96);
    let err = append(&mut p, c, 4 * B).unwrap_err();
    assert!(matches!(err, KvError::Full { .. }), "{err}");
    p.check_invariants().unwrap();
    assert_eq!(p.cached_prefix(&new), 96);
}

#[test]
fn a_sequence_growing_past_its_window_takes_back_what_the_cache_holds() {
    // A pool for one sequence: its sliding layer has room for the window
    // alone. Publishing every step keeps old sliding blocks in the cache;
    // they are given back as the window moves on, while the full layer's
    // blocks (the sequence still holds them) stay.
    let mut p = pool(config(512, 1, 16));
    let s = p.add_sequence();
    let t: Vec<u32> = (0..480).map(|i| i as u32 % 17).collect();
    for _ in 0..30 {
        append(&mut p, s, 16).unwrap();
        let n = p.len(s).unwrap();
        p.publish(s, &t[..n]).unwrap();
        p.check_invariants().unwrap();
    }
    assert_eq!(p.len(s).unwrap(), 480);
    assert_eq!(p.cached_blocks(), 15);
}
