//! The NATS broker sink: `--sink nats://HOST:PORT/SUBJECT`.
//!
//! This module owns the NATS sink's spec (the URL and its options), its
//! subject layout and its publisher task: one task per sink reads the
//! sink's bounded queue and publishes each record as JSON, in queue order,
//! over one connection (so the records of one stream arrive in order). It
//! must not look inside records beyond their stream, model and kind, and it
//! never touches a client's stream: the proxy only ever `try_send`s into
//! the queue (policy `drop`), or waits for room in it (policy `block`).
//!
//! # The spec
//!
//! `nats://[USER:PASSWORD@|TOKEN@]HOST[:PORT]/SUBJECT[?OPTION=VALUE&...]`
//! (port 4222 when left out). Options:
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `jetstream` | `0` | `1`: publish through JetStream and wait for each record's acknowledgement (a stream must cover the subjects) |
//! | `overflow` | `drop` | `drop` or `block`: what happens when the broker is down or slower than the proxy (below) |
//! | `queue` | the proxy's sink queue (10,000) | records queued between the proxy and the publisher |
//! | `instance` | random, 8 hex digits | this proxy's name in subjects and message ids (`[A-Za-z0-9_-]`) |
//! | `template` | `{subject}.{instance}.{stream}.{kind}` | the subject of each record |
//!
//! A token from `SPINDLE_NATS_TOKEN` (set by the config layer, never
//! printed) is used when the URL has no credentials.
//!
//! # Subjects
//!
//! The template's placeholders: `{subject}` (the URL's SUBJECT, which may
//! have dots: `llm.events`), `{instance}`, `{stream}` (the proxy's number
//! of the request), `{kind}` (the record's `type`: `element`, `repair`,
//! `diagnostic`, `call_delta`, `finish`, `usage`, `stream_error`,
//! `truncated`, `content_filter`) and `{model}` (the request's model, every
//! character outside `[A-Za-z0-9_-]` made `_`; `_` when there is none). With
//! the default layout a consumer subscribes to `spindle.>` (everything),
//! `spindle.*.*.element` (completed elements of every proxy),
//! `spindle.web-3.>` (one proxy) or `spindle.web-3.17.*` (one stream).
//!
//! # When the broker is down or slow
//!
//! * `overflow=drop` (the default): the proxy puts a record in the queue
//!   only when there is room and never waits; a full queue drops the record.
//!   While the connection is down the publisher drops what it takes from
//!   the queue instead of buffering it, so that fresh records flow as soon
//!   as the broker is back. Both count in `spindle_proxy_sink_dropped_total`.
//!   A client's stream is never slowed.
//! * `overflow=block`: the proxy waits for room in the queue, and the
//!   publisher waits for the broker: nothing is dropped, and a client's
//!   stream waits while the broker is down (until the proxy's hard stop).
//!
//! The connection reconnects by itself (backoff from 0 ms doubling to 4 s);
//! reconnects count in `spindle_proxy_sink_reconnects_total` and the state
//! shows in `spindle_proxy_sink_connected`. Core NATS delivers at most
//! once: a record handed to a connection that breaks before it reaches the
//! broker is lost without being counted. With `jetstream=1` a record counts
//! as published only when the broker acknowledged it; a failed publish is
//! retried with the same `Nats-Msg-Id` (`INSTANCE-STREAM-N`, which the
//! broker's duplicate window uses to store it once), three times under
//! `drop` (not when no stream covers the subject, nor for a record larger
//! than the broker's `max_payload`), until it succeeds under `block`; then
//! it counts in `spindle_proxy_sink_failed_total`.

use super::{Overflow, SinkRecord};
use crate::proxy::metrics::Metrics;
use async_nats::connection::State;
use bytes::Bytes;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The default subject template.
pub const DEFAULT_TEMPLATE: &str = "{subject}.{instance}.{stream}.{kind}";

