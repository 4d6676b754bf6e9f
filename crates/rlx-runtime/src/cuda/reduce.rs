//! The host side of `reduce_part`/`reduce_draw`/`reduce_merge` (kernels.cu): requests written in the
//! kernel's layout, digests read back from it. Pure byte work, tested
//! without a GPU.

use crate::reduce::{RowDigest, RowReduce, TOP_MAX};

/// Bytes of one row's request (`RdReq`).
const REQ_BYTES: usize = 72;
/// Bytes of one logit change (`RdAdj`).
const ADJ_BYTES: usize = 16;
/// Bytes of one row's digest (`RD_OUT_BYTES`).
pub(super) const OUT_BYTES: usize = 8 + 5 * 4 + 4 + TOP_MAX * 8 + TOP_MAX * 4;
/// The kernel's "none" token.
const NONE: u32 = u32::MAX;
/// Bytes of one slice's partial results (`RdPart`).
pub(super) const PART_BYTES: usize = TOP_MAX * 8 + TOP_MAX * 4 + 8 + 8 + 4 * 4;
/// Most slices a row is cut into (`reduce_merge` sorts 32 × 64 entries).
pub(super) const MAX_SPLITS: usize = 32;
/// Tokens a warp takes a step, and warps a block (`RD_STEP`, `RD_WARPS`).
const STEP: usize = 256;
const WARPS: usize = 8;

/// Slices a row of `vocab` is cut into when `rows` rows reduce at once on
/// `sms` multiprocessors: about four blocks a multiprocessor, at least a
/// step per warp, at most [`MAX_SPLITS`].
pub(super) fn splits(rows: usize, vocab: usize, sms: usize) -> usize {
    let steps = vocab.div_ceil(STEP);
    (4 * sms)
        .div_ceil(rows.max(1))
        .min(steps / WARPS)
        .clamp(1, MAX_SPLITS)
}

/// The requests of `rows`, then every row's changes, then every row's
/// mask words: one upload. Returns the bytes and the offset of the changes
/// (the masks follow them, at the offset each request names in words from
/// the changes' start).
pub(super) fn encode(rows: &[RowReduce]) -> (Vec<u8>, usize) {
    let changes: usize = rows.iter().map(|r| r.adjust.len()).sum::<usize>().max(1);
    let words: usize = rows
        .iter()
        .map(|r| r.allowed.as_ref().map_or(0, Vec::len))
        .sum();
    let adj_at = rows.len() * REQ_BYTES;
    let mut b = Vec::with_capacity(adj_at + changes * ADJ_BYTES + words * 4);
    let mut start = 0u32;
    // Mask words counted from the changes' start, in u32s.
    let mut mask_at = (changes * ADJ_BYTES / 4) as u32;
    for r in rows {
        let (inv_temp, ln_min_p, u) = match r.draw {
            Some(d) => (1.0 / d.temperature, d.ln_min_p, d.u),
            None => (0.0, f64::NEG_INFINITY, 0.0),
        };
        for x in [
            r.penalties.repeat,
            r.penalties.frequency,
            r.penalties.presence,
            inv_temp,
            ln_min_p,
            u,
        ] {
            b.extend_from_slice(&x.to_le_bytes());
        }
        let len = r.adjust.len() as u32;
        let mask_len = r.allowed.as_ref().map_or(0, Vec::len) as u32;
        for x in [
            start,
            len,
            r.top as u32,
            u32::from(r.allowed.is_some()),
            mask_at,
            mask_len,
        ] {
            b.extend_from_slice(&x.to_le_bytes());
        }
        start += len;
        mask_at += mask_len;
    }
    for a in rows.iter().flat_map(|r| &r.adjust) {
        b.extend_from_slice(&a.bias.to_le_bytes());
        b.extend_from_slice(&a.token.to_le_bytes());
        b.extend_from_slice(&a.count.to_le_bytes());
    }
    // The kernel reads no change of a row without any, but the space is
    // there so that the masks start where the requests say.
    if rows.iter().all(|r| r.adjust.is_empty()) {
        b.extend_from_slice(&[0; ADJ_BYTES]);
    }
    for w in rows.iter().filter_map(|r| r.allowed.as_ref()).flatten() {
        b.extend_from_slice(&w.to_le_bytes());
    }
    (b, adj_at)
}

