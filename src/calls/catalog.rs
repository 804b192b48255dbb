//! Tool definitions and the checking of calls against them (spec 002 §6-7,
//! §10; spec 004 §3.3, §5.5).
//!
//! This module owns the [`ToolCatalog`]: tool ids, descriptions and
//! JSON-Schema parameters (with the `implementation` kept, untouched, for
//! whoever runs the tools), loaded from a plugins directory or added in
//! code; and the check of a [`ToolCall`] against it, which names the
//! closest valid tool or parameter and formats the observation text the
//! model reads on its next turn. It runs no tool.
//!
//! # Plugins directory
//!
//! ```text
//! plugins/
//!   my-plugin/
//!     plugin.yaml        name, displayName, version, description, tools: { entry: ./tools }
//!     tools/
//!       fetch.tool.json  { "id", "displayName", "description", "parameters", "implementation" }
//! ```
//!
//! [`ToolCatalog::load_plugins`] reads every subdirectory's `plugin.yaml`
//! (or the directory's own, when it is a single plugin), follows
//! `tools.entry` (relative to the manifest) and loads each `*.tool.json`
//! there, in name order.
//!
//! Each plugin, and each tool file in it, loads on its own (spec 002 §7.1,
//! §15.1.2: one plugin's failure does not stop the others). What cannot be
//! loaded is left out and kept as a [`LoadWarning`] naming the file and the
//! reason ([`ToolCatalog::warnings`]):
//!
//! | problem | what is left out |
//! |---|---|
//! | a subdirectory without `plugin.yaml` | that folder ([`Skipped::Plugin`]) |
//! | a manifest that is unreadable, too large, does not parse, has no `name`, or whose `tools.entry` is not a readable directory | that plugin ([`Skipped::Plugin`]) |
//! | a `*.tool.json` that is unreadable, too large, does not parse, has no `id` or a broken schema | that file; the plugin's other tools load ([`Skipped::ToolFile`]) |
//! | a tool id already defined (by an earlier file, in name order) | the later file ([`Skipped::ToolFile`]; the warning names both) |
//!
//! Two cases stay errors, because nothing at all would load: the directory
//! itself cannot be read (it does not exist, it is not a directory, no
//! permission), and the directory is itself one plugin whose own manifest
//! is broken. (Spec 002 §15.1.2 skips a missing `plugins/` folder with a
//! message; here the folder is named by the caller, so a missing one is
//! more likely a typo than an install without plugins.)
//!
//! # Checking a call
//!
//! ```
//! use spindle::calls::{ToolCatalog, ToolDef, Step, ToolCall, CallFormat};
//! use serde_json::json;
//!
//! let mut catalog = ToolCatalog::new();
//! catalog.add(ToolDef::new("GetPlayerInfo", json!({
//!     "type": "object",
//!     "properties": {"player_id": {"type": "string"}},
//!     "required": ["player_id"]
//! }))).unwrap();
//!
//! let mut step = Step::new("GetPlayerInfo");
//! step.params.insert("playerId".into(), json!("player123"));
//! let mut call = ToolCall::new(CallFormat::Action);
//! call.steps.push(step);
//! assert_eq!(
//!     catalog.observations(&call),
//!     ["Observation: Error - Invalid parameters for GetPlayerInfo: Unknown parameter 'playerId', did you mean 'player_id'?"]
//! );
//! ```
//!
//! Values read from text (TAM, ACTION) are strings; before schema
//! validation they are converted to the type the schema declares where the
//! text allows it (`"25"` to `25` for an integer, `"true"` to `true`, JSON
//! text to an object or array, a single value to a one-element array).
//!
//! TAM keys are matched without regard to case and underscores (spec 002
//! §5.3): a TAM key (normalised by the reader, `file_path`) that the tool
//! does not declare as written stands for the declared property whose
//! normalised name is the same (`filePath`), or else for the one that is
//! equal with case and underscores left out (`filepath` for `file_path`).
//! Only when exactly one property matches: `filepath` against both
//! `file_path` and `filePath` stays an unknown parameter, with the
//! closest as its suggestion. ACTION, ATTP and Filament names are matched
//! as written.

use super::attp::PYTHON_TOOL;
use super::tam::normalize_key;
use super::{CallFormat, Step, ToolCall};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;
use std::path::{Path, PathBuf};

/// Largest manifest or tool file read, in bytes (default of
/// [`LoadOptions::max_file_len`]).
pub const MAX_FILE_LEN: usize = 1024 * 1024;

/// Options for loading tool definitions from disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// Largest `plugin.yaml` or `*.tool.json` read; a larger file is an
    /// error naming it.
    pub max_file_len: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { max_file_len: MAX_FILE_LEN }
    }
}

/// Why tool definitions could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    /// A file or directory could not be read.
    #[error("cannot read {}: {cause}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// A tool id asked for (an agent's tool list) that the catalog does
    /// not have.
    #[error("unknown tool id {id:?}{}", suggestion.as_ref().map(|s| format!(", did you mean {s:?}?")).unwrap_or_default())]
    UnknownTool {
        /// The id as given.
        id: String,
        /// The closest id the catalog has, if one is close.
        suggestion: Option<String>,
    },
    /// A file is larger than [`LoadOptions::max_file_len`].
    #[error("{} is {len} bytes, more than the {limit}-byte limit", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        len: u64,
        /// The limit.
        limit: usize,
    },
    /// A plugin directory has no `plugin.yaml`.
    #[error("plugin directory {} has no plugin.yaml", path.display())]
    MissingManifest {
        /// The directory.
        path: PathBuf,
    },
    /// A `plugin.yaml` does not parse or lacks a field.
    #[error("plugin manifest {} is invalid: {message}", path.display())]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A `*.tool.json` does not parse or lacks a field.
    #[error("tool file {} is invalid: {message}", path.display())]
    ToolFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A tool's `parameters` is not a usable JSON Schema.
    #[error("tool {id:?}{}: `parameters` is not a valid JSON Schema: {message}", in_file(path))]
    Schema {
        /// The tool.
        id: String,
        /// Where it was defined, if on disk.
        path: Option<PathBuf>,
        /// What is wrong.
        message: String,
    },
    /// OpenAI `tools` that are not an array.
    #[error("OpenAI `tools` must be an array of tools, not {found}")]
    OpenAiToolsNotArray {
        /// What it is instead (`a string`, `an object`).
        found: &'static str,
    },
    /// An OpenAI `tools` array entry that is not a function tool.
    #[error("OpenAI tools[{index}] is invalid: {message}")]
    OpenAiTool {
        /// The entry's position in the array.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// Two definitions share one tool id.
    #[error("tool id {id:?} is defined twice: {first} and {second}")]
    Duplicate {
        /// The id.
        id: String,
        /// The first definition's origin.
        first: String,
        /// The second definition's origin.
        second: String,
    },
}