/// Records published per batch (and acknowledgements awaited together).
const BATCH: usize = 256;

/// Publishes queued inside the NATS client (its command channel) before a
/// publish waits.
const CLIENT_CAPACITY: usize = 1024;

/// One piece of a subject template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Subject,
    Instance,
    Stream,
    Kind,
    Model,
}

/// A NATS sink: where to connect, what subjects to use, how to behave when
/// the broker is down. Built by parsing a `nats://` sink spec.
///
/// ```
/// use spindle::proxy::SinkSpec;
/// let spec: SinkSpec = "nats://127.0.0.1:4222/llm.events?jetstream=1&instance=web-3".parse().unwrap();
/// let SinkSpec::Nats(nats) = spec else { unreachable!() };
/// assert_eq!(nats.subject_for(17, "element", Some("gpt-4o")), "llm.events.web-3.17.element");
/// assert!(nats.jetstream());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct NatsSink {
    /// `nats://HOST:PORT`, without credentials.
    server: String,
    auth: Auth,
    subject: String,
    template: Vec<Part>,
    jetstream: bool,
    overflow: Overflow,
    queue: Option<usize>,
    instance: String,
    /// The spec as given, with any password or token masked.
    masked: String,
}

/// Credentials for the broker (never printed).
#[derive(Clone, PartialEq, Eq, Default)]
enum Auth {
    #[default]
    None,
    Token(String),
    UserPassword(String, String),
}

impl fmt::Debug for NatsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsSink").field("spec", &self.masked).field("instance", &self.instance).finish()
    }
}

/// Why a `nats://` sink spec could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad NATS sink {given:?}: {why}")]
pub struct NatsSpecError {
    given: String,
    why: String,
}

impl NatsSpecError {
    /// What is wrong with the spec.
    pub(crate) fn why(&self) -> &str {
        &self.why
    }
}

/// Whether `token` may be one token of a subject we publish to.
fn is_token(token: &str) -> bool {
    !token.is_empty() && !token.contains(['*', '>']) && !token.chars().any(|c| c.is_whitespace() || c.is_control())
}

fn is_subject(subject: &str) -> bool {
    subject.split('.').all(is_token)
}

fn is_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `value` as one subject token: characters outside `[A-Za-z0-9_-]` become `_`.
fn sanitise(value: &str) -> String {
    let out: String =
        value.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
    if out.is_empty() { "_".to_string() } else { out }
}

/// A random instance name: 8 hex digits. The standard library's
/// `RandomState` is seeded from the operating system's random source, which
/// is all a name that only has to differ between proxies needs (no crate).
fn random_instance() -> String {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(now.as_nanos());
    }
    format!("{:08x}", hasher.finish() as u32)
}

fn parse_template(template: &str) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            parts.push(Part::Literal(rest[..open].to_string()));
        }
        let Some(close) = rest[open..].find('}') else {
            return Err(format!("unclosed {{ in template {template:?}"));
        };
        let name = &rest[open + 1..open + close];
        parts.push(match name {
            "subject" => Part::Subject,
            "instance" => Part::Instance,
            "stream" => Part::Stream,
            "kind" => Part::Kind,
            "model" => Part::Model,
            _ => {
                return Err(format!(
                    "unknown placeholder {{{name}}} in template (known: subject, instance, stream, kind, model)"
                ));
            }
        });
        rest = &rest[open + close + 1..];
    }
    if rest.contains('}') {
        return Err(format!("stray }} in template {template:?}"));
    }
    if !rest.is_empty() {
        parts.push(Part::Literal(rest.to_string()));
    }
    Ok(parts)
}

impl std::str::FromStr for NatsSink {
    type Err = NatsSpecError;

