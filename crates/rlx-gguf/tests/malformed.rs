//! Hand-made malformed and hostile GGUF files: each is rejected with the
//! right error kind, and none makes the reader panic or over-allocate.

use rlx_gguf::{ErrorKind, GgmlType, GgufFile, GgufWriter};

/// Raw little-endian byte builder for files the writer refuses to make.
#[derive(Default, Clone)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut r = Raw::default();
        r.0.extend_from_slice(b"GGUF");
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A `u32` key/value pair.
    fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.str(key).u32(4).u32(v)
    }
    /// A tensor record.
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    fn pad(&mut self, align: usize) -> &mut Self {
        while !self.0.len().is_multiple_of(align) {
            self.0.push(0);
        }
        self
    }
    fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
}

fn kind(bytes: Vec<u8>) -> ErrorKind {
    match GgufFile::from_bytes(bytes) {
        Ok(_) => panic!("malformed file was accepted"),
        Err(e) => {
            // Every error renders to a message.
            assert!(!e.to_string().is_empty());
            e.kind
        }
    }
}

fn valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "gemma3").unwrap();
    w.add("tokenizer.ggml.tokens", vec!["a".to_string(), "bb".into()])
        .unwrap();
    w.add("x.f32s", vec![1.0f32, 2.0]).unwrap();
    w.add_tensor("w.q4", GgmlType::Q4_0, &[64, 2], vec![3; 72])
        .unwrap();
    w.add_tensor("w.f32", GgmlType::F32, &[3], vec![1; 12])
        .unwrap();
    w.to_bytes()
}

#[test]
fn the_valid_base_file_is_accepted() {
    let g = GgufFile::from_bytes(valid_file()).unwrap();
    assert_eq!(g.tensors().len(), 2);
}

#[test]
fn bad_magic() {
    let mut f = valid_file();
    f[..4].copy_from_slice(b"GGML");
    assert!(matches!(kind(f), ErrorKind::BadMagic { .. }));
    assert!(matches!(kind(b"GG".to_vec()), ErrorKind::Truncated { .. }));
}

#[test]
fn unknown_versions() {
    for v in [0u32, 1, 4, 0x0001_0004] {
        let f = Raw::header(v, 0, 0).0;
        assert!(
            matches!(kind(f), ErrorKind::UnsupportedVersion { version } if version == v),
            "version {v}"
        );
    }
}

#[test]
fn big_endian_files_are_named_as_such() {
    let mut f = Raw::default();
    f.bytes(b"GGUF").bytes(&3u32.to_be_bytes()).zeros(16);
    let e = GgufFile::from_bytes(f.0).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::BigEndian { .. }));
    assert!(e.to_string().contains("big-endian"), "{e}");
}

#[test]
fn truncated_header_metadata_and_tensor_table() {
    // Header cut inside the counts.
    assert!(matches!(
        kind(Raw::header(3, 0, 0).0[..20].to_vec()),
        ErrorKind::Truncated { .. }
    ));
    // Metadata promised but absent: the count does not fit the file.
    assert!(matches!(
        kind(Raw::header(3, 0, 5).0),
        ErrorKind::Truncated { .. }
    ));
    // Metadata value cut short.
    let mut f = Raw::header(3, 0, 1);
    f.str("general.alignment").u32(4).bytes(&[32, 0]);
    assert!(matches!(kind(f.0), ErrorKind::Truncated { .. }));
    // Tensor record cut short.
    let mut f = Raw::header(3, 1, 0);
    f.str("t").u32(2).u64(32);
    f.zeros(8); // pad so the count check passes; the dims/type are cut
    assert!(matches!(kind(f.0), ErrorKind::Truncated { .. }));
}

#[test]
fn every_prefix_of_a_valid_file_is_rejected_cleanly() {
    let f = valid_file();
    let g = GgufFile::from_bytes(f.clone()).unwrap();
    let data_end = g.data_offset() as usize + 64 + 12;
    for n in 0..data_end.min(f.len()) {
        let res = GgufFile::from_bytes(f[..n].to_vec());
        assert!(res.is_err(), "prefix of {n} bytes accepted");
    }
}

