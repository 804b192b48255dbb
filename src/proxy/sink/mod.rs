//! Sinks: where the proxy sends the elements it parsed on the side.
//!
//! This module owns the sink queues and workers: a JSONL file (one record
//! per line, appended), a webhook (records POSTed as JSON arrays), a NATS
//! broker ([`nats`]), or an in-process channel (library users,
//! `spindle demo`). Every sink has a bounded queue filled with `try_send`:
//! a slow or dead sink loses records (counted in `/metrics` as
//! `sink_dropped_total`) and never slows a client's stream — unless a NATS
//! sink asks for [`Overflow::Block`]. It must not look inside records
//! beyond serialising them.

pub mod nats;

use super::metrics::Metrics;
use crate::sources::SourceEvent;
use nats::NatsSink;
use serde::Serialize;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// One record sent to the sinks: a parsed event of one proxied stream.
///
/// In JSON the event's own fields come first-level, next to `stream`,
/// `path`, `model` and `ts_ms`:
/// `{"stream":7,"path":"/v1/chat/completions","model":"gpt-4o","ts_ms":1767225600123,
/// "type":"element","id":1,"tag":"content","text":"Hi",...,"choice":0,"channel":"content"}`.
#[derive(Debug, Clone, Serialize)]
pub struct SinkRecord {
    /// The proxy's number for the request (unique within one run).
    pub stream: u64,
    /// The request path.
    pub path: String,
    /// The `model` of the request, when it named one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// When the proxy saw the event, in Unix milliseconds.
    pub ts_ms: u64,
    /// The event.
    #[serde(flatten)]
    pub event: SourceEvent,
}

/// Which events the sinks get: completed elements, repairs, diagnostics,
/// tool-call progress (`call_delta`), and the stream-level events (finish,
/// usage, errors, truncation, content filters, stream diagnostics). Opens,
/// deltas, closes, comments and gaps stay in the proxy.
pub fn is_sink_event(event: &SourceEvent) -> bool {
    match event {
        SourceEvent::Choice(c) => matches!(c.event.type_name(), "element" | "repair" | "diagnostic" | "call_delta"),
        SourceEvent::Finish { .. }
        | SourceEvent::Usage { .. }
        | SourceEvent::StreamError { .. }
        | SourceEvent::Truncated { .. }
        | SourceEvent::ContentFilter { .. }
        | SourceEvent::Diagnostic(_) => true,
        SourceEvent::Done => false,
    }
}

/// What a sink does when its queue is full or its destination is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overflow {
    /// Drop the record and count it (`spindle_proxy_sink_dropped_total`);
    /// the client's stream never waits. The default.
    #[default]
    Drop,
    /// Wait for room: nothing is lost, and the client's stream waits while
    /// the sink is down.
    Block,
}

impl FromStr for Overflow {
    type Err = ();

    /// `drop` or `block`.
    fn from_str(s: &str) -> Result<Overflow, ()> {
        match s {
            "drop" => Ok(Overflow::Drop),
            "block" => Ok(Overflow::Block),
            _ => Err(()),
        }
    }
}

/// Where parsed records go.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum SinkSpec {
    /// Append one JSON record per line to this file (created if missing).
    Jsonl(PathBuf),
    /// POST batches of records to this URL as a JSON array (at most
    /// [`WEBHOOK_BATCH`] per request, sent as soon as the previous POST
    /// finished; a failed POST is retried twice, then its records are
    /// counted as failed).
    Webhook(String),
    /// Publish every record to a NATS broker (`nats://HOST:PORT/SUBJECT`,
    /// see [`nats`] for the options and the subject layout).
    Nats(NatsSink),
    /// Send every record to this channel (in-process consumers).
    Channel(mpsc::Sender<Arc<SinkRecord>>),
}

/// Most records in one webhook POST.
pub const WEBHOOK_BATCH: usize = 256;

/// Why a sink argument could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad sink {given:?}: {why} (expected jsonl:FILE, webhook:URL or nats://HOST:PORT/SUBJECT)")]
pub struct SinkSpecError {
    given: String,
    why: String,
}

