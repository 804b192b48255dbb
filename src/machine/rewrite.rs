//! The corrected text (`--format rewrite`): the input with synthetic tags
//! inserted and dropped markers left out, built as the machine decides.
//!
//! Two decisions arrive late and are made room for here rather than in the
//! machine: a held `</A>` (merge or real close?) and the open/close tags of
//! an implicit lead element whose tag is not known yet. [`Rewrite::take`]
//! never hands out bytes in front of an undecided insertion point.
//!
//! With call text left out ([`crate::CallText::Omit`]), it also marks
//! where each call element ended ([`Rewrite::mark`]), so that a caller can
//! put something in its place (the proxy's observations of calls it does
//! not send).

#[derive(Debug, Default)]
pub(super) struct Rewrite {
    buf: Vec<u8>,
    /// Where the implicit lead element's open tag goes once its tag is known.
    open_at: Option<usize>,
    /// Where its synthetic close goes.
    close_at: Option<usize>,
    /// A close tag waiting for the merge decision.
    held: Option<Vec<u8>>,
    /// Bytes written now are left out (inside a call element that the
    /// corrected text omits).
    omitting: bool,
    /// Where call elements ended, in `buf`.
    marks: Vec<Mark>,
}

/// Where a call element ended.
#[derive(Debug, Clone, Copy)]
struct Mark {
    id: u32,
    at: usize,
    /// Made after [`Rewrite::hold_open`] / [`Rewrite::hold_close`] (at
    /// their very position, a mark made before goes in front of the tag
    /// inserted there, one made after behind it).
    after_open: bool,
    after_close: bool,
}

impl Rewrite {
    pub(super) fn push(&mut self, bytes: &[u8]) {
        if !self.omitting {
            self.buf.extend_from_slice(bytes);
        }
    }

    /// From here on, nothing written is kept (a call element began).
    pub(super) fn begin_omit(&mut self) {
        self.omitting = true;
    }

    /// Writing is kept again (the call element ended).
    pub(super) fn end_omit(&mut self) {
        self.omitting = false;
    }

    /// Marks where the call element `id` ended: here, after what was
    /// written of it (nothing, when it was left out).
    pub(super) fn mark(&mut self, id: u32) {
        let mark =
            Mark { id, at: self.buf.len(), after_open: self.open_at.is_some(), after_close: self.close_at.is_some() };
        self.marks.push(mark);
    }

    pub(super) fn push_tag(&mut self, spelling: &str, close: bool) {
        if self.omitting {
            return;
        }
        self.buf.push(b'<');
        if close {
            self.buf.push(b'/');
        }
        self.buf.extend_from_slice(spelling.as_bytes());
        self.buf.push(b'>');
    }

    pub(super) fn hold_open(&mut self) {
        self.open_at = Some(self.buf.len());
    }

    pub(super) fn hold_close(&mut self) {
        self.close_at = Some(self.buf.len());
    }

    /// The implicit lead's tag is known: `None` when it is written bare.
    pub(super) fn resolve(&mut self, spelling: Option<&str>) {
        let close = self.close_at.take();
        let open = self.open_at.take();
        let Some(s) = spelling else { return };
        if let Some(c) = close {
            let tag = format!("</{s}>");
            for m in &mut self.marks {
                if m.at > c || (m.at == c && m.after_close) {
                    m.at += tag.len();
                }
            }
            self.buf.splice(c..c, tag.into_bytes());
        }
        if let Some(o) = open {
            let tag = format!("<{s}>");
            for m in &mut self.marks {
                if m.at > o || (m.at == o && m.after_open) {
                    m.at += tag.len();
                }
            }
            self.buf.splice(o..o, tag.into_bytes());
        }
        for m in &mut self.marks {
            (m.after_open, m.after_close) = (false, false);
        }
    }

    pub(super) fn hold_raw(&mut self, raw: &[u8]) {
        if self.omitting {
            return;
        }
        self.held = Some(raw.to_vec());
    }

    pub(super) fn release_held(&mut self) {
        if let Some(h) = self.held.take() {
            self.buf.extend_from_slice(&h);
        }
    }

    pub(super) fn drop_held(&mut self) {
        self.held = None;
    }

    /// The bytes that are final; the marks among them are appended to
    /// `marks` (element id, offset in the bytes returned).
    pub(super) fn take(&mut self, marks: &mut Vec<(u32, usize)>) -> Vec<u8> {
        let upto = self.open_at.unwrap_or(self.buf.len());
        let out: Vec<u8> = self.buf.drain(..upto).collect();
        // A mark at the undecided open's place that came after it goes
        // behind the tag still to be inserted there: not final yet.
        let is_final = |m: &Mark| m.at < upto || (m.at == upto && !(self.open_at.is_some() && m.after_open));
        marks.extend(self.marks.iter().filter(|m| is_final(m)).map(|m| (m.id, m.at)));
        self.marks.retain(|m| !is_final(m));
        for m in &mut self.marks {
            m.at -= upto;
        }
        if let Some(o) = &mut self.open_at {
            *o -= upto;
        }
        if let Some(c) = &mut self.close_at {
            *c -= upto;
        }
        out
    }
}
