//! The sandboxed Jinja2 renderer (spec 003 §2.3.1–§2.3.3, §2.3.5) on
//! minijinja: prompts with `{{ user }}`, `{{ char }}`, `{{ state.hp }}`,
//! `{% set x %}…{% endset %}` and the helper functions and filters of the
//! spec's tables, rendered to plain text before they go to the model.
//!
//! This module owns the environment (functions, filters, limits) and the
//! render. The sandbox:
//!
//! * `state` and `state_desc` are read-only: the values are immutable, and a
//!   template that binds them (`{% set state = … %}`,
//!   `{% set state.hp = 0 %}`, a tuple target, `{% for state in … %}`,
//!   `{% with state = … %}`, a macro parameter) is refused before it runs;
//! * no file system or network: there is no template loader (so `include`,
//!   `import` and `extends` find nothing) and no function that reads or
//!   fetches anything;
//! * only the functions below exist;
//! * limits ([`RenderLimits`]): instructions (fuel: a loop that runs too
//!   long ends), recursion depth (macros calling themselves), output size.
//!   A template past a limit ends with a [`RenderError`] that says which.
//!
//! # Global writes
//!
//! `{% set_global name = value %}` (what [`crate::prompt::migrate`] makes
//! of SillyTavern's `{{setglobalvar}}` and its kin, spec 003 §2.3.4)
//! writes nothing: it prints nothing and hands the write to the host, in
//! [`Rendered::global_writes`] ([`Renderer::render_full`]), to apply to
//! its own store. The rest of the render reads the written value as
//! `global_state.name` (a top-level name; a dotted one is handed on but
//! not read back).
//!
//! # Context
//!
//! The variables given (`user`, `char`, `group`, `history`, `config`, …, as
//! the host has them; one it did not give prints as nothing, and so do its
//! attributes), `state` (the variable state that `variable_update`
//! maintains, [`crate::state`]), `state_desc`, and `now` (an RFC 3339 time;
//! fixed with [`Renderer::with_now`] for reproducible renders).
//!
//! # Functions and filters
//!
//! | name | what |
//! |---|---|
//! | `random(list)` | one item, from a seeded generator ([`Renderer::with_seed`]) |
//! | `pick(list)` | one item chosen by a hash of the list and the seed: the same list gives the same item |
//! | `roll('2d6+1')` | dice: `NdM`, `dM`, `+`/`-` constants; a number alone is one die of that many sides (`roll('20')` is `1d20`), and a formula it cannot read, or of more than 1,000 dice in all, rolls nothing (empty), as in SillyTavern |
//! | `time_diff(a, b)` | the time between two times (RFC 3339, ISO 8601 without an offset read as UTC, or `November 24, 2026` as `{{date}}` shows it), in words (`2 hours`); `Invalid date` when one cannot be read, as in SillyTavern |
//! | `outlet(name)` | the text of world-info outlet `name` (from the `outlets` variable) |
//! | `time(fmt)` | `now` in moment.js tokens (default `LT`: `9:05 PM`) |
//! | `format(fmt, args…)` | printf-style formatting, as the `format` filter: `format('%s: %d HP', name, hp)` |
//! | `addvar(current, value)` | SillyTavern's `addvar`: a list gets `value` appended; numbers (and text that reads as one) add; anything else is joined as text; unset counts as `0` (what migrated `{{addvar}}`, `{{incvar}}`, `{{decvar}}` call) |
//! | `x \| time_format(fmt)` | a time in moment.js tokens (default `LT`: `9:05 PM`) |
//! | `x \| date_format(fmt)` | the same, default `LL` (`November 24, 2026`) |
//! | `x \| utc_offset(hours)` | the time at that UTC offset |
//! | `x \| to_yaml` | 2-space YAML |
//! | `x \| format_examples` | SillyTavern example dialogue (`<START>` blocks), numbered |
//! | `x \| filter_not_muted` | the names of the group members that are not muted, comma-separated |
//!
//! The standard Jinja2 filters and tests (`trim`, `reverse`, `join`,
//! `default`, …) are there too.

use super::yaml::to_yaml;
use chrono::{DateTime, Datelike, FixedOffset, NaiveDate, NaiveDateTime, Timelike};
use minijinja::value::{Rest, Value};
use minijinja::{Environment, Error, ErrorKind, State};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// The stack of a render's own thread (see [`RenderLimits::max_time`]).
const RENDER_STACK: usize = 8 * 1024 * 1024;

/// The renderer's limits.
///
/// They bound work and memory (`fuel`), stack (`recursion`), output
/// (`max_output`) and wall time (`max_time`). Fuel pays for instructions
/// and for data: minijinja charges one fuel per instruction and one per
/// 64 bytes of most strings, lists and maps a template creates (`~`, `*`,
/// filters, captured output, strings and tuples joined with `+`), and
/// refuses such an allocation when it is larger than the fuel left. So a
/// string joined with itself again and again (`{% set a = a ~ a %}`) ends
/// with the fuel limit.
///
/// One growth fuel does not see: lists joined with `+` stay lazy and cost
/// nothing until minijinja (3.1) copies a chain of more than 32 of them in
/// one step, uncharged. A list doubled 40 times (`{% set ns.a = ns.a +
/// ns.a %}` in a loop) would take hours and all memory. `max_time` ends
/// such a render: the caller gets [`RenderError::Limit`] at the deadline.
/// The render itself cannot be stopped in the middle of that step and
/// goes on, on its own thread, until it ends (in a short-lived process,
/// such as `spindle prompt render`, with the process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderLimits {
    /// Most work one render may do (default 1,000,000): one fuel per
    /// instruction, one per 64 bytes of data created.
    pub fuel: u64,
    /// Deepest nesting of macro calls and blocks (default 64).
    pub recursion: usize,
    /// Most bytes of output (default 4 MiB).
    pub max_output: usize,
    /// Most wall time of one render (default 10 s). With a limit the render
    /// runs on a thread of its own (about 20 µs more per render), which the
    /// caller stops waiting for at the deadline; `None`: on the caller's
    /// thread, for templates the host trusts.
    pub max_time: Option<Duration>,
}

impl Default for RenderLimits {
    fn default() -> Self {
        RenderLimits {
            fuel: 1_000_000,
            recursion: 64,
            max_output: 4 * 1024 * 1024,
            max_time: Some(Duration::from_secs(10)),
        }
    }
}