fn in_file(path: &Option<PathBuf>) -> String {
    path.as_ref().map(|p| format!(" in {}", p.display())).unwrap_or_default()
}

/// One tool (a `*.tool.json`, spec 002 §6.3 / §10.2.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDef {
    /// The tool's unique id (`BilibiliFetch:getSubtitle`).
    pub id: String,
    /// A name for people.
    #[serde(default, rename = "displayName", skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// What the tool does (for tool manuals in prompts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of the parameters object.
    #[serde(default = "empty_object_schema")]
    pub parameters: Value,
    /// How to run the tool (`{"type": "script", "command": ...}`), kept as
    /// written for the executor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub implementation: Option<Value>,
    /// Other fields of the file (`configSchema`, ...), kept as written.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
    /// The plugin that declared it.
    #[serde(skip)]
    pub plugin: Option<String>,
    /// The file it came from.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

fn empty_object_schema() -> Value {
    serde_json::json!({"type": "object"})
}

impl ToolDef {
    /// A definition with an id and a parameters schema.
    pub fn new(id: impl Into<String>, parameters: Value) -> ToolDef {
        ToolDef {
            id: id.into(),
            display_name: None,
            description: None,
            parameters,
            implementation: None,
            extra: serde_json::Map::new(),
            plugin: None,
            source: None,
        }
    }

    fn origin(&self) -> String {
        match (&self.source, &self.plugin) {
            (Some(p), _) => p.display().to_string(),
            (None, Some(plugin)) => format!("plugin {plugin}"),
            (None, None) => "(added in code)".to_string(),
        }
    }
}

/// A plugin's `plugin.yaml` (spec 002 §6.2), the fields this crate uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginManifest {
    /// The plugin's id (kebab-case).
    pub name: String,
    /// A name for people.
    #[serde(default, rename = "displayName", skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// Version, as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<Value>,
    /// What the plugin does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Where its tool definitions are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<ToolsEntry>,
}

/// The `tools:` section of a manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolsEntry {
    /// The folder of `*.tool.json` files, relative to the manifest.
    pub entry: String,
}

/// What loading a plugins directory left out (a [`LoadWarning`]'s kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Skipped {
    /// A whole plugin folder: it has no `plugin.yaml`, or its manifest or
    /// its tools folder cannot be used; none of its tools loaded.
    Plugin,
    /// One `*.tool.json`; the other tools of its plugin loaded.
    ToolFile,
}

impl Skipped {
    /// The snake_case name used in JSON (`plugin`, `tool_file`).
    pub fn as_str(self) -> &'static str {
        match self {
            Skipped::Plugin => "plugin",
            Skipped::ToolFile => "tool_file",
        }
    }
}

/// A plugin or tool file that [`ToolCatalog::load_plugins`] left out, and
/// why (see the module docs for which problem leaves out what).
///
/// ```
/// use spindle::calls::ToolCatalog;
/// use spindle::calls::catalog::Skipped;
///
/// let dir = std::env::temp_dir().join(format!("spindle-doc-warn-{}", std::process::id()));
/// std::fs::create_dir_all(dir.join("good/tools")).unwrap();
/// std::fs::create_dir_all(dir.join("assets")).unwrap(); // no plugin.yaml
/// std::fs::write(dir.join("good/plugin.yaml"), "name: good\ntools:\n  entry: ./tools\n").unwrap();
/// std::fs::write(dir.join("good/tools/a.tool.json"), r#"{"id": "A"}"#).unwrap();
/// std::fs::write(dir.join("good/tools/b.tool.json"), "{broken").unwrap();
///
/// let catalog = ToolCatalog::load_plugins(&dir).unwrap();
/// assert_eq!(catalog.len(), 1, "A loaded");
/// let skipped: Vec<Skipped> = catalog.warnings().iter().map(|w| w.skipped).collect();
/// assert_eq!(skipped, [Skipped::Plugin, Skipped::ToolFile]);
/// assert!(catalog.warnings()[1].to_string().starts_with("skipped tool file "));
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct LoadWarning {
    /// What was left out.
    pub skipped: Skipped,
    /// The plugin folder or tool file left out.
    pub path: PathBuf,
    /// Why (its text names the file at fault).
    pub error: CatalogError,
}

impl LoadWarning {
    /// The JSON form: `{"skipped": "tool_file", "path": "...", "reason": "..."}`.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "skipped": self.skipped.as_str(),
            "path": self.path.display().to_string(),
            "reason": self.error.to_string(),
        })
    }
}

impl fmt::Display for LoadWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.skipped {
            Skipped::Plugin => "plugin",
            Skipped::ToolFile => "tool file",
        };
        write!(f, "skipped {what} {}: {}", self.path.display(), self.error)
    }
}

/// A loaded plugin.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginInfo {
    /// Its manifest.
    pub manifest: PluginManifest,
    /// Its directory.
    pub dir: PathBuf,
    /// The ids of the tools it declared.
    pub tools: Vec<String>,
}

/// A tool and its compiled schema.
struct Entry {
    def: ToolDef,
    validator: jsonschema::Validator,
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Entry").field("def", &self.def).finish_non_exhaustive()
    }
}

