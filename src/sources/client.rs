//! A small client for OpenAI-compatible `/chat/completions` endpoints:
//! posts a request with `"stream": true` and returns an [`EventStream`].
//!
//! This module owns the HTTP request and the errors before the first body
//! byte (connection, status, content type); the body is
//! [`super::stream`]'s. Every error says which side failed and whether a
//! retry may help ([`ClientError::side`], [`ClientError::is_retryable`]).
//!
//! ```no_run
//! use futures::StreamExt;
//! use spindle::sources::ChatClient;
//!
//! # #[allow(dead_code)]
//! # async fn run() -> Result<(), spindle::sources::ClientError> {
//! // OPENAI_BASE_URL (default https://api.openai.com/v1) and
//! // SPINDLE_API_KEY or OPENAI_API_KEY from the environment.
//! let client = ChatClient::from_env();
//! let request = serde_json::json!({
//!     "model": "gpt-4o-mini",
//!     "messages": [{"role": "user", "content": "Say hi"}],
//! });
//! let mut events = client.stream_chat(&request).await?;
//! while let Some(event) = events.next().await {
//!     println!("{}", serde_json::to_string(&event).unwrap_or_default());
//! }
//! # Ok(())
//! # }
//! ```

use super::model::StreamOptions;
use super::stream::EventStream;
use serde_json::Value;
use std::time::Duration;

/// Which side of a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorSide {
    /// The server (or the network to it).
    Upstream,
    /// The caller: a request or configuration that cannot work.
    Local,
}

/// Why a chat request failed before its stream started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The request body is not a JSON object.
    #[error("the request must be a JSON object, got {0}")]
    InvalidRequest(&'static str),
    /// The server could not be reached (refused, DNS, TLS, timeout), or
    /// the request could not be built (an invalid URL: side `Local`).
    #[error("{} {url}: {}", if cause.is_builder() { "cannot make a request to" } else { "cannot reach" }, super::error_chain(cause))]
    Connect {
        /// The endpoint.
        url: String,
        /// The cause.
        cause: reqwest::Error,
    },
    /// The server answered with an error status.
    #[error("{url} answered {status}: {message}")]
    Status {
        /// The endpoint.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The error message from the body (`error.message`), or the start
        /// of the body.
        message: String,
        /// The body, when it was JSON.
        body: Option<Value>,
    },
    /// The server answered 2xx with something that is neither an event
    /// stream nor JSON (an HTML login page, a proxy error).
    #[error("{url} answered with content type {content_type:?}, not an event stream or JSON: {excerpt}")]
    NotEventStream {
        /// The endpoint.
        url: String,
        /// The `Content-Type` it sent.
        content_type: String,
        /// The start of the body.
        excerpt: String,
    },
}

impl ClientError {
    /// Which side failed.
    pub fn side(&self) -> ErrorSide {
        match self {
            ClientError::InvalidRequest(_) => ErrorSide::Local,
            ClientError::Connect { cause, .. } if cause.is_builder() => ErrorSide::Local,
            ClientError::Status { status: 400 | 401 | 403 | 404 | 422, .. } => ErrorSide::Local,
            _ => ErrorSide::Upstream,
        }
    }

    /// Whether sending the same request again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::InvalidRequest(_) | ClientError::NotEventStream { .. } => false,
            ClientError::Connect { cause, .. } => !cause.is_builder(),
            ClientError::Status { status, .. } => matches!(status, 408 | 409 | 429 | 500..=599),
        }
    }
}

/// Largest error body read for a message.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// A client for one OpenAI-compatible endpoint.
#[derive(Debug, Clone)]
pub struct ChatClient {
    http: reqwest::Client,
    base_url: String,
    api_key: Option<String>,
    options: StreamOptions,
    idle_timeout: Option<Duration>,
}

/// An OpenAI-compatible API's base URL, the part before
/// `/chat/completions`, as an OpenAI SDK's `base_url` is: given as it is
/// (`https://api.openai.com/v1`, `https://open.bigmodel.cn/api/paas/v4`),
/// without a trailing `/`, but a bare origin (`http://127.0.0.1:8788`, the
/// form `spindle proxy --upstream` takes) is given `/v1`, so that the same
/// URL reaches the same server from the client, the agent and the proxy.
pub(crate) fn api_base(base_url: &str) -> String {
    let base = base_url.trim_end_matches('/');
    match reqwest::Url::parse(base) {
        Ok(url) if url.path() == "/" && url.query().is_none() => format!("{base}/v1"),
        _ => base.to_string(),
    }
}

/// Checks that `url` can be an API's base: an `http://` or `https://` URL
/// with a host, and no query or fragment. The proxy's `--upstream` and the
/// agent's base URL are checked alike; the error says what is wrong.
#[cfg(feature = "tools")]
pub(crate) fn check_api_url(url: &str) -> Result<reqwest::Url, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| e.to_string())?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err("it must be an http:// or https:// URL with a host".into());
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err("it must not have a query or fragment".into());
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        // Not sent, and printed wherever the URL is: refused, not ignored.
        return Err("it must not hold a user name or password; give the API key instead".into());
    }
    Ok(parsed)
}

