//! The accept loop and one task per connection (HTTP/1.1 through hyper),
//! instead of `axum::serve`, for two things it does not offer:
//!
//! * a header read timeout that answers 408: hyper enforces the timeout but
//!   only closes the connection, so the connection task keeps a second
//!   handle on the socket ([`SharedIo`]) and writes the 408 itself when
//!   hyper gives up in the middle of a request's headers (an idle
//!   kept-alive connection is just closed);
//! * a connection limit: past `HttpLimits::max_connections` a new
//!   connection gets a 503 and is closed at once;
//! * a graceful shutdown that keeps answering: while draining, new
//!   connections are still accepted (their requests get 503 from
//!   [`crate::guard::drain`]), existing ones finish the request they are on
//!   and close, and the loop returns once no admitted request is left or
//!   the grace period is over.

use crate::error::ApiError;
use crate::{AppState, ServeOptions};
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

/// A socket that hyper reads and writes while the connection task keeps
/// its own handle (to answer 408 after hyper's header timeout).
struct SharedIo(Arc<TcpStream>);

impl AsyncRead for SharedIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            match self.0.try_read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for SharedIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(shutdown_write(&self.0))
    }
}

/// Sends FIN (the peer sees the end of the response); a peer already gone
/// is not an error.
fn shutdown_write(s: &TcpStream) -> io::Result<()> {
    match socket2::SockRef::from(s).shutdown(std::net::Shutdown::Write) {
        Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
        r => r,
    }
}

/// Connection tasks still running.
#[derive(Clone, Default)]
struct Connections(Arc<AtomicUsize>);

struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl Connections {
    fn open(&self) -> Open {
        self.0.fetch_add(1, SeqCst);
        Open(self.0.clone())
    }
    fn count(&self) -> usize {
        self.0.load(SeqCst)
    }
}

/// Serves until drained (see the module doc).
pub(crate) async fn serve(listener: std::net::TcpListener, state: AppState, opts: ServeOptions) -> io::Result<()> {
    let listener = TcpListener::from_std(listener)?;
    let shutdown = state.shutdown.clone();
    if opts.signals {
        spawn_signal_handler(shutdown.clone())?;
    }
    let app = crate::router(state.clone());
    let conns = Connections::default();
    // true once draining: connections finish their current request and close
    let (close_tx, close_rx) = watch::channel(false);
    let max_connections = state.http.max_connections;
    let accept = |stream: io::Result<(TcpStream, std::net::SocketAddr)>, draining: bool| match stream {
        Ok((s, _)) if conns.count() >= max_connections => {
            let e = ApiError {
                status: axum::http::StatusCode::SERVICE_UNAVAILABLE,
                message: format!("the server has {max_connections} open connections (--max-connections); retry later"),
                kind: "server_error",
                param: None,
                code: Some("too_many_connections"),
            };
            let open = conns.open();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(1), answer_and_close(&s, &e)).await;
                drop(open);
            });
        }
        Ok((s, _)) => {
            let task = connection(s, app.clone(), state.http.header_timeout, close_rx.clone(), !draining);
            let open = conns.open();
            tokio::spawn(async move {
                task.await;
                drop(open);
            });
        }
        // out of descriptors and the like: keep serving the connections we have
        Err(e) => eprintln!("kvslim serve: accept failed: {e}"),
    };
    loop {
        tokio::select! {
            s = listener.accept() => accept(s, false),
            _ = shutdown.draining() => break,
        }
    }
    let _ = close_tx.send(true);
    let deadline = Instant::now() + opts.grace_period;
    eprintln!(
        "kvslim serve: draining: new requests get 503; {} running, waiting up to {} s",
        shutdown.in_flight(),
        opts.grace_period.as_secs_f64()
    );
    loop {
        if shutdown.in_flight() == 0 {
            break;
        }
        tokio::select! {
            s = listener.accept() => accept(s, true),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            _ = tokio::time::sleep_until(deadline) => {
                eprintln!("kvslim serve: grace period over with {} requests still running; stopping", shutdown.in_flight());
                return Ok(());
            }
        }
    }
    drop(listener);
    // the last responses are written and their connections closing
    while conns.count() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("kvslim serve: drained; stopping");
    Ok(())
}

/// Drains on the first SIGTERM or SIGINT; a second one exits at once.
fn spawn_signal_handler(shutdown: crate::Shutdown) -> io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::spawn(async move {
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            eprintln!("kvslim serve: signal received; draining (send it again to stop at once)");
            shutdown.drain();
            tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            eprintln!("kvslim serve: second signal; stopping now");
            std::process::exit(1);
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            shutdown.drain();
        }
    });
    Ok(())
}

/// One connection: hyper's HTTP/1.1 with the header read timeout, a
/// graceful close when the server starts draining, and a 408 when the
/// client stalls inside a request's headers.
async fn connection(
    stream: TcpStream,
    app: Router,
    header_timeout: Duration,
    mut close: watch::Receiver<bool>,
    keep_alive: bool,
) {
    let _ = stream.set_nodelay(true);
    let sock = Arc::new(stream);
    // whether a request has reached the service: a connection accepted just
    // before the drain but whose first request is still on its way must not
    // be closed unanswered, so it serves that request (a 503) instead
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (seen, draining) = (started.clone(), close.clone());
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        seen.store(true, SeqCst);
        let (mut app, draining) = (app.clone(), draining.clone());
        async move {
            let mut r = tower_service::Service::call(&mut app, req).await?;
            if *draining.borrow() {
                r.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
            }
            Ok::<_, std::convert::Infallible>(r)
        }
    });
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(header_timeout).keep_alive(keep_alive);
    let conn = builder.serve_connection(TokioIo::new(SharedIo(sock.clone())), service);
    tokio::pin!(conn);
    // a connection accepted while draining serves its one request (a 503)
    let mut closing = *close.borrow_and_update();
    let result = loop {
        tokio::select! {
            r = conn.as_mut() => break r,
            c = close.changed(), if !closing => {
                closing = true;
                // idle or mid-request: finish and close; not started yet: the
                // response to its first request says `Connection: close`
                if c.is_ok() && started.load(SeqCst) {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    };
    if let Err(e) = result {
        if e.is_timeout() {
            let e = ApiError {
                status: axum::http::StatusCode::REQUEST_TIMEOUT,
                message: format!(
                    "the request's headers did not arrive within {} s (--header-timeout)",
                    header_timeout.as_secs_f64()
                ),
                kind: "invalid_request_error",
                param: None,
                code: Some("request_timeout"),
            };
            let _ = tokio::time::timeout(Duration::from_secs(1), answer_and_close(&sock, &e)).await;
        }
    }
}

/// Writes `e` as a whole HTTP response (OpenAI's error shape) on a socket
/// hyper does not serve (a client that stalled in its headers, one over the
/// connection limit) and closes it.
async fn answer_and_close(sock: &TcpStream, e: &ApiError) -> io::Result<()> {
    let body = e.body().to_string();
    let msg = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        e.status.as_u16(),
        e.status.canonical_reason().unwrap_or(""),
        body.len()
    );
    let mut left = msg.as_bytes();
    while !left.is_empty() {
        sock.writable().await?;
        match sock.try_write(left) {
            Ok(n) => left = &left[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    shutdown_write(sock)?;
    // read what the client still sends until it closes (the caller's
    // timeout bounds this): closing with unread bytes would reset the
    // connection and could destroy the answer before the client reads it
    let mut sink = [0u8; 1024];
    loop {
        sock.readable().await?;
        match sock.try_read(&mut sink) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}
