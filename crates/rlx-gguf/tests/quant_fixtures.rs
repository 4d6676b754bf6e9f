//! Bit-exact checks of the reference (de)quantizers against llama.cpp.
//!
//! The fixtures in tests/fixtures/quants were produced by libggml itself (see
//! the README there and scripts/make_quant_fixtures.py). Dequantized values are
//! compared by their bits and quantized blocks byte for byte, because the
//! scalar code is meant to be identical to ggml's, not just close. Every
//! fixture file found must be covered by a test here, so none goes unchecked.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use rlx_gguf::{dequantize, quantize, GgmlType, GgufFile};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/quants")
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Dequantizes `<dir>/<T>.blocks` and compares it with `<dir>/<T>.f32`.
fn check_dequant(ty: GgmlType, dir: &str) -> Result<(), String> {
    let label = format!("{dir}/{ty}");
    let base = fixture_dir().join(dir);
    let blocks = read(&base.join(format!("{ty}.blocks")))?;
    let want_bytes = read(&base.join(format!("{ty}.f32")))?;
    if want_bytes.len() % 4 != 0 {
        return Err(format!("{label}.f32: not a whole number of f32s"));
    }
    let want = f32s(&want_bytes);
    if ty.bytes_for(want.len() as u64) != Some(blocks.len() as u64) {
        return Err(format!(
            "{label}: {} bytes of blocks do not hold {} elements",
            blocks.len(),
            want.len()
        ));
    }
    let mut got = vec![f32::NAN; want.len()];
    dequantize(ty, &blocks, &mut got).map_err(|e| format!("{label}: {e}"))?;
    let bad: Vec<usize> = (0..want.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    match bad.first() {
        None => Ok(()),
        Some(&i) => Err(format!(
            "{label}: {} of {} values differ; first at index {i} (block {}, element {}): \
             got {:?} ({:#010x}), want {:?} ({:#010x})",
            bad.len(),
            want.len(),
            i / ty.block_elems(),
            i % ty.block_elems(),
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits(),
        )),
    }
}

/// Quantizes `quantize/<T>.input.f32` and compares it with `quantize/<T>.ref`.
fn check_quant(ty: GgmlType) -> Result<(), String> {
    let label = format!("quantize/{ty}");
    let base = fixture_dir().join("quantize");
    let input_bytes = read(&base.join(format!("{ty}.input.f32")))?;
    let want = read(&base.join(format!("{ty}.ref")))?;
    let input = f32s(&input_bytes);
    if input_bytes.len() % 4 != 0 || ty.bytes_for(input.len() as u64) != Some(want.len() as u64) {
        return Err(format!(
            "{label}: {} input bytes do not match {} reference bytes",
            input_bytes.len(),
            want.len()
        ));
    }
    let mut got = vec![0u8; want.len()];
    quantize(ty, &input, &mut got).map_err(|e| format!("{label}: {e}"))?;
    let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) else {
        return Ok(());
    };
    let bb = ty.block_bytes();
    let blk = i / bb;
    let bad_blocks = got
        .chunks_exact(bb)
        .zip(want.chunks_exact(bb))
        .filter(|(g, w)| g != w)
        .count();
    let block = |b: &[u8]| hex(&b[blk * bb..(blk + 1) * bb]);
    Err(format!(
        "{label}: {bad_blocks} of {} blocks differ; first at byte {i} (block {blk}, offset {}, \
         input elements {}..{}): got {:#04x}, want {:#04x}\n  got  {}\n  want {}",
        want.len() / bb,
        i % bb,
        blk * ty.block_elems(),
        (blk + 1) * ty.block_elems(),
        got[i],
        want[i],
        block(&got),
        block(&want),
    ))
}

fn run_all(checks: impl IntoIterator<Item = Result<(), String>>) {
    let errors: Vec<String> = checks.into_iter().filter_map(Result::err).collect();
    assert!(errors.is_empty(), "\n{}", errors.join("\n"));
}

macro_rules! dequant_tests {
    ($($name:ident: $ty:ident in [$($dir:literal),+];)*) => {
        $(
            #[test]
            fn $name() {
                run_all([$(check_dequant(GgmlType::$ty, $dir)),+]);
            }
        )*
        /// Which fixture folders the tests above read, per type.
        const DEQUANT_COVERED: &[(GgmlType, &[&str])] = &[$((GgmlType::$ty, &[$($dir),+])),*];
    };
}

macro_rules! quant_tests {
    ($($name:ident: $ty:ident;)*) => {
        $(
            #[test]
            fn $name() {
                run_all([check_quant(GgmlType::$ty)]);
            }
        )*
        const QUANT_COVERED: &[GgmlType] = &[$(GgmlType::$ty),*];
    };
}

