//! The expected-structure registry (DESIGN §3, spec 003 §11.2): which tags a
//! response may contain, how each one's body is read, and what the
//! corrector may assume (lead tag, default tag, mergeable tags, order).
//!
//! This module owns the data and its validation, the built-in profiles and
//! the file format. It must not look at input bytes: the machine asks it
//! questions ([`Registry::lookup`], [`Registry::lookup_marker`]) and acts on
//! the answers.
//!
//! # Example: a registry from a TOML file
//!
//! ```
//! use spindle::registry::{Registry, BodyKind};
//!
//! let registry = Registry::from_toml_str(r#"
//!     name = "rp"
//!     extends = "filament"
//!
//!     [[tag]]
//!     name = "status_block"
//!     aliases = ["StatusBlock"]
//!     body = "structured"
//!     after = ["content"]
//! "#).unwrap();
//! let id = registry.lookup(b"STATUSBLOCK").unwrap();
//! assert_eq!(registry.tag(id).name, "status_block");
//! assert_eq!(registry.tag(id).body, BodyKind::Structured);
//! ```

mod profiles;
mod protocols;

pub use protocols::{PROTOCOLS, ProtocolRegistry, declared_protocols, registry_for};

use crate::event::TagName;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// How an element's body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BodyKind {
    /// Text delivered as `delta` events while it arrives (thought, content).
    /// Non-registry tags inside are text (inline HTML).
    Stream,
    /// A JSON document, parsed when the element completes (tool_call,
    /// ui_component).
    Json,
    /// Child tags parsed into a tree when the element completes
    /// (variable_update, status_bar, choice, details).
    Structured,
    /// No body needed: `<media ... />` (a body, if written, is kept).
    Void,
    /// Verbatim text: only the element's own close tag ends it.
    Raw,
    /// A TAM block, `<|[REQUEST_TOOL]|> ... <|[END_TOOL]|>` (spec 000).
    Tam,
    /// An `<ACTION>` XML block (spec 004).
    Action,
    /// A whole-output ATTP TOML document (spec 001).
    Attp,
}

impl BodyKind {
    /// Whether the machine streams this body as `delta` events.
    pub fn emits_deltas(self) -> bool {
        matches!(self, BodyKind::Stream | BodyKind::Attp)
    }

    /// Whether the machine hands the body's text on as it arrives: the
    /// bodies that stream, and JSON bodies, whose tool calls stream their
    /// name and arguments ([`crate::calls::stream`]); the payload stage
    /// turns a JSON body's raw text into `call_delta` events or drops it.
    pub(crate) fn machine_deltas(self) -> bool {
        matches!(self, BodyKind::Stream | BodyKind::Attp | BodyKind::Json)
    }

    /// Whether only the element's own close can end it: other registry tags
    /// inside are text (a TAM value or an ACTION parameter may hold any
    /// markup).
    pub fn is_opaque(self) -> bool {
        matches!(self, BodyKind::Raw | BodyKind::Tam | BodyKind::Action | BodyKind::Attp)
    }
}

/// Index of a tag in its registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TagId(pub(crate) u16);

impl TagId {
    /// The position of the tag in [`Registry::tags`].
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// Special-marker delimiters for a tag written as `<|[OPEN]|> ... <|[CLOSE]|>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Markers {
    /// The name inside the opening marker, e.g. `REQUEST_TOOL`.
    pub open: String,
    /// The name inside the closing marker, e.g. `END_TOOL`.
    pub close: String,
}