    /// Reads `nats://[USER:PASSWORD@|TOKEN@]HOST[:PORT]/SUBJECT[?OPTIONS]`.
    fn from_str(s: &str) -> Result<NatsSink, NatsSpecError> {
        let url = reqwest::Url::parse(s).map_err(|e| NatsSpecError { given: mask_url(s), why: e.to_string() })?;
        let masked = mask_url(s);
        let err = |why: String| NatsSpecError { given: masked.clone(), why };
        if url.scheme() != "nats" {
            return Err(err("the scheme must be nats://".into()));
        }
        let host = url.host_str().filter(|h| !h.is_empty()).ok_or_else(|| err("no host".into()))?;
        let port = url.port().unwrap_or(4222);
        let subject = percent_decode(url.path().trim_start_matches('/')).ok_or_else(|| err("bad %-escape".into()))?;
        if subject.is_empty() {
            return Err(err("no subject (nats://HOST:PORT/SUBJECT)".into()));
        }
        if !is_subject(&subject) {
            return Err(err(format!(
                "{subject:?} is not a subject to publish to (dot-separated tokens, no spaces, * or >)"
            )));
        }
        let decode = |v: &str| {
            percent_decode(v).ok_or_else(|| NatsSpecError { given: masked.clone(), why: "bad %-escape".into() })
        };
        let auth = match (url.username(), url.password()) {
            ("", None) => Auth::None,
            (token, None) => Auth::Token(decode(token)?),
            (user, Some(pass)) => Auth::UserPassword(decode(user)?, decode(pass)?),
        };
        let mut sink = NatsSink {
            server: format!("nats://{}:{port}", if host.contains(':') { format!("[{host}]") } else { host.into() }),
            auth,
            subject,
            template: Vec::new(),
            jetstream: false,
            overflow: Overflow::Drop,
            queue: None,
            instance: String::new(),
            masked: masked.clone(),
        };
        let mut template = DEFAULT_TEMPLATE.to_string();
        for (key, value) in url.query_pairs() {
            match &*key {
                "jetstream" | "js" => {
                    sink.jetstream = match &*value {
                        "1" | "true" | "yes" | "on" => true,
                        "0" | "false" | "no" | "off" => false,
                        _ => return Err(err(format!("jetstream={value:?}: expected 1 or 0"))),
                    }
                }
                "overflow" => {
                    sink.overflow =
                        value.parse().map_err(|_| err(format!("overflow={value:?}: expected drop or block")))?;
                }
                "queue" => match value.parse::<usize>() {
                    Ok(n) if n > 0 => sink.queue = Some(n),
                    _ => return Err(err(format!("queue={value:?}: expected a positive number"))),
                },
                "instance" if is_name(&value) => sink.instance = value.into_owned(),
                "instance" => return Err(err(format!("instance={value:?}: expected [A-Za-z0-9_-]+"))),
                "template" => template = value.into_owned(),
                _ => {
                    return Err(err(format!(
                        "unknown option {key:?} (known: jetstream, overflow, queue, instance, template)"
                    )));
                }
            }
        }
        sink.template = parse_template(&template).map_err(err)?;
        if sink.instance.is_empty() {
            sink.instance = random_instance();
        }
        let sample = sink.subject_for(1, "element", Some("m"));
        if !is_subject(&sample) {
            return Err(err(format!("template {template:?} makes {sample:?}, which is not a subject to publish to")));
        }
        Ok(sink)
    }
}

/// Decodes `%XX` escapes (URL user names and passwords); `None` on a bad
/// escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `s` with the password (or the token) of its URL replaced by `***`.
pub(crate) fn mask_url(s: &str) -> String {
    let Some(scheme_end) = s.find("://") else { return s.to_string() };
    let after = &s[scheme_end + 3..];
    let authority_end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let authority = &after[..authority_end];
    let Some(at) = authority.rfind('@') else { return s.to_string() };
    let userinfo = &authority[..at];
    let masked = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_string(),
    };
    format!("{}{masked}{}", &s[..scheme_end + 3], &after[at..])
}