fn f64_at(b: &[u8], at: usize) -> f64 {
    f64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The digests of `rows` rows as the kernel wrote them.
pub(super) fn decode(b: &[u8], rows: usize) -> Vec<RowDigest> {
    (0..rows)
        .map(|r| {
            let o = &b[r * OUT_BYTES..(r + 1) * OUT_BYTES];
            let invalid = u32_at(o, 16);
            let listed = (u32_at(o, 24) as usize).min(TOP_MAX);
            let drawn = u32_at(o, 12);
            RowDigest {
                top: (0..listed)
                    .map(|k| (u32_at(o, 32 + TOP_MAX * 8 + 4 * k), f64_at(o, 32 + 8 * k)))
                    .collect(),
                live: u32_at(o, 8) as usize,
                sum_exp: f64_at(o, 0),
                drawn: (drawn != NONE).then_some(drawn),
                invalid: (invalid != NONE).then(|| (invalid, f32::from_bits(u32_at(o, 20)))),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reduce::{Adjust, Draw};

    #[test]
    fn rows_are_cut_to_fill_the_gpu() {
        // One Gemma row on an H200: 32 slices of 32 steps.
        assert_eq!(splits(1, 262_144, 132), 32);
        assert_eq!(splits(64, 262_144, 132), 9);
        assert_eq!(splits(512, 262_144, 132), 2);
        assert_eq!(splits(1024, 262_144, 132), 1);
        // A tiny vocabulary: one slice.
        assert_eq!(splits(1, 96, 132), 1);
        assert_eq!(splits(1, 5000, 132), 2);
    }

    #[test]
    fn requests_in_the_kernels_layout() {
        let rows = [
            RowReduce {
                adjust: vec![Adjust {
                    token: 7,
                    bias: -1.5,
                    count: 2,
                }],
                draw: Some(Draw {
                    temperature: 0.5,
                    ln_min_p: -3.0,
                    u: 0.25,
                }),
                ..RowReduce::top(40)
            },
            RowReduce {
                allowed: Some(vec![0xF0, 1]),
                ..RowReduce::top(1)
            },
        ];
        let (b, adj_at) = encode(&rows);
        assert_eq!((adj_at, b.len()), (144, 144 + 16 + 8));
        assert_eq!(f64_at(&b, 0), 1.0);
        assert_eq!(f64_at(&b, 24), 2.0);
        assert_eq!(f64_at(&b, 32), -3.0);
        assert_eq!(f64_at(&b, 40), 0.25);
        let req = |at: usize| [48, 52, 56, 60, 64, 68].map(|o| u32_at(&b, at + o));
        // Changes from 0, one; top 40; no mask (its words would start at 4).
        assert_eq!(req(0), [0, 1, 40, 0, 4, 0]);
        assert_eq!(f64_at(&b, 72 + 24), 0.0);
        // The second row's mask: two words, 4 u32s after the changes' start.
        assert_eq!(req(72), [1, 0, 1, 1, 4, 2]);
        assert_eq!(f64_at(&b, 144), -1.5);
        assert_eq!([u32_at(&b, 152), u32_at(&b, 156)], [7, 2]);
        assert_eq!([u32_at(&b, 160), u32_at(&b, 164)], [0xF0, 1]);
    }

    #[test]
    fn digests_from_the_kernels_layout() {
        let mut b = vec![0u8; 2 * OUT_BYTES];
        let mut put = |at: usize, x: &[u8]| b[at..at + x.len()].copy_from_slice(x);
        put(0, &2.5f64.to_le_bytes());
        for (at, x) in [(8, 9u32), (12, 3), (16, NONE), (20, 0), (24, 2)] {
            put(at, &x.to_le_bytes());
        }
        put(32, &1.0f64.to_le_bytes());
        put(40, &0.5f64.to_le_bytes());
        put(32 + 512, &3u32.to_le_bytes());
        put(32 + 516, &4u32.to_le_bytes());
        let o = OUT_BYTES;
        for (at, x) in [(8, 0u32), (12, NONE), (16, 5), (20, f32::NAN.to_bits())] {
            put(o + at, &x.to_le_bytes());
        }
        let d = decode(&b, 2);
        assert_eq!(d[0].top, vec![(3, 1.0), (4, 0.5)]);
        assert_eq!((d[0].live, d[0].sum_exp, d[0].drawn), (9, 2.5, Some(3)));
        assert_eq!(d[0].invalid, None);
        assert_eq!(d[1].drawn, None);
        assert!(matches!(d[1].invalid, Some((5, v)) if v.is_nan()));
    }
}
