//! Where in `bottle.toml` a problem is: field paths (`agents.claude.egress.allow[2]`)
//! and the source positions they point at.
//!
//! The document is parsed once into toml's spanned tree; the same tree feeds
//! serde and, after deserialising, lets semantic checks find the line and
//! column of the value (or key) they complain about.

use std::fmt;
use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    /// A table key.
    Key(String),
    /// An array index.
    Index(usize),
}

/// A path from the document root to a value, rendered the way an operator
/// would write it: `agents.claude.egress.allow[2]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldPath(Vec<Seg>);

impl FieldPath {
    /// The document root.
    pub(crate) fn root() -> FieldPath {
        FieldPath(Vec::new())
    }

    /// This path extended by a key.
    pub(crate) fn key(&self, key: &str) -> FieldPath {
        let mut segs = self.0.clone();
        segs.push(Seg::Key(key.to_string()));
        FieldPath(segs)
    }

    /// This path extended by an array index.
    pub(crate) fn index(&self, index: usize) -> FieldPath {
        let mut segs = self.0.clone();
        segs.push(Seg::Index(index));
        FieldPath(segs)
    }

    /// Appends a segment in place.
    pub(crate) fn push(&mut self, seg: Seg) {
        self.0.push(seg);
    }

    /// Drops the last segment; false at the root.
    pub(crate) fn pop(&mut self) -> bool {
        self.0.pop().is_some()
    }

    /// The segments, root first.
    pub(crate) fn segments(&self) -> &[Seg] {
        &self.0
    }
}

/// Keys that TOML accepts unquoted are shown bare; anything else is quoted
/// so that the path can be pasted back into a manifest.
fn is_bare_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(key) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    if is_bare_key(key) {
                        f.write_str(key)?;
                    } else {
                        write!(f, "{key:?}")?;
                    }
                }
                Seg::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}

/// What kind of value a path holds in the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Table,
    Array,
    Scalar,
}

/// The manifest text and its spanned parse tree.
pub(crate) struct Doc<'i> {
    text: &'i str,
    root: Spanned<DeTable<'i>>,
}

/// Where a path ends in the text: the span of its last key (when the value
/// sits under a key) and of its value.
#[derive(Debug, Clone)]
pub(crate) struct Located {
    pub(crate) key: Option<Range<usize>>,
    pub(crate) value: Range<usize>,
}

impl<'i> Doc<'i> {
    /// Parses the text; syntax errors come back as toml's error (with a span).
    pub(crate) fn parse(text: &'i str) -> Result<Doc<'i>, toml::de::Error> {
        Ok(Doc {
            text,
            root: DeTable::parse(text)?,
        })
    }

    /// The document's root table.
    pub(crate) fn root(&self) -> &DeTable<'i> {
        self.root.get_ref()
    }

