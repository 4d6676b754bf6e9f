//! Data movement: narrow and concat along an axis.

/// Copies rows `start..start+len` of axis `axis` of a tensor with dims `dims`.
pub fn narrow(x: &[f32], dims: &[usize], axis: usize, start: usize, len: usize, out: &mut [f32]) {
    let outer: usize = dims[..axis].iter().product();
    let inner: usize = dims[axis + 1..].iter().product();
    let src_block = dims[axis] * inner;
    let dst_block = len * inner;
    for o in 0..outer {
        let src = &x[o * src_block + start * inner..][..dst_block];
        out[o * dst_block..][..dst_block].copy_from_slice(src);
    }
}

/// Concatenates tensors that agree on every axis but `axis`.
pub fn concat(parts: &[(&[f32], &[usize])], axis: usize, out: &mut [f32]) {
    let dims0 = parts[0].1;
    let outer: usize = dims0[..axis].iter().product();
    let inner: usize = dims0[axis + 1..].iter().product();
    let total: usize = parts.iter().map(|(_, d)| d[axis]).sum();
    for o in 0..outer {
        let mut at = o * total * inner;
        for (data, dims) in parts {
            let block = dims[axis] * inner;
            out[at..at + block].copy_from_slice(&data[o * block..][..block]);
            at += block;
        }
    }
}
