//! Where a JSON output stands, byte by byte: inside a string or a number
//! and how long it is, how many items the open arrays hold, and whether an
//! object just repeated an earlier item of its array. Enough to hold values
//! to soft length limits and to end a list of repeated calls, without a
//! second parser: the grammar engine has already checked the bytes.

use std::ops::Range;

/// Soft limits on the length of JSON values, so a sampled model cannot
/// spend its whole token budget on one value. A limit only ever narrows the
/// choice to continuations the schema allows at that point: where the
/// schema needs more (a `minLength`, `minItems` or pattern beyond it), the
/// value goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueLimits {
    /// Digits in a number (integer part, fraction and exponent together;
    /// the exponent has at most two, so every number is a double). 15
    /// keeps every integer exact in a double.
    pub digits: usize,
    /// Characters in a string (keys included).
    pub string_chars: usize,
    /// Items in an array.
    pub array_items: usize,
}

impl Default for ValueLimits {
    fn default() -> ValueLimits {
        ValueLimits {
            digits: 15,
            string_chars: 256,
            array_items: 32,
        }
    }
}

/// What the next token must do to respect a limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Limit {
    None,
    /// Close the string: a token starting with `"`.
    EndString,
    /// End the number: a token not starting with a number's character.
    EndNumber,
    /// No further item: a token without a comma.
    EndArray,
}

/// The lexical state of a JSON text: open containers, and whether it is
/// inside a string or a number (and how long that is so far).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Lex {
    depth: usize,
    in_string: bool,
    escape: bool,
    string_chars: usize,
    in_number: bool,
    digits: usize,
    /// Digits of the number's exponent (`e` or `E` seen).
    exponent: Option<usize>,
}

/// What a byte did to the structure.
enum Event {
    None,
    /// A string, number or literal began.
    Value,
    /// An array (`true`) or object began.
    Open(bool),
    /// An object (`true`) or array ended.
    Close(bool),
}

impl Lex {
    fn byte(&mut self, b: u8) -> Event {
        if self.in_string {
            if self.escape {
                self.escape = false;
            } else if b == b'\\' {
                self.escape = true;
                self.string_chars += 1;
            } else if b == b'"' {
                self.in_string = false;
            } else if b & 0xC0 != 0x80 {
                // Not a UTF-8 continuation byte: a new character.
                self.string_chars += 1;
            }
            return Event::None;
        }
        if self.in_number {
            match b {
                b'0'..=b'9' => {
                    self.digits += 1;
                    if let Some(e) = &mut self.exponent {
                        *e += 1;
                    }
                    return Event::None;
                }
                b'e' | b'E' => {
                    self.exponent = Some(0);
                    return Event::None;
                }
                b'.' | b'+' | b'-' => return Event::None,
                _ => self.in_number = false,
            }
        }
        match b {
            b'"' => {
                self.in_string = true;
                self.string_chars = 0;
                Event::Value
            }
            b'{' | b'[' => {
                self.depth += 1;
                Event::Open(b == b'[')
            }
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                Event::Close(b == b'}')
            }
            b'0'..=b'9' | b'-' => {
                self.in_number = true;
                self.digits = usize::from(b != b'-');
                self.exponent = None;
                Event::Value
            }
            // The first letter of `true`, `false` or `null` (their other
            // letters are none of these).
            b't' | b'f' | b'n' => Event::Value,
            _ => Event::None,
        }
    }

    /// Takes bytes.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    /// Takes bytes that each close something (a string, an object, an
    /// array); false, with the state undefined, at the first that does not.
    pub(crate) fn close_each(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| {
            let before = self.open();
            self.byte(b);
            self.open() < before
        })
    }

    /// Whether it is inside a string.
    pub(crate) fn in_string(&self) -> bool {
        self.in_string
    }

    /// How many things are open: containers, and a string.
    pub(crate) fn open(&self) -> usize {
        self.depth + usize::from(self.in_string)
    }
}

/// An open object or array.
#[derive(Debug)]
struct Frame {
    array: bool,
    items: usize,
    /// Where the open item of an array starts in the output.
    item_start: usize,
    /// The array's object items so far, as ranges of the output.
    objects: Vec<Range<usize>>,
}

/// Where a JSON output stands (see the module's notes).
#[derive(Debug, Default)]
pub(crate) struct JsonShape {
    lex: Lex,
    text: Vec<u8>,
    stack: Vec<Frame>,
    repeated: bool,
}

