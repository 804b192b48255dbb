//! The prompt side of Filament (spec 003 §2): what the model is told,
//! before the parser reads what it writes.
//!
//! This layer owns the input-side formats: Skein blocks (XML tags holding
//! 2-space YAML, [`Skein`]), world-book normalisation ([`normalize_entry`]),
//! SillyTavern character cards and world info ([`import`]), the sandboxed
//! Jinja2 renderer ([`Renderer`]), the SillyTavern macro migration
//! ([`migrate`]) and the `<use_protocol>` declarations that build the
//! response's expected-structure registry ([`registry_for`]). It renders
//! text and reads files the caller names; it must not write the variable
//! state (templates see `state` read-only) and does no I/O of its own
//! beyond reading what it is handed. Synchronous, feature `prompt`.

mod card;
mod migrate;
mod skein;
mod template;
mod worldbook;
mod yaml;

pub use crate::registry::{PROTOCOLS, ProtocolRegistry, declared_protocols, registry_for};
pub use card::{CardError, Imported, import, import_bytes};
pub use migrate::{Migration, MigrationNote, NoteKind, migrate};
pub use skein::{Block, Skein};
pub use template::{GlobalWrite, RenderError, RenderLimits, Rendered, Renderer};
pub use worldbook::{EntryFormat, Normalized, normalize_entry};
pub use yaml::{YamlError, from_yaml, to_yaml};
