//! Shapes with symbolic dimensions, so one graph serves every prompt length.

use std::collections::HashMap;
use std::fmt;

/// A named symbolic dimension, bound to a number when a plan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sym(pub &'static str);

impl Sym {
    /// Tokens in the current step (prompt chunk length, or 1 in decode).
    pub const SEQ: Sym = Sym("seq");
    /// Sequences decoded together.
    pub const BATCH: Sym = Sym("batch");
    /// Rows of a step whose logits are wanted.
    pub const ROWS: Sym = Sym("rows");
}

impl fmt::Display for Sym {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// One dimension: a fixed size or a symbol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    Fixed(usize),
    Sym(Sym),
}

impl Dim {
    pub fn fixed(self) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(n),
            Dim::Sym(_) => None,
        }
    }

    /// The concrete size under `b`, or `None` if a symbol is unbound.
    pub fn resolve(self, b: &Bindings) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(n),
            Dim::Sym(s) => b.get(s),
        }
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Self {
        Dim::Fixed(n)
    }
}

impl From<Sym> for Dim {
    fn from(s: Sym) -> Self {
        Dim::Sym(s)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Sym(s) => write!(f, "{s}"),
        }
    }
}

/// A tensor shape; the last dimension is contiguous.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    pub fn new(dims: impl IntoIterator<Item = Dim>) -> Self {
        Shape(dims.into_iter().collect())
    }

    pub fn fixed(dims: &[usize]) -> Self {
        Shape(dims.iter().map(|&d| Dim::Fixed(d)).collect())
    }

    pub fn rank(&self) -> usize {
        self.0.len()
    }

    pub fn dims(&self) -> &[Dim] {
        &self.0
    }

    pub fn last(&self) -> Option<Dim> {
        self.0.last().copied()
    }

    /// Concrete sizes under `b`.
    pub fn resolve(&self, b: &Bindings) -> Option<Vec<usize>> {
        self.0.iter().map(|d| d.resolve(b)).collect()
    }

    /// Element count under `b`.
    pub fn numel(&self, b: &Bindings) -> Option<usize> {
        self.resolve(b).map(|v| v.iter().product())
    }

    /// Product of the dimensions if all are fixed.
    pub fn fixed_numel(&self) -> Option<usize> {
        self.0.iter().map(|d| d.fixed()).product()
    }

    /// The symbols this shape mentions.
    pub fn syms(&self) -> impl Iterator<Item = Sym> + '_ {
        self.0.iter().filter_map(|d| match d {
            Dim::Sym(s) => Some(*s),
            Dim::Fixed(_) => None,
        })
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Values of the symbols for one run (or the maxima a plan is sized for).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bindings(HashMap<Sym, usize>);

impl Bindings {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, s: Sym, v: usize) -> Self {
        self.0.insert(s, v);
        self
    }

    pub fn set(&mut self, s: Sym, v: usize) {
        self.0.insert(s, v);
    }

    pub fn get(&self, s: Sym) -> Option<usize> {
        self.0.get(&s).copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (Sym, usize)> + '_ {
        self.0.iter().map(|(s, v)| (*s, *v))
    }
}
