//! Drivers: a [`Parser`] fed from a byte stream or an `AsyncRead`, every
//! event routed as soon as it is emitted, the router finished at the end.
//! This module owns only that loop and its report; parsing is the
//! parser's, routing the router's.

use crate::parser::Parser;
use crate::route::{RouteReport, Router};
use futures::{Stream, StreamExt};
use serde::Serialize;
use tokio::io::AsyncRead;

/// What a driven run did: the input read and the routing report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RunReport {
    /// Bytes fed to the parser.
    pub input_bytes: u64,
    /// Chunks they came in.
    pub chunks: u64,
    /// The router's final report.
    pub routing: RouteReport,
}

/// The input failed part-way. What had arrived was parsed and routed, the
/// parser was finished (elements still open were closed and routed, with
/// `closed_at_eof` repairs) and the handlers drained; `report` says what
/// happened.
#[derive(Debug, thiserror::Error)]
#[error("input failed after {} bytes: {error}", report.input_bytes)]
pub struct RunError<E> {
    /// The input's error.
    #[source]
    pub error: E,
    /// Everything done up to and after it.
    pub report: RunReport,
}

impl Router {
    /// Drives `parser` from a stream of byte chunks (`Bytes`, `Vec<u8>`,
    /// `&[u8]`, `String`, ...): each chunk is parsed and its events routed
    /// before the next chunk is awaited, so an element reaches its handler
    /// while the input is still running. Under [`Backpressure::Wait`] a
    /// full subscription holds up reading the input. At the end of input the
    /// parser is finished, its last events routed, and the router finished
    /// ([`Router::finish`]).
    ///
    /// ```
    /// use futures::stream;
    /// use spindle::route::Router;
    /// use spindle::{Parser, Registry};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut router = Router::new();
    /// let mut thoughts = router.subscribe("thought");
    /// let input = stream::iter(["<thought>a</thought>", "<content>b</content>"].map(Ok::<_, std::io::Error>));
    /// let report = router.run(Parser::new(Registry::filament()), input).await?;
    /// assert_eq!(thoughts.recv().await.unwrap().text, "a");
    /// assert_eq!((report.chunks, report.routing.elements), (2, 2));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// When the stream yields an error, reading stops and the run ends as
    /// at end of input; the error is returned in a [`RunError`] with the
    /// report.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropping the future drops the parser (its unfinished
    /// elements are never routed) and the router (handlers drain what they
    /// were sent, in the background, unreported).
    ///
    /// [`Backpressure::Wait`]: crate::route::Backpressure::Wait
    pub async fn run<S, B, E>(mut self, mut parser: Parser, input: S) -> Result<RunReport, RunError<E>>
    where
        S: Stream<Item = Result<B, E>>,
        B: AsRef<[u8]>,
    {
        let mut input = std::pin::pin!(input);
        let mut input_bytes = 0u64;
        let mut chunks = 0u64;
        let mut failure = None;
        while let Some(item) = input.next().await {
            match item {
                Ok(chunk) => {
                    let chunk = chunk.as_ref();
                    input_bytes += chunk.len() as u64;
                    chunks += 1;
                    self.feed(&mut parser, chunk).await;
                }
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            }
        }
        self.end(parser).await;
        let report = RunReport { input_bytes, chunks, routing: self.finish().await };
        match failure {
            None => Ok(report),
            Some(error) => {
                tracing::warn!(bytes = input_bytes, "route input failed; finished with what arrived");
                Err(RunError { error, report })
            }
        }
    }

    /// Like [`Router::run`], reading `reader` in chunks of
    /// [`RouterOptions::read_chunk`](crate::route::RouterOptions::read_chunk)
    /// bytes (a file, a socket, a child's stdout).
    ///
    /// ```
    /// use spindle::route::Router;
    /// use spindle::{Parser, Registry};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut router = Router::new();
    /// let mut all = router.subscribe_all();
    /// let input: &[u8] = b"<thought>t</thought><content>c</content>";
    /// let report = router.run_reader(Parser::new(Registry::filament()), input).await?;
    /// assert_eq!(report.input_bytes, input.len() as u64);
    /// assert_eq!(&*all.recv().await.expect("thought routed").tag, "thought");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// A read error (other than `Interrupted`, which is retried) ends the
    /// run as at end of input and is returned with the report.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe, as [`Router::run`].
    pub async fn run_reader<R>(self, parser: Parser, reader: R) -> Result<RunReport, RunError<std::io::Error>>
    where
        R: AsyncRead,
    {
        let capacity = self.options().read_chunk;
        let input = tokio_util::io::ReaderStream::with_capacity(reader, capacity)
            .filter(|read| std::future::ready(!matches!(read, Err(e) if e.kind() == std::io::ErrorKind::Interrupted)));
        self.run(parser, input).await
    }
}
