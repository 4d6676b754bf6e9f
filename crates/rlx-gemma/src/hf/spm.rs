//! The pieces of a SentencePiece `tokenizer.model` (a protobuf
//! `ModelProto`): text, score and type of each, which is what llama.cpp's
//! converter copies into the GGUF vocabulary.

/// A piece's text, score and type (SentencePiece's numbering, which is
/// GGUF's: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
/// 6 byte).
pub struct Piece {
    pub text: String,
    pub score: f32,
    pub kind: i32,
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.b.get(self.pos)?;
            self.pos += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }

    /// The next field: number, wire type, and its bytes (length-delimited
    /// and fixed-width fields) or value (varints).
    fn field(&mut self) -> Option<(u64, u64, &'a [u8], u64)> {
        let key = self.varint()?;
        let (num, wire) = (key >> 3, key & 7);
        match wire {
            0 => Some((num, wire, &[][..], self.varint()?)),
            1 => Some((num, wire, self.take(8)?, 0)),
            2 => {
                let n = usize::try_from(self.varint()?).ok()?;
                Some((num, wire, self.take(n)?, 0))
            }
            5 => Some((num, wire, self.take(4)?, 0)),
            _ => None,
        }
    }
}

/// Every piece, in id order; `None` if the bytes are not a model.
pub fn pieces(bytes: &[u8]) -> Option<Vec<Piece>> {
    let mut r = Reader { b: bytes, pos: 0 };
    let mut out = Vec::new();
    while r.pos < bytes.len() {
        let (num, wire, body, _) = r.field()?;
        if num != 1 || wire != 2 {
            continue;
        }
        let mut p = Reader { b: body, pos: 0 };
        let mut piece = Piece {
            text: String::new(),
            score: 0.0,
            kind: 1,
        };
        while p.pos < body.len() {
            let (n, w, b, v) = p.field()?;
            match (n, w) {
                (1, 2) => piece.text = String::from_utf8(b.to_vec()).ok()?,
                (2, 5) => piece.score = f32::from_le_bytes(b.try_into().ok()?),
                (3, 0) => piece.kind = i32::try_from(v).ok()?,
                _ => {}
            }
        }
        out.push(piece);
    }
    Some(out)
}