dequant_tests! {
    dequant_f32: F32 in ["real"];
    dequant_f16: F16 in ["random"];
    dequant_bf16: BF16 in ["random"];
    dequant_q4_0: Q4_0 in ["random"];
    dequant_q4_1: Q4_1 in ["random"];
    dequant_q5_0: Q5_0 in ["random", "real"];
    dequant_q5_1: Q5_1 in ["random"];
    dequant_q8_0: Q8_0 in ["random", "real"];
    dequant_q8_1: Q8_1 in ["random"];
    dequant_q2_k: Q2_K in ["random"];
    dequant_q3_k: Q3_K in ["random"];
    dequant_q4_k: Q4_K in ["random", "real"];
    dequant_q5_k: Q5_K in ["random"];
    dequant_q6_k: Q6_K in ["random", "real"];
    dequant_q8_k: Q8_K in ["random"];
    dequant_iq4_nl: IQ4_NL in ["random"];
    dequant_iq4_xs: IQ4_XS in ["random"];
    dequant_iq2_xxs: IQ2_XXS in ["random"];
    dequant_iq2_xs: IQ2_XS in ["random"];
    dequant_iq2_s: IQ2_S in ["random"];
    dequant_iq3_xxs: IQ3_XXS in ["random"];
    dequant_iq3_s: IQ3_S in ["random"];
    dequant_iq1_s: IQ1_S in ["random"];
    dequant_iq1_m: IQ1_M in ["random"];
    dequant_tq1_0: TQ1_0 in ["random"];
    dequant_tq2_0: TQ2_0 in ["random"];
    dequant_mxfp4: MXFP4 in ["random"];
    dequant_nvfp4: NVFP4 in ["random"];
    dequant_q1_0: Q1_0 in ["random"];
    dequant_q2_0: Q2_0 in ["random"];
}

quant_tests! {
    quant_q8_0: Q8_0;
    quant_q8_1: Q8_1;
    quant_q4_0: Q4_0;
    quant_q4_1: Q4_1;
    quant_q5_0: Q5_0;
    quant_q5_1: Q5_1;
    quant_q8_k: Q8_K;
    quant_q2_k: Q2_K;
    quant_q3_k: Q3_K;
    quant_q4_k: Q4_K;
    quant_q5_k: Q5_K;
    quant_q6_k: Q6_K;
}

fn file_names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

/// Splits `Q4_K.input.f32` into its type and the rest (`input.f32`).
fn split_name(file: &str) -> Option<(GgmlType, &str)> {
    let (ty, ext) = file.split_once('.')?;
    Some((GgmlType::from_name(ty)?, ext))
}

#[test]
fn every_fixture_file_is_checked() {
    let root = fixture_dir();
    let mut problems = Vec::new();
    let top = file_names(&root);
    let expected_top: BTreeSet<String> = ["README.md", "quantize", "random", "real"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if top != expected_top {
        problems.push(format!(
            "top level holds {top:?}, expected {expected_top:?}"
        ));
    }
    for dir in ["random", "real"] {
        for file in file_names(&root.join(dir)) {
            if dir == "real" && file == "manifest.json" {
                continue;
            }
            let covered = split_name(&file).filter(|(_, ext)| *ext == "blocks" || *ext == "f32");
            let covered = covered.is_some_and(|(ty, _)| {
                DEQUANT_COVERED
                    .iter()
                    .any(|(t, dirs)| *t == ty && dirs.contains(&dir))
            });
            if !covered {
                problems.push(format!("{dir}/{file} is not read by any test"));
            }
        }
    }
    for file in file_names(&root.join("quantize")) {
        let covered = split_name(&file)
            .filter(|(_, ext)| *ext == "input.f32" || *ext == "ref")
            .is_some_and(|(ty, _)| QUANT_COVERED.contains(&ty));
        if !covered {
            problems.push(format!("quantize/{file} is not read by any test"));
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// The few JSON shapes manifest.json uses; enough to read it with std only.
#[derive(Debug)]
enum Json {
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn parse(text: &str) -> Json {
        let mut p = JsonParser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value();
        p.ws();
        assert_eq!(p.i, p.s.len(), "manifest.json: trailing data");
        v
    }

    fn get(&self, key: &str) -> &Json {
        match self {
            Json::Obj(kv) => kv
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v)
                .unwrap_or_else(|| panic!("manifest.json: no key {key:?}")),
            _ => panic!("manifest.json: {key:?} looked up in a non-object"),
        }
    }

    fn str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            v => panic!("manifest.json: expected a string, got {v:?}"),
        }
    }

    fn u64(&self) -> u64 {
        match self {
            Json::Num(n) if n.fract() == 0.0 && *n >= 0.0 => *n as u64,
            v => panic!("manifest.json: expected an unsigned integer, got {v:?}"),
        }
    }

    fn arr(&self) -> &[Json] {
        match self {
            Json::Arr(a) => a,
            v => panic!("manifest.json: expected an array, got {v:?}"),
        }
    }
}

struct JsonParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl JsonParser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        let hit = self.s.get(self.i) == Some(&c);
        self.i += usize::from(hit);
        hit
    }

    fn value(&mut self) -> Json {
        self.ws();
        match self.s.get(self.i) {
            Some(b'{') => {
                self.i += 1;
                let mut kv = Vec::new();
                if !self.eat(b'}') {
                    loop {
                        self.ws();
                        let Json::Str(k) = self.value() else {
                            panic!("manifest.json: object key is not a string at {}", self.i)
                        };
                        assert!(self.eat(b':'), "manifest.json: expected ':' at {}", self.i);
                        kv.push((k, self.value()));
                        if self.eat(b'}') {
                            break;
                        }
                        assert!(self.eat(b','), "manifest.json: expected ',' at {}", self.i);
                    }
                }
                Json::Obj(kv)
            }
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                if !self.eat(b']') {
                    loop {
                        items.push(self.value());
                        if self.eat(b']') {
                            break;
                        }
                        assert!(self.eat(b','), "manifest.json: expected ',' at {}", self.i);
                    }
                }
                Json::Arr(items)
            }
            Some(b'"') => {
                // Names in the manifest are plain ASCII, so escapes are refused.
                let start = self.i + 1;
                let len = self.s[start..]
                    .iter()
                    .position(|&c| c == b'"')
                    .expect("manifest.json: unterminated string");
                let s = std::str::from_utf8(&self.s[start..start + len]).unwrap();
                assert!(
                    !s.contains('\\'),
                    "manifest.json: escapes are not supported"
                );
                self.i = start + len + 1;
                Json::Str(s.to_owned())
            }
            _ => {
                let start = self.i;
                while self.i < self.s.len() && b"+-.0123456789eE".contains(&self.s[self.i]) {
                    self.i += 1;
                }
                let t = std::str::from_utf8(&self.s[start..self.i]).unwrap();
                Json::Num(
                    t.parse()
                        .unwrap_or_else(|_| panic!("manifest.json: bad value at {start}")),
                )
            }
        }
    }
}

