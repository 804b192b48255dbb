//! spindle turns the text stream of a language model into structured,
//! repaired events **while it is still arriving**: what is thinking, what is
//! the answer, which state changes and tool calls the model asked for.
//!
//! Models break structure all the time: a missing `<think>`, a tag never
//! closed, `</content><content>` splits, JSON with trailing commas, output cut
//! at `max_tokens`. spindle is an incremental, byte-level, fault-tolerant state
//! machine, driven by an expected-structure [`Registry`], that repairs this as
//! the bytes arrive, announces every repair, and completes each element the
//! moment it ends.
//!
//! # Table of contents
//!
//! * [Example: parse a stream](#example-parse-a-stream)
//! * [Example: a custom registry](#example-a-custom-registry)
//! * [Which layer to use](#which-layer-to-use)
//! * [Guarantees](#guarantees)
//!
//! # Example: parse a stream
//!
//! Feed chunks as they arrive — split anywhere, even inside a tag or a UTF-8
//! character — and act on events as they come:
//!
//! ```
//! use spindle::{Event, Parser, Registry};
//! use spindle::event::RepairKind;
//!
//! let mut parser = Parser::new(Registry::filament());
//! let mut events = Vec::new();
//! // A DeepSeek-style response: the opening <thought> is missing, and the
//! // answer is split in two <content> parts.
//! for chunk in ["I should gr", "eet them.</thought>\n<con", "tent>Hello</content>\n<content>, friend!</content>"] {
//!     events.extend(parser.feed(chunk.as_bytes()));
//! }
//! events.extend(parser.finish());
//!
//! let elements: Vec<(&str, &str)> =
//!     events.iter().filter_map(Event::as_element).map(|e| (&*e.tag, e.text.as_str())).collect();
//! assert_eq!(elements, [("thought", "I should greet them."), ("content", "Hello, friend!")]);
//!
//! let repairs: Vec<RepairKind> =
//!     events.iter().filter_map(|e| match e { Event::Repair(r) => Some(r.kind), _ => None }).collect();
//! assert_eq!(repairs, [RepairKind::HeaderInserted, RepairKind::MergedAdjacent]);
//! ```
//!
//! # Example: a custom registry
//!
//! ```
//! use spindle::{Registry, parse};
//!
//! let registry = Registry::from_toml_str(r#"
//!     extends = "filament"
//!     [[tag]]
//!     name = "status_block"
//!     aliases = ["StatusBlock"]
//!     body = "structured"
//! "#).unwrap();
//! let events = parse(registry, b"<content>Hi</content><StatusBlock><hp>3</hp></StatusBlock>");
//! let tags: Vec<_> = events.iter().filter_map(|e| e.as_element()).map(|e| e.tag.to_string()).collect();
//! assert_eq!(tags, ["content", "status_block"]);
//! ```
//!
//! # Which layer to use
//!
//! | you have | use |
//! | --- | --- |
//! | bytes of one response, in any chunks | [`Parser`] (`feed` / `finish`), or [`parse`] for a whole buffer |
//! | events, and handlers that should run as elements complete | `route::Router` (feature `route`) |
//! | a streamed OpenAI-compatible chat completion | `sources` (feature `sources`) |
//! | tool calls written as TAM, ACTION or ATTP | [`calls`] (payloads arrive on the element events) |
//! | only the tokens (tags, text runs), no structure | [`scan::Scanner`] |
//!
//! The types these layers hand you are re-exported at the crate root
//! ([`Event`] and its parts, [`ToolCall`], [`ToolCatalog`], and with their
//! features the router, source and tool-runner types); the modules hold
//! the rest of each layer's surface.
//!
//! The core ([`scan`], the state machine behind [`Parser`], [`payload`]) is synchronous and owns no
//! I/O; everything async is built on top of it, so the core runs the same in
//! a proxy, a CLI, a test or a benchmark.
//!
//! # Cargo features
//!
//! The default, `cli` and `mimalloc`, turns on everything (the `spindle`
//! binary, every layer, and mimalloc as the binary's allocator). With `default-features = false` the crate is the sans-IO core
//! alone: [`scan`], [`Parser`], [`registry`], [`payload`], [`calls`],
//! [`state`] and [`event`], with no async runtime and no HTTP crate. Add the
//! layers you need:
//!
//! | feature | adds | pulls in |
//! | --- | --- | --- |
//! | `sources` | `sources`: SSE and chat-completions stream decoding, `EventStream` | futures, bytes, tokio (`time`, `macros`) |
//! | `client` | `sources::ChatClient` | `sources`, reqwest (with its default TLS: rustls on aws-lc-rs, which builds C with cmake), tokio |
//! | `route` | `route`: handlers for completed elements | tokio (`rt`, `sync`, `time`, `macros`), tokio-stream, tokio-util, futures, tracing |
//! | `tools` | `tools`: manuals, the runner (scripts, MCP), the agent loop | `client`, tokio (`process`, `io-util`), rmcp, nix |
//! | `proxy` | `proxy`: the OpenAI-compatible proxy and its sinks | `tools`, tokio (`net`, `fs`, `signal`), axum, async-nats |
//! | `prompt` | `prompt`: Skein blocks, world books, cards, sandboxed Jinja2, `<use_protocol>` registries | minijinja, png, chrono |
//! | `mock` | `mock`: the mock upstream (test support) | axum |
//! | `cli` | the `spindle` binary | all of the above, all of tokio, clap |
//! | `mimalloc` | mimalloc as the binary's (and examples') allocator, through its C entry points (the binary's only `unsafe` code); the library never sets one and forbids `unsafe` | libmimalloc-sys (C) |
//!
//! # Guarantees
//!
//! * **Split invariance**: any split of the input gives the same events once
//!   adjacent deltas of one element are joined ([`event::coalesce`]).
//! * **Linear time**: each byte is examined at most twice; nothing already
//!   released is re-scanned.
//! * **Bounded memory**: [`ParserOptions`] limits the longest marker, comment
//!   and element; past a limit the parser degrades and emits a diagnostic.
//! * **Nothing lost, nothing invented silently**: every input byte is in some
//!   event, and every byte the parser adds or drops is announced by a
//!   [`event::Repair`].
//! * **No panics** on any input (fuzzed; see `fuzz/`).
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![warn(missing_debug_implementations, rust_2018_idioms, unreachable_pub)]
#![doc(test(attr(deny(warnings))))]

