//! An error printed with its causes, once each: the one place the crate
//! turns a `source()` chain into a line (client errors, handler failures,
//! template errors). It must not depend on any layer.

/// An error and its causes, `: `-separated; a cause whose text the message
/// already holds is not repeated (reqwest's own message hides the cause,
/// e.g. "connection refused"; anyhow-style errors print their chain).
pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = cause.source();
    }
    text
}
