//! Scripted conversations: which transcript answers which turn of a
//! multi-turn conversation (an agent loop, a tool-calling client), chosen
//! by the turn number or by what the last message says.
//!
//! This module owns the script format and the choice of a turn; serving
//! the chosen transcript is the mock's.
//!
//! # Format
//!
//! A TOML file, `NAME.script.toml` in the transcript directory (loaded with
//! it) or given with `spindle mock-upstream --script FILE`:
//!
//! ```toml
//! # The model that plays this script (default: the file name without
//! # `.script.toml`).
//! model = "agent-demo"
//!
//! [[turn]]
//! turn = 1                      # the first request (no assistant message yet)
//! transcript = "sum-question"   # a transcript name, as GET /v1/models lists it
//!
//! [[turn]]
//! last_contains = "Math.Add"    # the last message's text contains this
//! transcript = "Math.Add"
//!
//! [[turn]]                      # no condition: the answer to anything else
//! transcript = "Sleepy"
//! ```
//!
//! The turn number is one more than the number of assistant messages in
//! the request. The first `[[turn]]` whose conditions all hold answers; a
//! turn with no condition always holds. A request that no turn answers gets
//! a 400 `script_exhausted` error naming the turn, so a test that goes off
//! script fails loudly.

use super::library::{Transcript, content_text};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// One scripted conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    /// The model name that plays it.
    pub model: String,
    /// The turns, in the order they are tried.
    pub turns: Vec<ScriptTurn>,
}

/// One entry of a script: a transcript and when it answers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptTurn {
    /// The transcript that answers (its name).
    pub transcript: String,
    /// Answer only this turn (1 = the first request).
    #[serde(default)]
    pub turn: Option<usize>,
    /// Answer only when the last message's text contains this.
    #[serde(default)]
    pub last_contains: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptFile {
    model: Option<String>,
    #[serde(default)]
    turn: Vec<ScriptTurn>,
}

/// Why a script could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScriptError {
    /// The file could not be read.
    #[error("cannot read script {path}: {cause}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        cause: std::io::Error,
    },
    /// The TOML is invalid or does not fit the format.
    #[error("script {path}: {cause}")]
    Toml {
        /// The file.
        path: String,
        /// The cause.
        cause: toml::de::Error,
    },
    /// The script is empty, or names no model.
    #[error("script {path}: {why}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
}

impl Script {
    /// Reads a script file.
    ///
    /// # Errors
    ///
    /// The file cannot be read, is not valid TOML of this format, has no
    /// turn, or has no model name.
    pub fn load(path: &Path) -> Result<Script, ScriptError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|cause| ScriptError::Io { path: shown.clone(), cause })?;
        let default_model =
            path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".script.toml")).map(str::to_string);
        Script::from_toml_str(&text, default_model).map_err(|e| match e {
            ScriptError::Toml { cause, .. } => ScriptError::Toml { path: shown.clone(), cause },
            ScriptError::Invalid { why, .. } => ScriptError::Invalid { path: shown.clone(), why },
            other => other,
        })
    }

    /// Reads a script from TOML text; `model` is the name used when the
    /// text sets none.
    ///
    /// # Errors
    ///
    /// Invalid TOML, no turn, no model name.
    pub fn from_toml_str(text: &str, model: Option<String>) -> Result<Script, ScriptError> {
        let file: ScriptFile =
            toml::from_str(text).map_err(|cause| ScriptError::Toml { path: "(text)".into(), cause })?;
        let invalid = |why: &str| ScriptError::Invalid { path: "(text)".into(), why: why.to_string() };
        let model = file.model.or(model).ok_or_else(|| invalid("no `model` name"))?;
        if file.turn.is_empty() {
            return Err(invalid("no [[turn]]"));
        }
        if file.turn.iter().any(|t| t.turn == Some(0)) {
            return Err(invalid("turns count from 1"));
        }
        Ok(Script { model, turns: file.turn })
    }

    /// Checks that every turn names a transcript of `transcripts`.
    ///
    /// # Errors
    ///
    /// A sentence naming the first unknown transcript.
    pub fn check(&self, transcripts: &[Transcript]) -> Result<(), String> {
        for t in &self.turns {
            if !transcripts.iter().any(|x| x.name == t.transcript || x.file == t.transcript) {
                return Err(format!("script {}: no transcript named {:?}", self.model, t.transcript));
            }
        }
        Ok(())
    }

    /// The turn number of a request: one more than its assistant messages.
    pub fn turn_of(request: &Value) -> usize {
        let assistants = request
            .get("messages")
            .and_then(Value::as_array)
            .map_or(0, |m| m.iter().filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant")).count());
        assistants + 1
    }

    /// The transcript name that answers `request`, or `None` when no turn
    /// of the script does.
    pub fn choose(&self, request: &Value) -> Option<&str> {
        let turn = Script::turn_of(request);
        let last = request
            .get("messages")
            .and_then(Value::as_array)
            .and_then(|m| m.last())
            .and_then(|m| m.get("content"))
            .map(content_text)
            .unwrap_or_default();
        self.turns
            .iter()
            .find(|t| t.turn.is_none_or(|n| n == turn) && t.last_contains.as_deref().is_none_or(|s| last.contains(s)))
            .map(|t| t.transcript.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DEMO: &str = r#"
model = "demo"
[[turn]]
turn = 1
transcript = "first"
[[turn]]
last_contains = "Result: 42"
transcript = "after-add"
"#;

    #[test]
    fn turns_are_chosen_by_number_and_by_the_last_message() {
        let s = Script::from_toml_str(DEMO, None).unwrap();
        let first = json!({"messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(s.choose(&first), Some("first"));
        let second = json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "calling"},
            {"role": "user", "content": [{"type": "text", "text": "Observation: Result: 42"}]}]});
        assert_eq!(s.choose(&second), Some("after-add"));
        let off = json!({"messages": [{"role": "assistant", "content": "x"}, {"role": "user", "content": "?"}]});
        assert_eq!(s.choose(&off), None);
    }

    #[test]
    fn bad_scripts_say_why() {
        let err = |t: &str| Script::from_toml_str(t, None).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err("[[turn]]\ntranscript = \"x\"").contains("no `model`"));
        assert!(err("model = \"m\"").contains("no [[turn]]"));
        assert!(err("model = \"m\"\n[[turn]]\ntranscript = \"x\"\nturn = 0").contains("from 1"));
        assert!(err("model = \"m\"\n[[turn]]\ntranscript = \"x\"\nwhen = 1").contains("unknown field"));
    }
}
