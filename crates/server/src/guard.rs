//! Protections in front of the API: request-size and slow-client limits,
//! the API key, and the draining state of a graceful shutdown.
//!
//! Every request passes three layers, outermost first:
//!
//! 1. [`auth`]: with an API key configured, every endpoint but `/health`
//!    and the web page's static files (`/`, `/web/…`, which hold no data;
//!    the page asks for the key) needs `Authorization: Bearer KEY` (401 otherwise, before the body is
//!    read, so an unauthenticated client cannot make the server buffer
//!    anything).
//! 2. [`drain`]: once a shutdown started, new requests get 503 (`/health`
//!    answers 503 `{"status": "draining"}` for load balancers; `/metrics`
//!    keeps working); admitted ones are counted until their response body
//!    (a whole SSE stream included) has been produced.
//! 3. [`read_body`]: the body is read here, not by the handlers: a declared
//!    `Content-Length` above `--max-body-bytes` is refused with 413 before
//!    a byte of it is read, a chunked body as soon as it passes the limit,
//!    and a body that does not arrive within `--body-timeout` gets 408.
//!    Both close the connection (the rest of the body is never read).
//!
//! The header read timeout lives in the connection loop ([`crate::serve`]):
//! hyper enforces it, and the loop answers 408 on the socket it shares.

use crate::error::ApiError;
use crate::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// Limits on what one client may make the server hold, and for how long.
#[derive(Clone, Debug)]
pub struct HttpLimits {
    /// Largest request body accepted (413 beyond it).
    pub max_body_bytes: usize,
    /// Time a client has to send a request's line and headers, counted from
    /// when the server starts waiting for them (the connection opened, or
    /// the previous response on a kept-alive connection ended). A client
    /// that sent part of a request by then gets 408; one that sent nothing
    /// (an idle connection) is closed without an answer.
    pub header_timeout: Duration,
    /// Time a client has to send a request's whole body once its headers
    /// arrived.
    pub body_timeout: Duration,
    /// Deadline of one request from its arrival (queueing, prefill and
    /// generation); `None`: no deadline. A request past it stops generating
    /// and frees its KV at once; the client gets an error that says so.
    pub request_timeout: Option<Duration>,
    /// Connections served at once; one more is answered 503 (code
    /// `too_many_connections`) and closed, so a flood of idle or slow
    /// clients cannot exhaust the process's file descriptors.
    pub max_connections: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_body_bytes: 1 << 20,
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(60),
            request_timeout: Some(Duration::from_secs(600)),
            max_connections: 512,
        }
    }
}

/// The server's shutdown state, shared by the connection loop, the
/// middleware and whoever starts the shutdown (a signal, or a test).
///
/// Why a handle rather than only a signal handler: the drain logic is
/// exercised in-process by the tests, which call [`Shutdown::drain`].
#[derive(Clone, Default)]
pub struct Shutdown {
    inner: Arc<ShutdownInner>,
}

#[derive(Default)]
struct ShutdownInner {
    draining: AtomicBool,
    notify: tokio::sync::Notify,
    /// Admitted requests whose response body is not finished.
    in_flight: AtomicUsize,
}

impl Shutdown {
    /// Stops admitting new requests; the server's loop lets the admitted
    /// ones finish (up to its grace period) and then returns.
    pub fn drain(&self) {
        if !self.inner.draining.swap(true, SeqCst) {
            self.inner.notify.notify_waiters();
        }
    }

    /// Whether [`Shutdown::drain`] was called.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(SeqCst)
    }

    /// Admitted requests still producing their response.
    pub fn in_flight(&self) -> usize {
        self.inner.in_flight.load(SeqCst)
    }

    /// Resolves once draining started.
    pub async fn draining(&self) {
        loop {
            let notified = self.inner.notify.notified();
            if self.is_draining() {
                return;
            }
            notified.await;
        }
    }

    fn enter(&self) -> InFlight {
        self.inner.in_flight.fetch_add(1, SeqCst);
        InFlight(self.inner.clone())
    }
}

/// One admitted request, counted until dropped (with its response body).
struct InFlight(Arc<ShutdownInner>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, SeqCst);
    }
}

