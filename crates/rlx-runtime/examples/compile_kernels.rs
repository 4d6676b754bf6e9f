//! Compiles the CUDA kernels for a GPU architecture into a kernel cache
//! directory, as a device start would, without a GPU: a machine that builds
//! rlx for a GPU machine carries the result there (`scripts/cuda-check.sh`).
//!
//! `cargo run --release -p rlx-runtime --features cuda --example
//! compile_kernels -- 9.0 DIR` (needs libnvrtc).

#[cfg(feature = "cuda")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [cc, dir] = args.as_slice() else {
        return Err("usage: compile_kernels MAJOR.MINOR DIR".into());
    };
    let (major, minor) = cc
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        .ok_or_else(|| format!("compute capability {cc:?}: expected MAJOR.MINOR, e.g. 9.0"))?;
    let dir = std::path::Path::new(dir);
    // The machine code a device loads, and the PTX it falls back to.
    rlx_runtime::cuda::compile_module_cached(major, minor, Some(dir))?;
    rlx_runtime::cuda::compile_kernels_cached(major, minor, Some(dir))?;
    let cubin = std::fs::read_dir(dir)?
        .any(|e| e.is_ok_and(|e| e.path().extension().is_some_and(|x| x == "cubin")));
    let kind = if cubin {
        "machine code and PTX"
    } else {
        "PTX only"
    };
    println!(
        "kernels for compute capability {cc}: {kind} in {}",
        dir.display()
    );
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("compile_kernels needs the cuda feature");
    std::process::exit(2);
}