impl FromStr for SinkSpec {
    type Err = SinkSpecError;

    /// `jsonl:FILE`, `webhook:URL` (`http://` or `https://`) or
    /// `nats://HOST:PORT/SUBJECT[?OPTIONS]`.
    ///
    /// ```
    /// use spindle::proxy::SinkSpec;
    /// assert!(matches!("jsonl:out/elements.jsonl".parse::<SinkSpec>(), Ok(SinkSpec::Jsonl(_))));
    /// assert!(matches!("webhook:http://127.0.0.1:9000/hook".parse::<SinkSpec>(), Ok(SinkSpec::Webhook(_))));
    /// assert!(matches!("nats://127.0.0.1:4222/spindle".parse::<SinkSpec>(), Ok(SinkSpec::Nats(_))));
    /// assert!("kafka:topic".parse::<SinkSpec>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<SinkSpec, SinkSpecError> {
        if s.starts_with("nats://") {
            // The NATS error names the spec itself (password masked).
            return s.parse().map(SinkSpec::Nats).map_err(|e: nats::NatsSpecError| SinkSpecError {
                given: nats::mask_url(s),
                why: e.why().to_string(),
            });
        }
        let err = |why: &str| SinkSpecError { given: s.to_string(), why: why.to_string() };
        let (kind, rest) = s.split_once(':').ok_or_else(|| err("no kind: prefix"))?;
        match kind {
            "jsonl" | "file" if !rest.is_empty() => Ok(SinkSpec::Jsonl(PathBuf::from(rest))),
            "jsonl" | "file" => Err(err("no file name")),
            "webhook" => match reqwest::Url::parse(rest) {
                Ok(url) if matches!(url.scheme(), "http" | "https") => Ok(SinkSpec::Webhook(rest.to_string())),
                Ok(_) => Err(err("the webhook URL must be http or https")),
                Err(_) => Err(err("the webhook URL does not parse")),
            },
            _ => Err(err("unknown sink kind")),
        }
    }
}

impl SinkSpec {
    /// The label of the sink in metrics and logs: a webhook by its origin
    /// only (its path and query may hold its secret, and `/metrics` is
    /// not guarded).
    pub fn label(&self) -> String {
        match self {
            SinkSpec::Jsonl(path) => format!("jsonl:{}", path.display()),
            SinkSpec::Webhook(url) => match reqwest::Url::parse(url) {
                Ok(u) if u.has_host() => format!("webhook:{}", u.origin().ascii_serialization()),
                _ => format!("webhook:{}", nats::mask_url(url)),
            },
            SinkSpec::Nats(nats) => nats.label(),
            SinkSpec::Channel(_) => "channel".to_string(),
        }
    }

    /// The spec as `--sink` takes it, with passwords and tokens in URLs
    /// masked (`None` for an in-process channel).
    pub fn to_masked_string(&self) -> Option<String> {
        match self {
            SinkSpec::Jsonl(path) => Some(format!("jsonl:{}", path.display())),
            SinkSpec::Webhook(url) => Some(format!("webhook:{}", nats::mask_query(&nats::mask_url(url)))),
            SinkSpec::Nats(nats) => Some(nats.masked().to_string()),
            SinkSpec::Channel(_) => None,
        }
    }
}

/// Why a sink could not start.
#[derive(Debug, thiserror::Error)]
#[error("sink {label}: {cause}")]
pub struct SinkStartError {
    label: String,
    cause: Box<dyn std::error::Error + Send + Sync>,
}

type Queue = mpsc::Sender<Arc<SinkRecord>>;

/// One running sink's queue.
#[derive(Debug)]
struct Entry {
    label: String,
    tx: Queue,
    overflow: Overflow,
}

/// A record that a sink with [`Overflow::Block`] had no room for yet.
#[derive(Debug)]
pub(crate) struct Blocked {
    label: String,
    tx: Queue,
}

