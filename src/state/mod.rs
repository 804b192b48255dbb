//! State updates (DESIGN §6, spec 003 §3.2.1): the `[OP, path, value?]`
//! opcodes of `<variable_update>` and [`apply`], which runs them against a
//! JSON state and says what each one did.
//!
//! This module owns the opcode vocabulary, path syntax and the semantics of
//! applying ops. It does not read responses (the payload stage turns a
//! `variable_update` element into ops) and does no I/O except
//! [`save_atomic`], the write-back helper `spindle parse --state` uses.
//!
//! # Semantics
//!
//! | op | needs | does |
//! | --- | --- | --- |
//! | `SET path value` | - | sets the value; missing objects on the way are created |
//! | `ADD/SUB/MUL/DIV path number` | a number at `path` | arithmetic; integers stay integers while exact |
//! | `PUSH path value` | an array at `path`, or nothing (a new array is created) | appends |
//! | `POP path` | a non-empty array at `path` | removes the last element |
//! | `DELETE path` | something at `path` | removes the key or array element |
//!
//! Every op is applied on its own: one that fails (a missing path, a path
//! through a string, division by zero) changes nothing and the next op still
//! runs. Paths are dotted keys with `[i]` indices (`[-1]` is the last
//! element), keys may hold any Unicode, and `["a.b"]` quotes a key that
//! holds dots. A purely numeric key (`items.0`) indexes an array.
//!
//! # Example
//!
//! ```
//! use serde_json::json;
//! use spindle::state::{apply, Op, OpCode};
//!
//! let mut state = json!({"纯田真奈": {"好感度": 1}, "mood": {"value": 3}});
//! let ops = [
//!     Op::new(OpCode::Set, "纯田真奈.好感度", Some(json!(2))),
//!     Op::new(OpCode::Add, "mood.value", Some(json!(1))),
//!     Op::new(OpCode::Div, "mood.value", Some(json!(0))),
//!     Op::new(OpCode::Push, "log", Some(json!("met Mana"))),
//! ];
//! let outcomes = apply(&mut state, &ops);
//! assert!(outcomes[0].is_ok() && outcomes[1].is_ok() && outcomes[3].is_ok());
//! assert_eq!(outcomes[2].to_string(), "DIV mood.value: failed: division by zero");
//! assert_eq!(state, json!({"纯田真奈": {"好感度": 2}, "mood": {"value": 4}, "log": ["met Mana"]}));
//! ```

mod path;

pub use path::{Path, PathError, Segment};

use serde::Serialize;
use serde_json::{Map, Number, Value};
use std::fmt;

/// A state-update opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum OpCode {
    /// Set a value.
    Set,
    /// Add a number.
    Add,
    /// Subtract a number.
    Sub,
    /// Multiply by a number.
    Mul,
    /// Divide by a number.
    Div,
    /// Append to an array.
    Push,
    /// Remove an array's last element.
    Pop,
    /// Remove a key or element.
    Delete,
}

impl OpCode {
    /// All opcodes.
    pub const ALL: [OpCode; 8] =
        [OpCode::Set, OpCode::Add, OpCode::Sub, OpCode::Mul, OpCode::Div, OpCode::Push, OpCode::Pop, OpCode::Delete];

    /// The opcode a name means, ignoring case (`set`, `Set`, `SET`).
    pub fn parse(name: &str) -> Option<OpCode> {
        let name = name.trim();
        OpCode::ALL.into_iter().find(|c| c.as_str().eq_ignore_ascii_case(name))
    }

    /// The upper-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            OpCode::Set => "SET",
            OpCode::Add => "ADD",
            OpCode::Sub => "SUB",
            OpCode::Mul => "MUL",
            OpCode::Div => "DIV",
            OpCode::Push => "PUSH",
            OpCode::Pop => "POP",
            OpCode::Delete => "DELETE",
        }
    }

    /// Whether the op takes a value (`[OP, path, value]`) or not
    /// (`[OP, path]`).
    pub fn takes_value(self) -> bool {
        !matches!(self, OpCode::Pop | OpCode::Delete)
    }

    /// Whether the value must be a number.
    pub fn is_arithmetic(self) -> bool {
        matches!(self, OpCode::Add | OpCode::Sub | OpCode::Mul | OpCode::Div)
    }
}