impl ChatClient {
    /// A client for `base_url` (the part before `/chat/completions`, e.g.
    /// `https://api.openai.com/v1` or `http://127.0.0.1:8080/v1`), without
    /// an API key. A bare origin (`http://127.0.0.1:8080`) is given `/v1`,
    /// as `spindle proxy --upstream` takes one; a base with a path is used
    /// as it is.
    pub fn new(base_url: impl Into<String>) -> ChatClient {
        let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(10)).build().unwrap_or_default();
        ChatClient {
            http,
            base_url: api_base(&base_url.into()),
            api_key: None,
            options: StreamOptions::default(),
            idle_timeout: Some(Duration::from_secs(300)),
        }
    }

    /// A client configured from the environment: the base URL from
    /// `OPENAI_BASE_URL` (default `https://api.openai.com/v1`), the key from
    /// `SPINDLE_API_KEY`, else `OPENAI_API_KEY` (none when both are unset).
    pub fn from_env() -> ChatClient {
        let base = std::env::var("OPENAI_BASE_URL")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "https://api.openai.com/v1".to_string());
        ChatClient::new(base).with_env_key()
    }

    /// Takes the API key from `SPINDLE_API_KEY`, else `OPENAI_API_KEY`.
    pub fn with_env_key(mut self) -> ChatClient {
        self.api_key = ["SPINDLE_API_KEY", "OPENAI_API_KEY"]
            .iter()
            .find_map(|name| std::env::var(name).ok().filter(|k| !k.is_empty()));
        self
    }

    /// Sets the API key (sent as `Authorization: Bearer`).
    pub fn with_api_key(mut self, key: impl Into<String>) -> ChatClient {
        self.api_key = Some(key.into());
        self
    }

    /// Sets the parse options (registry, limits, rewrite).
    pub fn with_options(mut self, options: StreamOptions) -> ChatClient {
        self.options = options;
        self
    }

    /// Uses this `reqwest::Client` (proxies, TLS, timeouts).
    pub fn with_http_client(mut self, http: reqwest::Client) -> ChatClient {
        self.http = http;
        self
    }

    /// Ends a stream that stays silent this long (default 300 s; `None`
    /// waits forever).
    pub fn with_idle_timeout(mut self, timeout: Option<Duration>) -> ChatClient {
        self.idle_timeout = timeout;
        self
    }

    /// The base URL.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Whether an API key is set.
    pub fn has_api_key(&self) -> bool {
        self.api_key.is_some()
    }

    /// The chat-completions URL.
    pub fn endpoint(&self) -> String {
        format!("{}/chat/completions", self.base_url)
    }

    /// Posts `request` (a chat-completions body; `"stream": true` is set)
    /// and returns its events.
    ///
    /// # Errors
    ///
    /// A [`ClientError`] when the request is not an object, the server
    /// cannot be reached, answers with an error status, or answers with a
    /// body that is neither an event stream nor JSON. Errors after the
    /// stream started are events (`stream_error`, `truncated`).
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future before it completes abandons the
    /// request (the connection is closed); nothing else is affected.
    pub async fn stream_chat(&self, request: &Value) -> Result<EventStream, ClientError> {
        let mut body = match request {
            Value::Object(map) => map.clone(),
            Value::Null => return Err(ClientError::InvalidRequest("null")),
            Value::Array(_) => return Err(ClientError::InvalidRequest("an array")),
            _ => return Err(ClientError::InvalidRequest("a scalar")),
        };
        body.insert("stream".into(), Value::Bool(true));
        let url = self.endpoint();
        let mut req = self.http.post(&url).header(reqwest::header::ACCEPT, "text/event-stream").json(&body);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        // The URL is in the message once (reqwest's error names it too).
        let mut response =
            req.send().await.map_err(|cause| ClientError::Connect { url: url.clone(), cause: cause.without_url() })?;
        let status = response.status();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        if !status.is_success() {
            let text = read_limited(&mut response).await;
            let body = serde_json::from_str::<Value>(&text).ok();
            let message = body
                .as_ref()
                .and_then(|b| b.get("error"))
                .and_then(|e| e.get("message").and_then(Value::as_str).or(e.as_str()))
                .map(str::to_string)
                .unwrap_or_else(|| super::model::excerpt(text.trim(), 300));
            return Err(ClientError::Status { url, status: status.as_u16(), message, body });
        }
        let is_json = content_type.starts_with("application/json") || content_type.contains("+json");
        if !content_type.starts_with("text/event-stream") && !is_json {
            let text = read_limited(&mut response).await;
            return Err(ClientError::NotEventStream {
                url,
                content_type,
                excerpt: super::model::excerpt(text.trim(), 300),
            });
        }
        let events = EventStream::from_response(response, self.options.clone());
        Ok(match self.idle_timeout {
            Some(timeout) => events.with_idle_timeout(timeout),
            None => events,
        })
    }
}

/// Reads up to [`ERROR_BODY_LIMIT`] bytes of a body as text.
async fn read_limited(response: &mut reqwest::Response) -> String {
    let mut buf = Vec::new();
    while buf.len() < ERROR_BODY_LIMIT {
        match response.chunk().await {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    buf.truncate(ERROR_BODY_LIMIT);
    String::from_utf8_lossy(&buf).into_owned()
}