/// The running sinks of one proxy.
#[derive(Debug)]
pub(crate) struct Sinks {
    queues: RwLock<Option<Vec<Entry>>>,
    workers: std::sync::Mutex<Vec<JoinHandle<()>>>,
    metrics: Arc<Metrics>,
}

impl Sinks {
    /// Opens the files and starts one worker per sink (needs a runtime).
    pub(crate) async fn start(
        specs: &[SinkSpec],
        queue_len: usize,
        http: reqwest::Client,
        metrics: Arc<Metrics>,
    ) -> Result<Sinks, SinkStartError> {
        let mut queues = Vec::new();
        let mut workers = Vec::new();
        for spec in specs {
            let label = spec.label();
            let mut overflow = Overflow::Drop;
            let tx = match spec {
                SinkSpec::Channel(tx) => tx.clone(),
                SinkSpec::Jsonl(path) => {
                    let file = tokio::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .await
                        .map_err(|e| SinkStartError { label: label.clone(), cause: Box::new(e) })?;
                    let (tx, rx) = mpsc::channel(queue_len.max(1));
                    workers.push(tokio::spawn(jsonl_worker(file, rx, label.clone(), metrics.clone())));
                    tx
                }
                SinkSpec::Webhook(url) => {
                    let (tx, rx) = mpsc::channel(queue_len.max(1));
                    workers.push(tokio::spawn(webhook_worker(
                        http.clone(),
                        url.clone(),
                        rx,
                        label.clone(),
                        metrics.clone(),
                    )));
                    tx
                }
                SinkSpec::Nats(nats) => {
                    overflow = nats.overflow();
                    let (tx, rx) = mpsc::channel(nats.queue().unwrap_or(queue_len).max(1));
                    let worker = nats
                        .start(rx, label.clone(), metrics.clone())
                        .await
                        .map_err(|e| SinkStartError { label: label.clone(), cause: Box::new(e) })?;
                    workers.push(worker);
                    tx
                }
            };
            queues.push(Entry { label, tx, overflow });
        }
        Ok(Sinks { queues: RwLock::new(Some(queues)), workers: std::sync::Mutex::new(workers), metrics })
    }

    /// Whether there is any sink (records are not even built otherwise).
    pub(crate) fn is_empty(&self) -> bool {
        self.queues.read().map(|q| q.as_ref().is_none_or(Vec::is_empty)).unwrap_or(true)
    }

    /// Queues a record on every sink without waiting; a full queue drops
    /// it, except on sinks with [`Overflow::Block`], which are returned for
    /// [`Sinks::wait`].
    pub(crate) fn send(&self, record: &Arc<SinkRecord>) -> Vec<Blocked> {
        let mut blocked = Vec::new();
        let Ok(queues) = self.queues.read() else { return blocked };
        for entry in queues.iter().flatten() {
            match entry.tx.try_send(record.clone()) {
                Ok(()) => {
                    // Channel sinks have no worker to count deliveries.
                    if entry.label == "channel" {
                        self.metrics.sink_sent(&entry.label, 1);
                    }
                }
                Err(mpsc::error::TrySendError::Full(_)) if entry.overflow == Overflow::Block => {
                    blocked.push(Blocked { label: entry.label.clone(), tx: entry.tx.clone() });
                }
                Err(_) => self.metrics.sink_dropped(&entry.label, 1),
            }
        }
        blocked
    }

    /// Waits for room for `record` in blocking sinks' queues, unless `stop`
    /// fires first (then the record counts as dropped).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future loses the record for the sinks not yet served
    /// (uncounted).
    pub(crate) async fn wait(&self, blocked: Vec<Blocked>, record: &Arc<SinkRecord>, stop: &CancellationToken) {
        for b in blocked {
            tokio::select! {
                biased;
                sent = b.tx.send(record.clone()) => {
                    if sent.is_err() {
                        self.metrics.sink_dropped(&b.label, 1);
                    }
                }
                () = stop.cancelled() => self.metrics.sink_dropped(&b.label, 1),
            }
        }
    }

