//! `rlx score` and `rlx generate` on a tiny model: interfaces scripts rely
//! on, sampling flags that are honoured, and errors for bad input.

mod common;

use common::{json, ok, rlx, tiny};

const PROMPT: &str = "2,327,73,345,213";

fn generate(extra: &[&str]) -> Vec<u64> {
    let out = ok(rlx()
        .args(["generate", "-m"])
        .arg(tiny())
        .args([
            "--tokens",
            PROMPT,
            "-n",
            "12",
            "--json",
            "--ignore-eos",
            "-t",
            "1",
        ])
        .args(extra));
    let v = json(&out);
    v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[test]
fn score_writes_npy_logits_and_top_k_json() {
    let dir = std::env::temp_dir().join(format!("rlx-score-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let npy = dir.join("logits.npy");
    let out = ok(rlx()
        .args(["score", "-m"])
        .arg(tiny())
        .args(["--tokens", PROMPT, "--top", "3", "--json", "--out"])
        .arg(&npy));
    let v = json(&out);
    let top = v["top"].as_array().unwrap();
    assert_eq!(top.len(), 5);
    assert_eq!(top[0].as_array().unwrap().len(), 3);
    let bytes = std::fs::read(&npy).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + header_len]).unwrap();
    assert!(
        header.contains("'descr': '<f4'") && header.contains("'shape': (5, "),
        "{header}"
    );
    let vocab: usize = header
        .split("(5, ")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(bytes.len(), 10 + header_len + 5 * vocab * 4);
    // The best logit of position 0 in the file is the one --top printed.
    let logits: Vec<f32> = bytes[10 + header_len..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let best = (0..vocab)
        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
        .unwrap();
    assert_eq!(top[0][0]["token"].as_u64().unwrap() as usize, best);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn greedy_is_deterministic_and_sampling_flags_are_honoured() {
    let greedy = generate(&["--temp", "0"]);
    assert_eq!(greedy.len(), 12);
    assert_eq!(
        greedy,
        generate(&["--temp", "0", "--seed", "9"]),
        "greedy ignores the seed"
    );
    let hot = |seed: &str| generate(&["--temp", "5", "--seed", seed]);
    let a = hot("1");
    assert_eq!(a, hot("1"), "a seed reproduces its sample");
    assert_ne!(a, hot("2"), "different seeds differ");
    assert_ne!(a, greedy, "temperature changes the output");
    // Successive draws are not all the same token.
    let distinct: std::collections::HashSet<_> = a.iter().collect();
    assert!(distinct.len() > 3, "{a:?}");
    // top-k 1 is greedy whatever the temperature.
    assert_eq!(
        generate(&["--temp", "5", "--top-k", "1", "--seed", "3"]),
        greedy
    );
}

#[test]
fn bad_input_is_one_error_line_and_a_failing_exit() {
    let cases: [&[&str]; 4] = [
        &["--tokens", "2,abc"],
        &["--tokens", "2,999999"],
        &["--tokens", "2", "--top-p", "1.5"],
        &["--tokens", "2", "--device", "gpu"],
    ];
    for extra in cases {
        let out = rlx()
            .args(["generate", "-m"])
            .arg(tiny())
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{extra:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.starts_with("error: "), "{extra:?}: {err}");
    }
    let out = rlx()
        .args(["generate", "-m", "no-such-model", "--tokens", "2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("fetch-model"));
}

#[test]
fn bench_reports_llama_bench_style_json() {
    let out = ok(rlx()
        .args(["bench", "-m"])
        .arg(tiny())
        .args(["-p", "8", "-n", "4", "-r", "2", "-t", "1", "--json"]));
    let v = json(&out);
    let rows = v.as_array().unwrap();
    let tests: Vec<&str> = rows.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(tests, ["pp8", "tg4"]);
    for r in rows {
        assert!(r["tokens_per_second"].as_f64().unwrap() > 0.0);
        assert!(r["stddev"].as_f64().unwrap() >= 0.0);
        assert_eq!(r["threads"], 1);
        assert_eq!(r["samples"].as_array().unwrap().len(), 2);
        // The default is llama.cpp's arithmetic and cache type.
        assert_eq!(r["precision"], "q8");
        assert_eq!(r["kv_type"], "f16");
    }
    // Generation rows pair every repetition with a bandwidth probe.
    let tg = &rows[1];
    assert_eq!(tg["memory_bandwidth_samples"].as_array().unwrap().len(), 2);
    assert!(tg["roofline_fraction"].as_f64().unwrap() > 0.0);
    assert!(rows[0]["roofline_fraction"].is_null());
    let out = rlx()
        .args(["bench", "-m"])
        .arg(tiny())
        .args(["-p", "4", "-n", "0", "-r", "1", "-d", "6"])
        .output()
        .unwrap();
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("| pp4 @ d6 |"), "{table}");
}