/// `s` with its URL's query (which may hold a key or a token: `?key=…`,
/// `?token=…`) replaced by `***`.
pub(crate) fn mask_query(s: &str) -> String {
    match s.split_once('?') {
        Some((base, _)) => format!("{base}?***"),
        None => s.to_string(),
    }
}

impl NatsSink {
    /// The subject a record of `stream`, of `kind` (the record's `type`)
    /// and for `model` is published to.
    pub fn subject_for(&self, stream: u64, kind: &str, model: Option<&str>) -> String {
        let mut out = String::new();
        for part in &self.template {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::Subject => out.push_str(&self.subject),
                Part::Instance => out.push_str(&self.instance),
                Part::Stream => out.push_str(&stream.to_string()),
                Part::Kind => out.push_str(kind),
                Part::Model => out.push_str(&sanitise(model.unwrap_or(""))),
            }
        }
        out
    }

    /// Whether records go through JetStream, acknowledged.
    pub fn jetstream(&self) -> bool {
        self.jetstream
    }

    /// The policy when the broker is down or slow.
    pub fn overflow(&self) -> Overflow {
        self.overflow
    }

    /// The queue length the spec asked for, if any.
    pub fn queue(&self) -> Option<usize> {
        self.queue
    }

    /// This proxy's name in subjects.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Uses `token` to authenticate unless the URL has credentials.
    pub fn with_token(mut self, token: impl Into<String>) -> NatsSink {
        if self.auth == Auth::None {
            self.auth = Auth::Token(token.into());
        }
        self
    }

    /// The spec as given, with any password or token masked.
    pub fn masked(&self) -> &str {
        &self.masked
    }

    /// The label in metrics and logs: `nats://HOST:PORT/SUBJECT`.
    pub fn label(&self) -> String {
        format!("{}/{}", self.server, self.subject)
    }

    /// Connects in the background (the proxy serves while the broker is
    /// down) and starts the publisher task on `rx`.
    pub(crate) async fn start(
        &self,
        rx: mpsc::Receiver<Arc<SinkRecord>>,
        label: String,
        metrics: Arc<Metrics>,
    ) -> Result<tokio::task::JoinHandle<()>, async_nats::ConnectError> {
        metrics.sink_connected(&label, false);
        let events = metrics.clone();
        let events_label = label.clone();
        let mut options = async_nats::ConnectOptions::new()
            .name(format!("spindle-proxy-{}", self.instance))
            .retry_on_initial_connect()
            .client_capacity(CLIENT_CAPACITY)
            .connection_timeout(Duration::from_secs(5))
            .event_callback(move |event| {
                let metrics = events.clone();
                let label = events_label.clone();
                async move { on_event(&metrics, &label, &event) }
            });
        match &self.auth {
            Auth::None => {}
            Auth::Token(t) => options = options.token(t.clone()),
            Auth::UserPassword(u, p) => options = options.user_and_password(u.clone(), p.clone()),
        }
        let client = options.connect(self.server.as_str()).await?;
        tracing::info!(sink = %label, instance = %self.instance, "NATS sink started (subjects {})",
            self.subject_for(0, "KIND", None).replace(".0.", ".STREAM."));
        let publisher = Publisher { sink: self.clone(), client, label, metrics, seq: 0, failing: false };
        Ok(tokio::spawn(publisher.run(rx)))
    }
}

/// Counts connection events (called by the NATS client's event task).
fn on_event(metrics: &Metrics, label: &str, event: &async_nats::Event) {
    match event {
        async_nats::Event::Connected => {
            if metrics.sink_connected(label, true) {
                metrics.sink_reconnect(label);
                tracing::info!(sink = %label, "NATS sink reconnected");
            } else {
                tracing::info!(sink = %label, "NATS sink connected");
            }
        }
        async_nats::Event::Disconnected => {
            metrics.sink_connected(label, false);
            tracing::warn!(sink = %label, "NATS sink disconnected; reconnecting");
        }
        other => tracing::debug!(sink = %label, "NATS event: {other}"),
    }
}

