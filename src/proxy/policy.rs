//! Who may talk to the proxy's listeners: the `Host` names a listener
//! answers to, the browser origins whose pages may call the proxy, and the
//! CORS headers those origins get.
//!
//! This module owns those decisions (plain functions of a request's head)
//! and the layer that applies them before a request reaches a route
//! ([`screen`]). It reads no body and never talks to the upstream.
//!
//! # Why
//!
//! * **DNS rebinding.** A page of `http://rebind.attacker.example:8787`
//!   whose name the attacker makes resolve to `127.0.0.1` is same-origin
//!   with a loopback listener: the browser lets it read every answer. Its
//!   requests still say `Host: rebind.attacker.example:8787`. So a listener
//!   bound to a loopback address answers only to loopback names
//!   (`localhost`, `*.localhost`, `127.x.y.z`, `[::1]`, with any port) and
//!   to the `--allowed-host` ones. A listener bound to another address is
//!   meant to be reached by names this proxy cannot know: it answers to any
//!   `Host`, unless `--allowed-host` is given (then to those names and the
//!   loopback ones). A request without a `Host` (HTTP/1.0) passes: browsers
//!   always send one.
//! * **Cross-site requests.** Any page can send a "simple" request (a
//!   `text/plain` POST) without a preflight; the proxy would add its API
//!   key to it, or run a tool in agent mode. Browsers name the page's
//!   origin in `Origin` on such requests and on every cross-origin `fetch`,
//!   so the proxy's listener refuses a request whose `Origin` is not an
//!   `--allow-origin` one (`*`: any), answers CORS preflights itself, and
//!   gives allowed origins `Access-Control-Allow-Origin` and `Vary:
//!   Origin`. Requests without `Origin` (curl, SDKs, server-side apps) are
//!   not a browser page's and pass. The inspector's listener has no browser
//!   policy: its page calls it same-origin, and its answers carry no CORS
//!   headers, so other pages cannot read them.
//! * **The upstream's CORS answers** (llama.cpp's and vLLM's servers allow
//!   any origin) never reach the client: [`drop_cors`]. The proxy's policy
//!   alone decides.
//!
//! Refusals are `403` with the proxy's JSON error body
//! (`host_not_allowed`, `origin_not_allowed`), naming the option that
//! would allow the request.

use super::error::{ProxyError, ProxyErrorKind, error_response};
use super::metrics::Metrics;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

/// How long a browser may keep a preflight's answer, in seconds.
const PREFLIGHT_MAX_AGE: &str = "600";

/// The most of a refused header value a message repeats.
const SHOWN: usize = 100;

/// An `--allowed-host` value as it is compared: lower case, without a
/// trailing dot, an IPv6 address without brackets.
///
/// # Errors
///
/// A sentence saying why `text` is not a host name or IP address (a
/// scheme, a port, a path).
pub(crate) fn host_name(text: &str) -> Result<String, String> {
    let trimmed = text.trim();
    let bare = trimmed.strip_prefix('[').and_then(|t| t.strip_suffix(']')).unwrap_or(trimmed);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(ip.to_string());
    }
    let name = bare.strip_suffix('.').unwrap_or(bare).to_ascii_lowercase();
    let label = |l: &str| {
        !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if !name.is_empty() && name.len() <= 253 && name.split('.').all(label) {
        Ok(name)
    } else {
        Err(format!(
            "{text:?} is not a host name or IP address (a name alone, no scheme, port or path: `proxy.example.com`, `10.0.0.5`)"
        ))
    }
}

/// An `--allow-origin` value as it is compared: `*`, `null`, or
/// `scheme://host[:port]` in lower case, without a trailing slash.
///
/// # Errors
///
/// A sentence saying why `text` is not an origin.
pub(crate) fn origin(text: &str) -> Result<String, String> {
    let trimmed = text.trim();
    if trimmed == "*" || trimmed.eq_ignore_ascii_case("null") {
        return Ok(trimmed.to_ascii_lowercase());
    }
    let bare = trimmed.strip_suffix('/').unwrap_or(trimmed);
    let valid = bare.split_once("://").is_some_and(|(scheme, rest)| {
        scheme.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
            && scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
            && !rest.is_empty()
            && !rest.contains(['/', '?', '#', '@', ' '])
    });
    if valid {
        Ok(bare.to_ascii_lowercase())
    } else {
        Err(format!(
            "{text:?} is not a browser origin (`https://app.example.com`, `http://localhost:3000`, or `*` for any)"
        ))
    }
}