impl fmt::Display for OpCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One state update: `[OP, path, value?]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Op {
    /// What to do.
    pub code: OpCode,
    /// Where, as written (see [`Path`]).
    pub path: String,
    /// The operand, for ops that take one.
    pub value: Option<Value>,
}

/// Why a JSON value is not a valid op.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    /// Not an array (or an `{op, path, value}` object).
    #[error("an op is an array [OP, path, value?], found {0}")]
    NotAnOp(&'static str),
    /// The first element is not an opcode.
    #[error("unknown op {0:?} (known: SET ADD SUB MUL DIV PUSH POP DELETE)")]
    UnknownOp(String),
    /// Wrong number of elements.
    #[error("{op} takes {expected} elements ([{shape}]), found {found}")]
    Arity {
        /// The opcode.
        op: OpCode,
        /// Elements it takes, the opcode included.
        expected: usize,
        /// Elements found.
        found: usize,
        /// The shape it takes.
        shape: &'static str,
    },
    /// The path is not a string.
    #[error("the path of {op} must be a string, found {found}")]
    PathNotString {
        /// The opcode.
        op: OpCode,
        /// The JSON type found.
        found: &'static str,
    },
    /// The path is empty (the root cannot be updated by a response).
    #[error("the path of {0} is empty")]
    EmptyPath(OpCode),
    /// The path does not parse.
    #[error(transparent)]
    BadPath(#[from] PathError),
    /// An arithmetic op's value is not a number.
    #[error("{op} needs a number, found {found}")]
    NotANumber {
        /// The opcode.
        op: OpCode,
        /// The JSON type found.
        found: &'static str,
    },
}

/// The JSON type name of a value, for messages.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// An op read from JSON without a copy ([`Op::read_json`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct OpRef<'a> {
    pub(crate) code: OpCode,
    pub(crate) path: &'a str,
    pub(crate) value: Option<&'a Value>,
}

impl OpRef<'_> {
    /// The op, its path and value copied.
    pub(crate) fn to_op(self) -> Op {
        Op::new(self.code, self.path, self.value.cloned())
    }
}

/// [`Op::check`] of an op's parts: the path parses (checked without being
/// built), the arity and the operand type fit the opcode.
fn check(code: OpCode, path: &str, value: Option<&Value>) -> Result<(), OpError> {
    if path.trim().is_empty() {
        return Err(OpError::EmptyPath(code));
    }
    Path::check(path)?;
    match (value, code.takes_value()) {
        (None, true) => Err(OpError::Arity { op: code, expected: 3, found: 2, shape: "OP, path, value" }),
        (Some(_), false) => Err(OpError::Arity { op: code, expected: 2, found: 3, shape: "OP, path" }),
        (Some(v), true) if code.is_arithmetic() && !v.is_number() => {
            Err(OpError::NotANumber { op: code, found: type_name(v) })
        }
        _ => Ok(()),
    }
}

impl Op {
    /// An op; not checked (see [`Op::check`]).
    pub fn new(code: OpCode, path: &str, value: Option<Value>) -> Op {
        Op { code, path: path.to_string(), value }
    }

    /// Reads `[OP, path, value?]` (OP in any case), or the object form
    /// `{"op": .., "path": .., "value": ..}`, and checks it.
    ///
    /// # Errors
    ///
    /// [`OpError`] for a wrong shape, an unknown opcode, a wrong arity, a
    /// non-string or empty or unparsable path, or a non-number operand of
    /// ADD/SUB/MUL/DIV.
    pub fn from_json(value: &Value) -> Result<Op, OpError> {
        Op::read_json(value).map(OpRef::to_op)
    }

    /// [`Op::from_json`] without the copy: the op's parts where they lie
    /// in `value` (a reader that keeps the JSON as it is copies nothing).
    pub(crate) fn read_json(value: &Value) -> Result<OpRef<'_>, OpError> {
        let (first, path, operand, len) = match value {
            Value::Array(items) => (items.first(), items.get(1), items.get(2), items.len()),
            Value::Object(map) => {
                let get = |names: &[&str]| names.iter().find_map(|n| map.get(*n));
                let code = get(&["op", "OP", "operation", "opcode", "action"])
                    .ok_or(OpError::NotAnOp("an object without \"op\""))?;
                let path = get(&["path", "key", "target"]).ok_or(OpError::NotAnOp("an object without \"path\""))?;
                let operand = get(&["value", "val", "amount"]);
                (Some(code), Some(path), operand, 2 + usize::from(operand.is_some()))
            }
            other => return Err(OpError::NotAnOp(type_name(other))),
        };
        let Some(first) = first else {
            return Err(OpError::NotAnOp("an empty array"));
        };
        let code = match first {
            Value::String(s) => OpCode::parse(s).ok_or_else(|| OpError::UnknownOp(s.clone()))?,
            other => return Err(OpError::UnknownOp(other.to_string())),
        };
        let (expected, shape) = if code.takes_value() { (3, "OP, path, value") } else { (2, "OP, path") };
        if len != expected {
            return Err(OpError::Arity { op: code, expected, found: len, shape });
        }
        let path = match path {
            Some(Value::String(s)) => s.as_str(),
            Some(other) => {
                return Err(OpError::PathNotString { op: code, found: type_name(other) });
            }
            None => return Err(OpError::NotAnOp("an array without a path")),
        };
        check(code, path, operand)?;
        Ok(OpRef { code, path, value: operand })
    }

    /// Checks the path and the operand type.
    ///
    /// # Errors
    ///
    /// As [`Op::from_json`].
    pub fn check(&self) -> Result<(), OpError> {
        check(self.code, &self.path, self.value.as_ref())
    }

    /// The `[OP, path, value?]` form.
    pub fn to_json(&self) -> Value {
        self.clone().into_json()
    }

    /// [`Op::to_json`], taking the op (no copy of its path or value).
    pub fn into_json(self) -> Value {
        let mut items = Vec::with_capacity(3);
        items.push(Value::String(self.code.as_str().into()));
        items.push(Value::String(self.path));
        if let Some(v) = self.value {
            items.push(v);
        }
        Value::Array(items)
    }
}

impl Serialize for Op {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.code, self.path)?;
        if let Some(v) = &self.value {
            write!(f, " {}", short(v))?;
        }
        Ok(())
    }
}

/// The ops of a `variable_update` payload (`payload.ops`); entries that are
/// not valid ops are skipped (the payload stage already reported them).
///
/// ```
/// let payload = serde_json::json!({"analysis": null, "ops": [["SET", "a", 1], ["POP", "b"]]});
/// let ops = spindle::state::ops_from_payload(&payload);
/// assert_eq!(ops.len(), 2);
/// ```
pub fn ops_from_payload(payload: &Value) -> Vec<Op> {
    payload
        .get("ops")
        .and_then(Value::as_array)
        .map(|ops| ops.iter().filter_map(|v| Op::from_json(v).ok()).collect())
        .unwrap_or_default()
}

