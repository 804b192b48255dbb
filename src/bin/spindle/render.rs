//! Printing events: JSONL for programs, a coloured view for people, the
//! corrected text, or a summary.

use anyhow::Result;
use spindle::event::{Event, RepairKind};
use spindle::{JsonLines, Registry};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

/// How `spindle parse` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// One JSON object per event and line (the public contract).
    Jsonl,
    /// The corrected text: synthetic tags inserted, dropped markers removed.
    Rewrite,
    /// A readable, coloured view (colour only on a terminal, never with NO_COLOR).
    Pretty,
    /// Counts of elements, repairs and diagnostics, bytes and time.
    Summary,
}

const RESET: &str = "\x1b[0m";
const DIM: &str = "\x1b[2m";
const ITALIC_DIM: &str = "\x1b[2;3m";
const BOLD_CYAN: &str = "\x1b[1;36m";
const YELLOW: &str = "\x1b[33m";
const MAGENTA: &str = "\x1b[35m";
const GREEN: &str = "\x1b[32m";

/// Counts for `--format summary`.
#[derive(Debug, Default)]
struct Counts {
    elements: BTreeMap<String, usize>,
    /// `tool_result`, `tool_audit` and `tool_task` records (`--execute`).
    tools: BTreeMap<String, usize>,
    repairs: BTreeMap<&'static str, usize>,
    diagnostics: BTreeMap<&'static str, usize>,
    deltas: usize,
    comments: usize,
}

/// The output buffer: large enough that a busy stream of small JSON lines
/// costs few writes.
pub(crate) const OUT_BUFFER: usize = 64 * 1024;

/// Prints events in one [`Format`].
pub(crate) struct Renderer {
    format: Format,
    /// Plain stdout, except for `pretty`, where colour is stripped unless
    /// stdout is a terminal and NO_COLOR is unset. Never stripped for
    /// `rewrite`: its bytes must be exact.
    out: Box<dyn Write>,
    /// JSON lines not yet handed to `out` (serde_json's many small writes
    /// land in a `Vec`): up to [`OUT_BUFFER`] of them go in one write (a
    /// write per line cost as much as building it).
    lines: Vec<u8>,
    /// Writes the event lines (the serde form of each, written field by
    /// field; a run of deltas shares its line start).
    json: JsonLines,
    counts: Counts,
    /// The streaming element whose deltas are being printed (pretty).
    streaming: Option<u32>,
    /// The tag the streaming element's deltas come under.
    streaming_tag: Option<String>,
    stream_tags: Vec<String>,
    at_line_start: bool,
}

impl Renderer {
    pub(crate) fn new(format: Format, registry: &Registry) -> Renderer {
        let out: Box<dyn Write> = match format {
            Format::Pretty => Box::new(std::io::BufWriter::new(anstream::AutoStream::auto(std::io::stdout()))),
            // The line batch is the buffer: each batch of whole lines goes
            // to stdout in one write, not copied into a second buffer first.
            Format::Jsonl => Box::new(std::io::stdout()),
            Format::Rewrite | Format::Summary => {
                Box::new(std::io::BufWriter::with_capacity(OUT_BUFFER, std::io::stdout()))
            }
        };
        Renderer {
            format,
            out,
            // Room for a full batch and the line that passes the mark: the
            // buffer is not grown (and copied) on the way there.
            lines: if format == Format::Jsonl { Vec::with_capacity(2 * OUT_BUFFER) } else { Vec::new() },
            json: JsonLines::new(),
            counts: Counts::default(),
            streaming: None,
            streaming_tag: None,
            stream_tags: registry.tags().iter().filter(|t| t.body.emits_deltas()).map(|t| t.name.clone()).collect(),
            at_line_start: true,
        }
    }

    pub(crate) fn events(&mut self, events: &[Event]) -> Result<()> {
        for event in events {
            self.count(event);
            match self.format {
                Format::Jsonl => {
                    self.json.push(event, &mut self.lines);
                    if self.lines.len() >= OUT_BUFFER {
                        self.write_lines()?;
                    }
                }
                Format::Pretty => self.pretty(event)?,
                Format::Rewrite | Format::Summary => {}
            }
        }
        Ok(())
    }

    /// The format it prints.
    pub(crate) fn format(&self) -> Format {
        self.format
    }

    /// One event of a response stream as a JSON line (`jsonl` only: the
    /// other formats show a choice's parse).
    pub(crate) fn source_line(&mut self, event: &spindle::SourceEvent) -> Result<()> {
        if self.format == Format::Jsonl {
            serde_json::to_writer(&mut self.lines, event)?;
            self.lines.push(b'\n');
            if self.lines.len() >= OUT_BUFFER {
                self.write_lines()?;
            }
        }
        Ok(())
    }