#[test]
fn string_lengths_past_the_end() {
    let mut f = Raw::header(3, 0, 1);
    f.u64(1 << 20).bytes(b"short");
    assert!(matches!(kind(f.0), ErrorKind::Truncated { .. }));
    let mut f = Raw::header(3, 0, 1);
    f.u64(u64::MAX).bytes(b"short");
    assert!(matches!(kind(f.0), ErrorKind::CountTooLarge { .. }));
    // A string value (not key) too long.
    let mut f = Raw::header(3, 0, 1);
    f.str("k").u32(8).u64(1000).bytes(b"abc");
    assert!(matches!(kind(f.0), ErrorKind::Truncated { .. }));
}

#[test]
fn array_lengths_past_the_end_allocate_nothing() {
    // 2^30 u64s claimed in a tiny file: refused before any allocation.
    let mut f = Raw::header(3, 0, 1);
    f.str("k").u32(9).u32(10).u64(1 << 30).u64(1);
    assert!(matches!(kind(f.0), ErrorKind::Truncated { .. }));
    // Over the global limit.
    let mut f = Raw::header(3, 0, 1);
    f.str("k").u32(9).u32(0).u64(u64::MAX);
    assert!(matches!(kind(f.0), ErrorKind::CountTooLarge { .. }));
    // String arrays: each element needs at least its 8-byte length.
    let mut f = Raw::header(3, 0, 1);
    f.str("k").u32(9).u32(8).u64(1000).zeros(100);
    assert!(matches!(kind(f.0), ErrorKind::Truncated { .. }));
}

#[test]
fn absurd_counts() {
    for (nt, nkv) in [(u64::MAX, 0), (0, u64::MAX), (1 << 31, 0), (0, 1 << 40)] {
        let f = Raw::header(3, nt, nkv).0;
        assert!(
            matches!(kind(f), ErrorKind::CountTooLarge { .. }),
            "{nt} {nkv}"
        );
    }
}

#[test]
fn unknown_value_type_ids() {
    let mut f = Raw::header(3, 0, 1);
    f.str("k").u32(13).u32(0);
    assert!(matches!(
        kind(f.0),
        ErrorKind::UnknownValueType { id: 13, .. }
    ));
    let mut f = Raw::header(3, 0, 1);
    f.str("k").u32(9).u32(77).u64(0);
    assert!(matches!(
        kind(f.0),
        ErrorKind::UnknownValueType { id: 77, .. }
    ));
}

#[test]
fn nested_arrays_are_rejected() {
    let mut f = Raw::header(3, 0, 1);
    f.str("k").u32(9).u32(9).u64(1).u32(4).u64(0);
    assert!(matches!(kind(f.0), ErrorKind::NestedArray { .. }));
}

#[test]
fn empty_and_non_utf8_keys() {
    let mut f = Raw::header(3, 0, 1);
    f.str("").u32(4).u32(0);
    assert!(matches!(kind(f.0), ErrorKind::EmptyKey { .. }));
    let mut f = Raw::header(3, 0, 1);
    f.u64(2).bytes(&[0xff, 0xfe]).u32(4).u32(0);
    assert!(matches!(kind(f.0), ErrorKind::InvalidUtf8 { .. }));
}

#[test]
fn duplicate_keys() {
    let mut f = Raw::header(3, 0, 2);
    f.kv_u32("a.b", 1).kv_u32("a.b", 2);
    match kind(f.0) {
        ErrorKind::DuplicateKey { key, offset } => {
            assert_eq!(key, "a.b");
            assert_eq!(offset, 24 + 8 + 3 + 8);
        }
        k => panic!("{k:?}"),
    }
}

#[test]
fn bad_alignment() {
    for a in [0u32, 48] {
        let mut f = Raw::header(3, 0, 1);
        f.kv_u32("general.alignment", a);
        assert!(matches!(kind(f.0), ErrorKind::BadAlignment { .. }), "{a}");
    }
    let mut f = Raw::header(3, 0, 1);
    f.str("general.alignment").u32(10).u64(32);
    assert!(matches!(kind(f.0), ErrorKind::BadAlignment { .. }));
}

/// One tensor record followed by `data_bytes` of (padded) data.
fn one_tensor(dims: &[u64], ty: u32, offset: u64, data_bytes: usize) -> Vec<u8> {
    let mut f = Raw::header(3, 1, 0);
    f.tensor("t", dims, ty, offset).pad(32).zeros(data_bytes);
    f.0
}