/// The tools a model may call, with their parameter schemas.
#[derive(Debug, Default)]
pub struct ToolCatalog {
    tools: Vec<Entry>,
    plugins: Vec<PluginInfo>,
    warnings: Vec<LoadWarning>,
}

/// One problem with a parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParamProblem {
    /// A parameter the tool does not declare.
    Unknown {
        /// The name as written.
        name: String,
        /// The closest declared name, if one is close.
        suggestion: Option<String>,
    },
    /// A TAM key that several declared parameters match once case and
    /// underscores are set aside (`filepath` for `file_path` and
    /// `filePath`).
    Ambiguous {
        /// The name as written.
        name: String,
        /// The declared names it matches.
        candidates: Vec<String>,
    },
    /// A required parameter is absent.
    Missing {
        /// Its name.
        name: String,
    },
    /// A value the schema rejects.
    Invalid {
        /// Where (`age`, `args.file.0.path`; empty for the whole object).
        path: String,
        /// The schema validator's message.
        message: String,
    },
}

impl fmt::Display for ParamProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamProblem::Unknown { name, suggestion: Some(s) } => {
                write!(f, "Unknown parameter '{name}', did you mean '{s}'?")
            }
            ParamProblem::Unknown { name, suggestion: None } => write!(f, "Unknown parameter '{name}'"),
            ParamProblem::Ambiguous { name, candidates } => {
                write!(f, "Parameter '{name}' is ambiguous: write it as one of '{}'", candidates.join("', '"))
            }
            ParamProblem::Missing { name } => write!(f, "Missing required parameter '{name}'"),
            ParamProblem::Invalid { path, message } if path.is_empty() => write!(f, "{message}"),
            ParamProblem::Invalid { path, message } => write!(f, "Parameter '{path}': {message}"),
        }
    }
}

/// A checked step ([`ToolCatalog::check_step_uris`]).
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct CheckedStep {
    /// The parameters as the tool takes them; one passed by URI holds the
    /// URI string.
    pub params: serde_json::Map<String, Value>,
    /// The parameters passed by URI: declared name to URI.
    pub uris: std::collections::BTreeMap<String, String>,
}

/// Why one step (or the whole call) cannot be run.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallProblem {
    /// The call itself could not be read (malformed XML, invalid TOML, no
    /// command): its `observation` text.
    Unreadable {
        /// The observation text from the payload.
        observation: String,
    },
    /// No tool has this id.
    UnknownTool {
        /// The step's position in `steps`.
        step: usize,
        /// The id as written.
        id: String,
        /// The closest known id, if one is close.
        suggestion: Option<String>,
    },
    /// The parameters do not fit the tool's schema.
    InvalidParams {
        /// The step's position in `steps`.
        step: usize,
        /// The tool.
        tool_id: String,
        /// What is wrong, in order.
        problems: Vec<ParamProblem>,
    },
    /// ATTP code calls a function no tool provides.
    UnknownFunction {
        /// The function name.
        name: String,
        /// The closest tool name, if one is close.
        suggestion: Option<String>,
    },
    /// ATTP code calls a function by a name several tools share (`get` for
    /// `Weather:get` and `Stock:get`).
    AmbiguousFunction {
        /// The function name.
        name: String,
        /// The function names of the tools it could mean.
        candidates: Vec<String>,
    },
}

impl CallProblem {
    /// The observation text for the model's next turn (spec 004 §3.3,
    /// §5.5): `Observation: Error - ...`.
    pub fn observation(&self) -> String {
        match self {
            CallProblem::Unreadable { observation } => observation.clone(),
            other => format!("Observation: Error - {other}"),
        }
    }
}

impl fmt::Display for CallProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallProblem::Unreadable { observation } => {
                write!(f, "{}", observation.strip_prefix("Observation: Error - ").unwrap_or(observation))
            }
            CallProblem::UnknownTool { id, suggestion: Some(s), .. } => {
                write!(f, "Unknown tool ID '{id}', did you mean '{s}'?")
            }
            CallProblem::UnknownTool { id, suggestion: None, .. } => write!(f, "Unknown tool ID '{id}'"),
            CallProblem::InvalidParams { tool_id, problems, .. } => {
                let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
                write!(f, "Invalid parameters for {tool_id}: {}", list.join("; "))
            }
            CallProblem::UnknownFunction { name, suggestion: Some(s) } => {
                write!(f, "Unknown tool '{name}' called in the code, did you mean '{s}'?")
            }
            CallProblem::UnknownFunction { name, suggestion: None } => {
                write!(f, "Unknown tool '{name}' called in the code")
            }
            CallProblem::AmbiguousFunction { name, candidates } => {
                write!(f, "Tool '{name}' called in the code is ambiguous: call one of '{}'", candidates.join("', '"))
            }
        }
    }
}

/// The observation text for a step that ran (spec 004 §5.1):
/// `Observation: Tool ReadWorldStateTool executed successfully. Result: sunny`.
pub fn observation_success(tool_id: &str, result: &str) -> String {
    format!("Observation: Tool {tool_id} executed successfully. Result: {result}")
}

/// The closest candidate to `name`, if one is close enough: an equal
/// normalised form (`playerId` ~ `player_id`) wins; otherwise the best of
/// Jaro-Winkler and normalised Damerau-Levenshtein, case-insensitively, at
/// 0.75 or more.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let norm = normalize_key(name).name;
    let lower = name.to_lowercase();
    let mut best: Option<(f64, &str)> = None;
    for c in candidates {
        let score = if normalize_key(c).name == norm {
            2.0
        } else {
            let cl = c.to_lowercase();
            strsim::jaro_winkler(&lower, &cl).max(strsim::normalized_damerau_levenshtein(&lower, &cl))
        };
        if score >= 0.75 && best.is_none_or(|(s, _)| score > s) {
            best = Some((score, c));
        }
    }
    best.map(|(_, c)| c)
}

impl ToolCatalog {
    /// An empty catalog.
    pub fn new() -> ToolCatalog {
        ToolCatalog::default()
    }