/// Why a render failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RenderError {
    /// The template is not valid Jinja2 (line in the message).
    #[error("template error: {0}")]
    Template(String),
    /// The template tried something the sandbox forbids.
    #[error("sandbox: {0}")]
    Sandbox(String),
    /// A limit ended the render.
    #[error("limit: {0}")]
    Limit(String),
}

/// A sandboxed Jinja2 renderer.
///
/// ```
/// use spindle::prompt::Renderer;
/// use serde_json::json;
///
/// let r = Renderer::new().with_seed(7);
/// let text = r.render(
///     "{{ char }} greets {{ user }} (HP {{ state.hp }}).{% set mood %}calm{% endset %} Mood: {{ mood }}",
///     &json!({"user": "Ann", "char": "Seraphina"}),
///     &json!({"hp": 18}),
/// ).unwrap();
/// assert_eq!(text, "Seraphina greets Ann (HP 18). Mood: calm");
/// ```
#[derive(Debug, Clone)]
pub struct Renderer {
    limits: RenderLimits,
    seed: u64,
    now: Option<DateTime<FixedOffset>>,
}

impl Default for Renderer {
    fn default() -> Self {
        Renderer::new()
    }
}

impl Renderer {
    /// A renderer with the default limits, seed 0 and the clock's time.
    pub fn new() -> Renderer {
        Renderer { limits: RenderLimits::default(), seed: 0, now: None }
    }

    /// Uses these limits.
    pub fn with_limits(mut self, limits: RenderLimits) -> Renderer {
        self.limits = limits;
        self
    }

    /// Seeds `random` and `pick` (the same seed gives the same render).
    pub fn with_seed(mut self, seed: u64) -> Renderer {
        self.seed = seed;
        self
    }

    /// Fixes `now` (reproducible renders of time macros).
    pub fn with_now(mut self, now: DateTime<FixedOffset>) -> Renderer {
        self.now = Some(now);
        self
    }

