//! A mixed-batch scenario driven the way a server drives `Sequences`: adds,
//! forks, removals, prompt chunks under a token budget beside decode tokens.

use std::collections::BTreeMap;

use rlx_gemma::{Feed, Model, SeqId, Sequences, SequencesOptions, SessionOptions, Want};

use super::rel_l2;

/// How one scenario runs.
pub struct Script {
    /// Prompt lengths of the sequences added at the start (A, B) and later (D).
    pub prompt_a: usize,
    pub prompt_b: usize,
    pub prompt_d: usize,
    /// Length each sequence generates to.
    pub target: usize,
    /// Tokens per step.
    pub budget: usize,
}

impl Script {
    /// For the tiny models: their 8-token windows and the 32-token blocks
    /// are crossed several times.
    pub const TINY: Script = Script {
        prompt_a: 45,
        prompt_b: 9,
        prompt_d: 70,
        target: 90,
        budget: 24,
    };
    /// Long enough to leave Gemma 3 270M's 512-token sliding window.
    pub const LONG: Script = Script {
        prompt_a: 530,
        prompt_b: 40,
        prompt_d: 300,
        target: 560,
        budget: 256,
    };
}

/// A deterministic token for sequence `tag` at position `pos`.
pub fn token(vocab: usize, tag: usize, pos: usize) -> u32 {
    (((tag * 7919 + pos * 104_729 + 13) % (vocab - 3)) + 3) as u32
}

struct Tracked {
    tag: usize,
    /// Tokens still to feed (the prompt, then one generated token at a time).
    pending: Vec<u32>,
    tokens: Vec<u32>,
    logits: Vec<f32>,
    target: usize,
}

/// Runs the scenario and returns every sequence's tokens and logit rows
/// (including a sequence removed part way).
pub fn run_batched(model: &Model, s: &Script) -> Vec<(Vec<u32>, Vec<f32>)> {
    let vocab = model.config().n_vocab;
    let mut seqs: Sequences = model
        .sequences(SequencesOptions {
            max_seqs: 6,
            context: Some(s.target + 8),
            max_step_tokens: s.budget,
            ..Default::default()
        })
        .unwrap();
    let mut live: BTreeMap<SeqId, Tracked> = BTreeMap::new();
    let mut done = Vec::new();
    let prompt = |tag: usize, n: usize| (0..n).map(|p| token(vocab, tag, p)).collect::<Vec<_>>();
    let add = |seqs: &mut Sequences, live: &mut BTreeMap<SeqId, Tracked>, tag, n| {
        let id = seqs.add().unwrap();
        live.insert(
            id,
            Tracked {
                tag,
                pending: prompt(tag, n),
                tokens: Vec::new(),
                logits: Vec::new(),
                target: s.target,
            },
        );
        id
    };
    let a = add(&mut seqs, &mut live, 1, s.prompt_a);
    let b = add(&mut seqs, &mut live, 2, s.prompt_b);
    let (mut forked_c, mut step_no) = (None, 0);
    while !live.is_empty() {
        // The fork of A once its prompt is in, D a few steps later, B gone
        // and a fork of C after that.
        if forked_c.is_none() && live[&a].pending.len() <= 1 && !live[&a].tokens.is_empty() {
            let c = seqs.fork(a).unwrap();
            let parent = &live[&a];
            let t = Tracked {
                tag: 3,
                pending: vec![token(vocab, 3, parent.tokens.len())],
                tokens: parent.tokens.clone(),
                logits: parent.logits.clone(),
                target: s.target - 5,
            };
            live.insert(c, t);
            forked_c = Some(c);
        }
        if step_no == 3 {
            add(&mut seqs, &mut live, 4, s.prompt_d);
        }
        if let (Some(c), true) = (forked_c, step_no == 9) {
            let gone = live.remove(&b).unwrap();
            seqs.remove(b).unwrap();
            done.push((gone.tokens, gone.logits));
            let e = seqs.fork(c).unwrap();
            let parent = &live[&c];
            let t = Tracked {
                tag: 5,
                pending: vec![token(vocab, 5, parent.tokens.len())],
                tokens: parent.tokens.clone(),
                logits: parent.logits.clone(),
                target: s.target,
            };
            live.insert(e, t);
        }
        // Decode tokens first, then prompt chunks in what is left.
        let mut budget = s.budget;
        let mut plan: Vec<(SeqId, usize)> = Vec::new();
        for (&id, t) in &live {
            if t.pending.len() == 1 && budget > 0 {
                plan.push((id, 1));
                budget -= 1;
            }
        }
        for (&id, t) in &live {
            if t.pending.len() > 1 && budget > 0 {
                let n = t.pending.len().min(budget);
                plan.push((id, n));
                budget -= n;
            }
        }
        let feeds: Vec<Feed> = plan
            .iter()
            .map(|&(id, n)| Feed {
                seq: id,
                tokens: &live[&id].pending[..n],
                logits: Want::All,
            })
            .collect();
        let out = seqs.step(&feeds).unwrap();
        assert_eq!(out.len(), plan.len());
        for (i, &(id, n)) in plan.iter().enumerate() {
            let rows = out.get(i);
            let t = live.get_mut(&id).unwrap();
            assert_eq!(rows.len(), n * vocab);
            let fed: Vec<u32> = t.pending.drain(..n).collect();
            t.tokens.extend(fed);
            t.logits.extend_from_slice(rows);
            if t.pending.is_empty() && t.tokens.len() < t.target {
                t.pending.push(token(vocab, t.tag, t.tokens.len()));
            }
        }
        for id in live.keys().copied().collect::<Vec<_>>() {
            if live[&id].pending.is_empty() {
                let t = live.remove(&id).unwrap();
                seqs.remove(id).unwrap();
                done.push((t.tokens, t.logits));
            }
        }
        seqs.pool().check_invariants().unwrap();
        step_no += 1;
    }
    assert_eq!(
        seqs.pool().free_blocks(),
        seqs.pool()
            .config()
            .groups()
            .iter()
            .map(|g| g.blocks)
            .collect::<Vec<_>>(),
        "every block is back in the pool"
    );
    done
}

/// Runs the scenario on `batched` and returns the largest relative L2, over
/// its sequences, against each sequence scored alone on `alone`.
pub fn worst_against_alone(batched: &Model, alone: &Model, s: &Script) -> f64 {
    let runs = run_batched(batched, s);
    assert_eq!(runs.len(), 5);
    let mut worst = 0f64;
    for (tokens, logits) in runs {
        let mut session = alone
            .session(SessionOptions {
                context: Some(tokens.len()),
                prefill_chunk: s.budget,
                ..Default::default()
            })
            .unwrap();
        let want = session.score(&tokens).unwrap();
        assert_eq!(want.len(), logits.len());
        worst = worst.max(rel_l2(&logits, &want));
    }
    worst
}