/// The publisher task of one NATS sink.
struct Publisher {
    sink: NatsSink,
    client: async_nats::Client,
    label: String,
    metrics: Arc<Metrics>,
    /// Records numbered for `Nats-Msg-Id`.
    seq: u64,
    /// Whether the last publish failed (logs only state changes).
    failing: bool,
}

/// One record ready to publish.
struct Outgoing {
    subject: String,
    payload: Bytes,
    msg_id: String,
}

impl Publisher {
    async fn run(mut self, mut rx: mpsc::Receiver<Arc<SinkRecord>>) {
        let jetstream = self.sink.jetstream.then(|| {
            async_nats::jetstream::ContextBuilder::new()
                .timeout(Duration::from_secs(5))
                .ack_timeout(Duration::from_secs(5))
                .build(self.client.clone())
        });
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            if rx.recv_many(&mut batch, BATCH).await == 0 {
                break;
            }
            if self.sink.overflow == Overflow::Drop && self.client.connection_state() != State::Connected {
                self.metrics.sink_dropped(&self.label, batch.len() as u64);
                batch.clear();
                continue;
            }
            let outgoing: Vec<Outgoing> = batch.drain(..).filter_map(|r| self.prepare(&r)).collect();
            match &jetstream {
                None => self.publish_core(outgoing).await,
                Some(js) => self.publish_acked(js, outgoing).await,
            }
        }
        if tokio::time::timeout(Duration::from_secs(5), self.client.flush()).await.is_err() {
            tracing::warn!(sink = %self.label, "NATS sink: flushing at shutdown timed out");
        }
    }

    fn prepare(&mut self, record: &SinkRecord) -> Option<Outgoing> {
        self.seq += 1;
        match serde_json::to_vec(record) {
            Ok(json) => Some(Outgoing {
                subject: self.sink.subject_for(record.stream, record.event.type_name(), record.model.as_deref()),
                payload: Bytes::from(json),
                msg_id: format!("{}-{}-{}", self.sink.instance, record.stream, self.seq),
            }),
            Err(e) => {
                tracing::error!(sink = %self.label, "a record does not serialise: {e}");
                self.metrics.sink_failed(&self.label, 1);
                None
            }
        }
    }

    fn outcome(&mut self, ok: bool, what: &dyn fmt::Display) {
        if ok {
            self.metrics.sink_sent(&self.label, 1);
            if self.failing {
                self.failing = false;
                tracing::info!(sink = %self.label, "NATS sink publishing again");
            }
        } else {
            self.metrics.sink_failed(&self.label, 1);
            if !self.failing {
                self.failing = true;
                tracing::warn!(sink = %self.label, "NATS sink: publishing failed: {what}");
            }
        }
    }

    /// Core NATS: each record handed to the connection in order (at most
    /// once; a full client buffer makes this wait).
    async fn publish_core(&mut self, outgoing: Vec<Outgoing>) {
        for o in outgoing {
            let result = self.client.publish(o.subject, o.payload).await;
            match result {
                Ok(()) => self.outcome(true, &""),
                Err(e) => self.outcome(false, &e),
            }
        }
    }

    /// JetStream: the batch published, then its acknowledgements awaited in
    /// order; failures retried in order with their message ids.
    async fn publish_acked(&mut self, js: &async_nats::jetstream::Context, outgoing: Vec<Outgoing>) {
        let mut pending = Vec::with_capacity(outgoing.len());
        for o in outgoing {
            let sent = js.publish_with_headers(o.subject.clone(), msg_id_headers(&o.msg_id), o.payload.clone()).await;
            pending.push((o, sent));
        }
        let mut retry = Vec::new();
        for (o, sent) in pending {
            let acked = match sent {
                Ok(ack) => ack.await.map(|_| ()),
                Err(e) => Err(e),
            };
            match acked {
                Ok(()) => self.outcome(true, &""),
                Err(e) if self.sink.overflow == Overflow::Drop && !worth_retrying(&e) => self.outcome(false, &e),
                Err(e) => {
                    if !self.failing {
                        tracing::warn!(sink = %self.label, "NATS sink: JetStream publish failed ({e}); retrying");
                    }
                    retry.push(o);
                }
            }
        }
        for o in retry {
            self.retry(js, o).await;
        }
    }

    async fn retry(&mut self, js: &async_nats::jetstream::Context, o: Outgoing) {
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            tokio::time::sleep(Duration::from_millis(100u64 << attempt.min(5))).await;
            let result =
                match js.publish_with_headers(o.subject.clone(), msg_id_headers(&o.msg_id), o.payload.clone()).await {
                    Ok(ack) => ack.await.map(|_| ()),
                    Err(e) => Err(e),
                };
            match result {
                Ok(()) => return self.outcome(true, &""),
                Err(e) if self.sink.overflow == Overflow::Drop && (attempt >= 3 || !worth_retrying(&e)) => {
                    return self.outcome(false, &e);
                }
                Err(_) => {}
            }
        }
    }
}