    /// Adds a tool, compiling its schema.
    ///
    /// # Errors
    ///
    /// [`CatalogError::Schema`] when `parameters` is not a valid JSON
    /// Schema; [`CatalogError::Duplicate`] when the id is taken.
    pub fn add(&mut self, def: ToolDef) -> Result<(), CatalogError> {
        if let Some(prev) = self.tools.iter().find(|e| e.def.id == def.id) {
            return Err(CatalogError::Duplicate { id: def.id.clone(), first: prev.def.origin(), second: def.origin() });
        }
        if !def.parameters.is_object() && !def.parameters.is_boolean() {
            return Err(CatalogError::Schema {
                id: def.id.clone(),
                path: def.source.clone(),
                message: "a schema must be an object".into(),
            });
        }
        let validator = jsonschema::validator_for(&def.parameters).map_err(|e| CatalogError::Schema {
            id: def.id.clone(),
            path: def.source.clone(),
            message: e.to_string(),
        })?;
        self.tools.push(Entry { def, validator });
        Ok(())
    }

    /// Reads one `*.tool.json` text; `path` names it in errors.
    ///
    /// # Errors
    ///
    /// [`CatalogError::ToolFile`] for JSON that does not parse or has no
    /// `id`; otherwise as [`ToolCatalog::add`].
    pub fn add_tool_json(&mut self, text: &str, path: Option<&Path>) -> Result<(), CatalogError> {
        let shown = path.map_or_else(|| PathBuf::from("(tool json)"), Path::to_path_buf);
        let mut def: ToolDef = serde_json::from_str(text)
            .map_err(|e| CatalogError::ToolFile { path: shown.clone(), message: e.to_string() })?;
        if def.id.trim().is_empty() {
            return Err(CatalogError::ToolFile { path: shown, message: "`id` is empty".into() });
        }
        def.source = path.map(Path::to_path_buf);
        self.add(def)
    }

    /// Adds the tools of an OpenAI `tools` array (a chat request's
    /// `[{"type": "function", "function": {"name", "description",
    /// "parameters"}}]`; the legacy `functions` entries `{"name", ...}` are
    /// read too), so that a request's tools can be rendered as a manual and
    /// checked like plugin tools. A function without `parameters` takes any
    /// object. Returns the ids added, in order.
    ///
    /// # Errors
    ///
    /// [`CatalogError::OpenAiTool`] for an entry that is not an object, has
    /// another `type` or no `name`; otherwise as [`ToolCatalog::add`]. The
    /// tools before the bad entry stay added.
    ///
    /// ```
    /// use spindle::calls::ToolCatalog;
    /// use serde_json::json;
    ///
    /// let mut catalog = ToolCatalog::new();
    /// let tools = json!([{"type": "function", "function": {
    ///     "name": "get_weather", "description": "Weather for a city",
    ///     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    /// }}]);
    /// assert_eq!(catalog.add_openai_tools(&tools).unwrap(), ["get_weather"]);
    /// assert_eq!(catalog.get("get_weather").unwrap().description.as_deref(), Some("Weather for a city"));
    /// ```
    pub fn add_openai_tools(&mut self, tools: &Value) -> Result<Vec<String>, CatalogError> {
        let list = match tools {
            Value::Array(list) => list.as_slice(),
            other => return Err(CatalogError::OpenAiToolsNotArray { found: crate::state::type_name(other) }),
        };
        let mut ids = Vec::new();
        for (index, entry) in list.iter().enumerate() {
            let bad = |message: &str| CatalogError::OpenAiTool { index, message: message.into() };
            let obj = entry.as_object().ok_or_else(|| bad("not an object"))?;
            let function = match obj.get("type").and_then(Value::as_str) {
                Some("function") => {
                    obj.get("function").and_then(Value::as_object).ok_or_else(|| bad("no `function` object"))?
                }
                Some(other) => return Err(bad(&format!("type {other:?} is not \"function\""))),
                None if obj.contains_key("name") => obj,
                None => return Err(bad("no `type` and no `name`")),
            };
            let name = function.get("name").and_then(Value::as_str).map(str::trim).filter(|n| !n.is_empty());
            let name = name.ok_or_else(|| bad("the function has no `name`"))?;
            let parameters = match function.get("parameters") {
                None | Some(Value::Null) => empty_object_schema(),
                Some(p) => p.clone(),
            };
            let mut def = ToolDef::new(name, parameters);
            def.description = function.get("description").and_then(Value::as_str).map(str::to_string);
            self.add(def)?;
            ids.push(name.to_string());
        }
        Ok(ids)
    }

    /// Loads every `*.tool.json` of `dir` (not recursive), in name order.
    ///
    /// # Errors
    ///
    /// The first [`CatalogError`] met: an unreadable directory or file, a
    /// file past the size limit, a broken definition or schema. Unlike
    /// [`ToolCatalog::load_plugins`], one bad file stops the load (the
    /// tools before it stay added).
    pub fn load_tools_dir(
        &mut self,
        dir: &Path,
        plugin: Option<&str>,
        options: LoadOptions,
    ) -> Result<Vec<String>, CatalogError> {
        let mut ids = Vec::new();
        for file in tool_files(dir)? {
            ids.push(self.load_tool_file(&file, plugin, options)?);
        }
        Ok(ids)
    }

    /// Loads a plugins directory (spec 002 §6-7, §10).
    ///
    /// `dir` is either one plugin (it holds `plugin.yaml`) or a folder of
    /// plugins, each a subdirectory with its `plugin.yaml`; hidden
    /// subdirectories are skipped. A plugin or tool file that cannot be
    /// loaded is left out and the rest loads: each is kept as a
    /// [`LoadWarning`] ([`ToolCatalog::warnings`]; the module docs list
    /// which problem leaves out what).
    ///
    /// # Errors
    ///
    /// Only when nothing could load: [`CatalogError::Io`] when `dir`
    /// cannot be read (missing, not a directory, no permission), or the
    /// manifest's error when `dir` is itself one plugin whose
    /// `plugin.yaml` is unreadable, does not parse, has no `name` or names
    /// a `tools.entry` that is not a readable directory.
    pub fn load_plugins(dir: &Path) -> Result<ToolCatalog, CatalogError> {
        ToolCatalog::load_plugins_with(dir, LoadOptions::default())
    }