impl JsonShape {
    /// Takes the bytes of an accepted token.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
            self.text.push(b);
        }
    }

    fn byte(&mut self, b: u8) {
        match self.lex.byte(b) {
            Event::None => {}
            Event::Value => self.value_start(),
            Event::Open(array) => {
                self.value_start();
                self.stack.push(Frame {
                    array,
                    items: 0,
                    item_start: 0,
                    objects: Vec::new(),
                });
            }
            Event::Close(object) => {
                self.stack.pop();
                if object {
                    self.object_item_end();
                }
            }
        }
    }

    /// The lexical state.
    pub(crate) fn lex(&self) -> Lex {
        self.lex
    }

    /// A value begins at the byte about to be pushed: in an array, a new
    /// item.
    fn value_start(&mut self) {
        let at = self.text.len();
        if let Some(f) = self.stack.last_mut().filter(|f| f.array) {
            f.items += 1;
            f.item_start = at;
        }
    }

    /// An object just closed (its `}` about to be pushed): if it is an
    /// array's item, compare it with the array's earlier object items.
    fn object_item_end(&mut self) {
        let end = self.text.len() + 1;
        let Some(f) = self.stack.last_mut().filter(|f| f.array) else {
            return;
        };
        let item = f.item_start..end;
        // The closing brace is not in `text` yet: compare without it.
        let body = &self.text[item.start..end - 1];
        if f.objects
            .iter()
            .any(|r| &self.text[r.start..r.end - 1] == body)
        {
            self.repeated = true;
        }
        f.objects.push(item);
    }

    /// Whether an array's object item repeated an earlier one.
    pub(crate) fn repeated(&self) -> bool {
        self.repeated
    }

    /// The limit the next token must respect, if one is reached.
    pub(crate) fn limit(&self, l: &ValueLimits) -> Limit {
        let lex = &self.lex;
        if lex.in_string {
            if !lex.escape && lex.string_chars >= l.string_chars {
                return Limit::EndString;
            }
            return Limit::None;
        }
        // Two exponent digits keep every number a double.
        if lex.in_number && (lex.digits >= l.digits || lex.exponent.is_some_and(|e| e >= 2)) {
            return Limit::EndNumber;
        }
        match self.stack.last() {
            Some(f) if f.array && f.items >= l.array_items => Limit::EndArray,
            _ => Limit::None,
        }
    }

    /// How many items of the outermost array of the output's top-level
    /// object (`{"key": [item, …]}`) were complete within the first `len`
    /// bytes: the calls of a JSON tool-call reply that the model finished
    /// before it was closed for it.
    pub(crate) fn complete_items(text: &[u8], len: usize) -> usize {
        let mut shape = JsonShape::default();
        let mut done = 0;
        for &b in &text[..len.min(text.len())] {
            let (depth, in_string) = (shape.stack.len(), shape.lex.in_string);
            shape.byte(b);
            shape.text.push(b);
            // An object item of the array at depth 2 closed.
            if !in_string && depth == 3 && b == b'}' && shape.stack.len() == 2 {
                done += 1;
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(text: &str) -> JsonShape {
        let mut s = JsonShape::default();
        s.push(text.as_bytes());
        s
    }

    #[test]
    fn limits_follow_strings_numbers_and_arrays() {
        let l = ValueLimits {
            digits: 3,
            string_chars: 4,
            array_items: 2,
        };
        assert_eq!(shape(r#"{"a": "abc"#).limit(&l), Limit::None);
        assert_eq!(shape(r#"{"a": "abcd"#).limit(&l), Limit::EndString);
        // An escape counts once, and a quote after a backslash is escaped.
        assert_eq!(shape(r#"{"a": "ab\"#).limit(&l), Limit::None);
        assert_eq!(shape(r#"{"a": "ab\""#).limit(&l), Limit::None);
        assert_eq!(shape(r#"{"a": "ab\"c"#).limit(&l), Limit::EndString);
        // Multi-byte characters count as one.
        assert_eq!(shape("{\"a\": \"ééé").limit(&l), Limit::None);
        assert_eq!(shape(r#"{"a": -12"#).limit(&l), Limit::None);
        assert_eq!(shape(r#"{"a": 1.25"#).limit(&l), Limit::EndNumber);
        assert_eq!(shape(r#"{"a": 1e1"#).limit(&l), Limit::None);
        assert_eq!(shape(r#"{"a": 1e-12"#).limit(&l), Limit::EndNumber);
        assert_eq!(shape(r#"{"a": [1, "x, y""#).limit(&l), Limit::EndArray);
        assert_eq!(
            shape(r#"{"a": [1, [5, 6, 7], {"b": 2"#).limit(&l),
            Limit::None
        );
        assert_eq!(
            shape(r#"{"a": [[5, 6, 7], {"b": 2}"#).limit(&l),
            Limit::EndArray
        );
        assert_eq!(shape(r#"{"a": [true, null"#).limit(&l), Limit::EndArray);
    }

    #[test]
    fn a_repeated_object_item_is_noticed() {
        let s = shape(r#"{"c": [{"n": "a", "x": [1]}, {"n": "b"}, {"n": "a", "x": [1"#);
        assert!(!s.repeated());
        let s = shape(r#"{"c": [{"n": "a", "x": [1]}, {"n": "b"}, {"n": "a", "x": [1]}"#);
        assert!(s.repeated());
        // Equal objects in different arrays are not repeats.
        let s = shape(r#"[[{"n": 1}], [{"n": 1}]]"#);
        assert!(!s.repeated());
    }

    #[test]
    fn complete_items_counts_the_calls_finished_in_a_prefix() {
        let text = br#"{"tool_calls": [{"name": "f", "arguments": {"a": "}"}}, {"name": "g", "arguments": {}}]}"#;
        let first_end = text.iter().position(|&b| b == b'}').unwrap();
        assert_eq!(JsonShape::complete_items(text, 20), 0);
        assert_eq!(JsonShape::complete_items(text, first_end + 3), 0);
        let first = br#"{"tool_calls": [{"name": "f", "arguments": {"a": "}"}}"#.len();
        assert_eq!(JsonShape::complete_items(text, first), 1);
        assert_eq!(JsonShape::complete_items(text, text.len()), 2);
    }
}
