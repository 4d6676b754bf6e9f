//! Feeds arbitrary bytes to the GGUF reader: it must return Ok or Err, never
//! panic, and every tensor view it hands out must be in bounds and dequantize.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlx_gguf::{quant, GgufFile};

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for (_, v) in file.metadata() {
        let _ = v.to_string();
    }
    for t in file.tensors() {
        let bytes = file.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.n_bytes);
        // Dequantize a bounded prefix to exercise the block routines on hostile data.
        if quant::can_dequantize(t.ty) {
            let blocks = (bytes.len() / t.ty.block_bytes()).min(64);
            let mut out = vec![0f32; blocks * t.ty.block_elems()];
            quant::dequantize(t.ty, &bytes[..blocks * t.ty.block_bytes()], &mut out)
                .expect("whole blocks dequantize");
        }
    }
});
