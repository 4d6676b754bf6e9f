//! The writer and reader agree with each other and with gguf-py.

use rlx_gguf::{Array, GgmlType, GgufFile, GgufWriter, Value};

fn all_value_kinds(w: &mut GgufWriter) {
    w.add("general.architecture", "gemma3").unwrap();
    w.add("t.u8", 7u8).unwrap();
    w.add("t.i8", -7i8).unwrap();
    w.add("t.u16", 65535u16).unwrap();
    w.add("t.i16", -300i16).unwrap();
    w.add("t.u32", 123456u32).unwrap();
    w.add("t.i32", -123456i32).unwrap();
    w.add("t.f32", 0.25f32).unwrap();
    w.add("t.bool", true).unwrap();
    w.add("t.string", "héllo ▁world").unwrap();
    w.add("t.u64", u64::MAX).unwrap();
    w.add("t.i64", i64::MIN).unwrap();
    w.add("t.f64", -1.5e300f64).unwrap();
    w.add(
        "t.arr_str",
        vec!["<pad>".to_string(), String::new(), "b".into()],
    )
    .unwrap();
    w.add("t.arr_f32", vec![1.0f32, -2.0, 3.5]).unwrap();
    w.add("t.arr_i32", vec![1i32, -2]).unwrap();
    w.add("t.arr_bool", vec![true, false]).unwrap();
    w.add("t.arr_u8", Vec::<u8>::new()).unwrap();
    w.add("t.arr_u64", vec![1u64 << 40]).unwrap();
}

#[test]
fn every_metadata_type_round_trips() {
    let mut w = GgufWriter::new();
    all_value_kinds(&mut w);
    let g = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.get_str("general.architecture").unwrap(), "gemma3");
    assert_eq!(g.get("t.u8"), Some(&Value::U8(7)));
    assert_eq!(g.get("t.i8"), Some(&Value::I8(-7)));
    assert_eq!(g.get("t.u16"), Some(&Value::U16(65535)));
    assert_eq!(g.get("t.i16"), Some(&Value::I16(-300)));
    assert_eq!(g.get_u64("t.u32").unwrap(), 123456);
    assert_eq!(g.get("t.i32"), Some(&Value::I32(-123456)));
    assert_eq!(g.get_f64("t.f32").unwrap(), 0.25);
    assert!(g.get_bool("t.bool").unwrap());
    assert_eq!(g.get_str("t.string").unwrap(), "héllo ▁world");
    assert_eq!(g.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(g.get("t.i64"), Some(&Value::I64(i64::MIN)));
    assert_eq!(g.get("t.f64"), Some(&Value::F64(-1.5e300)));
    assert_eq!(
        g.get_array("t.arr_str").unwrap().as_strings().unwrap(),
        ["<pad>", "", "b"]
    );
    assert_eq!(
        g.get_array("t.arr_f32").unwrap(),
        &Array::F32(vec![1.0, -2.0, 3.5])
    );
    assert_eq!(
        g.get_array("t.arr_i32").unwrap().as_i32s().unwrap(),
        [1, -2]
    );
    assert_eq!(
        g.get_array("t.arr_bool").unwrap(),
        &Array::Bool(vec![true, false])
    );
    assert!(g.get_array("t.arr_u8").unwrap().is_empty());
    assert_eq!(
        g.get_array("t.arr_u64").unwrap().to_u64s().unwrap(),
        [1u64 << 40]
    );
    // Order is preserved.
    let keys: Vec<&str> = g.metadata().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys[0], "general.architecture");
    assert_eq!(keys[1], "t.u8");
}

#[test]
fn typed_getters_name_the_key_on_error() {
    let mut w = GgufWriter::new();
    w.add("a.string", "x").unwrap();
    let g = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let e = g.get_u64("a.string").unwrap_err().to_string();
    assert!(e.contains("a.string") && e.contains("string"), "{e}");
    let e = g.get_str("missing.key").unwrap_err().to_string();
    assert!(e.contains("missing.key"), "{e}");
    let e = g.tensor_by_name("nope").unwrap_err().to_string();
    assert!(e.contains("nope"), "{e}");
}