/// The host of a `Host` value or URI authority (`name`, `name:port`,
/// `[v6]:port`), as [`host_name`] writes it; `None` when it is not one.
fn authority_host(value: &str) -> Option<String> {
    let digits = |port: &str| port.bytes().all(|b| b.is_ascii_digit());
    if let Some(rest) = value.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let port_ok = after.is_empty() || after.strip_prefix(':').is_some_and(digits);
        return if port_ok { inside.parse::<Ipv6Addr>().ok().map(|ip| ip.to_string()) } else { None };
    }
    let host = match value.rsplit_once(':') {
        Some((host, port)) if digits(port) => host,
        Some(_) => return None,
        None => value,
    };
    host_name(host).ok()
}

/// Whether a name (as [`host_name`] writes it) can only lead to this
/// machine: `localhost`, `*.localhost` (browsers resolve these to loopback
/// themselves), a loopback address.
fn is_loopback_name(name: &str) -> bool {
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// The `Host` names a listener answers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Hosts {
    /// Any name: a listener bound to a non-loopback address, no
    /// `--allowed-host` given.
    Any,
    /// The loopback names, and these (as [`host_name`] writes them).
    Listed(Vec<String>),
}

impl Hosts {
    /// The names a listener bound to `bound` answers to, with the
    /// `--allowed-host` names (as [`host_name`] writes them).
    pub(crate) fn for_listener(bound: IpAddr, allowed: &[String]) -> Hosts {
        if allowed.is_empty() && !bound.to_canonical().is_loopback() {
            Hosts::Any
        } else {
            Hosts::Listed(allowed.to_vec())
        }
    }

    /// Whether a `Host` value (or URI authority) names this listener.
    fn allows(&self, value: &str) -> bool {
        match self {
            Hosts::Any => true,
            Hosts::Listed(names) => {
                authority_host(value).is_some_and(|host| is_loopback_name(&host) || names.contains(&host))
            }
        }
    }