    /// [`ToolCatalog::load_plugins`] with explicit limits.
    ///
    /// # Errors
    ///
    /// As [`ToolCatalog::load_plugins`].
    pub fn load_plugins_with(dir: &Path, options: LoadOptions) -> Result<ToolCatalog, CatalogError> {
        let mut catalog = ToolCatalog::new();
        if let Some(manifest) = manifest_in(dir) {
            catalog.load_plugin(dir, &manifest, options)?;
            return Ok(catalog);
        }
        let mut dirs: Vec<PathBuf> = list_dir(dir)?
            .into_iter()
            .filter(|p| p.is_dir() && !p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.')))
            .collect();
        dirs.sort();
        for sub in dirs {
            let loaded = match manifest_in(&sub) {
                Some(manifest) => catalog.load_plugin(&sub, &manifest, options),
                None => Err(CatalogError::MissingManifest { path: sub.clone() }),
            };
            if let Err(error) = loaded {
                catalog.warnings.push(LoadWarning { skipped: Skipped::Plugin, path: sub, error });
            }
        }
        Ok(catalog)
    }

    /// Loads one plugin. A manifest or tools-folder problem is the error
    /// (and nothing of the plugin is added); a bad tool file is a warning.
    fn load_plugin(&mut self, dir: &Path, manifest_path: &Path, options: LoadOptions) -> Result<(), CatalogError> {
        let text = read_limited(manifest_path, options)?;
        let bad = |message: String| CatalogError::Manifest { path: manifest_path.to_path_buf(), message };
        let manifest: PluginManifest = serde_saphyr::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if manifest.name.trim().is_empty() {
            return Err(bad("`name` is empty".into()));
        }
        // A plugin's name is its id (spec 002 §6.2): two plugins of one
        // name would be one plugin to the manual, the audit and the config.
        if let Some(first) = self.plugins.iter().find(|p| p.manifest.name == manifest.name) {
            return Err(bad(format!("plugin name {:?} is already the name of {}", manifest.name, first.dir.display())));
        }
        let mut ids = Vec::new();
        if let Some(tools) = &manifest.tools {
            // `entry: ./tools` names `DIR/tools`: the `.` components are
            // left out, so the paths shown to users read plainly.
            let mut entry: PathBuf =
                dir.join(&tools.entry).components().filter(|c| !matches!(c, std::path::Component::CurDir)).collect();
            if entry.as_os_str().is_empty() {
                entry = PathBuf::from(".");
            }
            if !entry.is_dir() {
                return Err(bad(format!("tools.entry {:?} is not a directory ({})", tools.entry, entry.display())));
            }
            // Listed before anything is added: a folder that cannot be
            // read leaves the whole plugin out.
            let files = tool_files(&entry)?;
            for file in files {
                match self.load_tool_file(&file, Some(&manifest.name), options) {
                    Ok(id) => ids.push(id),
                    Err(error) => self.warnings.push(LoadWarning { skipped: Skipped::ToolFile, path: file, error }),
                }
            }
        }
        self.plugins.push(PluginInfo { manifest, dir: dir.to_path_buf(), tools: ids });
        Ok(())
    }

    /// Reads and adds one `*.tool.json`; returns its id.
    fn load_tool_file(
        &mut self,
        file: &Path,
        plugin: Option<&str>,
        options: LoadOptions,
    ) -> Result<String, CatalogError> {
        let text = read_limited(file, options)?;
        let before = self.tools.len();
        self.add_tool_json(&text, Some(file))?;
        let entry = self.tools.get_mut(before).ok_or_else(|| CatalogError::ToolFile {
            path: file.to_path_buf(),
            message: "the tool was not added".into(),
        })?;
        entry.def.plugin = plugin.map(str::to_string);
        Ok(entry.def.id.clone())
    }

    /// Checks that the catalog has every tool in `ids`.
    ///
    /// # Errors
    ///
    /// [`CatalogError::UnknownTool`] for the first id it does not have,
    /// with the closest id it has.
    pub fn check_ids(&self, ids: &[String]) -> Result<(), CatalogError> {
        match ids.iter().find(|id| self.get(id).is_none()) {
            Some(id) => {
                Err(CatalogError::UnknownTool { id: id.clone(), suggestion: self.suggest_tool(id).map(str::to_string) })
            }
            None => Ok(()),
        }
    }

    /// Keeps only the tools in `ids` (all when `ids` is empty): an agent's
    /// tool list (spec 002 §4.4.1 `tool_ids_inventory`, spec 004 §3.3),
    /// so that its manual shows them alone and a call of any other tool is
    /// an unknown tool, never run.
    ///
    /// ```
    /// use spindle::calls::{ToolCatalog, ToolDef};
    /// use serde_json::json;
    ///
    /// let mut catalog = ToolCatalog::new();
    /// for id in ["File.Read", "File.Write"] {
    ///     catalog.add(ToolDef::new(id, json!({"type": "object"}))).unwrap();
    /// }
    /// catalog.keep_only(&["File.Read".to_string()]).unwrap();
    /// assert!(catalog.get("File.Write").is_none());
    /// assert!(catalog.keep_only(&["File.Reed".to_string()]).is_err());
    /// ```
    ///
    /// # Errors
    ///
    /// As [`ToolCatalog::check_ids`]; the catalog is then unchanged.
    pub fn keep_only(&mut self, ids: &[String]) -> Result<(), CatalogError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.check_ids(ids)?;
        self.tools.retain(|e| ids.contains(&e.def.id));
        for plugin in &mut self.plugins {
            plugin.tools.retain(|id| ids.contains(id));
        }
        Ok(())
    }

    /// What loading left out, in load order: plugins without a usable
    /// manifest, tool files that could not be loaded (see the module
    /// docs). Empty for a catalog built in code.
    pub fn warnings(&self) -> &[LoadWarning] {
        &self.warnings
    }

