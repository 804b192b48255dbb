//! SillyTavern macros → Jinja2 (spec 003 §2.3.4, every table): a prompt or
//! card text in SillyTavern's `{{macro}}` language becomes a template for
//! [`super::Renderer`], with a report of every macro converted and every
//! macro that has no equivalent (kept visibly in the output, never
//! dropped), each with its line.
//!
//! This module owns the macro table and the conversion. `{{setvar::x::v}}`
//! becomes `{% set x = v %}` (a block `{% set x %}…{% endset %}` when the
//! value spans lines), and later `{{x}}` / `{{getvar::x}}` read that
//! template variable, as in the spec's worked example (§2.3.2); other
//! variables read the read-only `state`.

use super::template::{is_identifier, is_name_char};
use serde::Serialize;
use std::borrow::Cow;
use std::collections::HashSet;

/// Deepest nesting of macros inside macros' arguments that is converted
/// (`{{setvar::x::{{user}}}}` is depth 2); deeper text is kept as written.
/// Each level is converted by a nested call, so this bounds the stack.
const MAX_NESTING: usize = 16;

/// What happened to one macro.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NoteKind {
    /// Converted to its Jinja2 equivalent.
    Converted,
    /// Converted, but the result needs something a template alone cannot do
    /// (a host value, a global write); the note says what.
    NeedsHost,
    /// No equivalent: kept in the output as its original text.
    Unsupported,
}

/// One macro of the input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigrationNote {
    /// 1-based line of the macro in the input.
    pub line: usize,
    /// The macro as written.
    pub from: String,
    /// What it became.
    pub to: String,
    /// Converted, needs the host, or unsupported.
    pub kind: NoteKind,
    /// Why, for the last two.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl MigrationNote {
    /// Whether migrating changes the text here: a macro converted (for the
    /// template or for the host) to something other than what is written.
    /// A macro already in its Jinja2 form (`{{ user }}`, which SillyTavern
    /// reads as `{{user}}` and Jinja2 as the variable) and a macro kept as
    /// written (no equivalent) change nothing.
    ///
    /// ```
    /// use spindle::prompt::migrate;
    ///
    /// let changes = |t: &str| migrate(t).notes.iter().filter(|n| n.changes_text()).count();
    /// assert_eq!(changes("{{user}} and <BOT>"), 2);
    /// assert_eq!(changes("{{ user }} and {{ char }}, {{ state.hp }}"), 0);
    /// ```
    pub fn changes_text(&self) -> bool {
        self.kind != NoteKind::Unsupported && self.from != self.to
    }
}

/// A converted text and its report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Migration {
    /// The Jinja2 template.
    pub text: String,
    /// Every macro, in order.
    pub notes: Vec<MigrationNote>,
}

/// Converts SillyTavern text to Jinja2.
///
/// ```
/// use spindle::prompt::migrate;
///
/// let m = migrate("{{char}} waves at {{user}}. {{random:a,b}}");
/// assert_eq!(m.text, "{{ char }} waves at {{ user }}. {{ random(['a', 'b']) }}");
/// assert_eq!(m.notes.len(), 3);
/// ```
pub fn migrate(input: &str) -> Migration {
    migrate_nested(input, 0)
}

/// [`migrate`] of text `depth` macros deep.
fn migrate_nested(input: &str, depth: usize) -> Migration {
    let mut m = Migrator {
        locals: HashSet::new(),
        notes: Vec::new(),
        out: String::new(),
        depth,
        blocks: Vec::new(),
        first_note: 0,
    };
    m.run(input);
    m.keep_unclosed_blocks();
    Migration { text: m.out, notes: m.notes }
}

struct Migrator {
    /// Variables set with `setvar` so far (template variables from then on).
    locals: HashSet<String>,
    notes: Vec<MigrationNote>,
    out: String,
    /// How many macros deep this text is (0: the input itself).
    depth: usize,
    /// The `{{#if}}` blocks open at this point, innermost last.
    blocks: Vec<Block>,
    /// The first note of the macro being converted (those of the macros
    /// in its arguments follow).
    first_note: usize,
}

/// An `{{#if}}` block open at this point of the text. Jinja2 needs its
/// blocks balanced, SillyTavern shows a block macro it cannot pair as
/// text: an `{{else}}` or `{{/if}}` converts only inside a converted
/// block, and a block never closed is turned back into text at the end.
struct Block {
    mode: BlockMode,
    branch: Branch,
    /// Each of its macros converted so far (`{{#if}}`, `{{else}}`): undone
    /// if the block is never closed.
    written: Vec<Written>,
}

/// How an `{{#if}}` block is migrated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockMode {
    /// As `{% if %}`…`{% endif %}`.
    Converted,
    /// As text: its condition has no Jinja2 equivalent, so its `{{else}}`
    /// and `{{/if}}` are kept as text too.
    Kept,
}

/// Which branch of an `{{#if}}` block the text is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Branch {
    Then,
    Else,
}

/// A converted block macro: where its Jinja2 starts in the output, how
/// long it is, its note, and the macro as written.
struct Written {
    at: usize,
    len: usize,
    note: usize,
    whole: String,
}

/// `{{ expr }}`.
fn expr(e: &str) -> String {
    format!("{{{{ {e} }}}}")
}

/// A Jinja string literal.
fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'").replace('\n', "\\n"))
}

