//! Blocking HTTP helpers over `ureq` for the integration tests, the soak
//! driver and `kvslim loadtest`: a request read whole ([`request`]), or a
//! response whose body is read as it arrives ([`open`]) with a reader for
//! server-sent events. An error status (4xx, 5xx) is a response like any
//! other; only transport failures are errors.

use std::io::{self, BufRead, BufReader, Read};
use std::time::Duration;

/// A complete response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Splits `http://host:port/prefix` into (`host:port`, `/prefix` without a trailing slash).
pub fn split_url(url: &str) -> io::Result<(String, String)> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "only http:// URLs are supported"))?;
    let (host, path) = rest.split_once('/').map_or((rest, ""), |(h, p)| (h, p));
    let path = format!("/{}", path.trim_end_matches('/'));
    Ok((host.to_string(), if path == "/" { String::new() } else { path }))
}

/// A response whose body is read as it arrives.
pub struct Streaming {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: BufReader<Box<dyn Read + Send + Sync>>,
}

impl Streaming {
    /// The next SSE `data:` payload, or `None` at the end of the stream.
    pub fn next_event(&mut self) -> io::Result<Option<String>> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.body.read_line(&mut line)? == 0 {
                return Ok(None);
            }
            if let Some(data) = line.trim_end_matches(['\r', '\n']).strip_prefix("data:") {
                return Ok(Some(data.trim_start().to_string()));
            }
        }
    }
}

/// Sends a request and returns once the headers arrived; `timeout` bounds
/// each wait for data (connect, headers, every read of the body).
pub fn open(addr: &str, method: &str, path: &str, body: Option<&str>, timeout: Duration) -> io::Result<Streaming> {
    open_with(addr, method, path, body, timeout, &[])
}

/// [`open`] with extra request headers (e.g. `Authorization`).
pub fn open_with(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
    headers: &[(&str, &str)],
) -> io::Result<Streaming> {
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(timeout)
        .timeout_read(timeout)
        .timeout_write(timeout)
        .redirects(0)
        .build();
    let mut req = agent.request(method, &format!("http://{addr}{path}")).set("Content-Type", "application/json");
    for (k, v) in headers {
        req = req.set(k, v);
    }
    let res = match body {
        Some(b) => req.send_string(b),
        None => req.call(),
    };
    let resp = match res {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(ureq::Error::Transport(t)) => return Err(transport_error(t)),
    };
    let mut names = resp.headers_names();
    names.dedup();
    let headers = names.iter().flat_map(|n| resp.all(n).into_iter().map(move |v| (n.clone(), v.to_string()))).collect();
    Ok(Streaming { status: resp.status(), headers, body: BufReader::new(resp.into_reader()) })
}

/// A transport failure as an I/O error of the matching kind, so callers can
/// tell a refused connection or a timeout from other failures.
fn transport_error(t: ureq::Transport) -> io::Error {
    use std::error::Error as _;
    let kind = t.source().and_then(|s| s.downcast_ref::<io::Error>()).map(io::Error::kind).unwrap_or(match t.kind() {
        ureq::ErrorKind::ConnectionFailed | ureq::ErrorKind::Dns => io::ErrorKind::ConnectionRefused,
        _ => io::ErrorKind::Other,
    });
    io::Error::new(kind, t.to_string())
}

/// Sends a request and reads the whole response.
pub fn request(addr: &str, method: &str, path: &str, body: Option<&str>) -> io::Result<Response> {
    request_with(addr, method, path, body, &[])
}

/// [`request`] with extra request headers.
pub fn request_with(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> io::Result<Response> {
    let mut s = open_with(addr, method, path, body, Duration::from_secs(120), headers)?;
    let mut buf = Vec::new();
    s.body.read_to_end(&mut buf)?;
    Ok(Response { status: s.status, headers: s.headers, body: buf })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    /// Answers one connection with `reply` after reading the request head.
    fn one_shot(reply: &'static [u8]) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            while r.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let _ = s.write_all(reply);
        });
        addr
    }

    #[test]
    fn error_statuses_are_responses_and_chunked_sse_streams() {
        let addr = one_shot(b"HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nnope!");
        let r = request(&addr, "GET", "/x", None).unwrap();
        assert_eq!((r.status, r.text().as_str(), r.header("x-a")), (404, "nope!", Some("1")));
        let addr = one_shot(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: a\n\n\r\nA\r\ndata: bc\n\n\r\n0\r\n\r\n",
        );
        let mut s = open(&addr, "POST", "/s", Some("{}"), Duration::from_secs(5)).unwrap();
        assert_eq!(s.next_event().unwrap().as_deref(), Some("a"));
        assert_eq!(s.next_event().unwrap().as_deref(), Some("bc"));
        assert_eq!(s.next_event().unwrap(), None);
    }

    #[test]
    fn refused_connections_are_io_errors() {
        let addr = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        let e = request(&addr, "GET", "/", None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
        assert_eq!(split_url("http://h:1/v1/").unwrap(), ("h:1".to_string(), "/v1".to_string()));
        assert!(split_url("https://h").is_err());
    }
}
