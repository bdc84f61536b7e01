//! A raw HTTP/1.1 client over `std::net::TcpStream` (127.0.0.1 only), so the fuzz can send what
//! no HTTP library would: broken heads, lying lengths, truncated streams, early closes. It
//! keeps a connection alive between well-formed requests and reads answers framed by
//! `Content-Length` (what the servers send) or by the connection's end.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

/// How long one answer may take before the fuzz calls the server hung.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// One answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
}

/// How a request is put on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Whole, on the kept-alive connection; an answer must come.
    Whole,
    /// Whole, on a fresh connection that the server may close after answering (bytes it may
    /// not parse, a body it refuses unread).
    Fresh,
    /// The first `n` bytes, then the write side is shut: an answer may or may not come.
    Truncated(usize),
    /// The first `n` bytes, then the connection is dropped without reading.
    Dropped(usize),
}

/// A client of one server.
pub struct Client {
    addr: SocketAddr,
    conn: Option<TcpStream>,
}

fn connect(addr: SocketAddr) -> TcpStream {
    assert!(addr.ip().is_loopback(), "the fuzz talks to loopback only");
    let c = TcpStream::connect(addr).expect("the server accepts connections");
    c.set_read_timeout(Some(PATIENCE)).unwrap();
    c.set_nodelay(true).unwrap();
    c
}

impl Client {
    pub fn new(addr: SocketAddr) -> Client {
        Client { addr, conn: None }
    }

    /// Sends `bytes` as `how` says; the answer, if one came. `head_only`: the request was
    /// `HEAD`, so the answer has no body whatever its length says.
    pub fn send(&mut self, bytes: &[u8], how: Mode, head_only: bool) -> Option<Answer> {
        match how {
            Mode::Whole => {
                // A kept-alive connection the server closed meanwhile fails before any byte of
                // an answer: the request is sent again, once, on a fresh connection.
                if let Some(mut c) = self.conn.take() {
                    if c.write_all(bytes).is_ok() {
                        if let Ok((a, keep)) = read_answer(&mut c, head_only) {
                            if keep {
                                self.conn = Some(c);
                            }
                            return Some(a);
                        }
                    }
                }
                let mut c = connect(self.addr);
                c.write_all(bytes).ok()?;
                let (a, keep) = read_answer(&mut c, head_only).ok()?;
                if keep {
                    self.conn = Some(c);
                }
                Some(a)
            }
            Mode::Fresh => {
                let mut c = connect(self.addr);
                // The server may answer and close before taking every byte.
                let _ = c.write_all(bytes);
                read_answer(&mut c, head_only).ok().map(|(a, _)| a)
            }
            Mode::Truncated(n) => {
                let mut c = connect(self.addr);
                let _ = c.write_all(&bytes[..n.min(bytes.len())]);
                let _ = c.shutdown(Shutdown::Write);
                read_answer(&mut c, head_only).ok().map(|(a, _)| a)
            }
            Mode::Dropped(n) => {
                let mut c = connect(self.addr);
                let _ = c.write_all(&bytes[..n.min(bytes.len())]);
                None
            }
        }
    }
}

/// No answer: the connection ended (or reset) before a complete head.
#[derive(Debug)]
pub struct Nothing;

/// Reads one answer; whether the connection stays usable.
fn read_answer(c: &mut TcpStream, head_only: bool) -> Result<(Answer, bool), Nothing> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match c.read(&mut chunk) {
            Ok(0) => return Err(Nothing),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {
                panic!("no answer within {PATIENCE:?}: the server hangs")
            }
            Err(_) => return Err(Nothing),
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {head:?}"));
    let (mut length, mut close, mut content_type) = (None, false, String::new());
    for line in lines {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        match k.as_str() {
            "content-length" => length = v.parse::<usize>().ok(),
            "connection" => close = v.eq_ignore_ascii_case("close"),
            "content-type" => content_type = v.to_string(),
            "transfer-encoding" => panic!("a chunked answer (the servers send lengths): {head:?}"),
            _ => {}
        }
    }
    let mut body = buf[end..].to_vec();
    let want = if head_only { Some(0) } else { length };
    match want {
        Some(n) => {
            while body.len() < n {
                match c.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => body.extend_from_slice(&chunk[..k]),
                }
            }
            body.truncate(n);
        }
        None => {
            close = true;
            let _ = c.read_to_end(&mut body);
        }
    }
    Ok((
        Answer {
            status,
            content_type,
            body,
        },
        !close,
    ))
}
