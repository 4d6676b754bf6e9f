//! Prints how long building and compiling the Gemma graphs of a model takes.
//!
//! cargo run --release -p rlx-gemma --example compile_time -- MODEL.gguf

use std::time::Instant;

use rlx_gemma::{Model, ModelOptions, SessionOptions};

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: compile_time MODEL.gguf");
    let t = Instant::now();
    let model = Model::load(&path, ModelOptions::default()).expect("load");
    println!(
        "load (map + config): {:.2} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let t = Instant::now();
    let s = model
        .session(SessionOptions {
            context: Some(4096),
            ..Default::default()
        })
        .expect("session");
    println!(
        "session (graph build + optimise + compile of the prefill and decode plans, {} layers): {:.2} ms",
        model.config().layers.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    drop(s);
}