    /// Checks the request's `Host` (and the authority of an absolute-form
    /// target): each one present must be allowed, and there is at most one
    /// `Host`.
    fn check(&self, request: &Request) -> Result<(), ProxyError> {
        let mut hosts = request.headers().get_all(header::HOST).iter();
        let first = hosts.next();
        if first.is_some() && hosts.next().is_some() {
            return Err(ProxyError::new(ProxyErrorKind::HostNotAllowed, "the request has more than one Host header"));
        }
        let given = first.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let authority = request.uri().authority().map(|a| a.as_str().to_string());
        for value in given.iter().chain(authority.iter()) {
            if !self.allows(value) {
                let name = authority_host(value).unwrap_or_else(|| "NAME".into());
                return Err(ProxyError::new(
                    ProxyErrorKind::HostNotAllowed,
                    format!(
                        "this listener does not answer to Host {:?} (against DNS rebinding, a loopback listener answers to \
                         localhost and loopback addresses only); if clients reach the proxy by that name, start it with \
                         --allowed-host {name}",
                        shown(value)
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// At most [`SHOWN`] characters of a header value, for a message.
fn shown(value: &str) -> String {
    value.chars().take(SHOWN).collect()
}

/// The browser origins whose pages may call the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Origins {
    /// Any origin (`--allow-origin '*'`).
    Any,
    /// These (as [`origin`] writes them); none by default.
    Listed(Vec<String>),
}

impl Origins {
    /// The origins the `--allow-origin` values (as [`origin`] writes them)
    /// allow.
    pub(crate) fn new(allowed: &[String]) -> Origins {
        if allowed.iter().any(|o| o == "*") { Origins::Any } else { Origins::Listed(allowed.to_vec()) }
    }

    /// Who sent a request, by its `Origin` headers.
    fn caller(&self, headers: &HeaderMap) -> Caller {
        let mut values = headers.get_all(header::ORIGIN).iter();
        let Some(first) = values.next() else { return Caller::Direct };
        let text = String::from_utf8_lossy(first.as_bytes()).into_owned();
        let allowed = match self {
            Origins::Any => true,
            Origins::Listed(list) => list.iter().any(|o| o.eq_ignore_ascii_case(&text)),
        };
        if allowed && values.next().is_none() { Caller::Allowed(first.clone()) } else { Caller::Refused(text) }
    }
}

/// Who sent a request, as its `Origin` tells.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Caller {
    /// No `Origin`: not a browser page's cross-origin request (curl, an
    /// SDK, a server-side app).
    Direct,
    /// A page of an allowed origin (the header's value, echoed in the
    /// CORS headers).
    Allowed(HeaderValue),
    /// A page of another origin, or more than one `Origin` (the first
    /// value, for the message).
    Refused(String),
}

/// What a listener checks before a request reaches its routes.
#[derive(Debug)]
pub(crate) struct Screen {
    hosts: Hosts,
    /// The browser policy: the proxy's listener has one; the inspector's
    /// has none (its page calls it same-origin).
    origins: Option<Origins>,
    metrics: Arc<Metrics>,
}

impl Screen {
    /// A screen of `hosts`, and of `origins` when the listener has a
    /// browser policy; refusals are counted in `metrics`.
    pub(crate) fn new(hosts: Hosts, origins: Option<Origins>, metrics: Arc<Metrics>) -> Screen {
        Screen { hosts, origins, metrics }
    }
}

/// The layer of both listeners (`axum::middleware::from_fn_with_state`):
/// the `Host` check, then for the proxy's listener the browser policy, in
/// that order; a request that passes goes on to the routes, and an allowed
/// origin's answer gets its CORS headers.
pub(crate) async fn screen(State(screen): State<Arc<Screen>>, request: Request, next: Next) -> Response {
    if let Err(err) = screen.hosts.check(&request) {
        screen.metrics.refused("host");
        tracing::info!("{err}");
        return error_response(&err);
    }
    let Some(origins) = &screen.origins else { return next.run(request).await };
    match origins.caller(request.headers()) {
        Caller::Direct => next.run(request).await,
        Caller::Refused(origin) => {
            screen.metrics.refused("origin");
            let err = ProxyError::new(
                ProxyErrorKind::OriginNotAllowed,
                format!(
                    "the proxy does not serve pages of the browser origin {:?}; to let them call it, add \
                     --allow-origin {} when starting the proxy",
                    shown(&origin),
                    if origin.is_empty() { "ORIGIN" } else { &origin }
                ),
            );
            tracing::info!("{err}");
            error_response(&err)
        }
        Caller::Allowed(origin) if is_preflight(&request) => preflight(origin, request.headers()),
        Caller::Allowed(origin) => {
            let mut response = next.run(request).await;
            let headers = response.headers_mut();
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            headers.append(header::VARY, HeaderValue::from_static("Origin"));
            response
        }
    }
}

/// Whether a request is a CORS preflight: `OPTIONS` with `Origin` and
/// `Access-Control-Request-Method`. Other `OPTIONS` requests go upstream.
fn is_preflight(request: &Request) -> bool {
    request.method() == Method::OPTIONS
        && request.headers().contains_key(header::ORIGIN)
        && request.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
}

/// The proxy's answer to an allowed origin's preflight: `204`, the origin,
/// the method and headers it asked for (the proxy forwards any), how long
/// to keep the answer, and private-network access when asked (a public
/// page calling a proxy on this machine).
fn preflight(origin: HeaderValue, asked: &HeaderMap) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    if let Some(method) = asked.get(header::ACCESS_CONTROL_REQUEST_METHOD) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_METHODS, method.clone());
    }
    if let Some(names) = asked.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, names.clone());
    }
    headers.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static(PREFLIGHT_MAX_AGE));
    let private = asked.get("access-control-request-private-network").is_some_and(|v| v.as_bytes() == b"true");
    if private {
        headers
            .insert(HeaderName::from_static("access-control-allow-private-network"), HeaderValue::from_static("true"));
    }
    headers.insert(
        header::VARY,
        HeaderValue::from_static("Origin, Access-Control-Request-Method, Access-Control-Request-Headers"),
    );
    response
}