/// Why an op could not be applied.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    /// The op itself is invalid.
    #[error(transparent)]
    Invalid(#[from] OpError),
    /// The state would nest deeper than [`MAX_DEPTH`].
    #[error("the state would nest {depth} levels deep (at most {MAX_DEPTH}, so that it reads back as JSON)")]
    TooDeep {
        /// How deep it would nest.
        depth: usize,
    },
    /// Nothing is at the path (or at a step on the way).
    #[error("nothing at {0}")]
    Missing(String),
    /// A step on the way is not a container.
    #[error("the path goes through {found} at {at}")]
    NotAContainer {
        /// Where the non-container is.
        at: String,
        /// Its type.
        found: &'static str,
    },
    /// An index step met an object, or a key step met an array.
    #[error("{at} is {found}, which {step} cannot index")]
    WrongStep {
        /// Where.
        at: String,
        /// Its type.
        found: &'static str,
        /// The step.
        step: String,
    },
    /// An index is outside the array.
    #[error("index {index} is out of range at {at} (length {len})")]
    OutOfRange {
        /// The array's path.
        at: String,
        /// The index.
        index: i64,
        /// The array's length.
        len: usize,
    },
    /// The target of an arithmetic op is not a number.
    #[error("{at} holds {found}, not a number")]
    NotANumber {
        /// The path.
        at: String,
        /// Its type.
        found: &'static str,
    },
    /// The target of PUSH/POP is not an array.
    #[error("{at} holds {found}, not an array")]
    NotAnArray {
        /// The path.
        at: String,
        /// Its type.
        found: &'static str,
    },
    /// POP on an empty array.
    #[error("{0} is an empty array")]
    Empty(String),
    /// DIV by zero.
    #[error("division by zero")]
    DivisionByZero,
    /// The result is not a finite number.
    #[error("the result is not a finite number")]
    NotFinite,
}

