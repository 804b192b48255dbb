//! The async adapter: any body stream of bytes (a `reqwest::Response`, a
//! hyper body, a test stream) in, a [`Stream`] of [`SourceEvent`]s out.
//!
//! This module owns the polling, the optional idle timeout, and the choice
//! between an SSE body and a whole JSON body; all parsing is the
//! synchronous [`StreamTap`] / [`ChatStream`]. Errors reading the body are
//! not `Err` items: they become a `stream_error` event (origin `transport`)
//! followed by `truncated`, so a stream never ends silently clean.
//!
//! # Example
//!
//! ```
//! use futures::StreamExt;
//! use spindle::sources::{EventStream, StreamOptions};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let reads = vec![
//!     Ok::<_, std::io::Error>(bytes::Bytes::from("data: {\"choices\":[{\"delta\":{\"content\":\"<think>hm</think>42\"}")),
//!     Ok(bytes::Bytes::from(",\"finish_reason\":\"stop\",\"index\":0}]}\n\ndata: [DONE]\n\n")),
//! ];
//! let mut events = EventStream::sse(futures::stream::iter(reads), StreamOptions::default());
//! let mut elements = Vec::new();
//! while let Some(event) = events.next().await {
//!     if let Some(el) = event.as_element() {
//!         elements.push((el.tag.to_string(), el.text.clone()));
//!     }
//! }
//! assert_eq!(elements, [("thought".to_string(), "hm".to_string()), ("content".to_string(), "42".to_string())]);
//! # }
//! ```

use super::events::SourceEvent;
use super::lines::LineTap;
use super::model::{ChatStream, Framing, StreamOptions};
use super::tap::StreamTap;
use crate::event::DiagnosticCode;
use crate::event::{Diagnostic, Level};
use bytes::Bytes;
use futures::Stream;
use std::collections::VecDeque;
use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// A boxed error from a body stream.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, BoxError>> + Send>>;

/// A reader of a body of chunks: the SSE tap and the JSON-lines tap, read
/// alike by [`EventStream`].
trait ChunkReader: std::fmt::Debug + Send {
    fn feed_into(&mut self, bytes: &[u8], out: &mut Vec<SourceEvent>);
    fn transport_error(&mut self, message: &str, out: &mut Vec<SourceEvent>);
    fn finish_into(self: Box<Self>, out: &mut Vec<SourceEvent>);
}

impl ChunkReader for StreamTap {
    fn feed_into(&mut self, bytes: &[u8], out: &mut Vec<SourceEvent>) {
        StreamTap::feed_into(self, bytes, out);
    }
    fn transport_error(&mut self, message: &str, out: &mut Vec<SourceEvent>) {
        StreamTap::transport_error(self, message, out);
    }
    fn finish_into(self: Box<Self>, out: &mut Vec<SourceEvent>) {
        StreamTap::finish_into(*self, out);
    }
}

impl ChunkReader for LineTap {
    fn feed_into(&mut self, bytes: &[u8], out: &mut Vec<SourceEvent>) {
        LineTap::feed_into(self, bytes, out);
    }
    fn transport_error(&mut self, message: &str, out: &mut Vec<SourceEvent>) {
        LineTap::transport_error(self, message, out);
    }
    fn finish_into(self: Box<Self>, out: &mut Vec<SourceEvent>) {
        LineTap::finish_into(*self, out);
    }
}

/// How the body is read.
#[derive(Debug)]
enum Body {
    /// Chunks: `text/event-stream`, or one JSON chunk per line
    /// (`application/x-ndjson`).
    Chunks(Box<dyn ChunkReader>),
    /// One JSON document (a non-streamed response), buffered up to a limit.
    Json { buf: Vec<u8>, limit: usize, overflowed: bool, options: Box<StreamOptions> },
    /// Finished.
    Done,
}

/// A [`Stream`] of [`SourceEvent`]s read from a body of bytes.
///
/// # Cancel safety
///
/// All state lives in the `EventStream`, not in the future returned by
/// `next()`: dropping that future (a `tokio::select!` branch that lost)
/// loses no event and no byte, and the next `next()` continues where the
/// last one stopped. Dropping the `EventStream` drops the body, which for a
/// `reqwest::Response` closes the connection and so cancels the upstream
/// request.
pub struct EventStream {
    body: Option<ByteStream>,
    reader: Body,
    queue: VecDeque<SourceEvent>,
    idle: Option<Duration>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    bytes: u64,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream")
            .field("reader", &self.reader)
            .field("queued", &self.queue.len())
            .field("idle", &self.idle)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

fn boxed<S, E>(body: S) -> ByteStream
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: Into<BoxError> + 'static,
{
    use futures::TryStreamExt;
    Box::pin(body.map_err(Into::into))
}

impl EventStream {
    /// Reads an SSE body (`text/event-stream`) of chat-completion chunks.
    pub fn sse<S, E>(body: S, options: StreamOptions) -> EventStream
    where
        S: Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        EventStream::with_reader(boxed(body), Body::Chunks(Box::new(StreamTap::new(options))))
    }

