//! `GET /metrics`: the engine's load in Prometheus' text format, under
//! llama-server's names where it has the same figure (`llamacpp:…`) and
//! `rlx:…` for the rest.

use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{counter, describe_counter, describe_gauge, gauge, with_local_recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use crate::engine::Load;

/// The server's own recorder (not the process-global one, so that several
/// servers in one process report apart).
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// Requests refused because the queue was full.
    pub rejected: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        with_local_recorder(&recorder, || {
            describe_counter!("llamacpp:prompt_tokens_total", "Prompt tokens run");
            describe_counter!(
                "rlx:prompt_tokens_cached_total",
                "Prompt tokens taken from the prefix cache instead of run"
            );
            describe_counter!("llamacpp:tokens_predicted_total", "Tokens generated");
            describe_counter!(
                "rlx:tokens_forced_total",
                "Generated tokens a structured-output constraint forced (no sampling)"
            );
            describe_gauge!("llamacpp:requests_processing", "Requests being generated");
            describe_gauge!("llamacpp:requests_deferred", "Requests waiting for a place");
            describe_counter!(
                "rlx:requests_rejected_total",
                "Requests refused because the queue was full"
            );
            describe_gauge!(
                "llamacpp:kv_cache_usage_ratio",
                "Fraction of the K/V pool's blocks in use (running sequences and the prefix cache)"
            );
            describe_gauge!(
                "rlx:prefix_cache_blocks",
                "Blocks the prefix cache holds (each of 32 tokens)"
            );
            describe_gauge!("rlx:kv_cache_used_bytes", "Bytes of K/V blocks in use");
            describe_counter!("rlx:busy_seconds_total", "Seconds spent running steps");
        });
        Metrics {
            recorder,
            handle,
            rejected: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// The current figures as Prometheus text.
    pub fn render(&self, load: &Load) -> String {
        let get = |a: &std::sync::atomic::AtomicUsize| a.load(Ordering::Relaxed);
        let total = get(&load.kv_total_bytes).max(1);
        with_local_recorder(&self.recorder, || {
            counter!("llamacpp:prompt_tokens_total")
                .absolute(load.prompt_tokens.load(Ordering::Relaxed));
            counter!("rlx:prompt_tokens_cached_total")
                .absolute(load.cached_tokens.load(Ordering::Relaxed));
            counter!("llamacpp:tokens_predicted_total")
                .absolute(load.generated_tokens.load(Ordering::Relaxed));
            counter!("rlx:tokens_forced_total")
                .absolute(load.forced_tokens.load(Ordering::Relaxed));
            counter!("rlx:tokens_drafted_total")
                .absolute(load.drafted_tokens.load(Ordering::Relaxed));
            counter!("rlx:tokens_draft_accepted_total")
                .absolute(load.accepted_tokens.load(Ordering::Relaxed));
            gauge!("llamacpp:requests_processing").set(get(&load.running) as f64);
            gauge!("llamacpp:requests_deferred").set(get(&load.waiting) as f64);
            counter!("rlx:requests_rejected_total").absolute(self.rejected.load(Ordering::Relaxed));
            gauge!("llamacpp:kv_cache_usage_ratio")
                .set(get(&load.kv_used_bytes) as f64 / total as f64);
            gauge!("rlx:kv_cache_used_bytes").set(get(&load.kv_used_bytes) as f64);
            gauge!("rlx:prefix_cache_blocks").set(get(&load.cached_blocks) as f64);
            counter!("rlx:busy_seconds_total").absolute(load.busy_secs() as u64);
        });
        self.handle.render()
    }
}
