//! Opening the real 270M file maps it rather than reading it: the process's
//! anonymous memory (heap) grows by the parsed metadata (the 262k-token
//! vocabulary), not by the 241 MiB of tensor data. File pages that touching
//! the mapping brings in are not counted: how many a fault maps depends on
//! the kernel (fault-around, large folios), not on rlx. One test in this
//! file so no other test's allocations run in the same process at once.
//! Linux only: it reads `/proc/self/status`.
#![cfg(target_os = "linux")]

use rlx_gguf::GgufFile;

#[path = "../../../tests/support/real_model.rs"]
mod real_model;
use real_model::real_model;

/// Resident anonymous memory of this process, in KiB (Linux `RssAnon`):
/// what a copy of the file would add, unlike file pages of a mapping.
fn anon_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon in /proc/self/status")
}

#[test]
fn opening_the_real_model_maps_instead_of_copying() {
    let before = anon_rss_kib();
    let g = GgufFile::open(real_model()).unwrap();
    assert!(g.is_mapped());
    assert_eq!(g.tensors().len(), 236);
    // Views point into the mapping: no copy per tensor.
    let file = g.bytes().as_ptr_range();
    let mut touched = 0u64;
    for t in g.tensors() {
        let data = g.tensor_data(t);
        assert!(file.contains(&data.as_ptr()));
        assert_eq!(data.len() as u64, t.n_bytes);
        touched += data.first().copied().unwrap_or(0) as u64;
    }
    // Measured while the file is open and every tensor has been touched.
    let grown_kib = anon_rss_kib().saturating_sub(before);
    let file_kib = g.file_len() / 1024;
    eprintln!("anonymous RSS grew by {grown_kib} KiB opening a {file_kib} KiB file ({touched})");
    assert!(
        grown_kib < file_kib / 4,
        "anonymous RSS grew by {grown_kib} KiB for a {file_kib} KiB file"
    );
    drop(g);
}