/// A response body that holds its request's [`InFlight`] until the body is
/// finished or dropped (a stream counts for as long as it runs).
struct Guarded {
    inner: Body,
    _guard: InFlight,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// An error response that also closes the connection (used where the
/// request's body was not read, so the connection cannot be reused).
fn closing(e: ApiError) -> Response {
    let mut r = e.into_response();
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Compares two byte strings in time that depends only on `given`'s length
/// (never on where they differ), so the key cannot be guessed byte by byte.
pub fn constant_time_eq(key: &[u8], given: &[u8]) -> bool {
    let mut diff = key.len() ^ given.len();
    for (i, &g) in given.iter().enumerate() {
        let k = key.get(i).copied().unwrap_or(0);
        diff |= std::hint::black_box((k ^ g) as usize);
    }
    diff == 0
}

/// Layer 1: `Authorization: Bearer KEY` on everything but `/health` and
/// the web page's static files.
pub async fn auth(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let Some(key) = st.api_key.as_deref() else {
        return next.run(req).await;
    };
    if req.uri().path() == "/health" || crate::web::is_public(req.uri().path()) {
        return next.run(req).await;
    }
    let given = req.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes()).and_then(|v| {
        let (scheme, rest) = v.split_at(v.iter().position(|&b| b == b' ').unwrap_or(v.len()));
        scheme.eq_ignore_ascii_case(b"bearer").then(|| rest.trim_ascii())
    });
    let message = match given {
        Some(g) if constant_time_eq(key.as_bytes(), g) => return next.run(req).await,
        Some(_) => "Incorrect API key provided.",
        None => "You didn't provide an API key. Send it as `Authorization: Bearer KEY`.",
    };
    let mut r = closing(ApiError {
        status: StatusCode::UNAUTHORIZED,
        message: message.into(),
        kind: "invalid_request_error",
        param: None,
        code: Some("invalid_api_key"),
    });
    r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// Layer 2: 503 for new requests while draining; counts admitted ones.
pub async fn drain(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if st.shutdown.is_draining() && path != "/health" && path != "/metrics" {
        return closing(ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the server is shutting down and admits no new requests; retry on another instance".into(),
            kind: "server_error",
            param: None,
            code: Some("server_shutting_down"),
        });
    }
    let guard = st.shutdown.enter();
    let r = next.run(req).await;
    r.map(|inner| Body::new(Guarded { inner, _guard: guard }))
}

/// Layer 3: reads the body under the size limit and the body timeout.
pub async fn read_body(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let limits = &st.http;
    let max = limits.max_body_bytes;
    let too_large = |declared: Option<u64>| {
        let size = declared.map_or_else(|| "is larger".to_string(), |n| format!("has {n} bytes"));
        closing(ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("the request body {size}; this server accepts at most {max} bytes (--max-body-bytes)"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        })
    };
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > max as u64) {
        return too_large(Some(n));
    }
    let (parts, body) = req.into_parts();
    let deadline = tokio::time::Instant::now() + limits.body_timeout;
    let mut data = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::with_capacity(declared.unwrap_or(0) as usize);
    loop {
        match tokio::time::timeout_at(deadline, data.next()).await {
            Err(_) => {
                return closing(ApiError {
                    status: StatusCode::REQUEST_TIMEOUT,
                    message: format!(
                        "the request body did not arrive within {} s (--body-timeout); got {} bytes",
                        limits.body_timeout.as_secs_f64(),
                        buf.len()
                    ),
                    kind: "invalid_request_error",
                    param: None,
                    code: Some("request_timeout"),
                })
            }
            Ok(None) => break,
            Ok(Some(Ok(chunk))) => {
                if buf.len() + chunk.len() > max {
                    return too_large(None);
                }
                buf.extend_from_slice(&chunk);
            }
            // the client broke the body off (or sent a malformed chunk)
            Ok(Some(Err(e))) => return closing(ApiError::bad(format!("cannot read the request body: {e}"), None)),
        }
    }
    next.run(Request::from_parts(parts, Body::from(buf))).await
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn key_comparison() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"secret", b"secre"));
        assert!(!constant_time_eq(b"secret", b""));
        // lengths that differ by a multiple of 256 still differ
        assert!(!constant_time_eq(&[0u8; 300], &[0u8; 44]));
    }
}
