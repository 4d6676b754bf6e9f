//! Stop strings over streamed text: text that might be the start of a stop
//! string is held back until the next piece shows whether it is.

/// Cuts a stream of text pieces at the first occurrence of any stop string.
#[derive(Debug, Default)]
pub struct StopFilter {
    stops: Vec<String>,
    text: String,
    /// Bytes of `text` handed out so far.
    sent: usize,
    stopped: bool,
}

impl StopFilter {
    /// Empty stop strings are ignored (they would match before any text).
    pub fn new(stops: Vec<String>) -> StopFilter {
        StopFilter {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..StopFilter::default()
        }
    }

    /// Adds a piece; returns the text that is now certain to be output and
    /// whether a stop string was found (the output then ends before it).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        if self.stopped {
            return (String::new(), true);
        }
        let old_len = self.text.len();
        self.text.push_str(piece);
        // No stop string was complete before this piece, so a match ends in
        // it and starts at most `longest - 1` bytes before it.
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = old_len.saturating_sub(longest).max(self.sent);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        // The match that ends first (the longest of those ending together)
        // wins, as it would have if the text had come a byte at a time.
        let hit = self
            .stops
            .iter()
            .filter_map(|s| {
                let at = from + self.text[from..].find(s.as_str())?;
                Some((at + s.len(), at))
            })
            .min();
        if let Some((_, at)) = hit {
            let at = at.max(self.sent);
            let out = self.text[self.sent..at].to_owned();
            self.sent = at;
            self.stopped = true;
            return (out, true);
        }
        let safe = self.text.len() - self.held_back();
        let out = self.text[self.sent..safe].to_owned();
        self.sent = safe;
        (out, false)
    }

    /// What is left once the stream ends without a stop string.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        let out = self.text[self.sent..].to_owned();
        self.sent = self.text.len();
        out
    }

    /// The longest end of the text that is a proper prefix of a stop string.
    fn held_back(&self) -> usize {
        let tail = &self.text[self.sent..];
        self.stops
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .rev()
                    .filter(|&k| s.is_char_boundary(k) && tail.ends_with(&s[..k]))
                    .take(1)
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(pieces: &[&str], stops: &[&str]) -> (String, bool) {
        let mut f = StopFilter::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (o, stop) = f.push(p);
            out.push_str(&o);
            if stop {
                return (out, true);
            }
        }
        out.push_str(&f.finish());
        (out, false)
    }

    #[test]
    fn a_stop_string_split_over_pieces_is_cut() {
        assert_eq!(
            run(&["Hello, wo", "rld! Bye"], &["world"]),
            ("Hello, ".into(), true)
        );
        assert_eq!(run(&["ab", "c", "d"], &["cd", "bc"]), ("a".into(), true));
        // "bc" is complete before "abcd" is, however the text is split.
        assert_eq!(run(&["abcd"], &["abcd", "bc"]), ("a".into(), true));
        assert_eq!(
            run(&["a", "b", "c", "d"], &["abcd", "bc"]),
            ("a".into(), true)
        );
    }

    #[test]
    fn a_partial_match_is_released_when_it_fails() {
        let mut f = StopFilter::new(vec!["STOP".into()]);
        assert_eq!(f.push("go ST"), ("go ".into(), false));
        assert_eq!(f.push("ay"), ("STay".into(), false));
        assert_eq!(f.finish(), "");
    }

    #[test]
    fn without_stops_everything_passes_at_once() {
        let mut f = StopFilter::new(vec![String::new()]);
        assert_eq!(f.push("héllo"), ("héllo".into(), false));
    }

    proptest! {
        // Whatever the split, the output is the text before the stop string
        // that is complete first.
        #[test]
        fn output_is_the_text_before_the_first_stop(
            text in "[abcé]{0,40}",
            stops in proptest::collection::vec("[abcé]{1,3}", 0..3),
            cuts in proptest::collection::vec(0usize..60, 0..8),
        ) {
            let mut bounds: Vec<usize> = cuts
                .into_iter()
                .map(|c| c.min(text.len()))
                .filter(|&c| text.is_char_boundary(c))
                .collect();
            bounds.push(0);
            bounds.push(text.len());
            bounds.sort();
            let pieces: Vec<&str> = bounds.windows(2).map(|w| &text[w[0]..w[1]]).collect();
            let stop_refs: Vec<&str> = stops.iter().map(String::as_str).collect();
            let first = (1..=text.len())
                .filter(|&e| text.is_char_boundary(e))
                .find_map(|e| {
                    let longest = stops
                        .iter()
                        .filter(|s| text[..e].ends_with(s.as_str()))
                        .map(String::len)
                        .max()?;
                    Some(e - longest)
                });
            let expected = first.map_or(text.as_str(), |at| &text[..at]);
            let (out, stopped) = run(&pieces, &stop_refs);
            prop_assert_eq!(out.as_str(), expected);
            prop_assert_eq!(stopped, first.is_some());
        }
    }
}