/// What an op changed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    /// The value before (absent when the op created it).
    pub old: Option<Value>,
    /// The value after (absent when the op removed it).
    pub new: Option<Value>,
}

/// What one op did.
#[derive(Debug, Clone, PartialEq)]
pub struct OpOutcome {
    /// Position of the op in the list given to [`apply`].
    pub index: usize,
    /// The op.
    pub op: Op,
    /// The change, or why there was none.
    pub result: Result<Change, ApplyError>,
}

impl OpOutcome {
    /// Whether the op was applied.
    pub fn is_ok(&self) -> bool {
        self.result.is_ok()
    }
}

impl Serialize for OpOutcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("index", &self.index)?;
        m.serialize_entry("op", &self.op)?;
        match &self.result {
            Ok(change) => {
                m.serialize_entry("ok", &true)?;
                m.serialize_entry("old", &change.old)?;
                m.serialize_entry("new", &change.new)?;
            }
            Err(e) => {
                m.serialize_entry("ok", &false)?;
                m.serialize_entry("error", &e.to_string())?;
            }
        }
        m.end()
    }
}

impl fmt::Display for OpOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: ", self.op.code, self.op.path)?;
        match &self.result {
            Err(e) => write!(f, "failed: {e}"),
            Ok(Change { old, new }) => match (self.op.code, old, new) {
                (OpCode::Push, _, Some(v)) => write!(f, "appended {}", short(v)),
                (OpCode::Pop | OpCode::Delete, Some(v), _) => write!(f, "removed {}", short(v)),
                (_, None, Some(v)) => write!(f, "(new) -> {}", short(v)),
                (_, Some(o), Some(v)) => write!(f, "{} -> {}", short(o), short(v)),
                (_, _, None) => f.write_str("done"),
            },
        }
    }
}

/// Compact JSON, cut to 80 characters.
fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() <= 80 {
        return s;
    }
    let cut: String = s.chars().take(77).collect();
    format!("{cut}...")
}

/// Applies `ops` to `state` in order and reports each one. An op that fails
/// changes nothing; the others still run.
pub fn apply(state: &mut Value, ops: &[Op]) -> Vec<OpOutcome> {
    ops.iter()
        .enumerate()
        .map(|(index, op)| OpOutcome { index, op: op.clone(), result: apply_one(state, op) })
        .collect()
}

/// How deep a state may nest (objects and arrays, the state itself
/// counted): an op that would nest deeper fails. JSON readers refuse
/// deeper documents (serde_json stops at 128), and a state must read
/// back as it was written.
pub const MAX_DEPTH: usize = 100;

/// How many levels of arrays and objects `value` nests (a scalar: 0),
/// counted without recursion.
fn value_depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((v, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        deepest = deepest.max(depth + 1);
        stack.extend(children.map(|c| (c, depth + 1)));
    }
    deepest
}

