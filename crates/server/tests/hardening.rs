//! The server against abusive or careless clients (stories260K on a
//! loopback port, short limits so each case takes well under a second):
//! oversized bodies (413), clients stalling in their headers or body (408),
//! the per-request deadline, the API key (401) and draining (503), each
//! with a raw TCP client where the HTTP client would hide the behaviour.

use kvslim_loadtest::http_client::{self, Response};
use kvslim_server::{HttpLimits, Limits};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
mod common;

use common::{metric, start_with};

fn limits() -> Limits {
    Limits { kv_memory: 64 << 20, max_batch: 16, queue_limit: 64, ..Limits::default() }
}

fn short(max_body_bytes: usize) -> HttpLimits {
    HttpLimits {
        max_body_bytes,
        header_timeout: Duration::from_millis(400),
        body_timeout: Duration::from_millis(400),
        request_timeout: None,
        max_connections: 512,
    }
}

/// Sends raw bytes on a fresh connection.
fn raw(addr: &str, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    s.flush().unwrap();
    s
}

/// Reads until the server closes the connection: (status, JSON body).
/// Panics when the server keeps the connection open (read timeout).
fn read_until_closed(s: &mut TcpStream) -> (u16, Value) {
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).expect("the server should answer and close the connection");
    let text = String::from_utf8_lossy(&buf);
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Reads `s` to its close: the answer must be `status` with an OpenAI
/// error of `kind` and `code`; returns its body.
fn refused(s: &mut TcpStream, status: u16, kind: &str, code: &str) -> Value {
    let (got, body) = read_until_closed(s);
    assert_eq!(got, status, "{body}");
    assert_openai_error(&body, kind, code);
    body
}