#[test]
fn tensors_of_any_type_round_trip_with_alignment() {
    for align in [32u32, 64, 256] {
        let mut w = GgufWriter::new();
        w.add("general.alignment", align).unwrap();
        let mut expected = Vec::new();
        for (i, ty) in GgmlType::ALL.iter().copied().enumerate() {
            let dims = [ty.block_elems() as u64 * 2, 3];
            let n = (dims[0] * dims[1]) as usize;
            let bytes: Vec<u8> = (0..n / ty.block_elems() * ty.block_bytes())
                .map(|j| (i * 31 + j * 7) as u8)
                .collect();
            let name = format!("t{i}.{ty}");
            w.add_tensor(&name, ty, &dims, bytes.clone()).unwrap();
            expected.push((name, ty, dims, bytes));
        }
        let g = GgufFile::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(g.alignment(), align as u64);
        assert_eq!(g.data_offset() % align as u64, 0);
        assert_eq!(g.tensors().len(), expected.len());
        let mut next_offset = 0;
        for (name, ty, dims, bytes) in &expected {
            let (info, data) = g.tensor_by_name(name).unwrap();
            assert_eq!(info.ty, *ty);
            assert_eq!(info.dims, dims);
            assert_eq!(data, &bytes[..]);
            // The contiguous layout llama.cpp requires.
            assert_eq!(info.offset, next_offset);
            next_offset += info.n_bytes.div_ceil(align as u64) * align as u64;
        }
        assert_eq!(g.file_len(), g.data_offset() + next_offset);
    }
}

#[test]
fn writer_rejects_inconsistent_tensors_and_keys() {
    let mut w = GgufWriter::new();
    assert!(w
        .add_tensor("x", GgmlType::Q4_0, &[33], vec![0; 18])
        .is_err());
    assert!(w
        .add_tensor("x", GgmlType::Q4_0, &[32], vec![0; 17])
        .is_err());
    w.add_tensor("x", GgmlType::Q4_0, &[32], vec![0; 18])
        .unwrap();
    assert!(w.add_tensor("x", GgmlType::F32, &[1], vec![0; 4]).is_err());
    assert!(w
        .add_tensor(&"n".repeat(65), GgmlType::F32, &[1], vec![0; 4])
        .is_err());
    w.add("k", 1u32).unwrap();
    assert!(w.add("k", 2u32).is_err());
    assert!(w.add("", 2u32).is_err());
    assert!(w.add("general.alignment", 48u32).is_err());
    assert!(w.add("general.alignment", 64u64).is_err());
}

#[test]
fn reads_a_file_written_by_gguf_py() {
    // Written by gguf-py's GGUFWriter (fuzz/seeds/quant.gguf), alignment 64.
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/gguf/gguf-py-written.gguf"
    );
    let g = GgufFile::open(path).unwrap();
    assert!(g.is_mapped());
    assert_eq!(g.alignment(), 64);
    assert_eq!(g.get_str("general.architecture").unwrap(), "gemma3");
    assert_eq!(g.get_u64("gemma3.block_count").unwrap(), 2);
    let names: Vec<(&str, GgmlType)> = g
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.ty))
        .collect();
    assert_eq!(
        names,
        [
            ("q8", GgmlType::Q8_0),
            ("q4k", GgmlType::Q4_K),
            ("iq2", GgmlType::IQ2_XXS),
            ("q5_0", GgmlType::Q5_0)
        ]
    );
    assert_eq!(g.tensor("q8").unwrap().dims, [32, 2]);
    // Re-writing it with our writer gives a file that reads back identically.
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        w.add(k, v.clone()).unwrap();
    }
    for t in g.tensors() {
        w.add_tensor(&t.name, t.ty, &t.dims, g.tensor_data(t).to_vec())
            .unwrap();
    }
    let bytes = w.to_bytes();
    assert_eq!(bytes, std::fs::read(path).unwrap());
}