    /// Reads a JSON-lines body (`application/x-ndjson`: one chunk per line,
    /// as Ollama's `/api/chat` sends them; see [`LineTap`]).
    pub fn ndjson<S, E>(body: S, options: StreamOptions) -> EventStream
    where
        S: Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        EventStream::with_reader(boxed(body), Body::Chunks(Box::new(LineTap::new(options))))
    }

    /// Reads a whole JSON response (`chat.completion`, or an error body):
    /// it is buffered (up to `options.sse.max_event_len` bytes) and parsed
    /// at the end.
    pub fn json<S, E>(body: S, mut options: StreamOptions) -> EventStream
    where
        S: Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        options.framing = Framing::Response;
        let limit = options.sse.max_event_len;
        EventStream::with_reader(
            boxed(body),
            Body::Json { buf: Vec::new(), limit, overflowed: false, options: Box::new(options) },
        )
    }

    /// Reads a `reqwest::Response`: SSE when its `Content-Type` is
    /// `text/event-stream`, JSON lines when it is `application/x-ndjson`
    /// (or `application/jsonl`), otherwise a whole JSON response. The
    /// status is not checked here (see [`super::ChatClient`], which does).
    #[cfg(feature = "client")]
    #[cfg_attr(docsrs, doc(cfg(feature = "client")))]
    pub fn from_response(response: reqwest::Response, options: StreamOptions) -> EventStream {
        let kind = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or_default().trim().to_ascii_lowercase())
            .unwrap_or_default();
        match kind.as_str() {
            "text/event-stream" => EventStream::sse(response.bytes_stream(), options),
            "application/x-ndjson" | "application/jsonl" | "application/json-lines" => {
                EventStream::ndjson(response.bytes_stream(), options)
            }
            _ => EventStream::json(response.bytes_stream(), options),
        }
    }

    /// Ends the stream with a transport error when no byte arrives for
    /// `timeout` (needs a tokio runtime with time enabled).
    pub fn with_idle_timeout(mut self, timeout: Duration) -> EventStream {
        self.idle = Some(timeout);
        self
    }

    /// Body bytes read so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes
    }

    fn with_reader(body: ByteStream, reader: Body) -> EventStream {
        EventStream { body: Some(body), reader, queue: VecDeque::new(), idle: None, timer: None, bytes: 0 }
    }

    fn feed(&mut self, bytes: &[u8]) {
        self.bytes += bytes.len() as u64;
        match &mut self.reader {
            Body::Chunks(tap) => {
                let mut out = Vec::new();
                tap.feed_into(bytes, &mut out);
                self.queue.extend(out);
            }
            Body::Json { buf, limit, overflowed, .. } => {
                if *overflowed {
                    return;
                }
                if buf.len() + bytes.len() > *limit {
                    *overflowed = true;
                    *buf = Vec::new();
                    self.queue.push_back(SourceEvent::Diagnostic(Diagnostic {
                        level: Level::Error,
                        code: DiagnosticCode::ResponseTooLarge,
                        tag: None,
                        element: None,
                        at: None,
                        message: format!("the JSON response is larger than {limit} bytes; it was not parsed"),
                    }));
                } else {
                    buf.extend_from_slice(bytes);
                }
            }
            Body::Done => {}
        }
    }

    fn finish(&mut self, transport_error: Option<String>) {
        self.body = None;
        self.timer = None;
        let mut out = Vec::new();
        match std::mem::replace(&mut self.reader, Body::Done) {
            Body::Chunks(mut tap) => {
                if let Some(message) = transport_error {
                    tap.transport_error(&message, &mut out);
                }
                tap.finish_into(&mut out);
            }
            Body::Json { buf, overflowed, options, .. } => {
                let mut stream = ChatStream::new(*options);
                if let Some(message) = transport_error {
                    stream.push_transport_error(&message, &mut out);
                } else if !overflowed {
                    stream.push_response(&buf, &mut out);
                }
                stream.finish_into(&mut out);
            }
            Body::Done => {}
        }
        self.queue.extend(out);
    }
}

impl Stream for EventStream {
    type Item = SourceEvent;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<SourceEvent>> {
        let this = self.get_mut();
        loop {
            if let Some(event) = this.queue.pop_front() {
                return Poll::Ready(Some(event));
            }
            let Some(body) = this.body.as_mut() else {
                return Poll::Ready(None);
            };
            match body.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(bytes))) => {
                    this.timer = None;
                    this.feed(&bytes);
                }
                Poll::Ready(Some(Err(e))) => {
                    let message = super::error_chain(&*e);
                    this.finish(Some(format!("reading the response body failed: {message}")));
                }
                Poll::Ready(None) => this.finish(None),
                Poll::Pending => {
                    let Some(idle) = this.idle else {
                        return Poll::Pending;
                    };
                    let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                    match timer.as_mut().poll(cx) {
                        Poll::Ready(()) => {
                            this.finish(Some(format!("no data from the server for {idle:?}")));
                        }
                        Poll::Pending => return Poll::Pending,
                    }
                }
            }
        }
    }
}