    /// The plugins loaded, in load order.
    pub fn plugins(&self) -> &[PluginInfo] {
        &self.plugins
    }

    /// All tools, in load order.
    pub fn tools(&self) -> impl Iterator<Item = &ToolDef> {
        self.tools.iter().map(|e| &e.def)
    }

    /// How many tools there are.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether the catalog has no tools.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// A tool by exact id.
    pub fn get(&self, id: &str) -> Option<&ToolDef> {
        self.entry(id).map(|e| &e.def)
    }

    /// A tool by its id, or by the name [`openai_function_name`] gives its
    /// id (a model that was given the OpenAI form calls `Math_Add` for
    /// `Math.Add`); the exact id first.
    fn entry(&self, id: &str) -> Option<&Entry> {
        self.tools.iter().find(|e| e.def.id == id).or_else(|| {
            // Only a name an id can map to: OpenAI's alphabet.
            is_openai_name(id).then(|| self.tools.iter().find(|e| openai_function_name(&e.def.id) == id)).flatten()
        })
    }

    /// The known tool id closest to `id`.
    pub fn suggest_tool(&self, id: &str) -> Option<&str> {
        closest(id, self.tools.iter().map(|e| e.def.id.as_str()))
    }

    /// Checks one step; on success returns its parameters as the tool
    /// expects them (converted to the schema's types, TAM names mapped to
    /// the declared ones). A parameter passed by URI (`uri_image`, spec
    /// 000 §3.3) is in it as the URI string; [`ToolCatalog::check_step_uris`]
    /// also says which parameters those are.
    ///
    /// # Errors
    ///
    /// [`CallProblem::UnknownTool`] or [`CallProblem::InvalidParams`].
    pub fn check_step(
        &self,
        format: CallFormat,
        index: usize,
        step: &Step,
    ) -> Result<serde_json::Map<String, Value>, CallProblem> {
        self.check_step_uris(format, index, step).map(|c| c.params)
    }

    /// [`ToolCatalog::check_step`], telling apart the parameters passed by
    /// URI (`uri_[param]_N`, spec 000 §3.3, §4): they count for `required`
    /// and are in `params` as the URI string, but are not checked against
    /// the schema (the URI stands for a resource that only whoever resolves
    /// it knows), and `uris` names them, by the declared parameter name.
    /// A parameter given both as a value and by URI is invalid.
    ///
    /// ```
    /// use spindle::calls::{CallFormat, Step, ToolCatalog, ToolDef};
    /// use serde_json::json;
    ///
    /// let mut catalog = ToolCatalog::new();
    /// catalog.add(ToolDef::new("Show", json!({"type": "object",
    ///     "properties": {"image": {"type": "object"}}, "required": ["image"]}))).unwrap();
    /// let mut step = Step::new("Show");
    /// step.uris.insert("image".into(), "fam://project/a.png".into());
    /// let checked = catalog.check_step_uris(CallFormat::Tam, 0, &step).unwrap();
    /// assert_eq!(checked.params["image"], "fam://project/a.png");
    /// assert_eq!(checked.uris["image"], "fam://project/a.png");
    /// ```
    ///
    /// # Errors
    ///
    /// As [`ToolCatalog::check_step`].
    pub fn check_step_uris(&self, format: CallFormat, index: usize, step: &Step) -> Result<CheckedStep, CallProblem> {
        let Some(entry) = self.entry(&step.tool_id) else {
            return Err(CallProblem::UnknownTool {
                step: index,
                id: step.tool_id.clone(),
                suggestion: self.suggest_tool(&step.tool_id).map(str::to_string),
            });
        };
        let schema = &entry.def.parameters;
        let props = schema.get("properties").and_then(Value::as_object);
        let closed = props.is_some()
            && !matches!(schema.get("additionalProperties"), Some(Value::Bool(true) | Value::Object(_)));
        let mut params = serde_json::Map::new();
        let mut problems = Vec::new();
        let declared: Vec<&str> = props.map(|p| p.keys().map(String::as_str).collect()).unwrap_or_default();
        let mut by_uri: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
        let names = step.params.iter().map(|(k, v)| (k, Ok(v))).chain(step.uris.iter().map(|(k, u)| (k, Err(u))));
        for (name, value) in names {
            let mut target = name.clone();
            if format == CallFormat::Tam && !declared.contains(&name.as_str()) {
                // TAM keys are normalised, and matched without regard to
                // case and underscores (spec 002 §5.3); the schema may
                // spell them otherwise. Not onto a name the step also
                // gives as written.
                match tam_match(name, &declared) {
                    TamMatch::One(d) if !step.params.contains_key(d) && !step.uris.contains_key(d) => {
                        target = d.to_string();
                    }
                    TamMatch::Several(candidates) if closed && !step.shared.contains(name) => {
                        let candidates = candidates.into_iter().map(str::to_string).collect();
                        problems.push(ParamProblem::Ambiguous { name: name.clone(), candidates });
                        continue;
                    }
                    _ => {}
                }
            }
            if closed && !declared.contains(&target.as_str()) {
                if step.shared.contains(name) {
                    // A `common_*` value for the other steps of the block.
                    continue;
                }
                problems.push(ParamProblem::Unknown {
                    name: name.clone(),
                    suggestion: closest(name, declared.iter().copied()).map(str::to_string),
                });
                continue;
            }
            match value {
                Ok(v) => {
                    params.insert(target, v.clone());
                }
                Err(uri) => {
                    by_uri.insert(target, uri.clone());
                }
            }
        }
        for target in by_uri.keys().filter(|t| params.contains_key(*t)) {
            problems.push(ParamProblem::Invalid {
                path: target.clone(),
                message: "it is given both as a value and by URI (uri_...); give one".into(),
            });
        }
        if format != CallFormat::Attp {
            let mut whole = Value::Object(params);
            coerce(&mut whole, schema);
            params = match whole {
                Value::Object(m) => m,
                _ => serde_json::Map::new(),
            };
        }
        let instance = Value::Object(params.clone());
        for err in entry.validator.iter_errors(&instance) {
            let path: Vec<String> = err.instance_path().as_str().split('/').skip(1).map(unescape_pointer).collect();
            match err.kind() {
                jsonschema::error::ValidationErrorKind::AdditionalProperties { .. } if path.is_empty() => {}
                jsonschema::error::ValidationErrorKind::Required { property } if path.is_empty() => {
                    let name = property.as_str().map_or_else(|| property.to_string(), str::to_string);
                    if !by_uri.contains_key(&name) {
                        problems.push(ParamProblem::Missing { name });
                    }
                }
                _ => problems.push(ParamProblem::Invalid { path: path.join("."), message: err.to_string() }),
            }
        }
        // `playerId` with "did you mean 'player_id'?" already says that
        // player_id is missing.
        let suggested: Vec<String> = problems
            .iter()
            .filter_map(|p| match p {
                ParamProblem::Unknown { suggestion: Some(s), .. } => Some(s.clone()),
                _ => None,
            })
            .collect();
        problems.retain(|p| !matches!(p, ParamProblem::Missing { name } if suggested.contains(name)));
        if problems.is_empty() {
            for (target, uri) in &by_uri {
                params.insert(target.clone(), Value::String(uri.clone()));
            }
            Ok(CheckedStep { params, uris: by_uri })
        } else {
            Err(CallProblem::InvalidParams { step: index, tool_id: step.tool_id.clone(), problems })
        }
    }

