//! The parser: the scanner and the machine joined behind one `feed` /
//! `finish` pair. This is the type most users want; it owns no I/O and no
//! runtime, so it runs the same inside a proxy, a CLI or a test.

use crate::event::Event;
use crate::machine::{Machine, MachineLimits};
use crate::payload::Stage;
use crate::payload::html::FilterLimits;
use crate::registry::Registry;
use crate::scan::{ScanLimits, Scanner};
use std::sync::Arc;

/// Largest piece of a chunk read before its events move on.
const PIECE: usize = 16 * 1024;

/// Limits and switches for a [`Parser`]. Every limit bounds memory; past a
/// limit the parser degrades and says so in a `diagnostic` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ParserOptions {
    /// Marker and comment length limits (see [`ScanLimits`]).
    pub scan: ScanLimits,
    /// Element size limit (see [`MachineLimits`]).
    pub machine: MachineLimits,
    /// Limits of the content HTML filter (see [`FilterLimits`]).
    pub html: FilterLimits,
    /// Also build the corrected text, read with [`Parser::take_rewrite`].
    pub rewrite: bool,
    /// Whether tool-call elements stay in the corrected text (the default)
    /// or are left out of it (a proxy that turns them into native
    /// `tool_calls`); only with `rewrite`.
    pub call_text: CallText,
    /// When the typed payloads of completed elements are built: all as
    /// they complete (the default), or, for those that depend on the
    /// element alone, when the caller asks
    /// ([`crate::payload::build_deferred`]).
    pub payloads: crate::payload::Payloads,
}

/// What the corrected text does with tool-call elements (`tool_call`,
/// TAM, ACTION).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CallText {
    /// They stay, as written (with their repairs). A `<tool_call>` inside
    /// Markdown code is then text of the element it is in, and a TAM or
    /// ACTION block inside an open code block gets a `call_in_code_block`
    /// diagnostic: examples the model shows, not calls.
    #[default]
    Keep,
    /// They are left out, with the code fences dropped around them: the
    /// corrected text is the answer without its calls. A call inside an
    /// open Markdown code block (an example the model shows) is not a
    /// call to leave out: it stays, and a `call_in_code_block` diagnostic
    /// names its element.
    Omit,
}

/// An incremental, fault-tolerant parser for one response (one choice of a
/// streamed completion).
///
/// Feed it chunks as they arrive, split anywhere (inside a tag, inside a
/// UTF-8 character); it returns the events that became certain. Joining
/// adjacent deltas of one element, the events do not depend on how the input
/// was split.
///
/// A parser is `Send` (a stream's task may move between threads) but not
/// `Sync` or `Clone`: one stream, one parser, driven by one task at a time
/// (its incremental HTML filter holds state that is not shareable). Share
/// the [`Registry`] instead (`Arc<Registry>`, see [`Parser::with_options`]).
///
/// ```
/// use spindle::{Event, Parser, Registry};
///
/// let mut parser = Parser::new(Registry::filament());
/// let mut events = Vec::new();
/// for chunk in ["Let me th", "ink.</thou", "ght>\n<content>Hi", "!</content>"] {
///     events.extend(parser.feed(chunk.as_bytes()));
/// }
/// events.extend(parser.finish());
///
/// let elements: Vec<(&str, &str)> = events
///     .iter()
///     .filter_map(Event::as_element)
///     .map(|e| (&*e.tag, e.text.as_str()))
///     .collect();
/// assert_eq!(elements, [("thought", "Let me think."), ("content", "Hi!")]);
/// ```
#[derive(Debug)]
pub struct Parser {
    scanner: Scanner,
    machine: Machine,
    stage: Stage,
    /// The event buffer of [`Parser::feed_with`], kept between calls (a
    /// small one: see [`BATCH_KEPT`]) so that a delta-sized feed does not
    /// allocate one.
    batch: Vec<Event>,
}

/// Largest event buffer capacity [`Parser::feed_with`] keeps between calls:
/// enough for the few events of a streamed delta, not a large chunk's.
const BATCH_KEPT: usize = 16;

impl Parser {
    /// A parser with default limits.
    pub fn new(registry: Registry) -> Parser {
        Parser::with_options(Arc::new(registry), ParserOptions::default())
    }

    /// A parser sharing `registry`, with explicit options.
    pub fn with_options(registry: Arc<Registry>, options: ParserOptions) -> Parser {
        let mut machine = Machine::new(registry.clone(), options.machine);
        if options.rewrite {
            machine.enable_rewrite();
            if options.call_text == CallText::Omit {
                machine.omit_calls();
            }
        }
        Parser {
            scanner: Scanner::new(options.scan),
            machine,
            stage: Stage::new(registry, options.machine.max_element_len, options.html, options.payloads),
            batch: Vec::new(),
        }
    }

