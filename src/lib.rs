//! spindle: an incremental, fault-tolerant parser for the structured text
//! that language models stream.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(missing_debug_implementations, rust_2018_idioms, unreachable_pub)]

pub mod calls;
pub mod event;
pub mod machine;
mod parser;
pub mod payload;
pub mod registry;
pub mod scan;
pub mod sources;

pub use event::Event;
pub use parser::{Parser, ParserOptions, parse};
pub use registry::Registry;