    fn environment(&self) -> Environment<'static> {
        let mut env = Environment::new();
        env.set_fuel(Some(self.limits.fuel));
        env.set_recursion_limit(self.limits.recursion);
        // What the host did not provide prints as nothing, attributes of it
        // too (as SillyTavern's macros do), instead of failing the render.
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Chainable);
        let rng = Arc::new(Mutex::new(ChaCha8Rng::seed_from_u64(self.seed)));
        let seed = self.seed;
        env.add_function("random", move |args: Rest<Value>| -> Result<Value, Error> {
            let items = items_of(&args)?;
            if items.is_empty() {
                return Ok(Value::from(""));
            }
            let n = rng.lock().unwrap_or_else(PoisonError::into_inner).next_u64();
            Ok(items[(n % items.len() as u64) as usize].clone())
        });
        env.add_function("pick", move |args: Rest<Value>| -> Result<Value, Error> {
            let items = items_of(&args)?;
            if items.is_empty() {
                return Ok(Value::from(""));
            }
            let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
            for item in &items {
                for b in item.to_string().bytes() {
                    h ^= u64::from(b);
                    h = h.wrapping_mul(0x0100_0000_01b3);
                }
            }
            Ok(items[(h % items.len() as u64) as usize].clone())
        });
        let dice = Arc::new(Mutex::new(ChaCha8Rng::seed_from_u64(self.seed ^ 0x5eed)));
        env.add_function("roll", move |formula: String| -> Value {
            roll(&formula, &mut dice.lock().unwrap_or_else(PoisonError::into_inner))
        });
        env.add_function("time_diff", |a: String, b: String| -> String {
            match (parse_time(&a), parse_time(&b)) {
                (Ok(a), Ok(b)) => humanize((a - b).num_seconds().abs()),
                // What SillyTavern's moment.js shows.
                _ => "Invalid date".into(),
            }
        });
        env.add_function("outlet", |state: &State<'_, '_>, name: String| -> Value {
            state.lookup("outlets").and_then(|o| o.get_attr(&name).ok()).unwrap_or(Value::from(""))
        });
        env.add_function("addvar", |current: Value, value: Value| st_add(&current, &value));
        // The `format` filter as a function too: `format('%s has %d HP', name, hp)`.
        env.add_function("format", minijinja::filters::format);
        env.add_filter("time_format", |v: String, fmt: Option<String>| -> Result<String, Error> {
            Ok(moment(&parse_time(&v)?, fmt.as_deref().unwrap_or("LT")))
        });
        env.add_filter("date_format", |v: String, fmt: Option<String>| -> Result<String, Error> {
            Ok(moment(&parse_time(&v)?, fmt.as_deref().unwrap_or("LL")))
        });
        env.add_filter("utc_offset", |v: String, hours: f64| -> Result<String, Error> {
            let secs = (hours * 3600.0).round() as i32;
            let offset = FixedOffset::east_opt(secs).ok_or_else(|| {
                Error::new(ErrorKind::InvalidOperation, format!("UTC offset {hours} is out of range"))
            })?;
            Ok(parse_time(&v)?.with_timezone(&offset).to_rfc3339())
        });
        env.add_filter("to_yaml", |v: Value| -> String {
            let json = serde_json::to_value(&v).unwrap_or(serde_json::Value::Null);
            to_yaml(&json).trim_end().to_string()
        });
        env.add_filter("format_examples", |v: Value| -> String {
            let text = v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
            let blocks: Vec<&str> = text.split("<START>").map(str::trim).filter(|b| !b.is_empty()).collect();
            blocks.iter().enumerate().map(|(i, b)| format!("Example {}:\n{b}", i + 1)).collect::<Vec<_>>().join("\n\n")
        });
        env.add_filter("filter_not_muted", |v: Value| -> Result<String, Error> {
            let mut names = Vec::new();
            for m in v.try_iter()? {
                let muted = m.get_attr("muted").map(|x| x.is_true()).unwrap_or(false);
                if muted {
                    continue;
                }
                let name = match m.get_attr("name") {
                    Ok(n) if !n.is_undefined() && !n.is_none() => n.to_string(),
                    _ => m.to_string(),
                };
                names.push(name);
            }
            Ok(names.join(", "))
        });
        env
    }

    /// Renders `template` with the variables `vars` (an object) and the
    /// read-only `state`. The writes of `{% set_global %}` are left out:
    /// [`Renderer::render_full`] hands them on.
    ///
    /// # Errors
    ///
    /// [`RenderError`]: invalid template, a sandbox violation, a limit hit.
    pub fn render(
        &self,
        template: &str,
        vars: &serde_json::Value,
        state: &serde_json::Value,
    ) -> Result<String, RenderError> {
        self.render_full(template, vars, state).map(|r| r.text)
    }

    /// [`Renderer::render`], with the writes of the template's
    /// `{% set_global %}` statements for the host to apply.
    ///
    /// ```
    /// use spindle::prompt::Renderer;
    /// use serde_json::json;
    ///
    /// let r = Renderer::new();
    /// let out = r.render_full(
    ///     "{% set_global met = addvar(global_state.met, 1) %}Met {{ global_state.met }} times.",
    ///     &json!({"global_state": {"met": 2}}),
    ///     &json!({}),
    /// ).unwrap();
    /// assert_eq!(out.text, "Met 3 times.");
    /// assert_eq!(out.global_writes[0].name, "met");
    /// assert_eq!(out.global_writes[0].value, json!(3));
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Renderer::render`].
    pub fn render_full(
        &self,
        template: &str,
        vars: &serde_json::Value,
        state: &serde_json::Value,
    ) -> Result<Rendered, RenderError> {
        let Some(limit) = self.limits.max_time else {
            return self.render_here(template, vars, state);
        };
        // On a thread of its own, so that a render that runs away (see
        // RenderLimits) is left behind at the deadline.
        let (tx, rx) = std::sync::mpsc::channel();
        let (me, template, vars, state) = (self.clone(), template.to_string(), vars.clone(), state.clone());
        std::thread::Builder::new()
            .name("spindle-render".into())
            // As deep as the main thread's: the recursion limit is counted
            // in template frames, not bytes.
            .stack_size(RENDER_STACK)
            .spawn(move || {
                let _ = tx.send(me.render_here(&template, &vars, &state));
            })
            .map_err(|e| RenderError::Limit(format!("no thread to render on: {e}")))?;
        match rx.recv_timeout(limit) {
            Ok(rendered) => rendered,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(RenderError::Limit(format!(
                "the template was still rendering after {} s (RenderLimits::max_time); a list that grows \
                 without bound (doubled with `+` in a loop) does that",
                limit.as_secs_f64()
            ))),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err(RenderError::Limit("the render ended without a result (its thread panicked)".into()))
            }
        }
    }

    /// [`Renderer::render_full`] on this thread, without `max_time`.
    fn render_here(
        &self,
        template: &str,
        vars: &serde_json::Value,
        state: &serde_json::Value,
    ) -> Result<Rendered, RenderError> {
        if let Some(why) = writes_state(template) {
            return Err(RenderError::Sandbox(why));
        }
        let template = with_global_writes(template);
        let writes: Writes = Arc::default();
        let mut env = self.environment();
        let sink = writes.clone();
        env.add_function(SET_GLOBAL_FN, move |name: String, value: Value| -> Value {
            sink.lock().unwrap_or_else(PoisonError::into_inner).push((name, value));
            Value::from("")
        });
        let now = self.now.unwrap_or_else(|| chrono::Local::now().fixed_offset());
        env.add_function("time", move |fmt: Option<String>| moment(&now, fmt.as_deref().unwrap_or("LT")));
        let tmpl = env.template_from_str(&template).map_err(|e| classify(&e))?;
        let mut ctx = match vars {
            serde_json::Value::Object(m) => m.clone(),
            _ => serde_json::Map::new(),
        };
        ctx.insert("state".into(), state.clone());
        if !ctx.contains_key("state_desc") {
            ctx.insert("state_desc".into(), serde_json::Value::Object(serde_json::Map::new()));
        }
        ctx.insert("now".into(), serde_json::Value::String(now.to_rfc3339()));
        // `user` and `char` given as objects print as their names and keep
        // their fields (`{{ char }}` and `{{ char.description }}` both work).
        let mut root: std::collections::BTreeMap<String, Value> =
            ctx.iter().map(|(k, v)| (k.clone(), Value::from(minijinja::value::Serde(v)))).collect();
        for key in ["user", "char"] {
            if let Some(serde_json::Value::Object(fields)) = ctx.get(key)
                && let Some(name) = fields.get("name").and_then(serde_json::Value::as_str)
            {
                let fields = Value::from(minijinja::value::Serde(fields));
                root.insert(key.into(), Value::from_object(Named { name: name.to_string(), fields }));
            }
        }
        let base = root.remove("global_state").unwrap_or_else(|| Value::from(()));
        root.insert("global_state".into(), Value::from_object(GlobalState { base, writes: writes.clone() }));
        let mut out = Limited { buf: Vec::new(), max: self.limits.max_output };
        match tmpl.render_captured_to(Value::from(root), &mut out) {
            Ok(_) => {
                let writes = std::mem::take(&mut *writes.lock().unwrap_or_else(PoisonError::into_inner));
                let global_writes = writes
                    .into_iter()
                    .map(|(name, value)| GlobalWrite {
                        name,
                        value: serde_json::to_value(&value).unwrap_or(serde_json::Value::Null),
                    })
                    .collect();
                Ok(Rendered { text: String::from_utf8_lossy(&out.buf).into_owned(), global_writes })
            }
            Err(e) if e.kind() == ErrorKind::WriteFailure => Err(RenderError::Limit(format!(
                "the output passed {} bytes (RenderLimits::max_output)",
                self.limits.max_output
            ))),
            Err(e) => Err(classify(&e)),
        }
    }
}

/// What [`Renderer::render_full`] gives: the text, and the global writes
/// for the host.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Rendered {
    /// The rendered text.
    pub text: String,
    /// The writes of `{% set_global %}`, in the order they ran.
    pub global_writes: Vec<GlobalWrite>,
}

/// One `{% set_global name = value %}` that ran.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct GlobalWrite {
    /// The variable (a dotted path as written: `quest.stage`).
    pub name: String,
    /// Its new value.
    pub value: serde_json::Value,
}

/// The writes of one render, as they run.
type Writes = Arc<Mutex<Vec<(String, Value)>>>;

/// The function a `{% set_global %}` becomes (a name no template uses).
const SET_GLOBAL_FN: &str = "__spindle_set_global";

/// `global_state`: the host's values, under the writes made so far.
#[derive(Debug)]
struct GlobalState {
    base: Value,
    writes: Writes,
}

impl minijinja::value::Object for GlobalState {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let name = key.as_str()?;
        let written = self.writes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, value)) = written.iter().rev().find(|(n, _)| n == name) {
            return Some(value.clone());
        }
        drop(written);
        self.base.get_item(key).ok().filter(|v| !v.is_undefined())
    }
}

/// `template` with each `{% set_global NAME = EXPR %}` made a call of
/// [`SET_GLOBAL_FN`] that prints nothing: `{{ __spindle_set_global("NAME",
/// (EXPR)) }}`, whitespace control kept. Comments, `{% raw %}` blocks and
/// string literals inside tags are stepped over. (minijinja has no custom
/// statements; its syntax tree is not part of its stable API.)
fn with_global_writes(template: &str) -> std::borrow::Cow<'_, str> {
    if !template.contains("set_global") {
        return std::borrow::Cow::Borrowed(template);
    }
    let mut out = String::with_capacity(template.len() + 64);
    let mut rest = template;
    while let Some(i) = rest.find('{') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let close = match rest.as_bytes().get(1) {
            Some(b'#') => "#}",
            Some(b'%') => "%}",
            Some(b'{') => "}}",
            _ => {
                out.push('{');
                rest = &rest[1..];
                continue;
            }
        };
        let end = if close == "#}" { rest.find(close).map(|e| e + 2) } else { tag_end(rest, close) };
        let Some(end) = end else {
            // Unclosed: minijinja reports it.
            out.push_str(rest);
            return std::borrow::Cow::Owned(out);
        };
        let (tag, after) = rest.split_at(end);
        rest = after;
        if close != "%}" {
            out.push_str(tag);
            continue;
        }
        let inner = &tag[2..tag.len() - 2];
        let (open_ws, inner) = split_ws_control(inner, true);
        let (close_ws, inner) = split_ws_control(inner, false);
        let words = inner.trim();
        if words == "raw" {
            // Everything to `{% endraw %}` is text.
            out.push_str(tag);
            let stop = raw_end(rest);
            out.push_str(&rest[..stop]);
            rest = &rest[stop..];
            continue;
        }
        let Some(assignment) = words.strip_prefix("set_global").filter(|a| a.starts_with(char::is_whitespace)) else {
            out.push_str(tag);
            continue;
        };
        match assignment.split_once('=') {
            Some((name, expr)) if is_path(name.trim()) && !expr.starts_with('=') => {
                out.push_str(&format!(
                    "{{{{{open_ws} {SET_GLOBAL_FN}(\"{}\", ({})) {close_ws}}}}}",
                    name.trim(),
                    expr.trim()
                ));
            }
            // Not an assignment: left for minijinja to refuse.
            _ => out.push_str(tag),
        }
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

/// The end (past `close`) of the tag `source` begins with, stepping over
/// string literals; `None` when it never closes.
fn tag_end(source: &str, close: &str) -> Option<usize> {
    let bytes = source.as_bytes();
    let mut i = 2;
    let mut quote: Option<u8> = None;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(_) if b == b'\\' => i += 1,
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None if b == b'"' || b == b'\'' => quote = Some(b),
            // Bytes, not `str`: `i` may be inside a character.
            None if bytes[i..].starts_with(close.as_bytes()) => return Some(i + close.len()),
            None => {}
        }
        i += 1;
    }
    None
}

/// A tag's whitespace control mark (`-` or `+`) at its start (`front`) or
/// end, and the rest.
fn split_ws_control(inner: &str, front: bool) -> (&str, &str) {
    let mark = |c: char| c == '-' || c == '+';
    if front {
        match inner.chars().next() {
            Some(c) if mark(c) => (&inner[..1], &inner[1..]),
            _ => ("", inner),
        }
    } else {
        match inner.chars().last() {
            Some(c) if mark(c) => (&inner[inner.len() - 1..], &inner[..inner.len() - 1]),
            _ => ("", inner),
        }
    }
}

/// Where the `{% endraw %}` that ends a raw block begins (the end when
/// none does).
fn raw_end(source: &str) -> usize {
    let mut from = 0;
    while let Some(i) = source[from..].find("{%") {
        let at = from + i;
        let inner = &source[at + 2..];
        let inner = inner.strip_prefix(['-', '+']).unwrap_or(inner);
        if inner.trim_start().starts_with("endraw") {
            return at;
        }
        from = at + 2;
    }
    source.len()
}

/// Whether `name` is a variable or a dotted path (`quest.stage`).
fn is_path(name: &str) -> bool {
    !name.is_empty() && name.split('.').all(is_identifier)
}

/// Whether `s` is a name as Jinja2 (and minijinja's `unicode` feature)
/// reads one: Unicode XID. The one rule of the prompt side: a name the
/// migration writes is a name the render reads, and the other way round.
pub(super) fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| is_name_char(c, true)) && chars.all(|c| is_name_char(c, false))
}

