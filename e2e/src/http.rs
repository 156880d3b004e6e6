//! A small blocking HTTP/1.1 client for the API, with no dependencies
//! beyond std: tests read status codes, Nomad's headers and JSON bodies.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// A reply.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl Reply {
    /// A header value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// `X-Nomad-Index`.
    pub fn index(&self) -> u64 {
        self.header("x-nomad-index").and_then(|v| v.parse().ok()).unwrap_or(0)
    }

    /// The body as JSON.
    pub fn json(&self) -> Result<Value> {
        serde_json::from_slice(&self.body).with_context(|| format!("body is not JSON: {}", self.text()))
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Talks to one agent.
#[derive(Debug, Clone)]
pub struct HttpClient {
    addr: String,
    token: Option<String>,
}

impl HttpClient {
    /// A client for `host:port`.
    pub fn new(addr: &str) -> HttpClient {
        HttpClient { addr: addr.to_string(), token: None }
    }

    /// The same agent, every request carrying `X-Nomad-Token: token`.
    pub fn with_token(&self, token: &str) -> HttpClient {
        HttpClient { addr: self.addr.clone(), token: Some(token.to_string()) }
    }

    /// Sends a request and reads the whole reply.
    pub fn request(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<Reply> {
        let mut s = TcpStream::connect(&self.addr).with_context(|| format!("connecting to {}", self.addr))?;
        s.set_read_timeout(Some(Duration::from_secs(330)))?;
        let body = body.unwrap_or_default();
        write!(s, "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n", self.addr, body.len())?;
        if !body.is_empty() {
            write!(s, "Content-Type: application/json\r\n")?;
        }
        if let Some(t) = &self.token {
            write!(s, "X-Nomad-Token: {t}\r\n")?;
        }
        write!(s, "\r\n")?;
        s.write_all(body)?;
        let mut r = BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line)?;
        let status: u16 =
            line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).with_context(|| format!("bad status line {line:?}"))?;
        let mut headers = Vec::new();
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                headers.push((k.trim().to_lowercase(), v.trim().to_string()));
            }
        }
        let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        let mut body = Vec::new();
        if chunked {
            loop {
                line.clear();
                r.read_line(&mut line)?;
                let size = usize::from_str_radix(line.trim(), 16).with_context(|| format!("bad chunk size {line:?}"))?;
                if size == 0 {
                    break;
                }
                let mut chunk = vec![0; size + 2];
                r.read_exact(&mut chunk)?;
                body.extend_from_slice(&chunk[..size]);
            }
        } else {
            r.read_to_end(&mut body)?;
        }
        Ok(Reply { status, headers, body })
    }

    /// Opens a streaming GET (chunked NDJSON) and returns its lines as they arrive.
    pub fn stream_lines(&self, path: &str, read_timeout: Duration) -> Result<LineStream> {
        let mut s = TcpStream::connect(&self.addr).with_context(|| format!("connecting to {}", self.addr))?;
        s.set_read_timeout(Some(read_timeout))?;
        write!(s, "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.addr)?;
        let mut r = BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line)?;
        if !line.contains(" 200 ") {
            bail!("GET {path}: {}", line.trim());
        }
        loop {
            line.clear();
            r.read_line(&mut line)?;
            if line.trim_end().is_empty() {
                break;
            }
        }
        Ok(LineStream { r, pending: String::new() })
    }

    /// GET, expecting 200.
    pub fn get(&self, path: &str) -> Result<Reply> {
        let r = self.request("GET", path, None)?;
        if r.status != 200 {
            bail!("GET {path}: {} {}", r.status, r.text());
        }
        Ok(r)
    }

    /// GET, expecting 200 and JSON.
    pub fn get_json(&self, path: &str) -> Result<Value> {
        self.get(path)?.json()
    }

    /// PUT a JSON body, expecting 200 and JSON.
    pub fn put_json(&self, path: &str, body: &Value) -> Result<Value> {
        let r = self.request("PUT", path, Some(body.to_string().as_bytes()))?;
        if r.status != 200 {
            bail!("PUT {path}: {} {}", r.status, r.text());
        }
        r.json()
    }

    /// DELETE, expecting 200 and JSON.
    pub fn delete_json(&self, path: &str) -> Result<Value> {
        let r = self.request("DELETE", path, None)?;
        if r.status != 200 {
            bail!("DELETE {path}: {} {}", r.status, r.text());
        }
        r.json()
    }
}

/// Lines of a chunked streaming body.
pub struct LineStream {
    r: BufReader<TcpStream>,
    pending: String,
}

impl LineStream {
    /// The next complete line (without the newline); errors on timeout or end of stream.
    pub fn next_line(&mut self) -> Result<String> {
        loop {
            if let Some(pos) = self.pending.find('\n') {
                let line: String = self.pending.drain(..=pos).collect();
                return Ok(line.trim_end().to_string());
            }
            let mut size_line = String::new();
            if self.r.read_line(&mut size_line)? == 0 {
                bail!("stream ended");
            }
            let size = usize::from_str_radix(size_line.trim(), 16).with_context(|| format!("bad chunk size {size_line:?}"))?;
            if size == 0 {
                bail!("stream ended");
            }
            let mut chunk = vec![0; size + 2];
            self.r.read_exact(&mut chunk)?;
            self.pending.push_str(&String::from_utf8_lossy(&chunk[..size]));
        }
    }

    /// The next line that is not a `{}` heartbeat, parsed as JSON.
    pub fn next_batch(&mut self) -> Result<Value> {
        loop {
            let line = self.next_line()?;
            if line != "{}" {
                return serde_json::from_str(&line).with_context(|| format!("bad event line {line:?}"));
            }
        }
    }
}
