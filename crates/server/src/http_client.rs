//! A tiny blocking HTTP/1.1 client over `std::net::TcpStream`, enough for
//! the integration tests and `kvslim loadtest`: one request per connection
//! (`Connection: close`), content-length or chunked bodies, and a reader for
//! server-sent events.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
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
    pub body: BufReader<Body>,
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

/// Sends a request and returns once the headers arrived.
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
    let stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    let mut w = stream.try_clone()?;
    let body = body.unwrap_or("");
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    );
    w.write_all(head.as_bytes())?;
    w.write_all(body.as_bytes())?;
    w.flush()?;
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            break;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let find = |n: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(n)).map(|(_, v)| v.clone());
    let chunked = find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    let length = find("content-length").and_then(|v| v.parse().ok());
    let body = Body { inner: r, chunked, left: 0, length, done: false };
    Ok(Streaming { status, headers, body: BufReader::new(body) })
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

/// A response body: chunked, content-length or until EOF.
pub struct Body {
    inner: BufReader<TcpStream>,
    chunked: bool,
    left: usize,
    length: Option<usize>,
    done: bool,
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.chunked {
            if self.left == 0 {
                let mut line = String::new();
                if self.inner.read_line(&mut line)? == 0 {
                    self.done = true;
                    return Ok(0);
                }
                let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("bad chunk size {line:?}")))?;
                if size == 0 {
                    self.done = true;
                    return Ok(0);
                }
                self.left = size;
            }
            let want = buf.len().min(self.left);
            let n = self.inner.read(&mut buf[..want])?;
            if n == 0 {
                self.done = true;
                return Ok(0);
            }
            self.left -= n;
            if self.left == 0 {
                let mut crlf = String::new();
                self.inner.read_line(&mut crlf)?;
            }
            Ok(n)
        } else if let Some(len) = self.length.as_mut() {
            if *len == 0 {
                self.done = true;
                return Ok(0);
            }
            let want = buf.len().min(*len);
            let n = self.inner.read(&mut buf[..want])?;
            *len -= n;
            if n == 0 {
                self.done = true;
            }
            Ok(n)
        } else {
            self.inner.read(buf)
        }
    }
}