/// Everything the registry says about one top-level tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagSpec {
    /// Canonical name, used in events (`tag`).
    pub name: String,
    /// How synthetic tags are written in rewritten output (`think` for the
    /// reasoning profile's thought).
    pub spelling: String,
    /// Other spellings that mean this tag (matched case-insensitively).
    pub aliases: Vec<String>,
    /// How the body is read.
    pub body: BodyKind,
    /// A response without this tag gets a `missing_mandatory` diagnostic.
    pub mandatory: bool,
    /// `</A>` + whitespace + `<A>` is one element.
    pub mergeable: bool,
    /// Written without tags in this profile (the reasoning profile's content,
    /// the free text around TAM blocks): opening or auto-closing it is not a
    /// repair, and rewritten output adds no tags for it.
    pub bare: bool,
    /// Tags that must appear before this one (order dependencies).
    pub after: Vec<TagId>,
    /// Registry tags that are children of this one rather than siblings.
    pub children: Vec<String>,
    /// Special markers that open and close this tag instead of `<name>`.
    pub markers: Option<Markers>,
    /// When the payload cannot be parsed even leniently, show the raw text
    /// as content (spec 003 §11.4).
    pub fallback_to_content: bool,
}

/// Who writes the open tag of the registry's lead (`<think>`).
///
/// Many chat templates (Qwen3 with thinking on, DeepSeek-R1-0528 and later,
/// QwQ, GLM-4.5, OLMo-3, Nemotron) end the prompt with `<think>`, so the
/// model's output begins inside the thought and may never close it (cut at
/// `max_tokens`, or still thinking). With [`LeadOpen::Template`] such output
/// is reported as the lead tag (with `closed_at_eof`), as vLLM, SGLang,
/// llama.cpp and Ollama report it; with [`LeadOpen::Model`] bare text at the
/// start is only *assumed* to be the lead and is reclassified as content
/// when nothing confirms it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LeadOpen {
    /// The model writes the lead's open tag itself; bare text at the start
    /// is a provisional lead (the default).
    #[default]
    Model,
    /// The chat template already wrote it: bare text at the start is the
    /// lead, whatever follows (registry files: `lead_prefilled = true`).
    Template,
}

/// Which end of a tag a special marker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerRole {
    /// `<|[REQUEST_TOOL]|>`
    Open,
    /// `<|[END_TOOL]|>`
    Close,
}

/// An expected-structure registry: the tags of one response and the rules
/// the corrector follows. Cheap to share behind an `Arc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    name: String,
    tags: Vec<TagSpec>,
    /// Lower-cased names and aliases, shortest first (declaration order
    /// within a length).
    names: Vec<(Vec<u8>, TagId)>,
    /// Where the names of each length start in `names`: those of length `n`
    /// are `names[by_len[n]..by_len[n + 1]]`. Every tag in the input is
    /// looked up; most lengths hold one or two names, so a lookup compares
    /// one or two instead of all.
    by_len: Vec<u32>,
    lead: Option<TagId>,
    default: Option<TagId>,
    lead_open: LeadOpen,
    /// Each tag's canonical name and spelling as event tag names, built
    /// once here rather than by every parser: the events of all streams
    /// share them (the spelling is the name's own string when they are the
    /// same).
    event_names: Vec<(TagName, TagName)>,
}

// The parse errors are in the message; they are not also `source()`, so a
// chain printer shows each cause once.
impl From<toml::de::Error> for RegistryError {
    fn from(e: toml::de::Error) -> Self {
        RegistryError::Toml(e)
    }
}

impl From<serde_json::Error> for RegistryError {
    fn from(e: serde_json::Error) -> Self {
        RegistryError::Json(e)
    }
}