    /// A deserializer over a copy of the tree.
    pub(crate) fn deserializer(&self) -> toml::Deserializer<'i> {
        toml::Deserializer::from(self.root.clone())
    }

    /// The value at `path`, if the text has it.
    fn value(&self, path: &FieldPath) -> Option<&Spanned<DeValue<'i>>> {
        let mut segs = path.segments().iter();
        let mut value = table_entry(self.root.get_ref(), segs.next()?)?.1;
        for seg in segs {
            value = match (value.get_ref(), seg) {
                (DeValue::Table(table), Seg::Key(_)) => table_entry(table, seg)?.1,
                (DeValue::Array(array), Seg::Index(index)) => array.get(*index)?,
                _ => return None,
            };
        }
        Some(value)
    }

    /// The kind of value at `path` (`None` if the path is not in the text).
    pub(crate) fn kind(&self, path: &FieldPath) -> Option<Kind> {
        if path.segments().is_empty() {
            return Some(Kind::Table);
        }
        Some(match self.value(path)?.get_ref() {
            DeValue::Table(_) => Kind::Table,
            DeValue::Array(_) => Kind::Array,
            _ => Kind::Scalar,
        })
    }

    /// The keys of the table at `path`, in document order.
    pub(crate) fn keys(&self, path: &FieldPath) -> Vec<String> {
        let table = if path.segments().is_empty() {
            Some(self.root.get_ref())
        } else {
            match self.value(path).map(Spanned::get_ref) {
                Some(DeValue::Table(table)) => Some(table),
                _ => None,
            }
        };
        table.map_or_else(Vec::new, |t| {
            t.keys().map(|k| k.get_ref().to_string()).collect()
        })
    }

    /// The length of the array at `path`; 0 if it is not an array.
    pub(crate) fn array_len(&self, path: &FieldPath) -> usize {
        match self.value(path).map(Spanned::get_ref) {
            Some(DeValue::Array(array)) => array.len(),
            _ => 0,
        }
    }

    /// Finds the key and value spans of `path`, if the path exists in the
    /// text (defaults filled in by serde have no span).
    pub(crate) fn locate(&self, path: &FieldPath) -> Option<Located> {
        let mut segs = path.segments().iter();
        // The root is a table, not a value; step into it by hand.
        let first = match segs.next() {
            None => {
                return Some(Located {
                    key: None,
                    value: self.root.span(),
                });
            }
            Some(seg) => seg,
        };
        let (k, v) = table_entry(self.root.get_ref(), first)?;
        let mut key = Some(k);
        let mut value: &Spanned<DeValue<'i>> = v;
        for seg in segs {
            match (value.get_ref(), seg) {
                (DeValue::Table(table), Seg::Key(_)) => {
                    let (k, v) = table_entry(table, seg)?;
                    key = Some(k);
                    value = v;
                }
                (DeValue::Array(array), Seg::Index(index)) => {
                    value = array.get(*index)?;
                    key = None;
                }
                _ => return None,
            }
        }
        Some(Located {
            key,
            value: value.span(),
        })
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub(crate) fn line_col(&self, offset: usize) -> (usize, usize) {
        line_col(self.text, offset)
    }

    /// The text a span covers.
    pub(crate) fn slice(&self, span: &Range<usize>) -> &'i str {
        self.text.get(span.clone()).unwrap_or("")
    }
}

/// 1-based line and column (in characters) of a byte offset in `text`.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
    (line, column)
}

fn table_entry<'a, 'i>(
    table: &'a DeTable<'i>,
    seg: &Seg,
) -> Option<(Range<usize>, &'a Spanned<DeValue<'i>>)> {
    let Seg::Key(want) = seg else { return None };
    table
        .iter()
        .find(|(k, _)| k.get_ref().as_ref() == want.as_str())
        .map(|(k, v)| (k.span(), v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_render_like_toml() {
        let path = FieldPath::root()
            .key("agents")
            .key("claude")
            .key("egress")
            .key("allow")
            .index(2);
        assert_eq!(path.to_string(), "agents.claude.egress.allow[2]");
        let odd = FieldPath::root().key("agents").key("my agent");
        assert_eq!(odd.to_string(), "agents.\"my agent\"");
    }

    #[test]
    fn locates_keys_values_and_array_items() {
        let text =
            "version = 1\n[agents.a]\nimage = \"x\"\n[[agents.a.git]]\nname = \"é\"\nurl = \"u\"\n";
        let doc = Doc::parse(text).unwrap();
        let image = doc
            .locate(&FieldPath::root().key("agents").key("a").key("image"))
            .unwrap();
        assert_eq!(doc.slice(&image.value), "\"x\"");
        assert_eq!(doc.line_col(image.key.unwrap().start), (3, 1));
        let url = FieldPath::root()
            .key("agents")
            .key("a")
            .key("git")
            .index(0)
            .key("url");
        let url = doc.locate(&url).unwrap();
        assert_eq!(doc.line_col(url.value.start), (6, 7));
        assert!(
            doc.locate(&FieldPath::root().key("agents").key("b"))
                .is_none()
        );
        assert!(
            doc.locate(&FieldPath::root().key("version").index(0))
                .is_none()
        );
    }

    #[test]
    fn columns_count_characters_not_bytes() {
        let doc = Doc::parse("a = \"é\"\nb = 1\n").unwrap();
        assert_eq!(doc.line_col(text_offset("a = \"é\"", "\"")), (1, 5));
        assert_eq!(doc.line_col("a = \"é\"\n".len() + 4), (2, 5));
    }

    fn text_offset(text: &str, needle: &str) -> usize {
        text.find(needle).unwrap()
    }
}
