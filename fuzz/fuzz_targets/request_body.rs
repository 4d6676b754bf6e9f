//! Arbitrary request bodies through the server's parsing of every endpoint's
//! fields: each is a value or an error naming the field, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlx_gemma::sampling::SamplerConfig;
use rlx_server::openai;

fuzz_target!(|data: &[u8]| {
    let Ok(body) = openai::object(data) else {
        return;
    };
    let defaults = SamplerConfig::default();
    for api in [openai::Api::Chat, openai::Api::Completions] {
        if let Ok(p) = openai::params(&body, api, &defaults, 1) {
            assert!((1..=openai::MAX_CHOICES).contains(&p.n));
        }
    }
    let _ = openai::messages(&body);
    let _ = openai::prompt(&body);
    let _ = openai::tokenize(&body);
    let _ = openai::detokenize(&body);
});