/// Whether Jinja2 takes `c` in a name (Unicode XID, and `_`), as its first
/// character or a later one.
pub(super) fn is_name_char(c: char, first: bool) -> bool {
    c == '_' || if first { unicode_ident::is_xid_start(c) } else { unicode_ident::is_xid_continue(c) }
}

/// A person given as an object: prints as its name, fields by attribute.
#[derive(Debug)]
struct Named {
    name: String,
    fields: Value,
}

impl minijinja::value::Object for Named {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.fields.get_item(key).ok().filter(|v| !v.is_undefined())
    }

    fn render(self: &Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

/// Output with a size limit (the write past it fails, which ends the
/// render).
struct Limited {
    buf: Vec<u8>,
    max: usize,
}

impl std::io::Write for Limited {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + data.len() > self.max {
            return Err(std::io::Error::other("output limit"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn classify(e: &Error) -> RenderError {
    let text = crate::chain::error_chain(e);
    match e.kind() {
        ErrorKind::OutOfFuel => RenderError::Limit(format!("the template ran too long (RenderLimits::fuel): {text}")),
        _ if ["include", "import", "extends", "from"]
            .iter()
            .any(|s| text.contains(&format!("unknown statement {s}"))) =>
        {
            RenderError::Sandbox(format!("templates cannot load other files: {text}"))
        }
        ErrorKind::TemplateNotFound | ErrorKind::BadInclude => {
            RenderError::Sandbox(format!("templates cannot load other files: {text}"))
        }
        _ if text.contains("recursion") => {
            RenderError::Limit(format!("the template nests too deep (RenderLimits::recursion): {text}"))
        }
        _ => RenderError::Template(text),
    }
}

/// A statement anywhere in the source that binds `state` or `state_desc`:
/// `{% set state … %}` (also in a tuple, `{% set (state, x) = … %}`),
/// `{% for state in … %}`, `{% with state = … %}`, a macro or call block
/// parameter. Each would show other values under the name the caller's
/// state has. (A scan of the source: minijinja's syntax tree is not part
/// of its stable API.)
fn writes_state(template: &str) -> Option<String> {
    let mut rest = template;
    while let Some(i) = rest.find("{%") {
        rest = &rest[i + 2..];
        let tag = rest.trim_start_matches(['-', '+']).trim_start();
        let tag = &tag[..tag.find("%}").unwrap_or(tag.len())];
        let keyword_end = tag.find(|c: char| !c.is_ascii_alphabetic()).unwrap_or(tag.len());
        let (keyword, body) = tag.split_at(keyword_end);
        // The part of the statement that names what it binds.
        let targets: Vec<&str> = match keyword {
            "set" => vec![body.split('=').next().unwrap_or(body)],
            "for" => vec![body.split(" in ").next().unwrap_or(body)],
            "with" => body.split(',').map(|a| a.split('=').next().unwrap_or(a)).collect(),
            "macro" | "call" => {
                let params = body.split_once('(').map_or("", |(_, params)| params);
                params.split(',').map(|p| p.split('=').next().unwrap_or(p)).collect()
            }
            _ => continue,
        };
        for target in targets {
            let names = target.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'));
            for name in names.map(|n| n.split('.').next().unwrap_or(n)) {
                if name == "state" || name == "state_desc" {
                    return Some(format!("templates cannot write `{name}` (it is read-only)"));
                }
            }
        }
    }
    None
}

/// SillyTavern's `addvar` on a variable's value (its `addLocalVariable`):
/// unset, empty or zero counts as `0`; a list (or text holding a JSON
/// list) gets `value` appended; when both read as numbers they add;
/// otherwise `value` is appended to the text (to nothing for `0`).
fn st_add(current: &Value, value: &Value) -> Value {
    let set = current.is_true();
    let current = if set { current.clone() } else { Value::from(0) };
    let list: Option<Vec<Value>> = match current.as_str() {
        Some(text) => serde_json::from_str::<Vec<serde_json::Value>>(text)
            .ok()
            .map(|items| items.iter().map(|v| Value::from(minijinja::value::Serde(v))).collect()),
        None if current.kind() == minijinja::value::ValueKind::Seq => current.try_iter().ok().map(Iterator::collect),
        None => None,
    };
    if let Some(mut items) = list {
        items.push(value.clone());
        return Value::from(items);
    }
    match (js_number(&current), js_number(value)) {
        (Some(a), Some(b)) => js_number_value(a + b),
        _ => {
            let head = if set { js_string(&current) } else { String::new() };
            Value::from(head + &js_string(value))
        }
    }
}

/// JavaScript's `Number(x)` for a template value, `None` for `NaN`.
fn js_number(v: &Value) -> Option<f64> {
    if let Some(text) = v.as_str() {
        let t = text.trim();
        let (sign, digits) = match t.strip_prefix('-') {
            Some(rest) => (-1.0, rest),
            None => (1.0, t.strip_prefix('+').unwrap_or(t)),
        };
        let radix = |p: &str, r: u32| t.get(..2).filter(|h| h.eq_ignore_ascii_case(p)).map(|_| (&t[2..], r));
        return if t.is_empty() {
            Some(0.0)
        } else if let Some((body, r)) = radix("0x", 16).or_else(|| radix("0o", 8)).or_else(|| radix("0b", 2)) {
            u64::from_str_radix(body, r).ok().map(|n| n as f64)
        } else if digits == "Infinity" {
            Some(sign * f64::INFINITY)
        } else if digits.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-')) {
            t.parse::<f64>().ok()
        } else {
            None
        };
    }
    match v.kind() {
        minijinja::value::ValueKind::Bool => Some(if v.is_true() { 1.0 } else { 0.0 }),
        minijinja::value::ValueKind::None => Some(0.0),
        minijinja::value::ValueKind::Number => f64::try_from(v.clone()).ok(),
        _ => None,
    }
}

/// A sum as JavaScript keeps it: a whole number prints without `.0`.
fn js_number_value(n: f64) -> Value {
    if n.fract() == 0.0 && n.abs() < 9.007_199_254_740_992e15 { Value::from(n as i64) } else { Value::from(n) }
}

/// JavaScript's `String(x)` for the values `addvar` joins.
fn js_string(v: &Value) -> String {
    match (v.as_str(), js_number(v).filter(|_| v.kind() == minijinja::value::ValueKind::Number)) {
        (Some(text), _) => text.to_string(),
        (None, Some(n)) => js_number_value(n).to_string(),
        (None, None) => v.to_string(),
    }
}

fn items_of(args: &[Value]) -> Result<Vec<Value>, Error> {
    match args {
        [one] if one.as_str().is_none() && one.try_iter().is_ok() => Ok(one.try_iter()?.collect()),
        _ => Ok(args.to_vec()),
    }
}

/// Most dice one formula rolls (all its terms together).
const MAX_DICE: u64 = 1000;

/// One term of a dice formula: `NdM` or a constant, with its sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Die {
    Dice { sign: i64, count: u32, sides: u64 },
    Constant(i64),
}

/// The terms of a dice formula (`2d6+1`, `d20 - 2`, `-3+d4`; whitespace
/// and case ignored), or `None` when it is not one: empty, a term that is
/// neither `NdM` nor a number, no dice or more than [`MAX_DICE`] of them in all, a die
/// of no side or more than a million, or a total that could overflow.
fn dice_terms(formula: &str) -> Option<Vec<Die>> {
    let f: String = formula.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_ascii_lowercase();
    if f.is_empty() || f.ends_with(['+', '-']) {
        return None;
    }
    let mut terms = Vec::new();
    let mut sign = 1i64;
    for (i, term) in f.split_inclusive(['+', '-']).enumerate() {
        let (body, next) = match term.strip_suffix('+') {
            Some(b) => (b, 1),
            None => match term.strip_suffix('-') {
                Some(b) => (b, -1),
                None => (term, 1),
            },
        };
        if body.is_empty() {
            // A sign before the first term.
            if i == 0 {
                sign = next;
                continue;
            }
            return None;
        }
        terms.push(match body.split_once('d') {
            Some((n, m)) => {
                let count: u32 = if n.is_empty() { 1 } else { n.parse().ok()? };
                let sides: u64 = m.parse().ok()?;
                if count == 0 || u64::from(count) > MAX_DICE || sides == 0 || sides > 1_000_000 {
                    return None;
                }
                Die::Dice { sign, count, sides }
            }
            None => Die::Constant(sign.checked_mul(body.parse::<i64>().ok()?)?),
        });
        sign = next;
    }
    // At most 1,000 dice in all: rolling them is work fuel does not count
    // (9,000 terms of `1000d1000000` took seconds a call).
    let dice: u64 = terms.iter().map(|t| if let Die::Dice { count, .. } = t { u64::from(*count) } else { 0 }).sum();
    if dice > MAX_DICE {
        return None;
    }
    // The largest total it can roll fits: rolling never overflows.
    terms
        .iter()
        .try_fold(0i64, |bound, term| match *term {
            Die::Dice { count, sides, .. } => bound.checked_add(i64::from(count).checked_mul(sides.try_into().ok()?)?),
            Die::Constant(c) => bound.checked_add(c.checked_abs()?),
        })
        .map(|_| terms)
}

/// SillyTavern's roll: a number alone is the sides of one die; a formula
/// it cannot read ([`dice_terms`]) rolls nothing.
fn roll(formula: &str, rng: &mut ChaCha8Rng) -> Value {
    let formula = formula.trim();
    let terms = if !formula.is_empty() && formula.bytes().all(|b| b.is_ascii_digit()) {
        dice_terms(&format!("1d{formula}"))
    } else {
        dice_terms(formula)
    };
    let Some(terms) = terms else { return Value::from("") };
    // The bound checked in `dice_terms`: the sum cannot overflow.
    let total: i64 = terms
        .into_iter()
        .map(|term| match term {
            Die::Dice { sign, count, sides } => {
                sign * (0..count).map(|_| (rng.next_u64() % sides) as i64 + 1).sum::<i64>()
            }
            Die::Constant(c) => c,
        })
        .sum();
    Value::from(total)
}

/// Times without an offset [`parse_time`] reads (read as UTC), most
/// specific first: ISO 8601 as SillyTavern hosts write it, and moment.js's
/// `LLL` (`November 24, 2026 9:05 PM`), so that a shown date and time is
/// read again, as moment.js reads it in SillyTavern. A time alone (`{{time}}`:
/// `9:05 PM`) is no point in time, there or here.
const NAIVE_TIMES: &[&str] =
    &["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%B %d, %Y %I:%M %p"];

/// Dates without a time [`parse_time`] reads (midnight UTC): ISO 8601 and
/// what the migrated `{{date}}` shows (`date_format('LL')`).
const NAIVE_DATES: &[&str] = &["%Y-%m-%d", "%B %d, %Y"];

/// A time as written: RFC 3339, `%Y-%m-%d %H:%M:%S %z`, or one of
/// [`NAIVE_TIMES`] or [`NAIVE_DATES`], read as UTC (the host's zone is not
/// known; both sides of a difference read alike).
fn parse_time(s: &str) -> Result<DateTime<FixedOffset>, Error> {
    let t = s.trim();
    let offset = DateTime::parse_from_rfc3339(t).or_else(|_| DateTime::parse_from_str(t, "%Y-%m-%d %H:%M:%S %z"));
    let naive = || {
        NAIVE_TIMES.iter().find_map(|f| NaiveDateTime::parse_from_str(t, f).ok()).or_else(|| {
            NAIVE_DATES.iter().find_map(|f| NaiveDate::parse_from_str(t, f).ok()).and_then(|d| d.and_hms_opt(0, 0, 0))
        })
    };
    match offset {
        Ok(time) => Ok(time),
        Err(e) => naive().map(|n| n.and_utc().fixed_offset()).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("cannot read time {s:?} (RFC 3339, ISO 8601 without an offset, or `November 24, 2026`): {e}"),
            )
        }),
    }
}

