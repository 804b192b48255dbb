//! Sources (DESIGN §8): spindle on OpenAI-compatible chat-completion
//! streams, live or recorded.
//!
//! This module owns everything between bytes from a server (or a file)
//! and the parser: SSE framing, the meaning of chunk fields, the async
//! adapter, a small HTTP client and transcript replay. It must not change
//! how content is parsed (that is the parser's, driven by the registry the
//! caller picks) and never alters the bytes it is given.
//!
//! # Which type to use
//!
//! | you have | use | you get |
//! |---|---|---|
//! | a `reqwest::Response` or any `Stream<Item = Result<Bytes, E>>` | [`EventStream`] | an async `Stream` of [`SourceEvent`] |
//! | a base URL and an API key | [`ChatClient`] | an [`EventStream`] per request |
//! | raw SSE bytes in a proxy (forward them, parse on the side) | [`StreamTap`] | events per read; [`TapFrame`]s for rewriting |
//! | decoded SSE data or parsed chunks | [`ChatStream`] | events per chunk |
//! | a whole non-streamed response body | [`ChatStream::response_events`] | its events |
//! | SSE bytes and nothing else | [`SseDecoder`] | [`SseItem`]s |
//! | a recorded file | [`transcript`] | detection, replay, content check |
//!
//! # Events
//!
//! Every event of a choice's parse is a [`SourceEvent::Choice`] carrying
//! `choice` and [`Channel`]; reasoning deltas become a `thought` element,
//! refusals a `refusal` element, native tool calls a `tool_call` element
//! with payload `{"id","name","arguments"}`. Stream-level events: `finish`,
//! `usage`, `stream_error`, `truncated`, `content_filter`, `done`, and
//! `diagnostic`s about the stream itself.
//!
//! The default registry is the `chat` profile: a plain answer streams as
//! content with no repair, `<think>…</think>` inside content becomes a
//! thought, and bare text at the start closed by `</think>` (a chat
//! template that already wrote `<think>`) is reclassified as a thought.
//! Pick another profile with [`StreamOptions::with_registry`].
//!
//! # Example: wrap a response in a few lines
//!
//! ```no_run
//! use futures::StreamExt;
//! use spindle::sources::{EventStream, SourceEvent, StreamOptions};
//!
//! # #[allow(dead_code)]
//! # async fn run(response: reqwest::Response) {
//! let mut events = EventStream::from_response(response, StreamOptions::default());
//! while let Some(event) = events.next().await {
//!     match &event {
//!         SourceEvent::Choice(c) => println!("choice {}: {}", c.choice, c.event.type_name()),
//!         SourceEvent::Finish { choice, reason } => println!("choice {choice}: {}", reason.as_str()),
//!         SourceEvent::Truncated { why, .. } => eprintln!("cut off: {}", why.as_str()),
//!         _ => {}
//!     }
//! }
//! # }
//! ```

mod chunk;
#[cfg(feature = "client")]
mod client;
mod events;
mod lines;
mod model;
mod sse;
mod stream;
mod tap;
pub mod transcript;

pub use chunk::{ChatChunk, Choice, Content, Delta, FunctionDelta, Nullable, ToolCallDelta};
#[cfg(feature = "client")]
#[cfg_attr(docsrs, doc(cfg(feature = "client")))]
pub use client::{ChatClient, ClientError, ErrorSide};
#[cfg(feature = "tools")]
pub(crate) use client::{api_base, check_api_url};
pub use events::{Channel, ChoiceEvent, ErrorOrigin, FinishReason, SourceEvent, Truncation};
pub use lines::LineTap;
#[cfg_attr(not(feature = "proxy"), allow(unused_imports))]
pub(crate) use model::CallMark;
pub use model::{ChatStream, Framing, StreamOptions, StreamStats};
pub use sse::{SseDecoder, SseEvent, SseFault, SseItem, SseLimits};
pub use stream::{BoxError, EventStream};
#[cfg_attr(not(feature = "proxy"), allow(unused_imports))]
pub(crate) use tap::join_marked;
pub use tap::{StreamTap, TapEnd, TapFrame};

pub(crate) use crate::chain::error_chain;