fn model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("RLX_TEST_MODEL") {
        return p.into();
    }
    // Same cache as scripts/fetch-model.sh.
    let dir = match std::env::var_os("RLX_HOME") {
        Some(d) => PathBuf::from(d),
        None => Path::new(&std::env::var_os("HOME").unwrap_or_default()).join(".cache/rlx/models"),
    };
    dir.join("gemma-3-270m-q4_k_m.gguf")
}

/// The manifest must describe the real/ files exactly; when the model is on
/// disk, the fixture rows must also be its bytes (the fixture could otherwise
/// drift from the file rlx actually loads).
#[test]
fn real_fixtures_match_manifest_and_model() {
    let real = fixture_dir().join("real");
    let manifest =
        Json::parse(&String::from_utf8(read(&real.join("manifest.json")).unwrap()).unwrap());
    let entries = manifest.get("entries").arr();
    let listed: BTreeSet<String> = entries
        .iter()
        .flat_map(|e| {
            let t = e.get("type").str();
            [format!("{t}.blocks"), format!("{t}.f32")]
        })
        .collect();
    let mut on_disk = file_names(&real);
    on_disk.remove("manifest.json");
    assert_eq!(
        listed, on_disk,
        "real/manifest.json does not list exactly the real/ files"
    );

    let mut blocks = Vec::new();
    for e in entries {
        let name = e.get("type").str();
        let ty = GgmlType::from_name(name).unwrap_or_else(|| panic!("unknown type {name}"));
        let rows: Vec<u64> = e.get("rows").arr().iter().map(Json::u64).collect();
        let row_elems = e.get("row_elems").u64();
        let row_bytes = e.get("row_bytes").u64();
        assert_eq!(ty.bytes_for(row_elems), Some(row_bytes), "{name}: row size");
        let b = read(&real.join(format!("{name}.blocks"))).unwrap();
        let f = read(&real.join(format!("{name}.f32"))).unwrap();
        assert_eq!(
            b.len() as u64,
            rows.len() as u64 * row_bytes,
            "real/{name}.blocks size"
        );
        assert_eq!(
            f.len() as u64,
            rows.len() as u64 * row_elems * 4,
            "real/{name}.f32 size"
        );
        blocks.push((ty, e.get("tensor").str().to_owned(), rows, b));
    }

    let path = model_path();
    if !path.exists() {
        eprintln!(
            "{} not found; skipped comparing real/ with the model",
            path.display()
        );
        return;
    }
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for (ty, tensor, rows, b) in blocks {
        let info = file
            .tensor(&tensor)
            .unwrap_or_else(|| panic!("{tensor}: not in {}", path.display()));
        assert_eq!(info.ty, ty, "{tensor}: type");
        let data = file.tensor_data(info);
        let rb = info.row_bytes() as usize;
        for (k, &r) in rows.iter().enumerate() {
            let r = r as usize;
            assert!((r + 1) * rb <= data.len(), "{tensor}: no row {r}");
            assert!(
                data[r * rb..(r + 1) * rb] == b[k * rb..(k + 1) * rb],
                "real/{ty}.blocks: row {r} of {tensor} differs from the model"
            );
        }
    }
}
