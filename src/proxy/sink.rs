//! Sinks: where the proxy sends the elements it parsed on the side.
//!
//! This module owns the sink queues and workers: a JSONL file (one record
//! per line, appended), a webhook (records POSTed as JSON arrays), or an
//! in-process channel (library users, `spindle demo`). Every sink has a
//! bounded queue filled with `try_send`: a slow or dead sink loses records
//! (counted in `/metrics` as `sink_dropped_total`) and never slows a
//! client's stream. It must not look inside records beyond serialising
//! them.

use super::metrics::Metrics;
use crate::sources::SourceEvent;
use serde::Serialize;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

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

/// Which events the sinks get: completed elements, repairs, and the
/// stream-level events (finish, usage, errors, truncation, content
/// filters). Opens, deltas and closes stay in the proxy.
pub fn is_sink_event(event: &SourceEvent) -> bool {
    match event {
        SourceEvent::Choice(c) => matches!(c.event.type_name(), "element" | "repair"),
        SourceEvent::Finish { .. }
        | SourceEvent::Usage { .. }
        | SourceEvent::StreamError { .. }
        | SourceEvent::Truncated { .. }
        | SourceEvent::ContentFilter { .. } => true,
        _ => false,
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
    /// Send every record to this channel (in-process consumers).
    Channel(mpsc::Sender<Arc<SinkRecord>>),
}

/// Most records in one webhook POST.
pub const WEBHOOK_BATCH: usize = 256;

/// Why a sink argument could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad sink {given:?}: {why} (expected jsonl:FILE or webhook:URL)")]
pub struct SinkSpecError {
    given: String,
    why: &'static str,
}

impl FromStr for SinkSpec {
    type Err = SinkSpecError;

    /// `jsonl:FILE` or `webhook:URL` (`http://` or `https://`).
    ///
    /// ```
    /// use spindle::proxy::SinkSpec;
    /// assert!(matches!("jsonl:out/elements.jsonl".parse::<SinkSpec>(), Ok(SinkSpec::Jsonl(_))));
    /// assert!(matches!("webhook:http://127.0.0.1:9000/hook".parse::<SinkSpec>(), Ok(SinkSpec::Webhook(_))));
    /// assert!("kafka:topic".parse::<SinkSpec>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<SinkSpec, SinkSpecError> {
        let err = |why| SinkSpecError { given: s.to_string(), why };
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
    /// The label of the sink in metrics and logs.
    pub fn label(&self) -> String {
        match self {
            SinkSpec::Jsonl(path) => format!("jsonl:{}", path.display()),
            SinkSpec::Webhook(url) => format!("webhook:{url}"),
            SinkSpec::Channel(_) => "channel".to_string(),
        }
    }
}

/// Why a sink could not start.
#[derive(Debug, thiserror::Error)]
#[error("sink {label}: {source}")]
pub struct SinkStartError {
    label: String,
    #[source]
    source: std::io::Error,
}

type Queue = mpsc::Sender<Arc<SinkRecord>>;

/// The running sinks of one proxy.
#[derive(Debug)]
pub(crate) struct Sinks {
    queues: RwLock<Option<Vec<(String, Queue)>>>,
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
            match spec {
                SinkSpec::Channel(tx) => queues.push((label, tx.clone())),
                SinkSpec::Jsonl(path) => {
                    let file = tokio::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .await
                        .map_err(|source| SinkStartError { label: label.clone(), source })?;
                    let (tx, rx) = mpsc::channel(queue_len.max(1));
                    workers.push(tokio::spawn(jsonl_worker(file, rx, label.clone(), metrics.clone())));
                    queues.push((label, tx));
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
                    queues.push((label, tx));
                }
            }
        }
        Ok(Sinks { queues: RwLock::new(Some(queues)), workers: std::sync::Mutex::new(workers), metrics })
    }

    /// Whether there is any sink (records are not even built otherwise).
    pub(crate) fn is_empty(&self) -> bool {
        self.queues.read().map(|q| q.as_ref().is_none_or(Vec::is_empty)).unwrap_or(true)
    }

    /// Queues a record on every sink without waiting; a full queue drops it.
    pub(crate) fn send(&self, record: &Arc<SinkRecord>) {
        let Ok(queues) = self.queues.read() else { return };
        for (label, tx) in queues.iter().flatten() {
            match tx.try_send(record.clone()) {
                Ok(()) => {
                    // Channel sinks have no worker to count deliveries.
                    if label == "channel" {
                        self.metrics.sink_sent(label, 1);
                    }
                }
                Err(_) => self.metrics.sink_dropped(label, 1),
            }
        }
    }

    /// Stops taking records and waits (up to `wait`) for the workers to
    /// write what is queued.
    pub(crate) async fn close(&self, wait: Duration) {
        if let Ok(mut queues) = self.queues.write() {
            queues.take();
        }
        let workers: Vec<JoinHandle<()>> = self.workers.lock().map(|mut w| std::mem::take(&mut *w)).unwrap_or_default();
        let all = futures::future::join_all(workers);
        if tokio::time::timeout(wait, all).await.is_err() {
            tracing::warn!("sinks did not finish writing within {wait:?}; queued records are lost");
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
