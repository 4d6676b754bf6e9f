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

/// The worst relative L2 of `other`'s logits against `reference`'s over
/// one session each: a prompt of `prompt_len` tokens prefilled in chunks
/// of `chunk`, 8 greedy decode steps (the same tokens), a rewind by 3 and
/// the tail again, and all-position scores of prompts of 1, 2, 3 and up
/// to 20 tokens. Every check must stay under `bound`.
pub fn compare_sessions(
    reference: &Model,
    other: &Model,
    name: &str,
    prompt_len: usize,
    chunk: usize,
    kv_types: Option<rlx_gemma::KvTypes>,
    bound: f64,
) -> Result<f64, rlx_gemma::ModelError> {
    let vocab = reference.config().n_vocab;
    let prompt: Vec<u32> = std::iter::once(2)
        .chain((1..prompt_len).map(|i| ((i * 7919) % (vocab - 16) + 16) as u32))
        .collect();
    let opts = SessionOptions {
        context: Some(prompt_len + 32),
        prefill_chunk: chunk,
        kv_types,
        ..SessionOptions::default()
    };
    let mut b = other.session(opts.clone())?;
    let mut a = reference.session(opts).unwrap();
    let mut worst = 0f64;
    let mut check = |what: &str, x: &[f32], y: &[f32]| {
        assert_eq!(x.len(), y.len(), "{name}: {what}: lengths");
        let e = rel_l2(y, x);
        assert!(e < bound, "{name}: {what}: relative L2 {e:.2e}");
        worst = worst.max(e);
    };
    let argmax = |v: &[f32]| super::argmax(v) as u32;
    let (mut la, mut lb) = (a.feed(&prompt).unwrap(), b.feed(&prompt)?);
    check("prefill", &la, &lb);
    for step in 0..8 {
        let t = argmax(&la);
        assert_eq!(t, argmax(&lb), "{name}: greedy token {step}");
        la = a.feed(&[t]).unwrap();
        lb = b.feed(&[t])?;
        check(&format!("decode {step}"), &la, &lb);
    }
    // Back a few tokens and on again (the rings keep what the rewind needs,
    // or the prefix runs again).
    let keep = prompt_len - 3;
    a.rewind(keep).unwrap();
    b.rewind(keep)?;
    let tail = &prompt[keep..];
    check("after rewind", &a.feed(tail).unwrap(), &b.feed(tail)?);
    // Logits of every position, for prompts of every length from 1: a row
    // must not depend on the rows after it.
    for n in [1, 2, 3, prompt_len.min(20)] {
        a.reset();
        b.reset();
        let short = &prompt[..n];
        check(
            &format!("score of {n}"),
            &a.score(short).unwrap(),
            &b.score(short)?,
        );
    }
    Ok(worst)
}