/// Why a registry could not be built or loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The file could not be read.
    #[error("cannot read registry file {path}")]
    Io {
        /// The file.
        path: String,
        /// The cause (the error's `source`).
        #[source]
        cause: std::io::Error,
    },
    /// The TOML did not parse or did not fit the schema.
    #[error("registry TOML is invalid: {0}")]
    Toml(toml::de::Error),
    /// The JSON did not parse or did not fit the schema.
    #[error("registry JSON is invalid: {0}")]
    Json(serde_json::Error),
    /// `extends` names no built-in profile.
    #[error("unknown profile {0:?} (known: {known})", known = Registry::profile_names().join(", "))]
    UnknownProfile(String),
    /// A tag name or alias is empty or not a valid tag name.
    #[error("invalid tag name {0:?}: names start with a letter or '_' and hold letters, digits, '_', '-', '.', ':'")]
    InvalidName(String),
    /// Two tags claim the same name or alias.
    #[error("tag name {0:?} is used twice")]
    Duplicate(String),
    /// `lead`, `default`, `after` or `without` names a tag that is not
    /// declared.
    #[error("{field} names unknown tag {name:?}")]
    UnknownTag {
        /// Which field.
        field: &'static str,
        /// The name it gave.
        name: String,
    },
    /// More tags than the machine can index.
    #[error("too many tags ({0}); the limit is 65535")]
    TooMany(usize),
    /// A tag's special marker can never be read as its tag says.
    #[error("tag {tag:?}: special marker {name:?} {why}")]
    InvalidMarker {
        /// The tag.
        tag: String,
        /// The marker name as given.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// `without` removed a tag that the profile's `lead` or `default`
    /// names, and the file does not name another.
    #[error(
        "`without` removes {name:?}, which the profile's {field} names; set {field} to another tag, or to \"\" for none"
    )]
    RemovedTag {
        /// `lead` or `default`.
        field: &'static str,
        /// The removed tag.
        name: String,
    },
    /// `lead_prefilled = true` in a registry that has no lead tag.
    #[error("lead_prefilled = true needs a lead tag (set lead)")]
    PrefilledWithoutLead,
}

/// The on-disk form of a registry (TOML or JSON). Every field but the tag
/// name has a default, so a file states only what differs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryFile {
    /// A name for the registry (shown in summaries).
    #[serde(default)]
    pub name: Option<String>,
    /// Start from a built-in profile; tags below add to it or replace its
    /// tags of the same name.
    #[serde(default)]
    pub extends: Option<String>,
    /// The tag assumed when the output starts with bare text (`""`: none,
    /// also when the profile `extends` gives one).
    #[serde(default)]
    pub lead: Option<String>,
    /// The tag opened by bare text between elements (`""`: none). Without
    /// one, that text is reported as `gap` events (it belongs to no
    /// element).
    #[serde(default)]
    pub default: Option<String>,
    /// The chat template already wrote the lead's open tag (`<think>`
    /// prefilled by Qwen3, DeepSeek-R1-0528, QwQ, GLM-4.5 templates): output
    /// that starts with bare text is inside the lead, and stays the lead
    /// even when it never closes (see [`LeadOpen::Template`]). Default
    /// `false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lead_prefilled: Option<bool>,
    /// Names of inherited tags to leave out (with `extends`): `without =
    /// ["tam", "action"]` turns off the tool-call blocks of `filament`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub without: Vec<String>,
    /// The tags.
    #[serde(default, rename = "tag", alias = "tags")]
    pub tags: Vec<TagFile>,
}

/// One tag in a [`RegistryFile`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TagFile {
    /// Canonical name.
    pub name: String,
    /// Spelling for synthetic tags; defaults to the name.
    #[serde(default)]
    pub spelling: Option<String>,
    /// Other spellings.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Body kind; defaults to `stream`.
    #[serde(default = "default_body")]
    pub body: BodyKind,
    /// See [`TagSpec::mandatory`].
    #[serde(default)]
    pub mandatory: bool,
    /// See [`TagSpec::mergeable`].
    #[serde(default)]
    pub mergeable: bool,
    /// See [`TagSpec::bare`].
    #[serde(default)]
    pub bare: bool,
    /// Names of tags that must come first.
    #[serde(default)]
    pub after: Vec<String>,
    /// See [`TagSpec::children`].
    #[serde(default)]
    pub children: Vec<String>,
    /// See [`TagSpec::markers`].
    #[serde(default)]
    pub markers: Option<Markers>,
    /// See [`TagSpec::fallback_to_content`].
    #[serde(default)]
    pub fallback_to_content: bool,
}