/// Applies one op.
///
/// # Errors
///
/// [`ApplyError`] saying why nothing changed.
pub fn apply_one(state: &mut Value, op: &Op) -> Result<Change, ApplyError> {
    op.check()?;
    let path = Path::parse(&op.path).map_err(OpError::from)?;
    // A value placed at the end of the path nests one container per
    // segment (the state object first) and its own levels below.
    let depth = path.segments().len() + op.value.as_ref().map_or(0, value_depth);
    if depth > MAX_DEPTH {
        return Err(ApplyError::TooDeep { depth });
    }
    let Some((last, parents)) = path.segments().split_last() else {
        return Err(OpError::EmptyPath(op.code).into());
    };
    let create = matches!(op.code, OpCode::Set | OpCode::Push);
    // Check first, so that a failing op creates no intermediate objects.
    check_parents(state, &path, parents, last, create)?;
    let parent = parent_mut(state, parents, create, &path)?;
    let at = path.to_string();
    match op.code {
        OpCode::Set => {
            let value = op.value.clone().unwrap_or(Value::Null);
            let old = put(parent, last, value.clone(), &path)?;
            Ok(Change { old, new: Some(value) })
        }
        OpCode::Add | OpCode::Sub | OpCode::Mul | OpCode::Div => {
            let operand =
                op.value.as_ref().and_then(Value::as_number).cloned().ok_or(OpError::NotANumber {
                    op: op.code,
                    found: op.value.as_ref().map_or("nothing", type_name),
                })?;
            let slot = get_mut(parent, last, &path)?.ok_or_else(|| ApplyError::Missing(at.clone()))?;
            let Value::Number(old) = slot else {
                return Err(ApplyError::NotANumber { at, found: type_name(slot) });
            };
            let new = arithmetic(op.code, old, &operand)?;
            let old = std::mem::replace(old, new.clone());
            Ok(Change { old: Some(Value::Number(old)), new: Some(Value::Number(new)) })
        }
        OpCode::Push => {
            let value = op.value.clone().unwrap_or(Value::Null);
            match get_mut(parent, last, &path)? {
                Some(Value::Array(items)) => items.push(value.clone()),
                Some(Value::Null) | None => {
                    put(parent, last, Value::Array(vec![value.clone()]), &path)?;
                }
                Some(other) => {
                    return Err(ApplyError::NotAnArray { at, found: type_name(other) });
                }
            }
            Ok(Change { old: None, new: Some(value) })
        }
        OpCode::Pop => match get_mut(parent, last, &path)? {
            Some(Value::Array(items)) => match items.pop() {
                Some(v) => Ok(Change { old: Some(v), new: None }),
                None => Err(ApplyError::Empty(at)),
            },
            Some(other) => Err(ApplyError::NotAnArray { at, found: type_name(other) }),
            None => Err(ApplyError::Missing(at)),
        },
        OpCode::Delete => {
            let removed = match (parent, last) {
                (Value::Object(map), Segment::Key(k)) => map.shift_remove(k.as_str()),
                (Value::Array(items), seg) if is_numeric_key(seg) => {
                    array_index(seg, items.len(), true).map(|i| items.remove(i))
                }
                (other, seg) => {
                    return Err(wrong_step(&path, parents.len(), other, seg));
                }
            };
            match removed {
                Some(v) => Ok(Change { old: Some(v), new: None }),
                None => Err(ApplyError::Missing(at)),
            }
        }
    }
}

/// An index segment (or a numeric key) as a position in an array of `len`;
/// `existing` requires it to name an element (otherwise `len` is allowed,
/// meaning "append").
fn array_index(seg: &Segment, len: usize, existing: bool) -> Option<usize> {
    let i = match seg {
        Segment::Index(i) => *i,
        Segment::Key(k) => k.parse::<i64>().ok()?,
    };
    let len_i = i64::try_from(len).ok()?;
    let i = if i < 0 { len_i + i } else { i };
    let limit = if existing { len_i } else { len_i + 1 };
    if (0..limit).contains(&i) { usize::try_from(i).ok() } else { None }
}