    /// Checks parameters that are already in the tool's terms (names as
    /// declared, values as JSON: after URIs were resolved) against the
    /// schema of tool `id`; no conversion. Empty when they fit (or no tool
    /// has the id).
    pub fn validate_params(&self, id: &str, params: &serde_json::Map<String, Value>) -> Vec<ParamProblem> {
        let Some(entry) = self.entry(id) else { return Vec::new() };
        let instance = Value::Object(params.clone());
        entry
            .validator
            .iter_errors(&instance)
            .map(|err| {
                let path: Vec<String> = err.instance_path().as_str().split('/').skip(1).map(unescape_pointer).collect();
                ParamProblem::Invalid { path: path.join("."), message: err.to_string() }
            })
            .collect()
    }

    /// Every problem of a call: an unreadable payload, unknown tools and
    /// parameters, schema violations, ATTP code calling unknown functions
    /// (only when the catalog has tools). Empty when the call may run.
    pub fn check(&self, call: &ToolCall) -> Vec<CallProblem> {
        let mut out = Vec::new();
        if let Some(obs) = &call.observation {
            out.push(CallProblem::Unreadable { observation: obs.clone() });
            if call.steps.is_empty() {
                return out;
            }
        }
        for (i, step) in call.steps.iter().enumerate() {
            if call.format == CallFormat::Attp && step.tool_id == PYTHON_TOOL {
                continue;
            }
            if let Err(p) = self.check_step(call.format, i, step) {
                out.push(p);
            }
        }
        if let (CallFormat::Attp, Some(attp)) = (call.format, &call.attp) {
            out.extend(self.function_problems(&attp.calls));
        }
        out
    }

    /// The Python function name of every tool, with its id, in load order:
    /// the names ATTP code calls them by and the manual shows (see
    /// [`python_names`](super::attp::python_names): unique, so two tools
    /// named `get` in different plugins are `Weather_get` and `Stock_get`).
    /// A host that runs ATTP code binds each name to its tool.
    pub fn python_functions(&self) -> Vec<(String, &str)> {
        let ids: Vec<&str> = self.tools.iter().map(|e| e.def.id.as_str()).collect();
        super::attp::python_names(&ids).into_iter().zip(ids).collect()
    }

    /// Every name ATTP code may call a tool by, with the tool's id: its
    /// [`python_functions`](ToolCatalog::python_functions) name, and the
    /// [`openai_function_name`] of its id (what a model that was shown the
    /// tools in OpenAI form, or its own earlier calls in that form, writes)
    /// when no other tool has that name. The table a host binds in the
    /// sandbox that runs the code.
    pub fn function_table(&self) -> Vec<(String, &str)> {
        self.with_aliases(self.python_functions())
    }

    /// `table` (the [`python_functions`](ToolCatalog::python_functions))
    /// with the OpenAI-name aliases of [`ToolCatalog::function_table`].
    fn with_aliases<'a>(&'a self, mut table: Vec<(String, &'a str)>) -> Vec<(String, &'a str)> {
        for e in &self.tools {
            let alias = openai_function_name(&e.def.id);
            if !table.iter().any(|(name, _)| *name == alias) {
                table.push((alias.into_owned(), e.def.id.as_str()));
            }
        }
        table
    }

    fn function_in<'a>(table: &[(String, &'a str)], name: &str) -> Option<&'a str> {
        table.iter().find(|(n, _)| n == name).map(|(_, id)| *id)
    }

    /// The problems of ATTP code calling the functions `calls` (the
    /// [`AttpCall::calls`](super::AttpCall::calls) of a call): functions no
    /// tool provides, and names several tools share. None when the catalog
    /// has no tools (nothing to check against).
    pub fn function_problems(&self, calls: &[String]) -> Vec<CallProblem> {
        if self.is_empty() {
            return Vec::new();
        }
        let functions = self.python_functions();
        let table = self.with_aliases(functions.clone());
        let mut out = Vec::new();
        for f in calls {
            if Self::function_in(&table, f).is_some() {
                continue;
            }
            let sharing: Vec<String> = functions
                .iter()
                .filter(|(_, id)| super::attp::id_tail(id) == f)
                .map(|(name, _)| name.clone())
                .collect();
            out.push(if sharing.len() > 1 {
                CallProblem::AmbiguousFunction { name: f.clone(), candidates: sharing }
            } else {
                let suggestion = sharing
                    .into_iter()
                    .next()
                    .or_else(|| closest(f, functions.iter().map(|(name, _)| name.as_str())).map(str::to_string));
                CallProblem::UnknownFunction { name: f.clone(), suggestion }
            });
        }
        out
    }

    /// The observation texts of [`ToolCatalog::check`], one per problem.
    pub fn observations(&self, call: &ToolCall) -> Vec<String> {
        self.check(call).iter().map(CallProblem::observation).collect()
    }
}

