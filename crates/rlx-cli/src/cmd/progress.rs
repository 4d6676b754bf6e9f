//! Progress display on stderr, only when it is a terminal.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// Prompts shorter than this prefill too fast to need a bar.
const MIN_TOKENS: usize = 256;

pub fn prefill_bar(tokens: usize) -> Option<ProgressBar> {
    if tokens < MIN_TOKENS || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(tokens as u64);
    bar.set_style(
        ProgressStyle::with_template("prefill {bar:40} {pos}/{len} tokens ({per_sec})")
            .expect("valid template"),
    );
    Some(bar)
}

pub fn spinner(message: &'static str) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let s = ProgressBar::new_spinner();
    s.set_message(message);
    s.enable_steady_tick(std::time::Duration::from_millis(100));
    Some(s)
}