/// Text that renders as itself: SillyTavern shows `{%` and `{#` as
/// written, so any `{` that would open a Jinja tag, expression or comment
/// is written as the expression `{{ '{' }}`; so is a `{` at the end, which
/// would open one with the `{{`, `{%` or `{#` written after it. Whole
/// unknown macros stay readable inside `{% raw %}`, unless they hold
/// `endraw`, which would end the raw block early.
fn literal(text: &str) -> Cow<'_, str> {
    let opens = |t: &str| {
        t.ends_with('{') || t.as_bytes().windows(2).any(|w| w[0] == b'{' && matches!(w[1], b'{' | b'%' | b'#'))
    };
    if !opens(text) {
        return Cow::Borrowed(text);
    }
    if text.starts_with("{{") && !text.contains("endraw") {
        return Cow::Owned(format!("{{% raw %}}{text}{{% endraw %}}"));
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '{' && matches!(chars.peek(), Some('{' | '%' | '#') | None) {
            out.push_str("{{ '{' }}");
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A Jinja comment holding `text` (a `#}` in it cannot end it early).
fn comment(text: &str) -> String {
    format!("{{# {} #}}", text.replace("#}", "# }"))
}

/// A Jinja literal for a `setvar` value: a number as a number, else a
/// string. A number is what Jinja2 reads as one: an integer that fits 64
/// bits (`-3`), or digits, a point and digits (`1.5`); `inf`, `1e5`, `.5`
/// and integers too large for minijinja stay strings.
fn value_lit(s: &str) -> String {
    let t = s.trim();
    if is_number(t) { t.to_string() } else { lit(s) }
}

/// Whether Jinja2 (minijinja) reads `t` as a number literal, the same
/// number: an integer that fits 64 bits, or digits, a point and digits
/// (finite), either after an optional `-`.
fn is_number(t: &str) -> bool {
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    let unsigned = t.strip_prefix('-').unwrap_or(t);
    match unsigned.split_once('.') {
        None => digits(unsigned) && t.parse::<i64>().is_ok(),
        Some((whole, fraction)) => digits(whole) && digits(fraction) && t.parse::<f64>().is_ok_and(f64::is_finite),
    }
}

/// A template variable name for an ST variable name: [`name_chars`], and
/// a leading `_` on a name Jinja2 reserves or the sandbox keeps read-only
/// (`true`, `loop`, `state`, …).
fn ident(name: &str) -> String {
    let mut out = name_chars(name);
    if RESERVED.contains(&out.as_str()) {
        out.insert(0, '_');
    }
    out
}

/// An ST name's characters as a Jinja2 name's (an attribute's, after a
/// `.`, where reserved names are fine): the characters Jinja2 takes in a
/// name (Unicode identifier characters, `_`) kept, others made `_`, and a
/// `_` before a leading digit.
fn name_chars(name: &str) -> String {
    let mut out: String = name
        .trim()
        .chars()
        .enumerate()
        .map(|(i, c)| if is_name_char(c, i == 0) || c.is_ascii_digit() { c } else { '_' })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// Names a template cannot assign or read as a plain variable: Jinja2's
/// constants and operators, the loop and self variables, and the sandbox's
/// read-only state.
const RESERVED: &[&str] = &[
    "true",
    "false",
    "none",
    "True",
    "False",
    "None",
    "not",
    "in",
    "loop",
    "self",
    "state",
    "state_desc",
    // The globals and functions the conversions write: a variable of one
    // of these names would hide it from every macro after it.
    "anchor_after",
    "anchor_before",
    "char",
    "config",
    "content",
    "context",
    "display_context",
    "global_state",
    "group",
    "history",
    "idle_duration",
    "instruct",
    "is_mobile",
    "last_generation",
    "lore_after",
    "lore_before",
    "not_char",
    "now",
    "outlet",
    "outlets",
    "pick",
    "pipe_result",
    "random",
    "roll",
    "system_prompt",
    "time_diff",
    "user",
    "user_input",
];

/// A state path: its segments as names, `a.b[0]` kept (an index of
/// digits); any other bracket made safe with the rest of its segment.
fn path(p: &str) -> String {
    p.trim()
        .split('.')
        .map(|seg| match seg.split_once('[') {
            Some((head, tail)) if is_index_chain(tail) => format!("{}[{tail}", name_chars(head)),
            _ => name_chars(seg),
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// Whether `tail` (after a segment's first `[`) is `0]`, `0][1]`, …: list
/// indices only.
fn is_index_chain(tail: &str) -> bool {
    tail.strip_suffix(']')
        .is_some_and(|t| t.split("][").all(|index| !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit())))
}

/// The scope of a Tavern-Helper variable macro (`get_chat_variable` with
/// `prefix` `get_`: `chat`), when it names one.
fn helper_scope<'a>(helper: &'a str, prefix: &str) -> Option<&'a str> {
    let scope = helper.strip_prefix(prefix)?.strip_suffix("_variable")?;
    matches!(scope, "message" | "chat" | "character" | "preset" | "global").then_some(scope)
}

/// A variable's value as an expression: a number or a string literal
/// ([`value_lit`]) of text, the expression of one macro; `None` for text
/// around a macro.
fn value_expr<'a>(arg: &'a Arg<'_>) -> Option<Cow<'a, str>> {
    match arg {
        Arg::Text(s) => Some(Cow::Owned(value_lit(s))),
        Arg::Template(_) => arg.as_expr(),
    }
}

fn list(items: &[&str]) -> String {
    format!("[{}]", items.iter().map(|s| lit(s.trim())).collect::<Vec<_>>().join(", "))
}

/// The line of an offset, counted incrementally (offsets asked for only
/// grow).
struct Lines {
    line: usize,
    counted: usize,
}

impl Lines {
    fn at(&mut self, input: &str, offset: usize) -> usize {
        if let Some(part) = input.as_bytes().get(self.counted..offset) {
            self.line += memchr::memchr_iter(b'\n', part).count();
            self.counted = offset;
        }
        self.line
    }
}

impl Migrator {
    fn note(&mut self, line: usize, from: &str, to: &str, kind: NoteKind, note: Option<&str>) {
        self.notes.push(MigrationNote {
            line,
            from: from.to_string(),
            to: to.to_string(),
            kind,
            note: note.map(str::to_string),
        });
    }

    fn run(&mut self, input: &str) {
        let mut rest = input;
        let mut consumed = 0usize;
        // Lines are counted once, up to each macro in turn (offsets only
        // grow), and each name is searched for again only once passed:
        // a long card with many macros is read in linear time.
        let mut lines = Lines { line: 1, counted: 0 };
        // Where each of `{{` and the names is next (absolute), once searched
        // for: found at `Some(at)`, or absent from there to the end (`None`).
        const NEEDLES: [&str; 4] = ["{{", "<USER>", "<BOT>", "<CHAR>"];
        let mut next: [Option<Option<usize>>; 4] = [None; 4];
        loop {
            for (found, needle) in next.iter_mut().zip(NEEDLES) {
                if found.is_none_or(|at| at.is_some_and(|at| at < consumed)) {
                    *found = Some(rest.find(needle).map(|i| consumed + i));
                }
            }
            // The next `{{` or `<USER>`-style name, relative to `rest`.
            let ahead = |k: usize| next[k].flatten().map(|at| at - consumed);
            let next_brace = ahead(0);
            let next_angle =
                (1..NEEDLES.len()).filter_map(|k| ahead(k).map(|i| (i, NEEDLES[k]))).min_by_key(|(i, _)| *i);
            match (next_brace, next_angle) {
                (_, Some((i, name))) if next_brace.is_none_or(|b| i < b) => {
                    self.out.push_str(&literal(&rest[..i]));
                    let to = if name == "<USER>" { expr("user") } else { expr("char") };
                    self.note(lines.at(input, consumed + i), name, &to, NoteKind::Converted, None);
                    self.out.push_str(&to);
                    rest = &rest[i + name.len()..];
                    consumed += i + name.len();
                }
                (Some(b), _) => {
                    self.out.push_str(&literal(&rest[..b]));
                    let too_deep = self.depth >= MAX_NESTING;
                    let Some(end) = closing(&rest[b..]).filter(|_| !too_deep) else {
                        // An unclosed `{{` (or one nested too deep): kept
                        // as text.
                        let tail = &rest[b..];
                        let why = if too_deep {
                            "macros nested this deep are kept as text"
                        } else {
                            "an unclosed {{ is kept as text"
                        };
                        let to = literal(tail);
                        self.note(lines.at(input, consumed + b), "{{", "{{ '{{' }}", NoteKind::Unsupported, Some(why));
                        self.out.push_str(&to);
                        return;
                    };
                    let whole = &rest[b..b + end];
                    let inner = &whole[2..whole.len() - 2];
                    let line = lines.at(input, consumed + b);
                    let converted = self.convert(inner, whole, line);
                    self.out.push_str(&converted);
                    rest = &rest[b + end..];
                    consumed += b + end;
                }
                (None, _) => {
                    self.out.push_str(&literal(rest));
                    return;
                }
            }
        }
    }

    /// One macro (`inner` is between the braces).
    fn convert(&mut self, inner: &str, whole: &str, line: usize) -> String {
        self.first_note = self.notes.len();
        // The value of a `setvar` keeps its whitespace (a block set's
        // newlines); everything else is read trimmed.
        let full = inner.trim_start();
        // The arguments, split at the `::` outside nested macros; one with
        // macros inside (`{{setvar::x::{{user}}}}`) is converted on its
        // own, to template text (its plain parts made literal there): a
        // split after converting could cut a `{% raw %}` block or a string
        // literal the conversion wrote.
        let pieces: Vec<Arg<'_>> = split_args(full)
            .into_iter()
            .map(|(at, piece)| {
                if !piece.contains("{{") {
                    return Arg::Text(piece);
                }
                let sub = migrate_nested(piece, self.depth + 1);
                // Lines of the nested notes: from the start of the macro.
                let before = 2 + inner.len() - full.len() + at;
                let lines = whole.as_bytes().get(..before).map_or(0, |b| memchr::memchr_iter(b'\n', b).count());
                for mut n in sub.notes {
                    n.line += line - 1 + lines;
                    self.notes.push(n);
                }
                Arg::Template(sub.text)
            })
            .collect();
        let args: Vec<&str> = pieces.iter().map(Arg::as_str).collect();
        // The whole macro, its arguments converted, trimmed: the text as
        // written when no argument held a macro (nothing to join again).
        // Whether an argument holds a macro.
        let nested = pieces.iter().any(|p| matches!(p, Arg::Template(_)));
        let joined = if nested { Cow::Owned(args.join("::")) } else { Cow::Borrowed(full) };
        let t = joined.trim();
        let name = args[0].trim();
        let lower = name.to_ascii_lowercase();
        let done = |m: &mut Migrator, to: String| {
            m.note(line, whole, &to, NoteKind::Converted, None);
            to
        };
        let host = |m: &mut Migrator, to: String, why: &str| {
            m.note(line, whole, &to, NoteKind::NeedsHost, Some(why));
            to
        };
        // Comments, conditionals.
        if let Some(c) = t.strip_prefix("//") {
            return done(self, comment(c.trim()));
        }
        if let Some(cond) = t.strip_prefix("#if").filter(|c| c.is_empty() || c.starts_with(char::is_whitespace)) {
            return self.open_block(cond, whole, line);
        }
        if t == "/if" {
            return self.close_block(whole, line);
        }
        if t == "else" {
            return self.else_branch(whole, line);
        }
        // A macro inside an argument of these forms is written into their
        // text: a literal would show its template text.
        let nested_kept = |m: &mut Migrator| {
            m.kept(whole, line, "a macro inside this macro's argument has no Jinja2 equivalent here")
        };
        // `name:arg` forms (single colon).
        if let Some((head, arg)) = t.split_once(':')
            && !t.contains("::")
        {
            let head = head.trim().to_ascii_lowercase();
            if nested && matches!(head.as_str(), "random" | "roll" | "reverse") {
                return nested_kept(self);
            }
            match head.as_str() {
                "random" => return done(self, expr(&format!("random({})", list(&arg.split(',').collect::<Vec<_>>())))),
                // SillyTavern's `{{roll:}}` is no macro (its formula needs a
                // character): text.
                "roll" if full.eq_ignore_ascii_case("roll:") => {
                    return self.kept(whole, line, "not a macro in SillyTavern (a roll needs a formula)");
                }
                "roll" => return done(self, expr(&format!("roll({})", lit(arg.trim())))),
                "reverse" => return done(self, expr(&format!("{} | reverse", lit(arg)))),
                _ => {}
            }
        }
        if let Some(arg) = lower.strip_prefix("roll ").map(|_| t[5..].trim()) {
            if nested {
                return nested_kept(self);
            }
            return done(self, expr(&format!("roll({})", lit(arg))));
        }
        if let Some(fmt) = t.strip_prefix("datetimeformat ") {
            if nested {
                return nested_kept(self);
            }
            return done(self, expr(&format!("now | date_format({})", lit(fmt.trim()))));
        }
        if let Some(word) = t.strip_prefix("banned ") {
            let to = comment(&format!("banned {} (safety filter)", word.trim()));
            self.note(
                line,
                whole,
                &to,
                NoteKind::NeedsHost,
                Some("word filtering is the host's safety filter, not the template's"),
            );
            return to;
        }
        if let Some(off) = t.strip_prefix("time_UTC").or_else(|| t.strip_prefix("time_utc")) {
            let hours = off.trim().trim_start_matches('+');
            if is_number(hours) {
                return done(self, expr(&format!("now | utc_offset({hours}) | time_format")));
            }
        }
        let var = |args: &[&str], i: usize| args.get(i).map(|s| s.trim()).unwrap_or_default().to_string();
        match (lower.as_str(), args.len()) {
            ("user", 1) => done(self, expr("user")),
            ("char", 1) => done(self, expr("char")),
            ("group", 1) => done(self, expr("group")),
            ("groupnotmuted", 1) => done(self, expr("group | filter_not_muted")),
            ("notchar", 1) => done(self, expr("not_char")),
            ("description", 1) => done(self, expr("char.description")),
            ("personality", 1) => done(self, expr("char.personality")),
            ("persona", 1) => done(self, expr("user.persona")),
            ("scenario", 1) => done(self, expr("char.scenario")),
            ("charversion", 1) | ("char_version", 1) => done(self, expr("char.version")),
            ("charprompt", 1) => done(self, expr("char.main_prompt")),
            ("charjailbreak", 1) => done(self, expr("char.jailbreak")),
            ("chardepthprompt", 1) => done(self, expr("char.depth_prompt")),
            ("creatornotes", 1) => done(self, expr("char.creator_notes")),
            ("model", 1) => done(self, expr("config.model")),
            ("mesexamples", 1) => done(self, expr("char.examples | format_examples")),
            ("mesexamplesraw", 1) => done(self, expr("char.examples_raw")),
            ("lastmessage", 1) => done(self, expr("history[-1].content")),
            ("lastmessageid", 1) => done(self, expr("history[-1].id")),
            ("lastusermessage", 1) => {
                done(self, expr("history | selectattr('role', 'eq', 'user') | map(attribute='content') | last"))
            }
            ("lastcharmessage", 1) => {
                done(self, expr("history | selectattr('role', 'eq', 'assistant') | map(attribute='content') | last"))
            }
            ("firstincludedmessageid", 1) => done(self, expr("context[0].id")),
            ("firstdisplayedmessageid", 1) => done(self, expr("display_context[0].id")),
            ("lastswipeid", 1) => done(self, expr("history[-1].swipe_count")),
            ("currentswipeid", 1) => done(self, expr("history[-1].current_swipe")),
            ("lastgenerationtype", 1) => done(self, expr("last_generation.type")),
            ("input", 1) => done(self, expr("user_input")),
            ("time", 1) => done(self, expr("now | time_format('LT')")),
            ("date", 1) => done(self, expr("now | date_format('LL')")),
            ("weekday", 1) => done(self, expr("now | date_format('dddd')")),
            ("isotime", 1) => done(self, expr("now | time_format('HH:mm')")),
            ("isodate", 1) => done(self, expr("now | date_format('YYYY-MM-DD')")),
            ("idle_duration", 1) => done(self, expr("idle_duration")),
            ("timediff", 3) => match (pieces[1].as_expr(), pieces[2].as_expr()) {
                // A macro as an argument is read as its value (SillyTavern
                // evaluates it first).
                (Some(a), Some(b)) => done(self, expr(&format!("time_diff({a}, {b})"))),
                _ => self.kept(whole, line, "a time argument of text around a macro has no Jinja2 equivalent"),
            },
            ("getvar", 2) => {
                let name = var(&args, 1);
                let to = if self.locals.contains(&name) {
                    expr(&ident(&name))
                } else {
                    expr(&format!("state.{}", path(&name)))
                };
                done(self, to)
            }
            ("setvar", 3) | ("setvar", _) if args.len() >= 3 => {
                let name = var(&args, 1);
                let value = args[2..].join("::");
                self.locals.insert(name.clone());
                let id = ident(&name);
                // A block set when the value spans lines or holds macros
                // (they render into it, as SillyTavern evaluates them first).
                let to = if value.contains('\n') || pieces[2..].iter().any(|p| matches!(p, Arg::Template(_))) {
                    let body: Vec<Cow<'_, str>> = pieces[2..].iter().map(Arg::as_template).collect();
                    format!("{{% set {id} %}}{}{{% endset %}}", body.join("::"))
                } else {
                    format!("{{% set {id} = {} %}}", value_lit(&value))
                };
                done(self, to)
            }
            ("addvar", 3) => {
                let name = var(&args, 1);
                let cur = if self.locals.contains(&name) { ident(&name) } else { format!("state.{}", path(&name)) };
                let Some(value) = value_expr(&pieces[2]) else { return nested_kept(self) };
                self.locals.insert(name.clone());
                done(self, format!("{{% set {} = addvar({cur}, {value}) %}}", ident(&name)))
            }
            ("incvar", 2) | ("decvar", 2) => {
                let name = var(&args, 1);
                let cur = if self.locals.contains(&name) { ident(&name) } else { format!("state.{}", path(&name)) };
                self.locals.insert(name.clone());
                // As spec 003's table has it, the new value is set, not
                // printed (SillyTavern's code also prints it, its comment
                // says it does not).
                let step = if lower == "incvar" { "1" } else { "-1" };
                done(self, format!("{{% set {} = addvar({cur}, {step}) %}}", ident(&name)))
            }
            ("getglobalvar", 2) => done(self, expr(&format!("global_state.{}", path(&var(&args, 1))))),
            ("setglobalvar", 3) | ("addglobalvar", 3) | ("incglobalvar", 2) | ("decglobalvar", 2) => {
                let name = path(&var(&args, 1));
                let value = match pieces.get(2).map(value_expr) {
                    Some(None) => return nested_kept(self),
                    Some(Some(value)) => value,
                    None => Cow::Borrowed(""),
                };
                let to = match lower.as_str() {
                    "setglobalvar" => format!("{{% set_global {name} = {value} %}}"),
                    "addglobalvar" => format!("{{% set_global {name} = addvar(global_state.{name}, {value}) %}}"),
                    "incglobalvar" => format!("{{% set_global {name} = addvar(global_state.{name}, 1) %}}"),
                    _ => format!("{{% set_global {name} = addvar(global_state.{name}, -1) %}}"),
                };
                host(
                    self,
                    to,
                    "writes a global variable: the template writes no state; the render hands the write to the host to apply (Renderer::render_full)",
                )
            }
            ("newline", 1) => done(self, expr("'\\n'")),
            ("trim", 1) => done(self, expr("content | trim")),
            ("noop", 1) => done(self, "{# no-op #}".into()),
            ("random", n) | ("pick", n) if n > 1 => {
                let Some(items) = pieces[1..].iter().map(Arg::as_expr).collect::<Option<Vec<_>>>() else {
                    return nested_kept(self);
                };
                done(self, expr(&format!("{lower}([{}])", items.join(", "))))
            }
            ("ismobile", 1) => done(self, expr("is_mobile")),
            ("outlet", 2) => match pieces[1].as_expr() {
                Some(name) => host(
                    self,
                    expr(&format!("outlet({name})")),
                    "the outlet's text comes from the host's world info (the `outlets` variable)",
                ),
                None => nested_kept(self),
            },
            ("maxprompt", 1) => done(self, expr("config.max_context")),
            ("pipe", 1) => host(self, expr("pipe_result"), "slash-command pipes are the host's"),
            ("anchorbefore", 1) => done(self, expr("anchor_before")),
            ("anchorafter", 1) => done(self, expr("anchor_after")),
            ("wibefore", 1) | ("lorebefore", 1) => done(self, expr("lore_before")),
            ("wiafter", 1) | ("loreafter", 1) => done(self, expr("lore_after")),
            ("system", 1) => done(self, expr("system_prompt")),
            ("instructsystemprompt", 1) => done(self, expr("instruct.system_prompt")),
            ("instructuserprefix", 1) => done(self, expr("instruct.user_prefix")),
            ("instructusersuffix", 1) => done(self, expr("instruct.user_suffix")),
            ("instructassistantprefix", 1) => done(self, expr("instruct.assistant_prefix")),
            ("instructassistantsuffix", 1) => done(self, expr("instruct.assistant_suffix")),
            ("useravatar", 1) => done(self, expr("user.avatar_path")),
            (helper, 2) if helper_scope(helper, "get_").is_some() => {
                let scope = helper_scope(helper, "get_").unwrap_or_default();
                done(self, expr(&format!("state.{scope}.{}", path(args[1]))))
            }
            (helper, 2) if helper_scope(helper, "format_").is_some() => {
                let scope = helper_scope(helper, "format_").unwrap_or_default();
                done(self, expr(&format!("state.{scope}.{} | to_yaml", path(args[1]))))
            }
            (_, 1) if is_identifier(name) => {
                // A variable set earlier, or a dynamic variable of the state.
                if self.locals.contains(name) {
                    done(self, expr(&ident(name)))
                } else {
                    let to = expr(&format!("state.{}", name_chars(name)));
                    self.note(
                        line,
                        whole,
                        &to,
                        NoteKind::Converted,
                        Some("not a known macro: read as a state variable ({{var_name}} → state.var_name)"),
                    );
                    to
                }
            }
            _ => self.unsupported(whole, line),
        }
    }

    /// `{{#if x}}`'s condition as a Jinja2 expression: a variable set
    /// earlier as is, a state variable or path (`a.b`) read from `state`,
    /// one macro converted (to a `{{ … }}` expression); anything else has
    /// no equivalent (`None`): it could not be read back as one expression.
    fn condition(&self, cond: &str) -> Option<String> {
        let c = cond.trim();
        if c.starts_with("{{ ") {
            // A macro as the condition, converted by `convert` to one
            // expression (not a statement, nor text around it).
            return one_expr(c).map(str::to_string);
        }
        if matches!(c, "user" | "char") {
            // The host's names (a variable set by that name is `_user`).
            return Some(c.to_string());
        }
        if self.locals.contains(c) && is_identifier(c) {
            return Some(ident(c));
        }
        if !c.is_empty() && c.split('.').all(is_identifier) {
            return Some(format!("state.{}", path(c)));
        }
        None
    }

    /// `{{#if cond}}`: opens a block, converted when its condition is.
    fn open_block(&mut self, cond: &str, whole: &str, line: usize) -> String {
        let Some(cond) = self.condition(cond) else {
            self.blocks.push(Block { mode: BlockMode::Kept, branch: Branch::Then, written: Vec::new() });
            return self.kept(whole, line, "the condition is not a variable, a state path or one macro: kept as written, with its {{else}} and {{/if}}");
        };
        let to = format!("{{% if {cond} %}}");
        let written = self.written(whole, &to, line);
        self.blocks.push(Block { mode: BlockMode::Converted, branch: Branch::Then, written: vec![written] });
        to
    }

    /// `{{else}}`: the other branch of the innermost block.
    fn else_branch(&mut self, whole: &str, line: usize) -> String {
        match self.blocks.last().map(|b| (b.mode, b.branch)) {
            Some((BlockMode::Converted, Branch::Then)) => {
                let to = "{% else %}".to_string();
                let written = self.written(whole, &to, line);
                if let Some(block) = self.blocks.last_mut() {
                    block.branch = Branch::Else;
                    block.written.push(written);
                }
                to
            }
            Some((BlockMode::Kept, _)) => self.kept(whole, line, "the {{else}} of an {{#if}} kept as written"),
            Some((BlockMode::Converted, Branch::Else)) => {
                self.kept(whole, line, "a second {{else}} in one {{#if}} has no Jinja2 equivalent; kept as written")
            }
            None => self.kept(whole, line, "an {{else}} outside any {{#if}} is kept as written"),
        }
    }

    /// `{{/if}}`: closes the innermost block.
    fn close_block(&mut self, whole: &str, line: usize) -> String {
        match self.blocks.pop().map(|b| b.mode) {
            Some(BlockMode::Converted) => {
                let to = "{% endif %}".to_string();
                self.note(line, whole, &to, NoteKind::Converted, None);
                to
            }
            Some(BlockMode::Kept) => self.kept(whole, line, "the {{/if}} of an {{#if}} kept as written"),
            None => self.kept(whole, line, "an {{/if}} without an {{#if}} is kept as written"),
        }
    }

    /// Notes a converted block macro about to be written at the end of the
    /// output.
    fn written(&mut self, whole: &str, to: &str, line: usize) -> Written {
        self.note(line, whole, to, NoteKind::Converted, None);
        Written { at: self.out.len(), len: to.len(), note: self.notes.len() - 1, whole: whole.to_string() }
    }

    /// At the end of the text: the macros of every converted block never
    /// closed by `{{/if}}` are turned back into text (Jinja2 would refuse
    /// the whole template), their notes saying so.
    fn keep_unclosed_blocks(&mut self) {
        let mut undo: Vec<Written> =
            self.blocks.drain(..).filter(|b| b.mode == BlockMode::Converted).flat_map(|b| b.written).collect();
        // From the end, so that each replacement leaves the earlier offsets
        // as they are.
        undo.sort_by_key(|w| std::cmp::Reverse(w.at));
        for w in undo {
            let to = literal(&w.whole).into_owned();
            if self.out.get(w.at..w.at + w.len).is_some() {
                self.out.replace_range(w.at..w.at + w.len, &to);
            }
            if let Some(n) = self.notes.get_mut(w.note) {
                n.to = to;
                n.kind = NoteKind::Unsupported;
                n.note = Some("an {{#if}} never closed by {{/if}} is kept as written".into());
            }
        }
    }

    /// A macro kept as written, with why. The macros inside it are kept
    /// with it: the notes of those converted go (the notes of those kept,
    /// with their reasons, stay).
    fn kept(&mut self, whole: &str, line: usize, why: &str) -> String {
        let (first, mut i) = (self.first_note, 0);
        self.notes.retain(|n| {
            i += 1;
            i <= first || n.kind == NoteKind::Unsupported
        });
        let to = literal(whole).into_owned();
        self.note(line, whole, &to, NoteKind::Unsupported, Some(why));
        to
    }

    fn unsupported(&mut self, whole: &str, line: usize) -> String {
        self.kept(whole, line, "no Jinja2 equivalent; kept as written")
    }
}

/// One argument of a macro (between its `::`).
enum Arg<'a> {
    /// As written: no macro inside.
    Text(&'a str),
    /// Template text: the macros inside converted, the rest made literal.
    Template(String),
}

impl Arg<'_> {
    fn as_str(&self) -> &str {
        match self {
            Arg::Text(s) => s,
            Arg::Template(t) => t,
        }
    }

    /// The argument as one Jinja2 expression: a string literal of its
    /// text, or the expression of the one macro it is (`{{lastMessage}}`
    /// as `history[-1].mes`); `None` for text around a macro, or a macro
    /// that converted to no expression.
    fn as_expr(&self) -> Option<Cow<'_, str>> {
        match self {
            Arg::Text(s) => Some(Cow::Owned(lit(s.trim()))),
            Arg::Template(t) => one_expr(t.trim()).map(Cow::Borrowed),
        }
    }

    /// The argument as template text that shows it.
    fn as_template(&self) -> Cow<'_, str> {
        match self {
            Arg::Text(s) => literal(s),
            Arg::Template(t) => Cow::Borrowed(t),
        }
    }
}