fn is_numeric_key(seg: &Segment) -> bool {
    match seg {
        Segment::Index(_) => true,
        Segment::Key(k) => !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()),
    }
}

fn wrong_step(path: &Path, n: usize, found: &Value, seg: &Segment) -> ApplyError {
    let at = if n == 0 { "the root".to_string() } else { path.prefix_string(n) };
    match found {
        Value::Object(_) | Value::Array(_) => ApplyError::WrongStep {
            at,
            found: type_name(found),
            step: match seg {
                Segment::Key(k) => format!("key {k:?}"),
                Segment::Index(i) => format!("index [{i}]"),
            },
        },
        other => ApplyError::NotAContainer { at, found: type_name(other) },
    }
}

/// Walks the parent steps without changing anything: every existing step
/// must be a container the next step can index; missing steps (or `null`)
/// are allowed only when `create` and the step after them is a key, since
/// only objects are created.
fn check_parents(
    state: &Value,
    path: &Path,
    parents: &[Segment],
    last: &Segment,
    create: bool,
) -> Result<(), ApplyError> {
    let mut cur = Some(state);
    for (n, seg) in parents.iter().chain(std::iter::once(last)).enumerate() {
        let is_last = n == parents.len();
        cur = match cur {
            None | Some(Value::Null) if create && matches!(seg, Segment::Key(_)) => None,
            None | Some(Value::Null) => {
                return Err(ApplyError::Missing(if n == 0 { "the root".into() } else { path.prefix_string(n) }));
            }
            Some(Value::Object(map)) => match seg {
                Segment::Key(k) => map.get(k.as_str()),
                Segment::Index(_) => {
                    return Err(wrong_step(path, n, &Value::Object(Map::new()), seg));
                }
            },
            Some(Value::Array(items)) if is_numeric_key(seg) => {
                if is_last {
                    // The last step may append (SET) or may be missing (the
                    // op decides); `put` checks the range.
                    return Ok(());
                }
                match array_index(seg, items.len(), true) {
                    Some(i) => items.get(i),
                    None => {
                        return Err(ApplyError::OutOfRange {
                            at: path.prefix_string(n),
                            index: segment_index(seg),
                            len: items.len(),
                        });
                    }
                }
            }
            Some(other) => return Err(wrong_step(path, n, other, seg)),
        };
        if is_last {
            break;
        }
    }
    Ok(())
}

fn segment_index(seg: &Segment) -> i64 {
    match seg {
        Segment::Index(i) => *i,
        Segment::Key(k) => k.parse().unwrap_or(0),
    }
}

/// The container the last step indexes, creating missing objects on the
/// way when `create` (after [`check_parents`] said that is possible).
fn parent_mut<'v>(
    state: &'v mut Value,
    parents: &[Segment],
    create: bool,
    path: &Path,
) -> Result<&'v mut Value, ApplyError> {
    let mut cur = state;
    for (n, seg) in parents.iter().enumerate() {
        if create && cur.is_null() {
            *cur = Value::Object(Map::new());
        }
        cur = match cur {
            Value::Object(map) => match seg {
                Segment::Key(k) => {
                    if create {
                        map.entry(k.clone()).or_insert_with(|| Value::Object(Map::new()))
                    } else {
                        map.get_mut(k.as_str()).ok_or_else(|| ApplyError::Missing(path.prefix_string(n + 1)))?
                    }
                }
                Segment::Index(_) => {
                    return Err(wrong_step(path, n, &Value::Object(Map::new()), seg));
                }
            },
            Value::Array(items) => {
                let len = items.len();
                let i = array_index(seg, len, true).ok_or_else(|| ApplyError::Missing(path.prefix_string(n + 1)))?;
                items.get_mut(i).ok_or_else(|| ApplyError::Missing(path.prefix_string(n + 1)))?
            }
            other => return Err(wrong_step(path, n, other, seg)),
        };
    }
    if create && cur.is_null() {
        *cur = Value::Object(Map::new());
    }
    Ok(cur)
}