#[test]
fn unknown_and_removed_tensor_types() {
    for id in [4u32, 5, 31, 36, 43, 1 << 31] {
        let f = one_tensor(&[32], id, 0, 64);
        assert!(
            matches!(kind(f), ErrorKind::UnknownTensorType { id: i, .. } if i == id),
            "{id}"
        );
    }
}

#[test]
fn row_length_not_a_multiple_of_the_block() {
    let f = one_tensor(&[33, 2], GgmlType::Q4_0.id(), 0, 1024);
    assert!(matches!(kind(f), ErrorKind::PartialBlock { ne0: 33, .. }));
    let f = one_tensor(&[100], GgmlType::Q4_K.id(), 0, 1024);
    assert!(matches!(kind(f), ErrorKind::PartialBlock { .. }));
}

#[test]
fn too_many_dims_and_element_overflow() {
    let f = one_tensor(&[1, 1, 1, 1, 1], 0, 0, 64);
    assert!(matches!(kind(f), ErrorKind::TooManyDims { n_dims: 5, .. }));
    let f = one_tensor(&[1 << 32, 1 << 32], 0, 0, 64);
    assert!(matches!(kind(f), ErrorKind::ElementCountOverflow { .. }));
    // Elements fit, bytes do not (F32 at 2^62 elements).
    let f = one_tensor(&[1 << 62], 0, 0, 64);
    assert!(matches!(kind(f), ErrorKind::ElementCountOverflow { .. }));
}

#[test]
fn tensor_data_past_the_end() {
    let f = one_tensor(&[64], 0, 0, 255);
    match kind(f) {
        ErrorKind::TensorOutOfBounds {
            name,
            end,
            file_len,
            ..
        } => {
            assert_eq!(name, "t");
            assert!(end > file_len);
        }
        k => panic!("{k:?}"),
    }
    // An offset near u64::MAX must not wrap around.
    let f = one_tensor(&[8], 0, u64::MAX - 31, 64);
    assert!(matches!(kind(f), ErrorKind::TensorOutOfBounds { .. }));
}

#[test]
fn misaligned_tensor_offsets() {
    let f = one_tensor(&[8], 0, 4, 64);
    assert!(matches!(
        kind(f),
        ErrorKind::MisalignedTensor {
            offset: 4,
            alignment: 32,
            ..
        }
    ));
}

#[test]
fn overlapping_tensors() {
    let mut f = Raw::header(3, 2, 0);
    f.tensor("a", &[16], 0, 0).tensor("b", &[16], 0, 32);
    f.pad(32).zeros(128);
    match kind(f.0) {
        ErrorKind::TensorOverlap { name, other, .. } => {
            assert_eq!((name.as_str(), other.as_str()), ("b", "a"));
        }
        k => panic!("{k:?}"),
    }
}

#[test]
fn duplicate_tensor_names() {
    let mut f = Raw::header(3, 2, 0);
    f.tensor("a", &[8], 0, 0).tensor("a", &[8], 0, 32);
    f.pad(32).zeros(64);
    assert!(matches!(kind(f.0), ErrorKind::DuplicateTensor { .. }));
}

#[test]
fn overlong_tensor_names() {
    let name = "x".repeat(65);
    let mut f = Raw::header(3, 1, 0);
    f.tensor(&name, &[8], 0, 0).pad(32).zeros(32);
    assert!(matches!(
        kind(f.0),
        ErrorKind::TensorNameTooLong { len: 65, .. }
    ));
}

#[test]
fn errors_from_open_name_the_file() {
    let dir = std::env::temp_dir().join(format!("rlx-malformed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.gguf");
    std::fs::write(&path, b"NOPE0000000000000000000000").unwrap();
    let e = GgufFile::open(&path).unwrap_err();
    assert!(e.to_string().contains("bad.gguf"), "{e}");
    let e = GgufFile::open(dir.join("missing.gguf")).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Io(_)));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn deterministic_byte_flips_never_panic() {
    // A cheap always-on complement to the fuzzer: flip every byte of the
    // header region of a valid file to a few values and require Ok or Err.
    let base = valid_file();
    let header_len = GgufFile::from_bytes(base.clone()).unwrap().data_offset() as usize;
    for i in 0..header_len {
        for v in [0x00u8, 0xff, 0x7f, 0x80, base[i] ^ 1] {
            let mut f = base.clone();
            f[i] = v;
            let _ = GgufFile::from_bytes(f);
        }
    }
}
