//! The input of one step: tokens of any number of sequences, each with its
//! own position, and which of them want logits.

use std::ops::Range;

/// A sequence in a [`KvPool`](crate::KvPool).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u32);

impl std::fmt::Display for SeqId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sequence {}", self.0)
    }
}

/// The tokens of one step. Prefill chunks of some sequences and single
/// decode tokens of others go in the same batch; a sequence's tokens form
/// one run of consecutive positions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    tokens: Vec<i32>,
    pos: Vec<i32>,
    seqs: Vec<SeqId>,
    logits: Vec<bool>,
    /// Bidirectional span id of each row (0: none).
    spans: Vec<i32>,
}

/// The rows of one sequence in a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqRun {
    pub seq: SeqId,
    pub rows: Range<usize>,
    /// Position of the first row.
    pub start: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("the batch is empty")]
    Empty,
    #[error(
        "{seq}: its tokens must be one run, but row {row} continues it after another sequence"
    )]
    Split { seq: SeqId, row: usize },
    #[error("{seq}: row {row} is at position {got}, expected {expected} (positions must be consecutive)")]
    Position {
        seq: SeqId,
        row: usize,
        got: usize,
        expected: usize,
    },
    #[error("token {token} at row {row} is not a valid id")]
    Token { row: usize, token: u32 },
}

impl Batch {
    pub fn new() -> Self {
        Batch::default()
    }

    /// Adds one token of `seq` at position `pos`.
    pub fn push(&mut self, seq: SeqId, pos: usize, token: u32, logits: bool) {
        self.push_in_span(seq, pos, token, logits, 0);
    }

    /// Adds one token in bidirectional span `span` (0: none): tokens of a
    /// sequence with the same non-zero span see each other whatever the
    /// attention mask (an image's tokens), where the graph reads spans.
    pub fn push_in_span(&mut self, seq: SeqId, pos: usize, token: u32, logits: bool, span: i32) {
        self.tokens.push(token as i32);
        self.pos.push(pos as i32);
        self.seqs.push(seq);
        self.logits.push(logits);
        self.spans.push(span);
    }

    /// Adds `tokens` of `seq` at positions `start ..`; `logits(i)` says
    /// whether token `i` of them wants logits.
    pub fn push_run(
        &mut self,
        seq: SeqId,
        start: usize,
        tokens: &[u32],
        logits: impl Fn(usize) -> bool,
    ) {
        for (i, &t) in tokens.iter().enumerate() {
            self.push(seq, start + i, t, logits(i));
        }
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn clear(&mut self) {
        self.tokens.clear();
        self.pos.clear();
        self.seqs.clear();
        self.logits.clear();
        self.spans.clear();
    }

    /// Token ids (i32, as the graph reads them).
    pub fn tokens(&self) -> &[i32] {
        &self.tokens
    }

    pub fn positions(&self) -> &[i32] {
        &self.pos
    }

    /// Each row's bidirectional span id (0: none).
    pub fn spans(&self) -> &[i32] {
        &self.spans
    }

    pub fn seqs(&self) -> &[SeqId] {
        &self.seqs
    }

    /// Whether each row wants logits.
    pub fn wants_logits(&self) -> &[bool] {
        &self.logits
    }

    /// The rows that want logits, in order: row `i` of a step's logits is
    /// batch row `logit_rows()[i]`.
    pub fn logit_rows(&self) -> Vec<i32> {
        (0..self.len() as i32)
            .filter(|&r| self.logits[r as usize])
            .collect()
    }

    /// The batch as runs of one sequence each, checked: every sequence in
    /// one run, positions consecutive within it.
    pub fn runs(&self) -> Result<Vec<SeqRun>, BatchError> {
        if self.is_empty() {
            return Err(BatchError::Empty);
        }
        if let Some(row) = self.tokens.iter().position(|&t| t < 0) {
            return Err(BatchError::Token {
                row,
                token: self.tokens[row] as u32,
            });
        }
        let mut runs: Vec<SeqRun> = Vec::new();
        for row in 0..self.len() {
            let (seq, pos) = (self.seqs[row], self.pos[row] as usize);
            match runs.last_mut() {
                Some(run) if run.seq == seq => {
                    let expected = run.start + run.rows.len();
                    if pos != expected {
                        return Err(BatchError::Position {
                            seq,
                            row,
                            got: pos,
                            expected,
                        });
                    }
                    run.rows.end = row + 1;
                }
                _ => {
                    if runs.iter().any(|r| r.seq == seq) {
                        return Err(BatchError::Split { seq, row });
                    }
                    runs.push(SeqRun {
                        seq,
                        rows: row..row + 1,
                        start: pos,
                    });
                }
            }
        }
        Ok(runs)
    }
}
