//! The paged K/V pool: groups by window, blocks that slide out of a window
//! returned, forks sharing blocks, truncation, and errors before anything is
//! taken. A property test drives random add/fork/step/truncate/free
//! sequences and checks the bookkeeping after every operation.

use proptest::prelude::*;
use rlx_ir::CacheSlot;
use rlx_runtime::cpu::CpuKvStorage;
use rlx_runtime::{Batch, KvDType, KvError, KvLayerSpec, KvPool, KvPoolConfig, SeqId};

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
        dtype: KvDType::F32,
        tokens,
        max_seqs,
        max_chunk,
    }
}

fn pool(c: KvPoolConfig) -> KvPool {
    let storage = CpuKvStorage::new(&c).unwrap();
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
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => Just(Op::Add),
        1 => (0..8usize).prop_map(Op::Fork),
        4 => proptest::collection::vec((0..8usize, 1..20usize), 1..4).prop_map(Op::Step),
        1 => (0..8usize, 0..200usize).prop_map(|(s, l)| Op::Truncate(s, l)),
        1 => (0..8usize).prop_map(Op::Free),
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
        for op in ops {
            match op {
                Op::Add if live.len() < 8 => live.push(p.add_sequence()),
                Op::Fork(i) if !live.is_empty() && live.len() < 8 => {
                    let src = live[i % live.len()];
                    live.push(p.fork(src).unwrap());
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
                        b.push_run(s, start, &vec![7; n], |_| false);
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
        let total: Vec<usize> = p.config().groups().iter().map(|g| g.blocks).collect();
        prop_assert_eq!(p.free_blocks(), total);
    }
}
