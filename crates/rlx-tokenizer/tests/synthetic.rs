//! Random small vocabularies against a literal, slow transcription of llama.cpp's algorithm:
//! special tokens cut out one after another (longest first, leftmost non-overlapping
//! matches), then repeated "merge the best adjacent pair" by full rescans. The fast
//! tokenizer (heap, word cuts at ▁, Aho-Corasick prefilter) must give the same ids.

use proptest::prelude::*;
use rlx_gguf::{GgufFile, GgufWriter};
use rlx_tokenizer::{EncodeOptions, Tokenizer};

const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const BYTE: i32 = 6;

struct Vocab {
    pieces: Vec<String>,
    scores: Vec<f32>,
    types: Vec<i32>,
    merges: Vec<(String, String)>,
}

fn base() -> Vocab {
    let mut v = Vocab {
        pieces: vec![],
        scores: vec![],
        types: vec![],
        merges: vec![],
    };
    for p in ["<pad>", "<eos>", "<bos>", "<unk>"] {
        v.pieces.push(p.into());
        v.scores.push(-1000.0);
        v.types.push(CONTROL);
    }
    for b in 0..256 {
        v.pieces.push(format!("<0x{b:02X}>"));
        v.scores.push(0.0);
        v.types.push(BYTE);
    }
    v
}

fn add(v: &mut Vocab, piece: &str, score: f32, ty: i32) {
    if !v.pieces.iter().any(|p| p == piece) {
        v.pieces.push(piece.into());
        v.scores.push(score);
        v.types.push(ty);
    }
}

fn build(v: &Vocab, model: &str) -> Tokenizer {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "gemma3").unwrap();
    w.add("tokenizer.ggml.model", model).unwrap();
    w.add("tokenizer.ggml.tokens", v.pieces.clone()).unwrap();
    w.add("tokenizer.ggml.scores", v.scores.clone()).unwrap();
    w.add("tokenizer.ggml.token_type", v.types.clone()).unwrap();
    w.add("tokenizer.ggml.bos_token_id", 2u32).unwrap();
    w.add("tokenizer.ggml.eos_token_id", 1u32).unwrap();
    w.add("tokenizer.ggml.add_space_prefix", false).unwrap();
    if model == "gemma4" {
        let merges: Vec<String> = v.merges.iter().map(|(l, r)| format!("{l} {r}")).collect();
        w.add("tokenizer.ggml.merges", merges).unwrap();
    }
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    Tokenizer::from_gguf(&file).unwrap()
}

enum Frag {
    Raw(Vec<u8>),
    Tok(u32),
}

/// llama.cpp's `tokenizer_st_partition`, literally.
fn partition(v: &Vocab, text: &[u8], parse_special: bool) -> Vec<Frag> {
    let mut specials: Vec<usize> = (0..v.pieces.len())
        .filter(|&i| v.types[i] == CONTROL || v.types[i] == USER_DEFINED)
        .collect();
    specials.sort_by_key(|&i| std::cmp::Reverse(v.pieces[i].len()));
    let mut frags = vec![Frag::Raw(text.to_vec())];
    for id in specials {
        if v.types[id] == CONTROL && !parse_special {
            continue;
        }
        let pat = v.pieces[id].as_bytes();
        let mut next = Vec::new();
        for f in frags {
            let Frag::Raw(raw) = f else {
                next.push(f);
                continue;
            };
            let mut start = 0;
            while let Some(m) = find(&raw[start..], pat) {
                if m > 0 {
                    next.push(Frag::Raw(raw[start..start + m].to_vec()));
                }
                next.push(Frag::Tok(id as u32));
                start += m + pat.len();
            }
            if start < raw.len() {
                next.push(Frag::Raw(raw[start..].to_vec()));
            }
        }
        frags = next;
    }
    frags
}

fn find(hay: &[u8], pat: &[u8]) -> Option<usize> {
    (0..=hay.len().checked_sub(pat.len())?).find(|&i| &hay[i..i + pat.len()] == pat)
}

fn chars(text: &[u8]) -> Vec<Vec<u8>> {
    let lens = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let n = (lens[(text[i] >> 4) as usize] as usize).min(text.len() - i);
        out.push(text[i..i + n].to_vec());
        i += n;
    }
    out
}

fn id_of(v: &Vocab, s: &[u8]) -> Option<u32> {
    v.pieces
        .iter()
        .rposition(|p| p.as_bytes() == s)
        .map(|i| i as u32)
}

/// Merge the best pair by rescanning, until nothing merges. `best` maps a pair to a
/// priority, higher first; ties go to the leftmost pair.
fn naive_merge(mut syms: Vec<Vec<u8>>, best: impl Fn(&[u8], &[u8]) -> Option<i64>) -> Vec<Vec<u8>> {
    loop {
        let mut pick: Option<(i64, usize)> = None;
        for i in 0..syms.len().saturating_sub(1) {
            if let Some(p) = best(&syms[i], &syms[i + 1]) {
                if pick.is_none_or(|(bp, _)| p > bp) {
                    pick = Some((p, i));
                }
            }
        }
        let Some((_, i)) = pick else { return syms };
        let right = syms.remove(i + 1);
        syms[i].extend(right);
    }
}

