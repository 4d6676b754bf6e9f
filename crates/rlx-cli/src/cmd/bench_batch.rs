//! `rlx bench --batch B1,B2,…`: many sequences at once, in the manner of
//! llama-batched-bench. For each B, B sequences each prefill their own
//! `-p`-token prompt (packed into steps of up to 512 tokens), then decode
//! `-n` tokens together, one token of each sequence per step. Speeds are
//! aggregates: all sequences' tokens over the wall time of the phase.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Result};
use rlx_gemma::{Feed, Model, SeqId, Sequences, SequencesOptions, Want};
use rlx_runtime::{KvTypes, RowReduce};
use serde_json::json;

use super::bench::{mean_std, print_profiles, profiled, tokens, BenchArgs};

/// Tokens per prefill step.
const STEP_TOKENS: usize = 512;

struct Sample {
    prefill_tps: f64,
    decode_tps: f64,
    /// K/V bytes the pool's blocks hold at the end.
    kv_used: usize,
    /// K/V bytes of a cache that kept every position of every layer.
    kv_full_length: usize,
}

/// One repetition at batch `b`.
fn time_batch(
    model: &Model,
    kv: KvTypes,
    b: usize,
    prompt: usize,
    gen: usize,
    whole_rows: bool,
) -> Result<Sample> {
    let context = prompt + gen + 1;
    let mut seqs: Sequences = model.sequences(SequencesOptions {
        max_seqs: b,
        context: Some(context),
        max_step_tokens: STEP_TOKENS.max(b),
        kv_types: Some(kv),
        ..Default::default()
    })?;
    let ids: Vec<SeqId> = (0..b)
        .map(|_| seqs.add())
        .collect::<rlx_gemma::model::Result<_>>()?;
    let prompts: Vec<Vec<u32>> = (0..b).map(|i| tokens(model, prompt, i * 31)).collect();
    // Prefill: prompts packed into steps of STEP_TOKENS, each sequence's
    // last chunk asking for its logits.
    let start = Instant::now();
    let mut done = vec![0usize; b];
    while done.iter().any(|&d| d < prompt) {
        let mut budget = seqs.max_step_tokens();
        let mut feeds = Vec::new();
        for i in 0..b {
            let n = (prompt - done[i]).min(budget);
            if n == 0 {
                continue;
            }
            let last = done[i] + n == prompt;
            feeds.push(Feed {
                seq: ids[i],
                tokens: &prompts[i][done[i]..done[i] + n],
                logits: if last { Want::Last } else { Want::None },
            });
            done[i] += n;
            budget -= n;
            if budget == 0 {
                break;
            }
        }
        let rows = feeds.iter().filter(|f| f.logits == Want::Last).count();
        if whole_rows {
            seqs.step(&feeds)?;
        } else {
            seqs.step_reduced(&feeds, &vec![RowReduce::top(1); rows])?;
        }
    }
    let prefill = start.elapsed().as_secs_f64();
    // Decode: one token of every sequence per step.
    let steps: Vec<Vec<u32>> = (0..b).map(|i| tokens(model, gen, 7 + i)).collect();
    // Each row reduced to its greedy choice, as `rlx run --temp 0` asks
    // (on a GPU the logits stay there).
    let greedy = vec![RowReduce::top(1); b];
    let start = Instant::now();
    for t in 0..gen {
        let feeds: Vec<Feed> = (0..b)
            .map(|i| Feed {
                seq: ids[i],
                tokens: &steps[i][t..t + 1],
                logits: Want::Last,
            })
            .collect();
        if whole_rows {
            seqs.step(&feeds)?;
        } else {
            seqs.step_reduced(&feeds, &greedy)?;
        }
    }
    let decode = start.elapsed().as_secs_f64();
    let pool = seqs.pool();
    Ok(Sample {
        prefill_tps: (b * prompt) as f64 / prefill,
        decode_tps: (b * gen) as f64 / decode,
        kv_used: pool.used_bytes(),
        kv_full_length: b * pool.config().full_length_bytes(prompt + gen),
    })
}

pub fn run(args: &BenchArgs, model: &Model, kv: KvTypes) -> Result<()> {
    let (Some(&prompt), Some(&gen)) = (args.prompt.first(), args.gen.first()) else {
        bail!("--batch needs -p and -n");
    };
    if gen == 0 || prompt == 0 {
        bail!("--batch needs -p and -n of at least 1");
    }
    if let Some(&b) = args.batch.iter().find(|&&b| b == 0) {
        bail!("--batch {b}: at least one sequence");
    }
    let threads = args
        .model
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let name = args.model.model.display().to_string();
    let mut rows = Vec::new();
    for &b in &args.batch {
        // One untimed warm-up of the timed steps' shapes (a device captures
        // a graph and loads kernels on a shape's first step).
        time_batch(model, kv, b, prompt, gen.min(4), args.whole_rows)?;
        let samples = (0..args.reps)
            .map(|_| time_batch(model, kv, b, prompt, gen, args.whole_rows))
            .collect::<Result<Vec<_>>>()?;
        rows.push((b, samples));
    }
    let mut profiles = Vec::new();
    if args.profile {
        for &b in &args.batch {
            profiles.extend(profiled(model, &format!("B = {b}"), || {
                time_batch(model, kv, b, prompt, gen, args.whole_rows).map(drop)
            })?);
        }
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        let arr: Vec<_> = rows
            .iter()
            .map(|(b, s)| {
                let tg: Vec<f64> = s.iter().map(|x| x.decode_tps).collect();
                let pp: Vec<f64> = s.iter().map(|x| x.prefill_tps).collect();
                let last = s.last().expect("at least one repetition");
                json!({
                    "model": name,
                    "test": format!("pp{prompt}+tg{gen}"),
                    "batch": b,
                    "tokens_per_second": mean_std(&tg).0,
                    "stddev": mean_std(&tg).1,
                    "samples": tg,
                    "prompt_tokens_per_second": mean_std(&pp).0,
                    "prompt_samples": pp,
                    "threads": threads,
                    "repetitions": s.len(),
                    "precision": args.model.precision_name(),
                    "device": args.model.device,
                    "kv_type": kv.to_string(),
                    "kv_bytes": last.kv_used,
                    "kv_bytes_full_length": last.kv_full_length,
                })
            })
            .collect();
        serde_json::to_writer_pretty(&mut out, &arr)?;
        writeln!(out)?;
        print_profiles(&mut std::io::stderr().lock(), &profiles)?;
        return Ok(());
    }
    writeln!(
        out,
        "| model | threads | precision | B | prompt t/s (B × pp{prompt}) | decode t/s (B × tg{gen}) | K/V held | K/V full length |"
    )?;
    writeln!(
        out,
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"
    )?;
    for (b, s) in &rows {
        let tg: Vec<f64> = s.iter().map(|x| x.decode_tps).collect();
        let pp: Vec<f64> = s.iter().map(|x| x.prefill_tps).collect();
        let (tg, tg_sd) = mean_std(&tg);
        let (pp, pp_sd) = mean_std(&pp);
        let last = s.last().expect("at least one repetition");
        let mib = |x: usize| x as f64 / (1024.0 * 1024.0);
        writeln!(
            out,
            "| {name} | {threads} | {} | {b} | {pp:.1} ± {pp_sd:.1} | {tg:.1} ± {tg_sd:.1} | {:.1} MiB | {:.1} MiB |",
            args.model.precision_name(),
            mib(last.kv_used),
            mib(last.kv_full_length),
        )?;
    }
    print_profiles(&mut out, &profiles)?;
    Ok(())
}