/// The value the last step names in `parent`, if any.
fn get_mut<'v>(parent: &'v mut Value, last: &Segment, path: &Path) -> Result<Option<&'v mut Value>, ApplyError> {
    let n = path.segments().len() - 1;
    match parent {
        Value::Object(map) => match last {
            Segment::Key(k) => Ok(map.get_mut(k.as_str())),
            Segment::Index(_) => Err(wrong_step(path, n, &Value::Object(Map::new()), last)),
        },
        Value::Array(items) => {
            if !is_numeric_key(last) {
                return Err(wrong_step(path, n, &Value::Array(Vec::new()), last));
            }
            let len = items.len();
            Ok(array_index(last, len, true).and_then(move |i| items.get_mut(i)))
        }
        other => Err(wrong_step(path, n, other, last)),
    }
}

/// Sets the last step in `parent`; returns the value it replaced.
fn put(parent: &mut Value, last: &Segment, value: Value, path: &Path) -> Result<Option<Value>, ApplyError> {
    let n = path.segments().len() - 1;
    match parent {
        Value::Object(map) => match last {
            Segment::Key(k) => Ok(map.insert(k.clone(), value)),
            Segment::Index(_) => Err(wrong_step(path, n, &Value::Object(Map::new()), last)),
        },
        Value::Array(items) => {
            if !is_numeric_key(last) {
                return Err(wrong_step(path, n, &Value::Array(Vec::new()), last));
            }
            let len = items.len();
            match array_index(last, len, false) {
                Some(i) if i == len => {
                    items.push(value);
                    Ok(None)
                }
                Some(i) => Ok(items.get_mut(i).map(|slot| std::mem::replace(slot, value))),
                None => Err(ApplyError::OutOfRange { at: path.prefix_string(n), index: segment_index(last), len }),
            }
        }
        other => Err(wrong_step(path, n, other, last)),
    }
}

/// `old OP operand`: exact integer arithmetic while it stays exact, floats
/// otherwise.
fn arithmetic(code: OpCode, old: &Number, operand: &Number) -> Result<Number, ApplyError> {
    if let (Some(a), Some(b)) = (old.as_i64(), operand.as_i64()) {
        let exact = match code {
            OpCode::Add => a.checked_add(b),
            OpCode::Sub => a.checked_sub(b),
            OpCode::Mul => a.checked_mul(b),
            OpCode::Div => {
                if b == 0 {
                    return Err(ApplyError::DivisionByZero);
                }
                if a.checked_rem(b) == Some(0) { a.checked_div(b) } else { None }
            }
            _ => None,
        };
        if let Some(n) = exact {
            return Ok(Number::from(n));
        }
    }
    let (Some(a), Some(b)) = (old.as_f64(), operand.as_f64()) else {
        return Err(ApplyError::NotFinite);
    };
    let r = match code {
        OpCode::Add => a + b,
        OpCode::Sub => a - b,
        OpCode::Mul => a * b,
        OpCode::Div => {
            if b == 0.0 {
                return Err(ApplyError::DivisionByZero);
            }
            a / b
        }
        _ => return Err(ApplyError::NotFinite),
    };
    Number::from_f64(r).ok_or(ApplyError::NotFinite)
}

/// Writes `state` to `path` atomically: pretty JSON into a temporary file in
/// the same directory, flushed to disk, then renamed over `path` (keeping
/// its permissions). A crash leaves either the old file or the new one.
///
/// # Errors
///
/// The I/O error of creating, writing, syncing or renaming the temporary
/// file; the temporary file is removed on failure.
pub fn save_atomic(path: &std::path::Path, state: &Value) -> std::io::Result<()> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "state".into());
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut text = serde_json::to_vec_pretty(state).map_err(std::io::Error::other)?;
        text.push(b'\n');
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        file.write_all(&text)?;
        if let Ok(meta) = std::fs::metadata(path) {
            file.set_permissions(meta.permissions())?;
        }
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