/// What a TAM key matches among the declared parameters.
enum TamMatch<'a> {
    /// No declared name.
    None,
    /// Exactly this one.
    One(&'a str),
    /// More than one, equally well.
    Several(Vec<&'a str>),
}

/// The declared parameter a TAM key `name` (already normalised,
/// `file_path`) stands for: the one whose normalised form is `name`
/// (`filePath`), else the one equal to it without case and underscores
/// (`filepath` for `file_path`, `FilePath`).
fn tam_match<'a>(name: &str, declared: &[&'a str]) -> TamMatch<'a> {
    let of = |found: Vec<&'a str>| match found.as_slice() {
        [] => TamMatch::None,
        [one] => TamMatch::One(one),
        _ => TamMatch::Several(found),
    };
    match of(declared.iter().copied().filter(|d| normalize_key(d).name == name).collect()) {
        TamMatch::None => {
            let squashed = squash(name);
            of(declared.iter().copied().filter(|d| squash(d) == squashed).collect())
        }
        found => found,
    }
}

/// A name without case and separators: `file_path`, `filePath`,
/// `FILE-PATH` are all `filepath`.
fn squash(name: &str) -> String {
    name.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect()
}

fn unescape_pointer(seg: &str) -> String {
    seg.replace("~1", "/").replace("~0", "~")
}

fn manifest_in(dir: &Path) -> Option<PathBuf> {
    ["plugin.yaml", "plugin.yml"].iter().map(|n| dir.join(n)).find(|p| p.is_file())
}

/// The `*.tool.json` files of `dir` (not recursive), in name order.
fn tool_files(dir: &Path) -> Result<Vec<PathBuf>, CatalogError> {
    let mut files: Vec<PathBuf> = list_dir(dir)?
        .into_iter()
        .filter(|p| p.is_file() && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(".tool.json")))
        .collect();
    files.sort();
    Ok(files)
}

fn list_dir(dir: &Path) -> Result<Vec<PathBuf>, CatalogError> {
    let io = |cause| CatalogError::Io { path: dir.to_path_buf(), cause };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        out.push(entry.map_err(io)?.path());
    }
    Ok(out)
}

fn read_limited(path: &Path, options: LoadOptions) -> Result<String, CatalogError> {
    let io = |cause| CatalogError::Io { path: path.to_path_buf(), cause };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > options.max_file_len as u64 {
        return Err(CatalogError::TooLarge { path: path.to_path_buf(), len, limit: options.max_file_len });
    }
    std::fs::read_to_string(path).map_err(io)
}

/// The JSON types a schema allows (`type` as a string or a list).
fn schema_types(schema: &Value) -> Vec<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// Converts text values to the types `schema` declares, where the text
/// allows it (see the module docs). Follows `properties`,
/// `additionalProperties` and `items`.
fn coerce(value: &mut Value, schema: &Value) {
    let types = schema_types(schema);
    if let Value::String(s) = value
        && !types.is_empty()
        && !types.contains(&"string")
        && let Some(v) = from_text(s, &types)
    {
        *value = v;
    }
    if types.contains(&"array") && !types.contains(&"object") && !value.is_array() && !value.is_null() {
        let single = std::mem::take(value);
        *value = Value::Array(vec![single]);
    }
    match value {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let extra = schema.get("additionalProperties").filter(|s| s.is_object());
            for (k, v) in map.iter_mut() {
                if let Some(s) = props.and_then(|p| p.get(k)).or(extra) {
                    coerce(v, s);
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items").filter(|s| s.is_object()) {
                for v in items {
                    coerce(v, s);
                }
            }
        }
        _ => {}
    }
}

fn from_text(s: &str, types: &[&str]) -> Option<Value> {
    let t = s.trim();
    for ty in types {
        let v = match *ty {
            "integer" => t.parse::<i64>().ok().map(Value::from),
            "number" => t
                .parse::<i64>()
                .ok()
                .map(Value::from)
                .or_else(|| t.parse::<f64>().ok().filter(|f| f.is_finite()).map(Value::from)),
            "boolean" => match t.to_ascii_lowercase().as_str() {
                "true" => Some(Value::Bool(true)),
                "false" => Some(Value::Bool(false)),
                _ => None,
            },
            "null" if t.is_empty() || t == "null" => Some(Value::Null),
            "object" => serde_json::from_str::<Value>(t).ok().filter(Value::is_object),
            "array" => serde_json::from_str::<Value>(t).ok().filter(Value::is_array),
            _ => None,
        };
        if v.is_some() {
            return v;
        }
    }
    None
}

/// The name OpenAI's API takes for a tool id: a function name is 1 to 64
/// of `a-z A-Z 0-9 _ -`, so every other character becomes `_` and the name
/// is cut at 64 (`Math.Add` is sent as `Math_Add`). [`ToolCatalog::get`]
/// finds a tool by this name too.
///
/// ```
/// use spindle::calls::openai_function_name;
/// assert_eq!(openai_function_name("Math.Add"), "Math_Add");
/// assert_eq!(openai_function_name("get_weather"), "get_weather");
/// ```
pub fn openai_function_name(id: &str) -> std::borrow::Cow<'_, str> {
    if is_openai_name(id) {
        return std::borrow::Cow::Borrowed(id);
    }
    let mut name: String =
        id.chars().map(|c| if u8::try_from(c).is_ok_and(is_openai_name_byte) { c } else { '_' }).collect();
    name.truncate(64);
    if name.is_empty() {
        name.push('_');
    }
    std::borrow::Cow::Owned(name)
}

/// Whether `id` is a function name OpenAI's API takes as it is.
fn is_openai_name(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(is_openai_name_byte)
}

fn is_openai_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}
