//! `rlx run`, `tokenize`, `detokenize` and `perplexity` on the tiny and the
//! real models.

mod common;

use common::{json, ok, real_model, rlx, tiny, with_stdin};

#[test]
fn run_streams_text_and_reports_json() {
    let out = ok(rlx().args(["run", "-m"]).arg(real_model()).args([
        "The capital of France is",
        "-n",
        "8",
        "--temp",
        "0",
        "--json",
        "-t",
        "2",
    ]));
    let v = json(&out);
    assert_eq!(v["tokens"].as_array().unwrap().len(), 8);
    assert!(v["text"].as_str().unwrap().starts_with(" the"), "{v}");
    assert_eq!(v["prompt_tokens"], 6);
    let summary = String::from_utf8(out.stderr).unwrap();
    assert!(
        summary.contains("prompt 6 tokens, generated 8 tokens"),
        "{summary}"
    );
}

#[test]
fn tokenize_and_detokenize_round_trip() {
    let out = rlx()
        .args(["tokenize", "-m"])
        .arg(real_model())
        .args(["--text", "The capital of France is", "--ids"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let ids = String::from_utf8(out.stdout).unwrap();
    assert_eq!(ids.trim(), "2,818,5279,529,7001,563");
    let out = rlx()
        .args(["detokenize", "-m"])
        .arg(real_model())
        .args(["--tokens", ids.trim()])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim_end(),
        "The capital of France is"
    );
    // --jsonl: one array per line, the model loaded once.
    let out = with_stdin(
        rlx()
            .args(["tokenize", "-m"])
            .arg(real_model())
            .arg("--jsonl"),
        b"\"Hello world\"\n\"\"\n",
    );
    let lines: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(lines, ["[2,9259,1902]", "[2]"]);
}

#[test]
fn perplexity_prints_llama_style_final_estimate() {
    let dir = std::env::temp_dir().join(format!("rlx-ppl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("t.txt");
    std::fs::write(
        &text,
        "the quick brown fox jumps over the lazy dog. ".repeat(20),
    )
    .unwrap();
    let out = ok(rlx()
        .args(["perplexity", "-m"])
        .arg(tiny())
        .arg("-f")
        .arg(&text)
        .args(["-c", "16", "-t", "1"]));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.starts_with("Final estimate: PPL = "), "{stdout}");
    let progress = String::from_utf8(out.stderr).unwrap();
    assert!(progress.starts_with("[1]"), "{progress}");
    // Too short a text is an error that says how many tokens are needed.
    std::fs::write(&text, "short").unwrap();
    let out = rlx()
        .args(["perplexity", "-m"])
        .arg(tiny())
        .arg("-f")
        .arg(&text)
        .args(["-c", "16"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 32"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn run_holds_its_output_to_a_schema_or_an_expression() {
    let schema = r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"], "additionalProperties": false}"#;
    for seed in ["1", "2", "3"] {
        let out = ok(rlx()
            .args(["run", "-m"])
            .arg(real_model())
            .args([
                "A person:",
                "-n",
                "60",
                "--temp",
                "1",
                "--seed",
                seed,
                "--json",
                "-t",
                "2",
            ])
            .args(["--json-schema", schema]));
        let v = json(&out);
        assert_eq!(v["stop"], "complete", "{v}");
        let person: serde_json::Value = serde_json::from_str(v["text"].as_str().unwrap()).unwrap();
        assert!(
            person["name"].is_string() && person["age"].is_u64(),
            "{person}"
        );
        assert_eq!(person.as_object().unwrap().len(), 2, "{person}");
    }
    let out = ok(rlx()
        .args(["run", "-m"])
        .arg(real_model())
        .args(["Call me at", "-n", "20", "--temp", "1", "--json", "-t", "2"])
        .args(["--regex", "[0-9]{3}-[0-9]{4}"]));
    let text = json(&out)["text"].as_str().unwrap().to_owned();
    assert!(
        text.len() == 8
            && text.as_bytes()[3] == b'-'
            && text.replace('-', "").bytes().all(|b| b.is_ascii_digit()),
        "{text:?}"
    );
    // A bad expression is a clear error, not a crash.
    let out = rlx()
        .args(["run", "-m"])
        .arg(real_model())
        .args(["x", "-n", "4", "--regex", "(unclosed"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("regular expression"), "{err}");
}

#[test]
fn a_constrained_output_is_closed_within_n_or_reported_cut() {
    // An unbounded list the 270M model goes on with: closed to fit -n.
    let schema = r#"{"type": "object", "properties": {"nums": {"type": "array",
        "items": {"type": "integer"}}, "name": {"type": "string"}}, "required": ["nums", "name"]}"#;
    let mut closed = 0;
    for seed in ["1", "2", "3", "4"] {
        let out = ok(rlx()
            .args(["run", "-m"])
            .arg(real_model())
            .args([
                "--raw",
                "Reply with JSON only.\n",
                "-n",
                "24",
                "--temp",
                "1",
            ])
            .args(["--seed", seed, "--json", "-t", "2", "--json-schema", schema]));
        let v = json(&out);
        assert_eq!(v["complete"], true, "{v}");
        let text = v["text"].as_str().unwrap();
        let value: serde_json::Value = serde_json::from_str(text).unwrap();
        assert!(value["nums"].is_array() && value["name"].is_string(), "{v}");
        if v["stop"] == "closed" {
            closed += 1;
            assert_eq!(v["finish_reason"], "length", "{v}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("closed early"), "{err}");
        }
    }
    assert!(closed > 0, "no output needed closing");
    // A pattern no ending of which fits in the tokens left: cut, said so.
    let schema = r#"{"type": "string", "pattern": "^[a-z]{100}$"}"#;
    for args in [&["--json"][..], &[]] {
        let out = rlx()
            .args(["run", "-m"])
            .arg(real_model())
            .args(["--raw", "A word:", "-n", "10", "--temp", "1", "-t", "2"])
            .args(["--json-schema", schema])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("output incomplete: stopped by -n after 10 tokens"),
            "{err}"
        );
        if args.is_empty() {
            // The partial output is still printed.
            assert!(String::from_utf8_lossy(&out.stdout).starts_with('"'));
        } else {
            let v = json(&out);
            assert_eq!(
                (&v["complete"], &v["finish_reason"]),
                (&false.into(), &"length".into()),
                "{v}"
            );
        }
    }
}

#[test]
fn cache_types_are_taken_as_llama_cpp_spells_them() {
    // `-ctk`/`-ctv` as llama.cpp's users type them, keys and values apart;
    // `rlx bench --json` reports what ran.
    let out = ok(rlx().args(["bench", "-m"]).arg(tiny()).args([
        "-p", "16", "-n", "4", "-r", "1", "-t", "1", "-ctk", "q8_0", "-ctv", "q4_0", "--json",
    ]));
    let v = json(&out);
    assert_eq!(v[0]["kv_type"], "K q8_0 / V q4_0", "{v}");
    // A block type needs heads of whole 32-element blocks: Gemma 2's are 16.
    let gemma2 = tiny().parent().unwrap().join("../gemma2/model-f32.gguf");
    let out = rlx()
        .args(["run", "-m"])
        .arg(gemma2)
        .args(["hello", "-n", "2", "--kv-type", "q4_0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("q4_0") && err.contains("16 elements"), "{err}");
}

#[test]
fn gpu_layer_flags_are_taken_as_llama_cpp_spells_them() {
    // `-ngl` is `--gpu-layers`; without a GPU the flags are refused by
    // name rather than ignored.
    for flags in [
        &["-ngl", "2"][..],
        &["--gpu-layers", "2"],
        &["--cpu-moe"],
        &["--n-cpu-moe", "1"],
    ] {
        let out = rlx()
            .args(["run", "-m"])
            .arg(tiny())
            .args(["hello", "-n", "2"])
            .args(flags)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flags:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--gpu-layers") && err.contains("--device cuda"),
            "{flags:?}: {err}"
        );
    }
    let out = rlx()
        .args(["run", "-m"])
        .arg(tiny())
        .args(["hello", "-n", "2", "--device", "cuda", "-ngl", "many"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--gpu-layers \"many\""), "{err}");
}

#[test]
fn run_with_prompt_lookup_gives_the_same_tokens() {
    let prompt = "Colors: red, green, blue, red, green, blue, red, green, blue, red,";
    let run = |spec: &[&str]| {
        let out = ok(rlx()
            .args(["run", "-m"])
            .arg(real_model())
            .args([prompt, "-n", "32", "--temp", "0", "--json", "-t", "2"])
            .args(spec));
        let v = json(&out);
        (v["tokens"].clone(), v["speculation"].clone())
    };
    let (plain, none) = run(&[]);
    let (spec, counts) = run(&["--spec", "ngram", "--draft-max", "4"]);
    assert_eq!(plain, spec);
    assert_eq!(none["drafted"], 0, "{none}");
    let (drafted, kept) = (
        counts["drafted"].as_u64().unwrap(),
        counts["accepted"].as_u64().unwrap(),
    );
    assert!(kept > 0 && kept <= drafted, "{counts}");
    // A draft of no tokens is refused by name.
    let out = rlx()
        .args(["run", "-m"])
        .arg(real_model())
        .args([prompt, "--spec", "ngram", "--draft-min", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("--draft-min 0"), "{err}");
    // Long drafts need the one-row kernels at every row count.
    let long = ["--spec", "ngram", "--draft-max", "12"];
    let out = rlx()
        .args(["run", "-m"])
        .arg(real_model())
        .args([prompt, "-n", "4"])
        .args(long)
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        !out.status.success() && err.contains("--batch-invariant"),
        "{err}"
    );
    let (long_spec, _) = run(&["--spec", "ngram", "--draft-max", "12", "--batch-invariant"]);
    assert_eq!(plain, long_spec);
}

/// A draft model gives the same tokens: the 270M file drafting for
/// itself (every draft kept but where a verification step's rows round
/// otherwise); a model of another vocabulary, or two ways of drafting at
/// once, are refused by name.
#[test]
fn run_with_a_draft_model_gives_the_same_tokens() {
    let prompt = "Write a short story about a lighthouse keeper.";
    let run = |extra: &[&str]| {
        let mut cmd = rlx();
        cmd.args(["run", "-m"])
            .arg(real_model())
            .args([prompt, "-n", "24", "--temp", "0", "--json", "-t", "2"])
            .args(extra);
        json(&ok(&mut cmd))
    };
    let plain = run(&[]);
    let model = real_model();
    let model = model.to_str().unwrap();
    let drafted = run(&["--draft-model", model, "--draft-max", "4"]);
    assert_eq!(plain["tokens"], drafted["tokens"]);
    let counts = &drafted["speculation"];
    let (d, kept) = (
        counts["drafted"].as_u64().unwrap(),
        counts["accepted"].as_u64().unwrap(),
    );
    assert!(d > 0 && kept * 10 >= d * 9, "{counts}");
    let refused = |extra: &[&str], want: &str| {
        let out = rlx()
            .args(["run", "-m"])
            .arg(real_model())
            .args([prompt, "-n", "4"])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(!out.status.success() && err.contains(want), "{err}");
    };
    let other = tiny();
    refused(&["--draft-model", other.to_str().unwrap()], "vocabulary");
    refused(&["--draft-model", model, "--spec", "ngram"], "give one");
}

#[test]
fn bench_times_speculation_beside_plain_generation() {
    let out = ok(rlx().args(["bench", "-m"]).arg(real_model()).args([
        "-p", "0", "-n", "24", "-r", "1", "-t", "2", "--spec", "ngram", "--json",
    ]));
    let v = json(&out);
    let tests: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["test"].as_str().unwrap())
        .collect();
    assert_eq!(tests, ["tg24", "tg24 greedy", "tg24 ngram"], "{v}");
    assert!(v[1]["speculation"].is_null(), "{v}");
    let spec = &v[2]["speculation"];
    let (drafted, kept) = (
        spec["drafted"].as_u64().unwrap(),
        spec["kept"].as_u64().unwrap(),
    );
    // The prompt repeats a phrase: lookup finds drafts from the start.
    assert!(drafted > 0 && kept <= drafted, "{spec}");
    assert!(v[2]["tokens_per_second"].as_f64().unwrap() > 0.0, "{v}");
    // A draft model's rows: the tiny model drafting for itself keeps
    // what it drafts.
    let out = ok(rlx()
        .args(["bench", "-m"])
        .arg(tiny())
        .args(["-p", "0", "-n", "16", "-r", "1", "-t", "2", "--json"])
        .arg("--draft-model")
        .arg(tiny()));
    let v = json(&out);
    assert_eq!(v[2]["test"], "tg16 draft", "{v}");
    let spec = &v[2]["speculation"];
    let (drafted, kept) = (
        spec["drafted"].as_u64().unwrap(),
        spec["kept"].as_u64().unwrap(),
    );
    assert!(drafted > 0 && kept == drafted, "{spec}");
}