/// moment.js-style `humanize` of a duration in seconds.
fn humanize(secs: i64) -> String {
    let m = secs as f64 / 60.0;
    let h = m / 60.0;
    let d = h / 24.0;
    match secs {
        s if s < 45 => "a few seconds".into(),
        s if s < 90 => "a minute".into(),
        _ if m < 45.0 => format!("{} minutes", m.round() as i64),
        _ if m < 90.0 => "an hour".into(),
        _ if h < 22.0 => format!("{} hours", h.round() as i64),
        _ if h < 36.0 => "a day".into(),
        _ if d < 26.0 => format!("{} days", d.round() as i64),
        _ if d < 45.0 => "a month".into(),
        _ if d < 320.0 => format!("{} months", (d / 30.4).round() as i64),
        _ if d < 548.0 => "a year".into(),
        _ => format!("{} years", (d / 365.25).round() as i64),
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// A time in moment.js format tokens (the ones SillyTavern's macros use):
/// `YYYY YY MMMM MMM MM M DD D dddd ddd HH H hh h mm m ss s A a` and the
/// locale forms `LT LTS L LL LLL LLLL` (English); text in `[brackets]` is
/// literal.
fn moment(t: &DateTime<FixedOffset>, fmt: &str) -> String {
    let expanded = match fmt {
        "LT" => "h:mm A",
        "LTS" => "h:mm:ss A",
        "L" => "MM/DD/YYYY",
        "LL" => "MMMM D, YYYY",
        "LLL" => "MMMM D, YYYY h:mm A",
        "LLLL" => "dddd, MMMM D, YYYY h:mm A",
        other => other,
    };
    const TOKENS: [&str; 21] = [
        "YYYY", "YY", "MMMM", "MMM", "MM", "M", "DD", "D", "dddd", "ddd", "HH", "H", "hh", "h", "mm", "m", "ss", "s",
        "A", "a", "Z",
    ];
    let month = t.month0() as usize;
    let day = t.weekday().num_days_from_monday() as usize;
    let h12 = match t.hour() % 12 {
        0 => 12,
        h => h,
    };
    let mut out = String::new();
    let mut rest = expanded;
    while !rest.is_empty() {
        if let Some(lit) = rest.strip_prefix('[')
            && let Some(end) = lit.find(']')
        {
            out.push_str(&lit[..end]);
            rest = &lit[end + 1..];
            continue;
        }
        let Some(tok) = TOKENS.iter().find(|t| rest.starts_with(**t)) else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            rest = &rest[c.len_utf8()..];
            continue;
        };
        let piece = match *tok {
            "YYYY" => format!("{:04}", t.year()),
            "YY" => format!("{:02}", t.year().rem_euclid(100)),
            "MMMM" => MONTHS[month].to_string(),
            "MMM" => MONTHS[month][..3].to_string(),
            "MM" => format!("{:02}", month + 1),
            "M" => (month + 1).to_string(),
            "DD" => format!("{:02}", t.day()),
            "D" => t.day().to_string(),
            "dddd" => DAYS[day].to_string(),
            "ddd" => DAYS[day][..3].to_string(),
            "HH" => format!("{:02}", t.hour()),
            "H" => t.hour().to_string(),
            "hh" => format!("{h12:02}"),
            "h" => h12.to_string(),
            "mm" => format!("{:02}", t.minute()),
            "m" => t.minute().to_string(),
            "ss" => format!("{:02}", t.second()),
            "s" => t.second().to_string(),
            "A" => if t.hour() < 12 { "AM" } else { "PM" }.to_string(),
            "a" => if t.hour() < 12 { "am" } else { "pm" }.to_string(),
            _ => t.offset().to_string(),
        };
        out.push_str(&piece);
        rest = &rest[tok.len()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fixed() -> Renderer {
        let now = DateTime::parse_from_rfc3339("2026-11-24T21:05:09+00:00").unwrap_or_default();
        Renderer::new().with_seed(42).with_now(now)
    }

    fn render(t: &str) -> Result<String, RenderError> {
        fixed().render(t, &json!({"user": "Ann", "char": "Sera"}), &json!({"hp": 18, "inventory": [{"name": "lamp"}]}))
    }

    /// Lists joined with `+` grow in one step fuel does not charge (see
    /// [`RenderLimits`]); `max_time` ends such a render for the caller.
    #[test]
    fn max_time_ends_a_render_fuel_does_not_stop() {
        // 2^18 items copied in one uncharged step, once the chain of joins
        // is more than 32 deep.
        let t = "{% set ns = namespace(a=[1]) %}{% for i in range(18) %}{% set ns.a = ns.a + ns.a %}{% endfor %}\
                 {% for i in range(15) %}{% set ns.a = ns.a + [1] %}{% endfor %}{{ ns.a|length }}";
        let untimed = fixed().with_limits(RenderLimits { max_time: None, ..RenderLimits::default() });
        let started = std::time::Instant::now();
        assert_eq!(untimed.render(t, &json!({}), &json!({})).unwrap_or_default(), "262159");
        let took = started.elapsed();
        let limit = (took / 5).max(Duration::from_millis(1));
        let timed = fixed().with_limits(RenderLimits { max_time: Some(limit), ..RenderLimits::default() });
        match timed.render(t, &json!({}), &json!({})) {
            Err(RenderError::Limit(m)) => assert!(m.contains("RenderLimits::max_time"), "{m}"),
            other => panic!("{other:?} (the untimed render took {took:?})"),
        }
        // A render within the limit is unchanged by it.
        assert_eq!(timed.render("{{ 1 + 2 }}", &json!({}), &json!({})).unwrap_or_default(), "3");
    }

    /// `addvar` does to a value what SillyTavern's `addvar`, `incvar` and
    /// `decvar` do: unset counts as 0, numbers (and text that reads as one)
    /// add, lists take the item, anything else joins as text.
    #[test]
    fn addvar_is_sillytaverns() {
        let state = json!({"n": "1", "f": 1.5, "log": "a", "list": [1], "json": "[\"x\"]", "zero": 0, "t": true});
        let cases = [
            ("{{ addvar(state.unset, 1) }}", "1"),
            ("{{ addvar(state.unset, -1) }}", "-1"),
            ("{{ addvar(state.unset, 'hello') }}", "hello"),
            ("{{ addvar(state.n, 5) }}", "6"),
            ("{{ addvar(state.n, ' 2 ') }}", "3"),
            ("{{ addvar(state.f, 1) }}", "2.5"),
            ("{{ addvar(state.log, 5) }}", "a5"),
            ("{{ addvar(state.n, 'x') }}", "1x"),
            ("{{ addvar(state.zero, 'x') }}", "x"),
            ("{{ addvar(state.t, 1) }}", "2"),
            ("{{ addvar(state.n, '0x10') }}", "17"),
            ("{{ addvar(state.n, 'inf') }}", "1inf"),
            ("{{ addvar(state.list, 2) | join('+') }}", "1+2"),
            ("{{ addvar(state.json, 'y') | join('+') }}", "x+y"),
        ];
        for (t, want) in cases {
            assert_eq!(fixed().render(t, &json!({}), &state).unwrap(), want, "{t}");
        }
    }

    /// Spec 003 §2.3.2's worked example.
    #[test]
    fn block_set_and_injection() {
        let t = "{# 1. 定义复杂内容块 (Block Assignment) #}\n{% set grey_soul_fragment %}\n- 灰魂会在任何用户需要的情况下合理的出现在用户所处场景，但不一定会帮助用户\n{% endset %}\n{{ grey_soul_fragment }}";
        let out = render(t).unwrap();
        assert_eq!(out.trim(), "- 灰魂会在任何用户需要的情况下合理的出现在用户所处场景，但不一定会帮助用户");
        assert_eq!(render("{{ state.inventory[0].name }} {{ state.hp }}").unwrap(), "lamp 18");
    }

    /// Dice as SillyTavern rolls them: a formula it cannot read rolls
    /// nothing, a number alone is one die, no total overflows.
    #[test]
    fn dice_formulas_are_rolled_or_show_nothing() {
        for (formula, range) in
            [("d6", 1..=6), ("2d6+1", 3..=13), (" 3D6 - 2 ", 1..=16), ("-5+d2", -4..=-3), ("20", 1..=20), ("+7", 7..=7)]
        {
            let n: i64 = render(&format!("{{{{ roll({formula:?}) }}}}")).unwrap().parse().unwrap_or(i64::MIN);
            assert!(range.contains(&n), "{formula}: {n}");
        }
        for bad in [
            "",
            " ",
            "abc",
            "d",
            "2d",
            "0d6",
            "1001d6",
            "d0",
            "d1000001",
            "2d6+",
            "+",
            "2d6++1",
            "1d6+9223372036854775807",
            "600d6+401d6",
        ] {
            assert_eq!(render(&format!("{{{{ roll({bad:?}) }}}}")).unwrap(), "", "{bad}");
        }
        // A thousand dice in all are rolled: split over terms too.
        let n: i64 = render("{{ roll('500d1+500d1') }}").unwrap().parse().unwrap_or(0);
        assert_eq!(n, 1000);
        // Many terms of many dice: refused at once, not rolled for seconds.
        let many = vec!["1000d1000000"; 9000].join("+");
        assert_eq!(render(&format!("{{{{ roll({many:?}) }}}}")).unwrap(), "");
        assert_eq!(render("{{ time_diff('yesterday', '2026-11-24T10:00:00Z') }}").unwrap(), "Invalid date");
    }

    #[test]
    fn helpers_are_reproducible_with_a_seed() {
        let a =
            render("{{ random(['a', 'b', 'c', 'd']) }}{{ random(['a', 'b', 'c', 'd']) }}{{ roll('2d6+1') }}").unwrap();
        assert_eq!(
            a,
            render("{{ random(['a', 'b', 'c', 'd']) }}{{ random(['a', 'b', 'c', 'd']) }}{{ roll('2d6+1') }}").unwrap()
        );
        assert_eq!(render("{{ pick(['x', 'y', 'z']) }}").unwrap(), render("{{ pick(['x', 'y', 'z']) }}").unwrap());
        let r: i64 = render("{{ roll('3d6-2') }}").unwrap().parse().unwrap_or(-99);
        assert!((1..=16).contains(&r), "{r}");
        assert_eq!(render("{{ now | time_format('LT') }}").unwrap(), "9:05 PM");
        assert_eq!(render("{{ now | date_format('LL') }}").unwrap(), "November 24, 2026");
        assert_eq!(render("{{ now | date_format('dddd') }}").unwrap(), "Tuesday");
        assert_eq!(render("{{ now | date_format('YYYY-MM-DD') }}").unwrap(), "2026-11-24");
        assert_eq!(render("{{ now | utc_offset(8) | time_format('HH:mm') }}").unwrap(), "05:05");
        assert_eq!(render("{{ time_diff('2026-11-24T21:00:00Z', '2026-11-24T19:00:00Z') }}").unwrap(), "2 hours");
        // What the migrated `{{date}}` shows is read again, and ISO 8601
        // without an offset (as UTC), as moment.js reads them.
        assert_eq!(render("{{ time_diff(now | date_format('LL'), '2026-11-20') }}").unwrap(), "4 days");
        assert_eq!(render("{{ time_diff('2026-11-24 21:00', '2026-11-24T19:00:00') }}").unwrap(), "2 hours");
        assert_eq!(render("{{ time_diff('November 24, 2026 9:05 PM', now) }}").unwrap(), "a few seconds");
        assert_eq!(render("{{ time_diff('November 31, 2026', now) }}").unwrap(), "Invalid date");
        assert_eq!(render("{{ state | to_yaml }}").unwrap(), "hp: 18\ninventory:\n  - name: lamp");
        assert_eq!(
            render("{{ [{'name': 'a'}, {'name': 'b', 'muted': true}, 'c'] | filter_not_muted }}").unwrap(),
            "a, c"
        );
        let ex =
            fixed().render("{{ ex | format_examples }}", &json!({"ex": "<START>\nA: hi\n<START>\nB: yo"}), &json!({}));
        assert_eq!(ex.unwrap(), "Example 1:\nA: hi\n\nExample 2:\nB: yo");
        assert_eq!(render("{{ 'abc' | reverse }}").unwrap(), "cba");
        let card =
            json!({"char": {"name": "Sera", "description": "a mage"}, "user": {"name": "Ann", "persona": "a bard"}});
        let out =
            fixed().render("{{ char }} is {{ char.description }}; {{ user }} is {{ user.persona }}", &card, &json!({}));
        assert_eq!(out.unwrap(), "Sera is a mage; Ann is a bard");
    }

    #[test]
    fn hostile_templates_are_stopped() {
        let limit = |t: &str| match render(t) {
            Err(RenderError::Limit(m)) => m,
            other => panic!("{t}: {other:?}"),
        };
        assert!(
            limit("{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}").contains("fuel")
        );
        assert!(limit("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").contains("deep"));
        let small = fixed().with_limits(RenderLimits { max_output: 1000, ..RenderLimits::default() });
        let big = small.render("{% for i in range(10000) %}xxxxxxxxxx{% endfor %}", &json!({}), &json!({}));
        assert!(matches!(big, Err(RenderError::Limit(m)) if m.contains("max_output")));
        for t in [
            "{% set state = {} %}",
            "{% set state.hp = 0 %}",
            "{%- set state_desc = 1 -%}",
            "{% set (state, x) = ({'hp': 999}, 1) %}HP {{ state.hp }}",
            "{% set x, state = 1, {} %}",
            "{% with state = {'hp': 999} %}HP {{ state.hp }}{% endwith %}",
            "{% with a = 1, state = {} %}{% endwith %}",
            "{% for state in [{'hp': 999}] %}HP {{ state.hp }}{% endfor %}",
            "{% for k, state in {}|items %}{% endfor %}",
            "{% macro m(state) %}{{ state }}{% endmacro %}",
        ] {
            assert!(matches!(render(t), Err(RenderError::Sandbox(m)) if m.contains("read-only")), "{t}");
        }
        for t in ["{% include '/etc/passwd' %}", "{% import 'x.html' as x %}", "{% extends 'base' %}"] {
            assert!(matches!(render(t), Err(RenderError::Sandbox(_))), "{t}: {:?}", render(t));
        }
        assert!(
            matches!(render("{{ open('/etc/passwd') }}"), Err(RenderError::Template(m)) if m.contains("unknown function"))
        );
        assert!(matches!(render("{% if %}"), Err(RenderError::Template(_))));
        // State is untouched whatever the template does.
        assert_eq!(render("{% set hp = 0 %}{{ hp }} {{ state.hp }}").unwrap(), "0 18");
        // Reading it in a statement is fine.
        for t in [
            "{% set hp = state.hp %}{{ hp }}",
            "{% with hp = state.hp %}{{ hp }}{% endwith %}",
            "{% for k in [state.hp] %}{{ k }}{% endfor %}",
            "{% macro m(hp=state.hp) %}{{ hp }}{% endmacro %}{{ m() }}",
            "{% set x %}{{ state.hp }}{% endset %}{{ x }}",
        ] {
            assert_eq!(render(t).unwrap(), "18", "{t}");
        }
    }
}