/// The expression of template text that is one `{{ expression }}` and
/// nothing else (what `convert` writes for a macro with a value).
fn one_expr(t: &str) -> Option<&str> {
    let e = t.strip_prefix("{{ ")?.strip_suffix(" }}")?;
    (!["{{", "}}", "{%", "%}", "{#", "#}"].iter().any(|s| e.contains(s))).then_some(e)
}

/// `s` split at each `::` outside nested macros, with the offset of each
/// piece.
fn split_args(s: &str) -> Vec<(usize, &str)> {
    let b = s.as_bytes();
    let (mut depth, mut i, mut start) = (0usize, 0usize, 0usize);
    let mut out = Vec::new();
    while i < b.len() {
        match b.get(i..i + 2) {
            Some(b"{{") => {
                depth += 1;
                i += 2;
            }
            Some(b"}}") if depth > 0 => {
                depth -= 1;
                i += 2;
            }
            Some(b"::") if depth == 0 => {
                out.push((start, s.get(start..i).unwrap_or_default()));
                i += 2;
                start = i;
            }
            _ => i += 1,
        }
    }
    out.push((start, s.get(start..).unwrap_or_default()));
    out
}

/// The length of the macro starting at `s` (`{{…}}`, nested ones counted).
fn closing(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let (mut depth, mut i) = (0usize, 0usize);
    while i + 1 < b.len() {
        if b[i] == b'{' && b[i + 1] == b'{' {
            depth += 1;
            i += 2;
        } else if b[i] == b'}' && b[i + 1] == b'}' {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return Some(i);
            }
        } else {
            i += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::Renderer;
    use serde_json::json;

    /// Spec 003 §2.3.2's worked example, migrated and rendered.
    #[test]
    fn setvar_block_and_later_use() {
        let st = "{{setvar::灰魂4::\n- 灰魂会在任何用户需要的情况下合理的出现在用户所处场景，但不一定会帮助用户\n}}\n...\n{{灰魂4}}";
        let m = migrate(st);
        assert_eq!(
            m.text,
            "{% set 灰魂4 %}\n- 灰魂会在任何用户需要的情况下合理的出现在用户所处场景，但不一定会帮助用户\n{% endset %}\n...\n{{ 灰魂4 }}"
        );
        assert!(m.notes.iter().all(|n| n.kind == NoteKind::Converted), "{:?}", m.notes);
        assert_eq!(m.notes.iter().map(|n| n.line).collect::<Vec<_>>(), [1, 5]);
        let out = Renderer::new().render(&m.text, &json!({}), &json!({})).unwrap();
        // The set block writes nothing; the later use writes the value.
        assert_eq!(out, "\n...\n\n- 灰魂会在任何用户需要的情况下合理的出现在用户所处场景，但不一定会帮助用户\n");
    }

    #[test]
    fn variables_conditions_and_unknowns() {
        let m = migrate(
            "{{setvar::hp::10}}{{incvar::hp}}{{getvar::hp}} {{getvar::gold}} {{#if gold}}rich{{else}}poor{{/if}}{{// note}}",
        );
        assert_eq!(
            m.text,
            "{% set hp = 10 %}{% set hp = addvar(hp, 1) %}{{ hp }} {{ state.gold }} {% if state.gold %}rich{% else %}poor{% endif %}{# note #}"
        );
        let out = Renderer::new().render(&m.text, &json!({}), &json!({"gold": 3})).unwrap();
        assert_eq!(out, "11 3 rich");
        // Variables never set count as 0, as in SillyTavern (no render error).
        let m = migrate(
            "{{incvar::turn}}{{getvar::turn}} {{decvar::hp}}{{getvar::hp}} {{addvar::log::hi}}{{getvar::log}} {{addvar::n::2}}{{getvar::n}}",
        );
        let out = Renderer::new().render(&m.text, &json!({}), &json!({})).unwrap();
        assert_eq!(out, "1 -1 hi 2");
        let m = migrate("a {{frobnicate::x}} b {{setglobalvar::g::1}}");
        assert_eq!(m.notes[0].kind, NoteKind::Unsupported);
        assert!(m.text.contains("{% raw %}{{frobnicate::x}}{% endraw %}"));
        assert_eq!(m.notes[1].kind, NoteKind::NeedsHost);
        let out = Renderer::new().render("a {% raw %}{{frobnicate::x}}{% endraw %} b", &json!({}), &json!({})).unwrap();
        assert_eq!(out, "a {{frobnicate::x}} b", "kept visibly");
    }

    /// SillyTavern shows `{%` and `{#` as written; so must the migrated
    /// template, whatever follows them.
    #[test]
    fn jinja_syntax_in_the_text_stays_text() {
        let r = Renderer::new();
        let vars = json!({"user": "Ann"});
        for (st, shown) in [
            ("50{% off {# x #} for {{user}}", "50{% off {# x #} for Ann"),
            ("{%- set x = 1 -%}{{ x }} {{user}}", "{%- set x = 1 -%}"),
            ("{{frob {% endraw %}{% set a = 1 %}}} after", "{{frob {% endraw %}{% set a = 1 %}}} after"),
            ("open {{ never closed {% if %}", "open {{ never closed {% if %}"),
            // A `{` before a macro or a name does not join its braces.
            ("a{{{user}} {<USER>} {", "a{"),
            ("x{<USER>} {", "x{Ann} {"),
        ] {
            let m = migrate(st);
            let out = r.render(&m.text, &vars, &json!({})).unwrap_or_else(|e| panic!("{st:?} -> {:?}: {e}", m.text));
            assert!(out.starts_with(shown), "{st:?} -> {:?} -> {out:?}", m.text);
        }
        // Nor in a variable's value set over several lines.
        let m = migrate("{{setvar::v::a {% if\n{# b}}{{getvar::v}}");
        assert_eq!(r.render(&m.text, &vars, &json!({})).unwrap(), "a {% if\n{# b");
        // A comment's text cannot end the comment early.
        let m = migrate("a{{// x #}{% if y %} }}b");
        assert_eq!(r.render(&m.text, &vars, &json!({})).unwrap(), "ab");
    }

    /// A macro as an argument is read as its value (SillyTavern evaluates
    /// it first), never written into a string literal as template text;
    /// text around a macro in an argument that needs one value is kept.
    #[test]
    fn macros_in_arguments_are_values() {
        let vars = serde_json::json!({"user": "Ann", "char": "Bo"});
        let r = Renderer::new();
        for (st, want, shown) in [
            ("{{random::{{user}}::{{user}}}}", "{{ random([user, user]) }}", "Ann"),
            ("{{pick::{{char}}::{{char}}}}", "{{ pick([char, char]) }}", "Bo"),
            ("{{outlet::{{user}}}}", "{{ outlet(user) }}", ""),
            (
                "{{timeDiff::{{lastMessage}}::2026-01-01T00:00:00Z}}",
                "{{ time_diff(history[-1].content, '2026-01-01T00:00:00Z') }}",
                "Invalid date",
            ),
            ("{{reverse:{{user}}}}", "{% raw %}{{reverse:{{user}}}}{% endraw %}", "{{reverse:{{user}}}}"),
            ("{{random:{{user}},b}}", "{% raw %}{{random:{{user}},b}}{% endraw %}", "{{random:{{user}},b}}"),
            (
                "{{random::a {{user}}::b}}",
                "{% raw %}{{random::a {{user}}::b}}{% endraw %}",
                "{{random::a {{user}}::b}}",
            ),
        ] {
            let m = migrate(st);
            assert_eq!(m.text, want, "{st}");
            assert_eq!(r.render(&m.text, &vars, &serde_json::json!({})).unwrap(), shown, "{st}");
        }
    }

    /// `{{roll}}` as SillyTavern reads it: the spec's form, whose `roll`
    /// rolls a number alone as one die and a formula it cannot read as
    /// nothing; `{{roll:}}` is no macro.
    #[test]
    fn roll_macros_read_as_sillytavern_reads_them() {
        let r = Renderer::new();
        for (st, want, range) in [
            ("{{roll:20}}", "{{ roll('20') }}", 1..=20),
            ("{{roll 2d6+1}}", "{{ roll('2d6+1') }}", 3..=13),
            ("{{ROLL : d4-1}}", "{{ roll('d4-1') }}", 0..=3),
            ("{{roll:abc}}", "{{ roll('abc') }}", 0..=0),
            ("{{roll: }}", "{{ roll('') }}", 0..=0),
        ] {
            let m = migrate(st);
            assert_eq!(m.text, want, "{st}");
            assert!(m.notes.iter().all(|n| n.kind == NoteKind::Converted), "{st}: {:?}", m.notes);
            let shown = r.render(&m.text, &serde_json::json!({}), &serde_json::json!({})).unwrap_or_default();
            let n: i64 = if shown.is_empty() { 0 } else { shown.parse().unwrap_or(-1) };
            assert!(range.contains(&n), "{st} rendered {shown:?}");
        }
        let m = migrate("{{roll:}}");
        assert_eq!(m.notes[0].kind, NoteKind::Unsupported);
        assert_eq!(r.render(&m.text, &serde_json::json!({}), &serde_json::json!({})).unwrap_or_default(), "{{roll:}}");
    }

    /// Jinja2 needs `{% if %}` blocks balanced; SillyTavern shows block
    /// macros it cannot pair as text. Every case renders, and each kept
    /// macro says why.
    #[test]
    fn block_macros_pair_or_stay_text() {
        let r = Renderer::new();
        for (st, want, shown) in [
            // Closed: converted, nested too.
            (
                "{{#if a}}{{#if b}}x{{else}}y{{/if}}{{/if}}",
                "{% if state.a %}{% if state.b %}x{% else %}y{% endif %}{% endif %}",
                "y",
            ),
            // A condition that is no variable, path or single macro: the
            // block is kept, with its `else` and `/if`; what is inside still
            // converts.
            (
                "{{#if a b}}{{#if c}}x{{/if}}{{else}}y{{/if}}",
                "{% raw %}{{#if a b}}{% endraw %}{% if state.c %}x{% endif %}{% raw %}{{else}}{% endraw %}y{% raw %}{{/if}}{% endraw %}",
                "{{#if a b}}x{{else}}y{{/if}}",
            ),
            ("{{#if}}x{{/if}}", "{% raw %}{{#if}}{% endraw %}x{% raw %}{{/if}}{% endraw %}", "{{#if}}x{{/if}}"),
            (
                "{{#if {{user}} {{char}}}}x{{/if}}",
                "{% raw %}{{#if {{user}} {{char}}}}{% endraw %}x{% raw %}{{/if}}{% endraw %}",
                "{{#if {{user}} {{char}}}}x{{/if}}",
            ),
            // Never closed: turned back into text at the end, `else` too;
            // an inner block that closes stays converted.
            (
                "{{#if a}}x{{else}}{{#if b}}y{{/if}}z",
                "{% raw %}{{#if a}}{% endraw %}x{% raw %}{{else}}{% endraw %}{% if state.b %}y{% endif %}z",
                "{{#if a}}x{{else}}z",
            ),
            // Unpaired `else` and `/if`, a second `else`.
            (
                "a{{else}}b{{/if}}c",
                "a{% raw %}{{else}}{% endraw %}b{% raw %}{{/if}}{% endraw %}c",
                "a{{else}}b{{/if}}c",
            ),
            (
                "{{#if a}}x{{else}}y{{else}}z{{/if}}",
                "{% if state.a %}x{% else %}y{% raw %}{{else}}{% endraw %}z{% endif %}",
                "x",
            ),
            // One macro as the condition; `user` and a local as they are.
            (
                "{{#if {{getvar::a}}}}x{{/if}}{{setvar::n::1}}{{#if n}}y{{/if}}{{#if user}}z{{/if}}",
                "{% if state.a %}x{% endif %}{% set n = 1 %}{% if n %}y{% endif %}{% if user %}z{% endif %}",
                "xyz",
            ),
        ] {
            let m = migrate(st);
            assert_eq!(m.text, want, "{st}");
            for n in m.notes.iter().filter(|n| n.kind == NoteKind::Unsupported) {
                assert!(n.note.is_some(), "{st}: {n:?}");
            }
            let out = r.render(&m.text, &json!({"user": "Ann"}), &json!({"a": true, "b": false, "c": true}));
            assert_eq!(out.as_deref().ok(), Some(shown), "{st} -> {}: {out:?}", m.text);
        }
        // Macros in a variable's value render into it.
        let m = migrate("{{setvar::x::{{user}} and {{char}}}}{{getvar::x}}");
        assert_eq!(m.text, "{% set x %}{{ user }} and {{ char }}{% endset %}{{ x }}");
        assert_eq!(r.render(&m.text, &json!({"user": "Ann", "char": "Bo"}), &json!({})).unwrap(), "Ann and Bo");
        // A kept macro's report is its own: the macros inside went with it.
        let m = migrate("{{char}}{{#if {{user}} {{frob::x}}}}");
        assert_eq!(
            m.notes.iter().map(|n| (n.from.as_str(), n.kind)).collect::<Vec<_>>(),
            [
                ("{{char}}", NoteKind::Converted),
                ("{{frob::x}}", NoteKind::Unsupported),
                ("{{#if {{user}} {{frob::x}}}}", NoteKind::Unsupported)
            ]
        );
        let m = migrate("{{#if a}}x");
        assert_eq!(m.notes[0].kind, NoteKind::Unsupported);
        assert_eq!(m.notes[0].to, "{% raw %}{{#if a}}{% endraw %}");
        assert_eq!(m.notes[0].note.as_deref(), Some("an {{#if}} never closed by {{/if}} is kept as written"));
    }

    /// Names and paths become names Jinja2 reads, whatever they hold.
    #[test]
    fn names_and_paths_are_safe_jinja() {
        for (st, want) in [
            // Reserved names as variables get a `_`; as attributes of
            // `state` they are fine.
            (
                "{{setvar::true::1}}{{true}} {{none}} {{getvar::loop}}",
                "{% set _true = 1 %}{{ _true }} {{ state.none }} {{ state.loop }}",
            ),
            ("{{setvar::state::1}}{{incvar::loop}}", "{% set _state = 1 %}{% set _loop = addvar(state.loop, 1) %}"),
            // Brackets: list indices kept, anything else made a name.
            (
                "{{getvar::a[1][2].b}} {{getvar::a[}} {{getvar::a[x]}} {{getvar::a[0 %}}",
                "{{ state.a[1][2].b }} {{ state.a_ }} {{ state.a_x_ }} {{ state.a_0__ }}",
            ),
            // Characters Jinja2 takes in a name, and no others.
            (
                "{{setvar::x²::1}}{{setvar::猫::2}}{{setvar::9a::3}}",
                "{% set x_ = 1 %}{% set 猫 = 2 %}{% set _9a = 3 %}",
            ),
            // Numbers Jinja2 reads as numbers; the rest as strings.
            (
                "{{setvar::a::-3}}{{setvar::b::1.5}}{{setvar::c::inf}}{{setvar::d::99999999999999999999}}{{setvar::e::.5}}",
                "{% set a = -3 %}{% set b = 1.5 %}{% set c = 'inf' %}{% set d = '99999999999999999999' %}{% set e = '.5' %}",
            ),
            // Tavern-Helper names without a scope: no macro.
            (
                "{{get_variable::x}}{{format_variable::x}}",
                "{% raw %}{{get_variable::x}}{% endraw %}{% raw %}{{format_variable::x}}{% endraw %}",
            ),
        ] {
            let m = migrate(st);
            assert_eq!(m.text, want, "{st}");
            let out = Renderer::new().render(&m.text, &json!({}), &json!({"loop": 1, "a": [0, [1, 2, {"b": 3}]]}));
            assert!(out.is_ok(), "{st} -> {}: {out:?}", m.text);
        }
    }

    /// A name read as an identifier is used as written: `name_chars`
    /// changes none of its characters. A name Jinja2 could not write as
    /// one (`a²`, not Unicode XID) is not read as a state variable under
    /// another name (`state.a_`, shared with `a³`): it is kept.
    #[test]
    fn identifiers_keep_their_names() {
        for name in ["x", "_x", "好感度", "hp2", "Ünïcode", "a_b"] {
            assert!(is_identifier(name), "{name}");
            assert_eq!(name_chars(name), name);
        }
        for name in ["a²", "a³", "2x", "a-b", "a b", ""] {
            assert!(!is_identifier(name), "{name}");
        }
        let m = migrate("{{a²}} {{a³}} {{好感度}}");
        assert!(m.text.contains("{{a²}}") && m.text.contains("{{a³}}"), "{}", m.text);
        assert!(m.text.contains("{{ state.好感度 }}"), "{}", m.text);
    }

    proptest::proptest! {
        /// Whatever the text, macros and braces, the migrated template
        /// compiles (global writes aside: the sandbox refuses those by
        /// design, and the report says the host must apply them).
        #[test]
        fn migrated_templates_compile(pieces in proptest::collection::vec(piece(), 0..24)) {
            let st = pieces.concat();
            let m = migrate(&st);
            if !m.text.contains("{% set_global") {
                let env = minijinja::Environment::new();
                let compiled = env.template_from_str(&m.text).map(|_| ());
                proptest::prop_assert!(compiled.is_ok(), "{st:?} -> {:?}: {compiled:?}", m.text);
                // And renders when every macro converted, with nothing set
                // (`{{incvar::x}}` counts an unset `x` as 0).
                if m.notes.iter().all(|n| n.kind == NoteKind::Converted) {
                    let shown = Renderer::new().render(&m.text, &serde_json::json!({}), &serde_json::json!({}));
                    proptest::prop_assert!(shown.is_ok(), "{st:?} -> {:?}: {shown:?}", m.text);
                }
            }
        }
    }

    /// A piece of SillyTavern text: plain text, braces and Jinja-looking
    /// marks, block macros, and macros with odd names and arguments.
    fn piece() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let word = prop_oneof![
            Just(String::new()),
            "[a-z]{1,3}",
            Just("true".to_string()),
            Just("loop".to_string()),
            Just("state".to_string()),
            Just("a.b".to_string()),
            Just("a[0]".to_string()),
            Just("a[".to_string()),
            Just("x²".to_string()),
            Just("猫".to_string()),
            Just("1".to_string()),
            prop_oneof![
                Just("-3"),
                Just("1.5"),
                Just("99999999999999999999"),
                Just("-9223372036854775808"),
                Just("1e400"),
                Just("inf"),
                Just("NaN"),
                Just(".5"),
                Just("5."),
                Just("1e5"),
                Just("+1"),
                Just("-0.0"),
                Just("1111111111111111111111111111111111111111111111111111111111111111111111111111111111111111111"),
            ]
            .prop_map(str::to_string),
            "[ -~]{0,4}",
            "[\\x00-\\x20\\x7f\\u{85}\\u{2028}]{1,2}",
        ];
        let name = prop_oneof![
            Just("user"),
            Just("char"),
            Just("getvar"),
            Just("setvar"),
            Just("addvar"),
            Just("incvar"),
            Just("getglobalvar"),
            Just("random"),
            Just("pick"),
            Just("roll"),
            Just("timeDiff"),
            Just("outlet"),
            Just("get_chat_variable"),
            Just("get_variable"),
            Just("format_variable"),
            Just("format_preset_variable"),
            Just("datetimeformat "),
            Just("time_UTC"),
            Just("time_UTC+99999999999999999999"),
            Just("time_UTC.5"),
            Just("time_UTC+inf"),
            Just("banned "),
            Just("//"),
            Just("noop"),
            Just("frob"),
            Just("reverse:"),
            Just("random:"),
            Just("roll "),
        ];
        prop_oneof![
            "[a-z \n]{0,6}",
            prop_oneof![
                Just("{"),
                Just("}"),
                Just("{{"),
                Just("}}"),
                Just("{%"),
                Just("%}"),
                Just("{#"),
                Just("#}"),
                Just("<USER>"),
                Just("{% endraw %}")
            ]
            .prop_map(str::to_string),
            word.clone().prop_map(|c| format!("{{{{#if {c}}}}}")),
            Just("{{else}}".to_string()),
            Just("{{/if}}".to_string()),
            // Macros inside arguments, values over several lines.
            (
                prop_oneof![Just("setvar::v::"), Just("random::"), Just("// "), Just("#if "), Just("getvar::")],
                proptest::collection::vec(
                    prop_oneof![
                        Just("{{user}}"),
                        Just("{{frob::a}}"),
                        Just("{{#if a}}"),
                        Just("{{else}}"),
                        Just("{{/if}}"),
                        Just("\n"),
                        Just("{%"),
                        Just("::"),
                        Just("'"),
                        Just("{% endraw %}"),
                        Just("x"),
                    ],
                    0..5,
                ),
            )
                .prop_map(|(head, inside)| format!("{{{{{head}{}}}}}", inside.concat())),
            (name, proptest::collection::vec(word, 0..3)).prop_map(|(n, args)| {
                let mut m = format!("{{{{{n}");
                for a in args {
                    m.push_str("::");
                    m.push_str(&a);
                }
                m.push_str("}}");
                m
            }),
        ]
    }

    /// Macros nested past `MAX_NESTING` are kept as text: the conversion
    /// recurses per level, so this is what bounds its stack.
    #[test]
    fn deep_nesting_is_kept_as_text() {
        let st = format!("{}x{}", "{{".repeat(20_000), "}}".repeat(20_000));
        let m = migrate(&st);
        assert!(m.notes.iter().any(|n| n.note.as_deref() == Some("macros nested this deep are kept as text")));
        let out = Renderer::new().render(&m.text, &json!({}), &json!({}));
        assert!(out.is_ok(), "{out:?}");
    }

    /// Lines are counted incrementally and names searched for once each:
    /// a long card with many macros is converted in linear time (this
    /// test would take minutes if each macro rescanned the text).
    #[test]
    fn many_macros_in_a_long_text() {
        let st = "{{user}} meets {{char}}.\n".repeat(60_000);
        let m = migrate(&st);
        assert_eq!(m.notes.len(), 120_000);
        assert_eq!(m.notes.last().map(|n| n.line), Some(60_000));
        let st = "<USER> and <BOT> {{char}}\n".repeat(60_000);
        let m = migrate(&st);
        assert_eq!(m.notes.len(), 180_000);
        assert_eq!(m.notes.last().map(|n| n.line), Some(60_000));
        assert!(m.text.starts_with("{{ user }} and {{ char }} {{ char }}\n"));
    }
}