    /// Parses one chunk and returns the events it made certain.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<Event> {
        let mut out = Vec::new();
        self.feed_into(chunk, &mut out);
        out
    }

    /// Like [`Parser::feed`], appending to `out` (no allocation per call).
    pub fn feed_into(&mut self, chunk: &[u8], out: &mut Vec<Event>) {
        let Ok(()) = self.feed_pieces::<std::convert::Infallible>(chunk, out, |_| Ok(()));
    }

    /// Like [`Parser::feed_into`], but hands the events to `each` in batches
    /// as they become certain (every 16 KiB of a large chunk) instead of
    /// collecting all of them: a whole file fed at once need not hold all
    /// of its events. The events, joined, are those of
    /// [`Parser::feed_into`].
    ///
    /// ```
    /// use spindle::{Event, Parser, Registry};
    /// let mut parser = Parser::new(Registry::filament());
    /// let text = "<content>".to_string() + &"word ".repeat(10_000) + "</content>";
    /// let (mut batches, mut streamed) = (0, 0);
    /// parser
    ///     .feed_with(text.as_bytes(), |events| {
    ///         batches += 1;
    ///         for event in events {
    ///             if let Event::Delta(d) = event {
    ///                 streamed += d.text.len();
    ///             }
    ///         }
    ///         Ok::<(), std::io::Error>(())
    ///     })
    ///     .unwrap();
    /// assert_eq!(streamed, 50_000);
    /// assert!(batches > 1);
    /// ```
    ///
    /// # Errors
    ///
    /// The first error of `each`; the parser then stops reading the chunk
    /// ([`Parser::offset`] says how far it got).
    pub fn feed_with<E>(&mut self, chunk: &[u8], mut each: impl FnMut(&[Event]) -> Result<(), E>) -> Result<(), E> {
        let mut batch = std::mem::take(&mut self.batch);
        let done = self.feed_pieces(chunk, &mut batch, |events| {
            let done = each(events);
            events.clear();
            done
        });
        batch.clear();
        if batch.capacity() <= BATCH_KEPT {
            self.batch = batch;
        }
        done
    }

    /// Reads `chunk` in pieces, each piece's events processed into `out`
    /// and handed to `each` before the next piece: the machine's event
    /// buffer stays small and warm instead of growing to a whole large
    /// chunk's events.
    fn feed_pieces<E>(
        &mut self,
        chunk: &[u8],
        out: &mut Vec<Event>,
        mut each: impl FnMut(&mut Vec<Event>) -> Result<(), E>,
    ) -> Result<(), E> {
        // The common streamed delta, plain text (no `<`, no backtick)
        // inside an element that streams, the short way (the same events).
        if chunk.len() <= PIECE
            && self.scanner.is_idle()
            && crate::scan::find_byte2(b'<', b'`', chunk).is_none()
            && self.machine.plain_text(chunk)
        {
            self.scanner.pass_text(chunk.len());
            let (events, tags) = self.machine.drain();
            self.stage.process(events, tags, out);
            return each(out);
        }
        // Every piece but the last hands on its events; pending text waits
        // for the last (a streamed delta is one piece, with no iterator).
        let mut rest = chunk;
        loop {
            let (piece, tail) = rest.split_at(rest.len().min(PIECE));
            self.scanner.feed(piece, &mut self.machine);
            if tail.is_empty() {
                break;
            }
            let (events, tags) = self.machine.events();
            self.stage.process(events, tags, out);
            each(out)?;
            rest = tail;
        }
        let (events, tags) = self.machine.drain();
        self.stage.process(events, tags, out);
        each(out)
    }

    /// Ends the input: closes what is open, settles pending decisions, and
    /// returns the last events (including end-of-response diagnostics).
    pub fn finish(self) -> Vec<Event> {
        self.finish_with_rewrite().0
    }

    /// Like [`Parser::finish`], appending to `out`.
    pub fn finish_into(self, out: &mut Vec<Event>) {
        out.extend(self.finish());
    }

    /// Ends the input and also returns the rest of the corrected text.
    pub fn finish_with_rewrite(self) -> (Vec<Event>, Vec<u8>) {
        self.finish_with_rewrite_marked(&mut Vec::new())
    }

    /// [`Parser::finish_with_rewrite`], and where call elements ended in
    /// the rest of it, as [`Parser::take_rewrite_marked`] gives them.
    #[cfg_attr(not(feature = "sources"), allow(dead_code))]
    pub(crate) fn finish_with_rewrite_marked(mut self, marks: &mut Vec<(u32, usize)>) -> (Vec<Event>, Vec<u8>) {
        self.scanner.finish(&mut self.machine);
        self.machine.finish(self.scanner.offset());
        let mut out = Vec::new();
        let (events, tags) = self.machine.drain();
        self.stage.process(events, tags, &mut out);
        // Every element ended with its events: the stage took every tag.
        debug_assert!(tags.is_empty(), "tags the stage never took: {tags:?}");
        let rest = self.machine.take_rewrite_marked(marks);
        (out, rest)
    }

    /// The corrected text that is final so far (only with
    /// [`ParserOptions::rewrite`]; empty otherwise).
    pub fn take_rewrite(&mut self) -> Vec<u8> {
        self.machine.take_rewrite()
    }

    /// [`Parser::take_rewrite`], and, when call text is left out
    /// ([`crate::CallText::Omit`]), where each call element ended in it:
    /// (element id, byte offset in the bytes returned), appended to
    /// `marks`. The proxy puts the observations of calls it does not send
    /// there.
    #[cfg_attr(not(feature = "sources"), allow(dead_code))]
    pub(crate) fn take_rewrite_marked(&mut self, marks: &mut Vec<(u32, usize)>) -> Vec<u8> {
        self.machine.take_rewrite_marked(marks)
    }

    /// Bytes fed so far.
    pub fn offset(&self) -> usize {
        self.scanner.offset()
    }

    /// Bytes the parser holds for undecided structure (a marker, an
    /// element's text, queued events); for memory tests.
    pub fn held_bytes(&self) -> usize {
        self.scanner.held_capacity() + self.machine.held_bytes()
    }
}

/// Parses a whole response at once.
///
/// ```
/// let events = spindle::parse(spindle::Registry::reasoning(), b"Hmm.</think>42");
/// let tags: Vec<_> = events.iter().filter_map(|e| e.as_element()).map(|e| &*e.tag).collect();
/// assert_eq!(tags, ["thought", "content"]);
/// ```
pub fn parse(registry: Registry, input: &[u8]) -> Vec<Event> {
    let mut parser = Parser::new(registry);
    let mut events = parser.feed(input);
    events.extend(parser.finish());
    events
}