fn default_body() -> BodyKind {
    BodyKind::Stream
}

impl TagFile {
    /// A tag with every optional field at its default.
    pub fn new(name: &str, body: BodyKind) -> TagFile {
        TagFile {
            name: name.to_string(),
            spelling: None,
            aliases: Vec::new(),
            body,
            mandatory: false,
            mergeable: false,
            bare: false,
            after: Vec::new(),
            children: Vec::new(),
            markers: None,
            fallback_to_content: false,
        }
    }
}

fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty() && crate::scan::is_name_start(b[0]) && b.iter().all(|&c| crate::scan::is_name_char(c))
}

/// Every special marker can be read as its tag says: a name the scanner
/// reads inside `<|[...]|>`, an open apart from the close, and no marker
/// claimed by two tags (the first would always win).
fn check_markers(tags: &[TagFile]) -> Result<(), RegistryError> {
    let invalid = |tag: &TagFile, name: &str, why| RegistryError::InvalidMarker {
        tag: tag.name.clone(),
        name: name.to_string(),
        why,
    };
    let mut seen: Vec<&str> = Vec::new();
    for tag in tags {
        let Some(m) = &tag.markers else { continue };
        for name in [&m.open, &m.close] {
            let ok = !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
            if !ok {
                return Err(invalid(tag, name, "must be non-empty and hold only letters, digits, '_', '-', '.', ':'"));
            }
            if seen.iter().any(|s| marker_eq(s.as_bytes(), name.as_bytes())) {
                return Err(invalid(tag, name, "is named twice (every open and close marker must be distinct)"));
            }
            seen.push(name);
        }
    }
    Ok(())
}

impl Registry {
    /// Builds and validates a registry from its file form.
    ///
    /// # Errors
    ///
    /// [`RegistryError`] when a name is invalid or used twice, when `lead`,
    /// `default` or `after` name an undeclared tag (or one `without`
    /// removed), when `extends` names no built-in profile, when a special
    /// marker is empty, holds characters a marker cannot, or is named twice,
    /// or when `lead_prefilled` is set without a lead.
    pub fn from_file_spec(file: RegistryFile) -> Result<Registry, RegistryError> {
        let mut merged = match &file.extends {
            Some(base) => profiles::file_spec(base).ok_or_else(|| RegistryError::UnknownProfile(base.clone()))?,
            None => RegistryFile::default(),
        };
        for name in &file.without {
            let before = merged.tags.len();
            merged.tags.retain(|t| !t.name.eq_ignore_ascii_case(name));
            if merged.tags.len() == before {
                return Err(RegistryError::UnknownTag { field: "without", name: name.clone() });
            }
        }
        // A file's tag replaces an inherited tag of the same name; two tags
        // of one name in the file itself are an error (found by `build`).
        let inherited = merged.tags.len();
        for tag in file.tags {
            match merged.tags[..inherited].iter_mut().find(|t| t.name.eq_ignore_ascii_case(&tag.name)) {
                Some(slot) => *slot = tag,
                None => merged.tags.push(tag),
            }
        }
        if file.name.is_some() {
            merged.name = file.name;
        }
        if file.lead.is_some() {
            merged.lead = file.lead;
        }
        if file.default.is_some() {
            merged.default = file.default;
        }
        // A profile's lead or default that `without` took away, and the
        // file did not replace, is the file's doing: say so in its terms.
        for (field, name) in [("lead", &merged.lead), ("default", &merged.default)] {
            if let Some(name) = name.as_deref().filter(|n| !n.is_empty())
                && file.without.iter().any(|w| w.eq_ignore_ascii_case(name))
            {
                return Err(RegistryError::RemovedTag { field, name: name.to_string() });
            }
        }
        if file.lead_prefilled.is_some() {
            merged.lead_prefilled = file.lead_prefilled;
        }
        Registry::build(merged)
    }