    /// Writes out what is buffered (the caller decides when: after each
    /// read of a live input, not after each simulated chunk of a file).
    pub(crate) fn flush(&mut self) -> Result<()> {
        self.write_lines()?;
        self.out.flush()?;
        Ok(())
    }

    /// Hands the event lines built so far to `out`, before anything else
    /// is written there.
    fn write_lines(&mut self) -> Result<()> {
        if !self.lines.is_empty() {
            self.out.write_all(&self.lines)?;
            self.lines.clear();
        }
        Ok(())
    }

    /// A tool runtime record (`tool_result`, `tool_audit`, `tool_task`):
    /// one JSON line; in pretty, the observation on its own line.
    pub(crate) fn tool_line(&mut self, value: &serde_json::Value) -> Result<()> {
        let kind = value.get("type").and_then(serde_json::Value::as_str).unwrap_or_default();
        *self.counts.tools.entry(kind.to_string()).or_default() += 1;
        match self.format {
            Format::Jsonl => {
                serde_json::to_writer(&mut self.lines, value)?;
                self.lines.push(b'\n');
            }
            Format::Pretty if kind != "tool_audit" => {
                if !self.at_line_start {
                    self.out.write_all(b"\n")?;
                }
                let obs = value.get("observation").and_then(serde_json::Value::as_str).unwrap_or_default();
                let ms = value.get("duration_ms").and_then(serde_json::Value::as_u64).unwrap_or_default();
                let colour = if value.get("ok") == Some(&serde_json::Value::Bool(true)) { GREEN } else { YELLOW };
                writeln!(self.out, "{colour}[{kind} {ms} ms]{RESET} {obs}")?;
                self.at_line_start = true;
            }
            _ => {}
        }
        // Out at once, with the event lines before it: a tool result is
        // not held back.
        self.flush()
    }

    /// Whether [`Renderer::rewrite`] prints (only `--format rewrite`):
    /// otherwise the parser's corrected text need not be taken.
    pub(crate) fn wants_rewrite(&self) -> bool {
        self.format == Format::Rewrite
    }

    pub(crate) fn rewrite(&mut self, bytes: &[u8]) -> Result<()> {
        if self.wants_rewrite() && !bytes.is_empty() {
            self.out.write_all(bytes)?;
        }
        Ok(())
    }

    fn count(&mut self, event: &Event) {
        let c = &mut self.counts;
        match event {
            // Looked up by the borrowed name: a tag's name is allocated
            // once per run, not once per element.
            Event::Element(e) => match c.elements.get_mut(&*e.tag) {
                Some(n) => *n += 1,
                None => {
                    c.elements.insert(e.tag.to_string(), 1);
                }
            },
            Event::Repair(r) => *c.repairs.entry(r.kind.as_str()).or_default() += 1,
            Event::Diagnostic(d) => *c.diagnostics.entry(d.code.as_str()).or_default() += 1,
            Event::Delta(_) => c.deltas += 1,
            Event::Comment(_) => c.comments += 1,
            _ => {}
        }
    }

    fn newline_if_needed(&mut self) -> Result<()> {
        if !self.at_line_start {
            writeln!(self.out)?;
            self.at_line_start = true;
        }
        Ok(())
    }