fn escape(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for &b in raw {
        if b == b' ' {
            out.extend_from_slice("\u{2581}".as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}

fn emit(v: &Vocab, syms: Vec<Vec<u8>>, out: &mut Vec<u32>) {
    for s in syms {
        match id_of(v, &s) {
            Some(id) => out.push(id),
            None => out.extend(
                s.iter()
                    .map(|&b| id_of(v, format!("<0x{b:02X}>").as_bytes()).unwrap()),
            ),
        }
    }
}

fn naive_spm(v: &Vocab, text: &[u8], parse_special: bool) -> Vec<u32> {
    let mut out = vec![2];
    for f in partition(v, text, parse_special) {
        match f {
            Frag::Tok(id) => out.push(id),
            Frag::Raw(raw) => {
                let syms = naive_merge(chars(&escape(&raw)), |l, r| {
                    let id = id_of(v, &[l, r].concat())?;
                    // Scores are small integers here, so this keeps their order.
                    Some((v.scores[id as usize] * 1000.0) as i64)
                });
                emit(v, syms, &mut out);
            }
        }
    }
    out
}

fn naive_bpe(v: &Vocab, text: &[u8], parse_special: bool) -> Vec<u32> {
    let mut out = vec![2];
    for f in partition(v, text, parse_special) {
        match f {
            Frag::Tok(id) => out.push(id),
            Frag::Raw(raw) => {
                let esc = escape(&raw);
                let mut i = 0;
                while i < esc.len() {
                    let nl = esc[i] == b'\n';
                    let mut j = i;
                    while j < esc.len() && (esc[j] == b'\n') == nl {
                        j += 1;
                    }
                    let chunk = &esc[i..j];
                    i = j;
                    if nl {
                        if let Some(id) = id_of(v, chunk) {
                            out.push(id);
                            continue;
                        }
                    }
                    let syms = naive_merge(chars(chunk), |l, r| {
                        let rank = v
                            .merges
                            .iter()
                            .position(|(a, b)| a.as_bytes() == l && b.as_bytes() == r)?;
                        Some(-(rank as i64))
                    });
                    emit(v, syms, &mut out);
                }
            }
        }
    }
    out
}

const ALPHABET: &[&str] = &["a", "b", "c", " ", "\n", "é", "▁", "<", ">"];

fn text_strategy() -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(ALPHABET), 0..40).prop_map(|v| v.concat())
}

fn piece_strategy() -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(ALPHABET), 2..5)
        .prop_map(|v| v.concat().replace(' ', "▁"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, .. ProptestConfig::default() })]

    #[test]
    fn spm_matches_the_literal_algorithm(
        pieces in proptest::collection::vec((piece_strategy(), -20i32..0), 0..40),
        specials in proptest::collection::vec((piece_strategy(), any::<bool>()), 0..6),
        texts in proptest::collection::vec(text_strategy(), 1..8),
    ) {
        let mut v = base();
        for c in ["a", "b", "c", "▁", "é", "<", ">"] {
            add(&mut v, c, -25.0, NORMAL);
        }
        for (p, s) in &pieces {
            add(&mut v, p, *s as f32, NORMAL);
        }
        for (p, control) in &specials {
            // User-defined pieces keep real spaces, as the converter writes them.
            add(&mut v, &p.replace('▁', " "), -1000.0, if *control { CONTROL } else { USER_DEFINED });
        }
        let tok = build(&v, "llama");
        for t in &texts {
            for parse_special in [false, true] {
                let got = tok.encode(t, EncodeOptions { add_bos: true, parse_special });
                prop_assert_eq!(got, naive_spm(&v, t.as_bytes(), parse_special), "text {:?}", t);
            }
        }
    }

    #[test]
    fn bpe_matches_the_literal_algorithm(
        merges in proptest::collection::vec((0usize..64, 0usize..64), 0..50),
        specials in proptest::collection::vec((piece_strategy(), any::<bool>()), 0..4),
        texts in proptest::collection::vec(text_strategy(), 1..8),
    ) {
        let mut v = base();
        let mut symbols: Vec<String> = ["a", "b", "c", "▁", "é", "<", ">", "\n", "\n\n"].iter().map(|s| s.to_string()).collect();
        for s in symbols.clone() {
            add(&mut v, &s, 0.0, NORMAL);
        }
        // Merges over symbols made so far, so that later merges build on earlier ones.
        for (a, b) in merges {
            let (l, r) = (symbols[a % symbols.len()].clone(), symbols[b % symbols.len()].clone());
            if l.contains('\n') || r.contains('\n') {
                continue;
            }
            let m = format!("{l}{r}");
            add(&mut v, &m, 0.0, NORMAL);
            v.merges.push((l, r));
            symbols.push(m);
        }
        for (p, control) in &specials {
            add(&mut v, &p.replace('▁', " "), -1000.0, if *control { CONTROL } else { USER_DEFINED });
        }
        let tok = build(&v, "gemma4");
        for t in &texts {
            for parse_special in [false, true] {
                let got = tok.encode(t, EncodeOptions { add_bos: true, parse_special });
                prop_assert_eq!(got, naive_bpe(&v, t.as_bytes(), parse_special), "text {:?}", t);
            }
        }
    }
}