fn assert_openai_error(body: &Value, kind: &str, code: &str) {
    assert!(body["error"]["message"].is_string(), "no OpenAI error shape: {body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
}

fn completion(max_tokens: usize) -> String {
    json!({"prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0}).to_string()
}

fn still_serves(addr: &str) {
    let r = http_client::request(addr, "POST", "/v1/completions", Some(&completion(5))).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], 5);
}

#[test]
fn oversized_body_is_413_before_it_is_read() {
    let (addr, _, _) = start_with(limits(), Duration::from_secs(5), |s| s.with_http_limits(short(4096)));
    // declared too large: answered with no byte of the body sent (a server
    // waiting for the body would answer 408 after the body timeout instead)
    let mut s = raw(
        &addr,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n",
    );
    let body = refused(&mut s, 413, "invalid_request_error", "request_too_large");
    assert!(body["error"]["message"].as_str().unwrap().contains("4096"));

    // chunked, no length: refused once it passes the limit
    let mut s = raw(&addr, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    let chunk = format!("1000\r\n{}\r\n", "a".repeat(0x1000));
    s.write_all(chunk.as_bytes()).unwrap();
    s.write_all(chunk.as_bytes()).unwrap();
    refused(&mut s, 413, "invalid_request_error", "request_too_large");

    // a body at the limit is fine
    let mut b = json!({"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0, "pad": ""});
    let pad = 4096 - b.to_string().len();
    b["pad"] = json!("x".repeat(pad));
    let r = http_client::request(&addr, "POST", "/v1/completions", Some(&b.to_string())).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    still_serves(&addr);
}

#[test]
fn client_stalling_in_its_headers_gets_408_and_is_closed() {
    let (addr, _, _) = start_with(limits(), Duration::from_secs(5), |s| s.with_http_limits(short(1 << 20)));
    let t = Instant::now();
    let mut s = raw(&addr, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le");
    refused(&mut s, 408, "invalid_request_error", "request_timeout");
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(350) && waited < Duration::from_secs(3), "after {waited:?}");
    // many stalled clients at once hold nothing: all answered, server serves
    let mut stalled: Vec<TcpStream> = (0..32).map(|_| raw(&addr, b"GET /health HTTP/1.1\r\n")).collect();
    for s in &mut stalled {
        assert_eq!(read_until_closed(s).0, 408);
    }
    still_serves(&addr);
}

#[test]
fn connections_past_the_limit_get_503_and_are_closed() {
    let http = HttpLimits { max_connections: 4, header_timeout: Duration::from_secs(20), ..short(1 << 20) };
    let (addr, _, _) = start_with(limits(), Duration::from_secs(5), |s| s.with_http_limits(http));
    // four idle clients hold every connection the server allows
    let idle: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    let mut s = raw(&addr, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    let body = refused(&mut s, 503, "server_error", "too_many_connections");
    assert!(body["error"]["message"].as_str().unwrap().contains("4 open connections"), "{body}");
    // once they leave, new clients are served again
    drop(idle);
    let t = Instant::now();
    loop {
        match http_client::request(&addr, "GET", "/health", None) {
            Ok(r) if r.status == 200 => break,
            r if t.elapsed() > Duration::from_secs(5) => panic!("still refused after the idle clients left: {r:?}"),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    still_serves(&addr);
}

#[test]
fn client_stalling_in_its_body_gets_408_and_is_closed() {
    let (addr, _, _) = start_with(limits(), Duration::from_secs(5), |s| s.with_http_limits(short(1 << 20)));
    let t = Instant::now();
    let mut s = raw(
        &addr,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":",
    );
    refused(&mut s, 408, "invalid_request_error", "request_timeout");
    assert!(t.elapsed() < Duration::from_secs(3));
    still_serves(&addr);
}

#[test]
fn request_deadline_stops_generation_and_frees_kv() {
    let http = HttpLimits { request_timeout: Some(Duration::from_millis(100)), ..short(1 << 20) };
    let (addr, _, _) = start_with(limits(), Duration::from_secs(5), |s| s.with_http_limits(http));
    // 16 choices × the rest of the context (507 tokens) take about a second
    // here (~10k tokens/s batched); the deadline cuts them, queued or running
    let body = json!({"prompt": "Once upon a time", "max_tokens": 100000, "n": 16, "temperature": 0}).to_string();
    let t = Instant::now();
    let r = http_client::request(&addr, "POST", "/v1/completions", Some(&body)).unwrap();
    assert_eq!(r.status, 504, "{}", r.text());
    assert_openai_error(&r.json(), "server_error", "request_timeout");
    assert!(t.elapsed() < Duration::from_secs(2), "answered after {:?}", t.elapsed());
    // streamed: an error chunk that says so, then [DONE]
    let mut sb: Value = serde_json::from_str(&body).unwrap();
    sb["stream"] = json!(true);
    let mut s =
        http_client::open(&addr, "POST", "/v1/completions", Some(&sb.to_string()), Duration::from_secs(10)).unwrap();
    assert_eq!(s.status, 200);
    let mut last_error = None;
    while let Some(d) = s.next_event().unwrap() {
        if d == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&d).unwrap();
        if v.get("error").is_some() {
            last_error = Some(v);
        } else {
            assert!(v["choices"][0]["finish_reason"].is_null(), "no choice may finish: {v}");
        }
    }
    assert_openai_error(&last_error.expect("an error chunk"), "server_error", "request_timeout");
    let deadline = Instant::now() + Duration::from_secs(2);
    while metric(&addr, "kvslim_kv_bytes_in_use") != 0.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(metric(&addr, "kvslim_kv_bytes_in_use"), 0.0);
    assert_eq!(metric(&addr, "kvslim_running_requests"), 0.0);
    assert!(metric(&addr, "kvslim_requests_timed_out_total") >= 2.0);
    // a short request still fits its deadline
    still_serves(&addr);
}

fn get(addr: &str, path: &str, key: Option<&str>) -> Response {
    let auth = key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    let mut s = raw(addr, format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}\r\n").as_bytes());
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let text = String::from_utf8_lossy(&buf);
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).as_bytes().to_vec();
    Response { status, headers: Vec::new(), body }
}

fn post_with_key(addr: &str, body: &str, auth: &str) -> (u16, Value) {
    let mut s = raw(
        addr,
        format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let text = String::from_utf8_lossy(&buf);
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    // content-length bodies only here (not streamed)
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[test]
fn api_key_is_required_everywhere_but_health() {
    let key = "sk-test-0123456789";
    let (addr, _, _) = start_with(limits(), Duration::from_secs(5), |s| s.with_api_key(Some(key.into())));
    let body = completion(4);
    for auth in ["".to_string(), "Authorization: Bearer wrong\r\n".into(), format!("Authorization: Basic {key}\r\n")] {
        let (status, v) = post_with_key(&addr, &body, &auth);
        assert_eq!(status, 401, "{auth:?}: {v}");
        assert_openai_error(&v, "invalid_request_error", "invalid_api_key");
    }
    let (status, v) = post_with_key(&addr, &body, &format!("Authorization: Bearer {key}\r\n"));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 4);
    // the scheme is case-insensitive, as RFC 9110 says
    assert_eq!(post_with_key(&addr, &body, &format!("authorization: bearer {key}\r\n")).0, 200);
    for path in ["/v1/models", "/metrics", "/tokenizer_info", "/no/such/endpoint"] {
        let r = get(&addr, path, None);
        assert_eq!(r.status, 401, "{path}: {}", r.text());
        assert_openai_error(&r.json(), "invalid_request_error", "invalid_api_key");
        assert_ne!(get(&addr, path, Some(key)).status, 401, "{path}");
    }
    assert_eq!(get(&addr, "/health", None).status, 200);
    // an oversized body without the key is refused for the key, unread
    let mut s = raw(&addr, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n");
    assert_eq!(read_until_closed(&mut s).0, 401);
}

#[test]
fn draining_refuses_new_requests_and_lets_running_ones_finish() {
    let (addr, shutdown, thread) =
        start_with(limits(), Duration::from_secs(20), |s| s.with_http_limits(HttpLimits::default()));
    assert_eq!(get(&addr, "/health", None).json()["status"], "ok");
    // a request in flight: its headers and half its body are in
    let body = json!({"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0, "stream": true}).to_string();
    let (head, tail) = body.split_at(body.len() / 2);
    let mut running = raw(
        &addr,
        format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{head}",
            body.len()
        )
        .as_bytes(),
    );
    let t = Instant::now();
    while shutdown.in_flight() == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "the request was never admitted");
        std::thread::sleep(Duration::from_millis(5));
    }
    shutdown.drain();
    // new requests: 503 in OpenAI's shape; /health says draining; /metrics works
    let (status, v) = post_with_key(&addr, &completion(4), "");
    assert_eq!(status, 503, "{v}");
    assert_openai_error(&v, "server_error", "server_shutting_down");
    let h = get(&addr, "/health", None);
    assert_eq!(h.status, 503);
    assert_eq!(h.json()["status"], "draining");
    assert_eq!(get(&addr, "/metrics", None).status, 200);
    assert!(!thread.is_finished(), "the server must wait for the running request");
    // the running request completes normally
    running.write_all(tail.as_bytes()).unwrap();
    let mut buf = Vec::new();
    running.read_to_end(&mut buf).unwrap();
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
    assert!(text.contains("data: [DONE]"), "{text}");
    // then the server returns, well before the grace period
    let t = Instant::now();
    while !thread.is_finished() {
        assert!(t.elapsed() < Duration::from_secs(5), "the server did not stop after draining");
        std::thread::sleep(Duration::from_millis(10));
    }
    thread.join().unwrap().unwrap();
    assert!(TcpStream::connect(&addr).is_err(), "the listener is closed");
}

#[test]
fn grace_period_bounds_the_drain() {
    let (addr, shutdown, thread) =
        start_with(limits(), Duration::from_millis(300), |s| s.with_http_limits(HttpLimits::default()));
    // a client that never finishes its body keeps its request in flight
    let _stalled = raw(&addr, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":");
    let t = Instant::now();
    while shutdown.in_flight() == 0 {
        assert!(t.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(5));
    }
    let t = Instant::now();
    shutdown.drain();
    thread.join().unwrap().unwrap();
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(3), "{took:?}");
}