/// Removes every `Access-Control-*` header: an upstream's CORS answer
/// never reaches the client (the proxy's own policy decides).
pub(crate) fn drop_cors(headers: &mut HeaderMap) {
    let cors: Vec<HeaderName> =
        headers.keys().filter(|name| name.as_str().starts_with("access-control-")).cloned().collect();
    for name in cors {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn loopback_listener(allowed: &[&str]) -> Hosts {
        let allowed: Vec<String> = allowed.iter().map(|h| host_name(h).unwrap_or_default()).collect();
        Hosts::for_listener(IpAddr::V4(Ipv4Addr::LOCALHOST), &allowed)
    }

    #[test]
    fn a_loopback_listener_answers_to_loopback_names_and_listed_ones() {
        let hosts = loopback_listener(&["Proxy.Example.com."]);
        for ok in [
            "localhost",
            "localhost:8787",
            "LOCALHOST:1",
            "app.localhost:3000",
            "127.0.0.1",
            "127.0.0.1:8787",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:8787",
            "[::ffff:127.0.0.1]:8787",
            "localhost.:8787",
            "proxy.example.com",
            "proxy.example.com:443",
            "PROXY.example.COM.:1",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for refused in [
            "rebind.attacker.example",
            "rebind.attacker.example:8787",
            "localhost.attacker.example",
            "127.0.0.1.nip.io",
            "0.0.0.0:8787",
            "10.0.0.5",
            "[::2]:1",
            "::1",
            "[::1]x",
            "localhost:http",
            "user@localhost",
            "",
            "example.com:8787",
            "sub.proxy.example.com",
        ] {
            assert!(!hosts.allows(refused), "{refused}");
        }
    }

    #[test]
    fn a_listener_on_the_network_answers_to_any_host_unless_names_are_given() {
        let any = Hosts::for_listener("0.0.0.0".parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), &[]);
        assert_eq!(any, Hosts::Any);
        assert!(any.allows("whatever.example:1") && any.allows("10.0.0.5"));
        let listed = Hosts::for_listener(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5)), &["gpu-box".to_string()]);
        assert!(listed.allows("gpu-box:8787") && listed.allows("localhost") && !listed.allows("10.0.0.5:8787"));
        // A loopback listener is never open to any name.
        assert!(
            !Hosts::for_listener("::1".parse().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)), &[]).allows("x.example")
        );
    }

    #[test]
    fn option_values_are_checked_and_normalised() {
        assert_eq!(host_name("[::1]").as_deref(), Ok("::1"));
        assert_eq!(host_name(" Gpu-Box.LAN. ").as_deref(), Ok("gpu-box.lan"));
        for bad in ["http://x", "x:80", "x/y", "", "a..b", "*.example.com"] {
            assert!(host_name(bad).is_err(), "{bad}");
        }
        assert_eq!(origin("https://App.Example.com/").as_deref(), Ok("https://app.example.com"));
        assert_eq!(origin("http://[::1]:3000").as_deref(), Ok("http://[::1]:3000"));
        assert_eq!(origin("*").as_deref(), Ok("*"));
        assert_eq!(origin("NULL").as_deref(), Ok("null"));
        for bad in ["app.example.com", "https://", "https://x/path", "https://x?q", "://x", "1http://x"] {
            assert!(origin(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_origin_header_tells_who_calls() {
        let listed = Origins::new(&["https://app.example.com".to_string()]);
        let with = |values: &[&'static str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(header::ORIGIN, HeaderValue::from_static(v));
            }
            h
        };
        assert_eq!(listed.caller(&HeaderMap::new()), Caller::Direct);
        assert_eq!(
            listed.caller(&with(&["https://APP.example.com"])),
            Caller::Allowed(HeaderValue::from_static("https://APP.example.com"))
        );
        assert_eq!(listed.caller(&with(&["https://evil.example"])), Caller::Refused("https://evil.example".into()));
        assert_eq!(listed.caller(&with(&["null"])), Caller::Refused("null".into()));
        let two = with(&["https://app.example.com", "https://evil.example"]);
        assert!(matches!(listed.caller(&two), Caller::Refused(_)));
        assert_eq!(
            Origins::new(&[]).caller(&with(&["http://localhost:3000"])),
            Caller::Refused("http://localhost:3000".into())
        );
        let any = Origins::new(&["https://a.example".to_string(), "*".to_string()]);
        assert_eq!(any, Origins::Any);
        assert_eq!(any.caller(&with(&["null"])), Caller::Allowed(HeaderValue::from_static("null")));
    }

    #[test]
    fn upstream_cors_headers_are_dropped_and_nothing_else() {
        let mut h = HeaderMap::new();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
        h.insert(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, HeaderValue::from_static("true"));
        h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static("*"));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
        drop_cors(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-type", "vary"]);
    }
}
