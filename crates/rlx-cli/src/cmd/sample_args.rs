//! Sampling flags shared by `run` and `chat`, llama.cpp-style.

use anyhow::{Context, Result};
use rlx_gemma::sampling::{Sampler, SamplerConfig};

#[derive(clap::Args, Clone, Debug)]
pub struct SampleArgs {
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    pub n: usize,
    /// Temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub typical_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// History the penalties look at, in tokens.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed (sampled output is reproducible for a given seed).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when this text appears (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
}

impl SampleArgs {
    pub fn sampler(&self) -> Result<Sampler> {
        Sampler::new(self.sampler_config()).context("bad sampling options")
    }

    pub fn sampler_config(&self) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            typical_p: self.typical_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.repeat_last_n,
            logit_bias: Vec::new(),
            seed: self.seed,
        }
    }
}