/// Whether a failed JetStream publish may succeed when tried again: not
/// when no stream covers the subject, nor when the record is too large.
fn worth_retrying(err: &async_nats::jetstream::context::PublishError) -> bool {
    use async_nats::jetstream::context::PublishErrorKind as K;
    !matches!(err.kind(), K::StreamNotFound | K::MaxPayloadExceeded)
}

fn msg_id_headers(id: &str) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", id);
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_subjects_render() {
        let s: NatsSink = "nats://127.0.0.1:4222/spindle?instance=a1".parse().unwrap();
        assert_eq!(s.subject_for(7, "repair", None), "spindle.a1.7.repair");
        assert_eq!(s.label(), "nats://127.0.0.1:4222/spindle");
        assert_eq!((s.jetstream(), s.overflow(), s.queue()), (false, Overflow::Drop, None));
        let s: NatsSink =
            "nats://u:p%40ss@host/ev?template={subject}.{model}.{kind}&overflow=block&queue=5&js=1".parse().unwrap();
        assert_eq!(s.subject_for(7, "element", Some("meta/llama-3.1 8b")), "ev.meta_llama-3_1_8b.element");
        assert!(s.auth == Auth::UserPassword("u".into(), "p@ss".into()));
        assert_eq!(s.masked(), "nats://u:***@host/ev?template={subject}.{model}.{kind}&overflow=block&queue=5&js=1");
        assert_eq!(s.label(), "nats://host:4222/ev");
        assert_eq!((s.jetstream(), s.overflow(), s.queue()), (true, Overflow::Block, Some(5)));
        let s: NatsSink = "nats://sekrit@host/ev".parse().unwrap();
        assert!(s.auth == Auth::Token("sekrit".into()));
        assert!(!format!("{s:?}").contains("sekrit"));
        let random: NatsSink = "nats://h/s".parse().unwrap();
        assert_eq!(random.instance().len(), 8);
    }

    #[test]
    fn bad_specs_say_why() {
        for (spec, why) in [
            ("nats://h", "no subject"),
            ("nats://h/a..b", "not a subject"),
            ("nats://h/a.>", "not a subject"),
            ("nats://h/s?overflow=maybe", "expected drop or block"),
            ("nats://h/s?queue=0", "positive"),
            ("nats://h/s?instance=a.b", "instance"),
            ("nats://h/s?template={subject}.{nope}", "unknown placeholder {nope}"),
            ("nats://h/s?template={subject}..{kind}", "not a subject"),
            ("nats://h/s?colour=red", "unknown option"),
            ("nats://u:hunter2@h/s?queue=x", "queue"),
        ] {
            let err = spec.parse::<NatsSink>().unwrap_err().to_string();
            assert!(err.contains(why), "{spec}: {err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
    }
}
