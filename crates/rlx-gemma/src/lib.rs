//! rlx-gemma: Gemma models on the rlx runtime.

pub mod sampling;