    /// Stops taking records and waits (up to `wait`) for the workers to
    /// write what is queued; workers still busy then are stopped.
    pub(crate) async fn close(&self, wait: Duration) {
        if let Ok(mut queues) = self.queues.write() {
            queues.take();
        }
        let workers: Vec<JoinHandle<()>> = self.workers.lock().map(|mut w| std::mem::take(&mut *w)).unwrap_or_default();
        let aborts: Vec<_> = workers.iter().map(JoinHandle::abort_handle).collect();
        let all = futures::future::join_all(workers);
        if tokio::time::timeout(wait, all).await.is_err() {
            tracing::warn!("sinks did not finish writing within {wait:?}; queued records are lost");
            for abort in aborts {
                abort.abort();
            }
        }
    }
}

fn serialise(record: &SinkRecord) -> Option<String> {
    serde_json::to_string(record).ok()
}

async fn jsonl_worker(
    file: tokio::fs::File,
    mut rx: mpsc::Receiver<Arc<SinkRecord>>,
    label: String,
    metrics: Arc<Metrics>,
) {
    let mut out = tokio::io::BufWriter::new(file);
    let mut batch = Vec::new();
    loop {
        if rx.recv_many(&mut batch, 1024).await == 0 {
            break;
        }
        let n = batch.len() as u64;
        let mut buf = String::new();
        for record in batch.drain(..) {
            if let Some(line) = serialise(&record) {
                buf.push_str(&line);
                buf.push('\n');
            }
        }
        let result = async {
            out.write_all(buf.as_bytes()).await?;
            out.flush().await
        }
        .await;
        match result {
            Ok(()) => metrics.sink_sent(&label, n),
            Err(e) => {
                tracing::error!(sink = %label, "writing {n} records failed: {e}");
                metrics.sink_failed(&label, n);
            }
        }
    }
}

async fn webhook_worker(
    http: reqwest::Client,
    url: String,
    mut rx: mpsc::Receiver<Arc<SinkRecord>>,
    label: String,
    metrics: Arc<Metrics>,
) {
    let mut batch = Vec::new();
    loop {
        if rx.recv_many(&mut batch, WEBHOOK_BATCH).await == 0 {
            break;
        }
        let n = batch.len() as u64;
        let mut body = String::from("[");
        for (i, record) in batch.drain(..).enumerate() {
            if let Some(line) = serialise(&record) {
                if i > 0 {
                    body.push(',');
                }
                body.push_str(&line);
            }
        }
        body.push(']');
        let mut delivered = false;
        for (attempt, backoff) in [0u64, 200, 1000].into_iter().enumerate() {
            if backoff > 0 {
                tokio::time::sleep(Duration::from_millis(backoff)).await;
            }
            let sent = http
                .post(&url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .timeout(Duration::from_secs(10))
                .body(body.clone())
                .send()
                .await;
            match sent {
                Ok(r) if r.status().is_success() => {
                    delivered = true;
                    break;
                }
                Ok(r) if r.status().is_client_error() && r.status().as_u16() != 429 => {
                    tracing::warn!(sink = %label, "webhook refused {n} records with {}; not retried", r.status());
                    break;
                }
                Ok(r) => tracing::warn!(sink = %label, attempt, "webhook answered {}", r.status()),
                Err(e) => tracing::warn!(sink = %label, attempt, "webhook POST failed: {}", super::error::chain(&e)),
            }
        }
        if delivered {
            metrics.sink_sent(&label, n);
        } else {
            metrics.sink_failed(&label, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SinkSpec;

    #[test]
    fn a_webhook_secret_stays_out_of_labels_and_printed_config() {
        let spec: SinkSpec = "webhook:http://user:pw@127.0.0.1:9000/hooks/SECRETPATH?token=QSECRET#f".parse().unwrap();
        let label = spec.label();
        assert_eq!(label, "webhook:http://127.0.0.1:9000");
        let printed = spec.to_masked_string().unwrap_or_default();
        assert!(!printed.contains("pw") && !printed.contains("QSECRET"), "{printed}");
        assert!(printed.starts_with("webhook:http://user:***@127.0.0.1:9000/hooks/SECRETPATH?***"), "{printed}");
    }
}