    fn build(file: RegistryFile) -> Result<Registry, RegistryError> {
        if file.tags.len() > usize::from(u16::MAX) {
            return Err(RegistryError::TooMany(file.tags.len()));
        }
        let mut names: Vec<(Vec<u8>, TagId)> = Vec::new();
        for (i, tag) in file.tags.iter().enumerate() {
            let id = TagId(i as u16);
            for n in std::iter::once(&tag.name).chain(&tag.aliases) {
                if !valid_name(n) {
                    return Err(RegistryError::InvalidName(n.clone()));
                }
                let lower = n.to_ascii_lowercase().into_bytes();
                if names.iter().any(|(k, _)| *k == lower) {
                    return Err(RegistryError::Duplicate(n.clone()));
                }
                names.push((lower, id));
            }
        }
        let find = |field: &'static str, name: &str| -> Result<TagId, RegistryError> {
            let lower = name.to_ascii_lowercase().into_bytes();
            names
                .iter()
                .find(|(k, _)| *k == lower)
                .map(|(_, id)| *id)
                .ok_or_else(|| RegistryError::UnknownTag { field, name: name.to_string() })
        };
        // An empty name clears a lead or default (one a profile gave).
        let lead = file.lead.as_deref().filter(|n| !n.is_empty()).map(|n| find("lead", n)).transpose()?;
        let default = file.default.as_deref().filter(|n| !n.is_empty()).map(|n| find("default", n)).transpose()?;
        if file.lead_prefilled == Some(true) && lead.is_none() {
            return Err(RegistryError::PrefilledWithoutLead);
        }
        check_markers(&file.tags)?;
        let mut tags = Vec::with_capacity(file.tags.len());
        for tag in &file.tags {
            let after = tag.after.iter().map(|n| find("after", n)).collect::<Result<Vec<_>, _>>()?;
            if let Some(bad) = tag.children.iter().find(|c| !valid_name(c)) {
                return Err(RegistryError::InvalidName(bad.clone()));
            }
            tags.push(TagSpec {
                name: tag.name.clone(),
                spelling: tag.spelling.clone().unwrap_or_else(|| tag.name.clone()),
                aliases: tag.aliases.clone(),
                body: tag.body,
                mandatory: tag.mandatory,
                mergeable: tag.mergeable,
                bare: tag.bare,
                after,
                children: tag.children.iter().map(|c| c.to_ascii_lowercase()).collect(),
                markers: tag.markers.clone(),
                fallback_to_content: tag.fallback_to_content,
            });
        }
        let lead_open = match file.lead_prefilled {
            Some(true) => LeadOpen::Template,
            _ => LeadOpen::Model,
        };
        names.sort_by_key(|(k, _)| k.len());
        let longest = names.last().map_or(0, |(k, _)| k.len());
        let by_len = (0..=longest + 1).map(|n| names.partition_point(|(k, _)| k.len() < n) as u32).collect();
        let event_names = tags
            .iter()
            .map(|t| {
                let name = TagName::from(t.name.as_str());
                let spelling = if t.spelling == t.name { name.clone() } else { TagName::from(t.spelling.as_str()) };
                (name, spelling)
            })
            .collect();
        Ok(Registry {
            name: file.name.unwrap_or_else(|| "custom".to_string()),
            tags,
            names,
            by_len,
            lead,
            default,
            lead_open,
            event_names,
        })
    }

    /// Parses a registry from TOML text.
    ///
    /// # Errors
    ///
    /// As [`Registry::from_file_spec`], plus TOML syntax and schema errors.
    pub fn from_toml_str(text: &str) -> Result<Registry, RegistryError> {
        Registry::from_file_spec(toml::from_str(text)?)
    }

    /// Parses a registry from JSON text.
    ///
    /// # Errors
    ///
    /// As [`Registry::from_file_spec`], plus JSON syntax and schema errors.
    pub fn from_json_str(text: &str) -> Result<Registry, RegistryError> {
        Registry::from_file_spec(serde_json::from_str(text)?)
    }

    /// Loads a registry file: `.json` files are JSON, anything else TOML.
    ///
    /// # Errors
    ///
    /// [`RegistryError::Io`] when the file cannot be read, otherwise as
    /// [`Registry::from_toml_str`] / [`Registry::from_json_str`].
    pub fn load(path: &Path) -> Result<Registry, RegistryError> {
        let text = std::fs::read_to_string(path)
            .map_err(|cause| RegistryError::Io { path: path.display().to_string(), cause })?;
        let is_json = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
        if is_json { Registry::from_json_str(&text) } else { Registry::from_toml_str(&text) }
    }

    /// A built-in profile by name (see [`Registry::profile_names`]).
    pub fn profile(name: &str) -> Option<Registry> {
        let spec = profiles::file_spec(name)?;
        Registry::build(spec).ok()
    }

    /// The built-in profile a transcript's file name asks for: a name that
    /// starts with `<profile>-` (`reasoning-r1.txt`, `tam-steps.txt`), else
    /// `None`. `spindle replay` and the corpus tests use this rule.
    ///
    /// ```
    /// use spindle::Registry;
    /// assert_eq!(Registry::profile_for_file_name("reasoning-r1-cut.txt"), Some("reasoning"));
    /// assert_eq!(Registry::profile_for_file_name("clean-rp.txt"), None);
    /// assert_eq!(Registry::profile_for_file_name("日本語.txt"), None);
    /// ```
    pub fn profile_for_file_name(name: &str) -> Option<&'static str> {
        // Compared as bytes: a name is any text, and a profile's length
        // may fall inside one of its characters.
        let name = name.as_bytes();
        profiles::NAMES.iter().copied().find(|p| {
            name.get(..p.len()).is_some_and(|head| head.eq_ignore_ascii_case(p.as_bytes()))
                && name.get(p.len()) == Some(&b'-')
        })
    }

    /// The names of the built-in profiles.
    pub fn profile_names() -> &'static [&'static str] {
        profiles::NAMES
    }

    /// The `filament` profile: every tag of spec 003 §3 with the legacy
    /// aliases; thought leads, content is the mandatory default, and
    /// variable_update comes after content.
    pub fn filament() -> Registry {
        Registry::build(profiles::filament()).unwrap_or_else(|_| unreachable_profile())
    }

    /// The `chat` profile for OpenAI-compatible chat content: plain answers
    /// are content, `<think>…</think>` is a thought.
    pub fn chat() -> Registry {
        Registry::build(profiles::chat()).unwrap_or_else(|_| unreachable_profile())
    }

    /// The `reasoning` profile for `<think>`-first models: thought leads and
    /// text after `</think>` is content without a `<content>` tag.
    pub fn reasoning() -> Registry {
        Registry::build(profiles::reasoning()).unwrap_or_else(|_| unreachable_profile())
    }

    /// The registry's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// All tags, indexed by [`TagId::index`].
    pub fn tags(&self) -> &[TagSpec] {
        &self.tags
    }

    /// One tag's spec.
    ///
    /// # Panics
    ///
    /// If `id` came from another registry with more tags; [`Registry::get`]
    /// returns `None` instead.
    pub fn tag(&self, id: TagId) -> &TagSpec {
        &self.tags[id.index()]
    }

    /// One tag's spec, or `None` for an id this registry has no tag for (an
    /// id from another registry).
    pub fn get(&self, id: TagId) -> Option<&TagSpec> {
        self.tags.get(id.index())
    }

    /// The canonical name and the spelling of `id`, as events carry them.
    pub(crate) fn event_names(&self, id: TagId) -> &(TagName, TagName) {
        &self.event_names[id.index()]
    }

    /// The tag assumed when output starts with bare text.
    pub fn lead(&self) -> Option<TagId> {
        self.lead
    }

    /// The tag opened by bare text between elements.
    pub fn default_tag(&self) -> Option<TagId> {
        self.default
    }

    /// Who opens the lead tag: the model, or the chat template before the
    /// output starts (`lead_prefilled = true`).
    pub fn lead_open(&self) -> LeadOpen {
        self.lead_open
    }

    /// The tag a name (or alias) means, matched case-insensitively.
    pub fn lookup(&self, name: &[u8]) -> Option<TagId> {
        let same_len = match self.by_len.get(name.len()..name.len() + 2) {
            Some(&[from, to]) if from < to => self.names.get(from as usize..to as usize)?,
            // No name of this length (most tags of HTML in content).
            _ => return None,
        };
        // The stored names are lower-case: their first bytes, compared
        // first, rule out the other names of that length at one byte each.
        let first = name.first()?.to_ascii_lowercase();
        // Most tags are written in lower case: an exact comparison settles
        // them without folding each byte.
        same_len
            .iter()
            .find(|(k, _)| k.first() == Some(&first) && (k.as_slice() == name || k.eq_ignore_ascii_case(name)))
            .map(|(_, id)| *id)
    }

    /// Whether some registry name or alias starts with `prefix`
    /// (case-insensitively); used to recognise a tag cut off at end of input.
    pub fn is_name_prefix(&self, prefix: &[u8]) -> bool {
        self.names.iter().any(|(k, _)| k.len() >= prefix.len() && k[..prefix.len()].eq_ignore_ascii_case(prefix))
    }

    /// The tag and role of a special marker name (`REQUEST_TOOL`).
    pub fn lookup_marker(&self, name: &[u8]) -> Option<(TagId, MarkerRole)> {
        self.tags.iter().enumerate().find_map(|(i, t)| {
            let m = t.markers.as_ref()?;
            let id = TagId(i as u16);
            if marker_eq(m.open.as_bytes(), name) {
                Some((id, MarkerRole::Open))
            } else if marker_eq(m.close.as_bytes(), name) {
                Some((id, MarkerRole::Close))
            } else {
                None
            }
        })
    }

    /// Whether some special marker of this registry starts with `prefix`.
    pub fn is_marker_prefix(&self, prefix: &[u8]) -> bool {
        let norm: Vec<u8> = prefix.iter().filter(|b| !matches!(b, b'[' | b']' | b' ' | b'\t')).copied().collect();
        self.tags.iter().filter_map(|t| t.markers.as_ref()).any(|m| {
            [&m.open, &m.close].iter().any(|n| {
                let n = n.as_bytes();
                n.len() >= norm.len() && n[..norm.len()].eq_ignore_ascii_case(&norm)
            })
        })
    }

    /// Whether `child` (a registry tag) is declared a child of `parent`,
    /// so it does not end `parent`.
    pub fn is_child(&self, parent: TagId, child: &[u8]) -> bool {
        self.tag(parent).children.iter().any(|c| c.as_bytes().eq_ignore_ascii_case(child))
    }
}

/// Special marker names compare case-insensitively, ignoring spaces and
/// treating `-` and `_` alike (`<|[request-tool]|>`).
fn marker_eq(want: &[u8], got: &[u8]) -> bool {
    let norm = |b: u8| if b == b'-' { b'_' } else { b.to_ascii_lowercase() };
    let got = got.iter().copied().filter(|b| !matches!(b, b' ' | b'\t'));
    want.iter().copied().map(norm).eq(got.map(norm))
}

/// The built-in profiles are fixed data validated by the unit tests; a
/// failure here is a bug in this file, never a consequence of input.
#[cold]
fn unreachable_profile() -> ! {
    panic!("built-in profile failed validation; see registry::tests")
}

#[cfg(test)]
mod tests;