    fn pretty(&mut self, event: &Event) -> Result<()> {
        match event {
            Event::Open(o) if self.stream_tags.iter().any(|t| **t == *o.tag) => {
                self.newline_if_needed()?;
                let mark = if o.synthetic { " (inserted)" } else { "" };
                writeln!(self.out, "{BOLD_CYAN}── {}{mark} ──{RESET}", o.tag)?;
                self.streaming = Some(o.id);
                self.streaming_tag = Some(o.tag.to_string());
            }
            Event::Delta(d) if self.streaming == Some(d.id) => {
                if self.streaming_tag.as_deref() != Some(&*d.tag) {
                    // Reclassified: the text comes again under its new tag.
                    self.newline_if_needed()?;
                    writeln!(self.out, "{BOLD_CYAN}── {} ──{RESET}", d.tag)?;
                    self.streaming_tag = Some(d.tag.to_string());
                }
                let style = if &*d.tag == "thought" { ITALIC_DIM } else { "" };
                write!(self.out, "{style}{}{RESET}", d.text)?;
                self.at_line_start = d.text.ends_with('\n');
            }
            Event::Delta(d) => {
                write!(self.out, "{DIM}{}{RESET}", d.text)?;
                self.at_line_start = d.text.ends_with('\n');
            }
            Event::Element(e) if self.streaming == Some(e.id) => {
                self.streaming = None;
                self.newline_if_needed()?;
                // The streamed (filtered) text was just shown; only what the
                // reader did not see is worth a line: hidden comments.
                if let Some(comments) = e.payload.get("comments").and_then(|c| c.as_array()).filter(|c| !c.is_empty()) {
                    for c in comments {
                        writeln!(self.out, "{DIM}   <!--{}-->{RESET}", c.as_str().unwrap_or_default())?;
                    }
                }
            }
            Event::Element(e) => {
                self.newline_if_needed()?;
                let attrs: String = e.attrs.iter().map(|(k, v)| format!(" {k}={v:?}")).collect();
                writeln!(self.out, "{BOLD_CYAN}◆ {}{attrs}{RESET}", e.tag)?;
                for line in e.text.trim_matches('\n').lines() {
                    writeln!(self.out, "  │ {line}")?;
                }
                if !e.payload.is_null() {
                    writeln!(self.out, "{GREEN}  payload: {}{RESET}", e.payload)?;
                }
            }
            Event::Repair(r) => {
                self.newline_if_needed()?;
                let tag = r.tag.as_deref().unwrap_or("-");
                let from = match (&r.from, r.kind) {
                    (Some(f), RepairKind::Reclassified) => format!(" (was {f})"),
                    (Some(f), _) => format!(" ({f})"),
                    _ => String::new(),
                };
                writeln!(self.out, "{YELLOW}⟲ {} {tag}{from} at byte {}{RESET}", r.kind.as_str(), r.at)?;
            }
            Event::Diagnostic(d) => {
                self.newline_if_needed()?;
                writeln!(self.out, "{MAGENTA}! {}: {}{RESET}", d.code, d.message)?;
            }
            _ => {}
        }
        Ok(())
    }

    pub(crate) fn finish(&mut self, bytes: usize, elapsed: Duration) -> Result<()> {
        self.write_lines()?;
        match self.format {
            Format::Pretty => self.newline_if_needed()?,
            Format::Summary => {
                let c = &self.counts;
                write_counts(&mut self.out, "elements", &c.elements)?;
                if !c.tools.is_empty() {
                    write_counts(&mut self.out, "tool records", &c.tools)?;
                }
                write_counts(&mut self.out, "repairs", &c.repairs)?;
                write_counts(&mut self.out, "diagnostics", &c.diagnostics)?;
                writeln!(self.out, "{:<12} {}", "deltas", c.deltas)?;
                writeln!(self.out, "{:<12} {}", "comments", c.comments)?;
                writeln!(self.out, "{:<12} {}", "bytes", bytes)?;
                let secs = elapsed.as_secs_f64();
                let rate = if secs > 0.0 { bytes as f64 / secs / 1e6 } else { 0.0 };
                writeln!(self.out, "{:<12} {:.3} ms ({rate:.1} MB/s)", "elapsed", secs * 1e3)?;
            }
            Format::Jsonl | Format::Rewrite => {}
        }
        self.out.flush()?;
        Ok(())
    }
}

impl Drop for Renderer {
    /// Lines of a run that ended early (an error) are still written, as
    /// the `BufWriter` under the other formats writes what it holds.
    fn drop(&mut self) {
        let _ = self.write_lines();
    }
}

fn write_counts<K: std::fmt::Display>(out: &mut impl Write, label: &str, map: &BTreeMap<K, usize>) -> Result<()> {
    let total: usize = map.values().sum();
    let detail: Vec<String> = map.iter().map(|(k, v)| format!("{k} {v}")).collect();
    if detail.is_empty() {
        writeln!(out, "{label:<12} {total}")?;
    } else {
        writeln!(out, "{label:<12} {total}  ({})", detail.join(", "))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use spindle::event::Delta;

    #[test]
    fn a_delta_line_is_the_serde_line() {
        let texts = ["word ", "", "quote \" back\\slash \n tab\t ctl\u{1} \u{7f} 雪 🎉", "</content>"];
        // One writer throughout: its line start is kept from delta to delta
        // of one element, and must change with the id or the tag.
        let mut json = JsonLines::new();
        for (i, text) in texts.iter().enumerate() {
            for tag in ["content", "content", "odd\"tag\\"] {
                let event = Event::Delta(Delta { id: i as u32 * 1000, tag: tag.into(), text: text.to_string() });
                let mut fast = Vec::new();
                json.push(&event, &mut fast);
                let mut serde = serde_json::to_vec(&event).unwrap_or_else(|e| panic!("{e}"));
                serde.push(b'\n');
                assert_eq!(String::from_utf8_lossy(&fast), String::from_utf8_lossy(&serde));
            }
        }
    }
}