pub mod calls;
#[cfg(any(feature = "sources", feature = "route", feature = "prompt"))]
mod chain;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod check;
pub mod event;
mod jsonl;
mod machine;
#[cfg(feature = "mock")]
#[cfg_attr(docsrs, doc(cfg(feature = "mock")))]
pub mod mock;
mod parser;
pub mod payload;
#[cfg(feature = "prompt")]
#[cfg_attr(docsrs, doc(cfg(feature = "prompt")))]
pub mod prompt;
#[cfg(feature = "proxy")]
#[cfg_attr(docsrs, doc(cfg(feature = "proxy")))]
pub mod proxy;
pub mod registry;
#[cfg(feature = "route")]
#[cfg_attr(docsrs, doc(cfg(feature = "route")))]
pub mod route;
pub mod scan;
mod shape;
#[cfg(feature = "sources")]
#[cfg_attr(docsrs, doc(cfg(feature = "sources")))]
pub mod sources;
pub mod state;
#[cfg(feature = "tools")]
#[cfg_attr(docsrs, doc(cfg(feature = "tools")))]
pub mod tools;

// The facade: the types a user of each layer needs, at the crate root.
pub use calls::{CallFormat, ToolCall, ToolCatalog, ToolDef};
pub use event::{
    AttrMap, CallDelta, Close, Comment, Delta, Diagnostic, DiagnosticCode, Element, Event, Gap, Level, Open, Repair,
    RepairKind, TagName,
};
pub use jsonl::JsonLines;
pub use machine::MachineLimits;
pub use parser::{CallText, Parser, ParserOptions, parse};
pub use payload::Payloads;
pub use payload::html::{CodeMarkup, FilterLimits};
pub use registry::Registry;
#[cfg(feature = "route")]
pub use route::{Router, RouterOptions, SubscribeOptions, Subscription, Topic};
pub use scan::{ScanLimits, Span};
#[cfg(feature = "client")]
pub use sources::ChatClient;
#[cfg(feature = "sources")]
pub use sources::{ChatStream, EventStream, LineTap, SourceEvent, SseDecoder, StreamOptions, StreamTap};
#[cfg(feature = "tools")]
pub use tools::{Protocol, Runner, RunnerOptions, ToolResult};

/// The README's Rust examples, compiled and run as doctests so that they
/// cannot drift from the API.
#[cfg(all(doctest, feature = "cli"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
