//! A scraper that keeps its connection, as Prometheus does: HTTP/1.1 to `/metrics` over one
//! TCP connection from scrape to scrape, opened again when the server has closed it (a server
//! that answers HTTP/1.0, as nvitop-exporter's does, closes it after each answer).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// One target's connection.
pub(super) struct Scraper {
    port: u16,
    conn: Option<BufReader<TcpStream>>,
}

impl Scraper {
    pub(super) fn new(port: u16) -> Self {
        Self { port, conn: None }
    }

    /// GET `/metrics` (asking for gzip with `gzip`); the body's bytes. A connection kept from
    /// the scrape before that turns out closed is opened again once.
    pub(super) fn get(&mut self, gzip: bool) -> Result<usize> {
        if self.conn.is_some() {
            match self.exchange(gzip) {
                Ok(n) => return Ok(n),
                Err(_) => self.conn = None,
            }
        }
        self.exchange(gzip)
    }

    fn exchange(&mut self, gzip: bool) -> Result<usize> {
        if self.conn.is_none() {
            let s = TcpStream::connect(("127.0.0.1", self.port))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            self.conn = Some(BufReader::with_capacity(64 * 1024, s));
        }
        let conn = self.conn.as_mut().context("a connection")?;
        write!(
            conn.get_mut(),
            "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n{}\r\n",
            if gzip {
                "Accept-Encoding: gzip\r\n"
            } else {
                ""
            }
        )?;
        let mut status = String::new();
        if conn.read_line(&mut status)? == 0 {
            bail!("closed before an answer");
        }
        if !status.starts_with("HTTP/1.") || !status.contains(" 200 ") {
            bail!("scrape failed: {}", status.trim_end());
        }
        let (mut length, mut chunked, mut close, mut gzipped) =
            (None, false, status.starts_with("HTTP/1.0"), false);
        loop {
            let mut line = String::new();
            if conn.read_line(&mut line)? == 0 {
                bail!("closed in the answer's head");
            }
            let line = line.trim_end().to_ascii_lowercase();
            if line.is_empty() {
                break;
            }
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match name {
                "content-length" => length = Some(value.parse::<usize>()?),
                "transfer-encoding" => chunked = value.contains("chunked"),
                "connection" => close = value.contains("close"),
                "content-encoding" => gzipped = value.contains("gzip"),
                _ => {}
            }
        }
        if gzip && !gzipped {
            bail!("asked for gzip, got another encoding");
        }
        let body = if chunked {
            let mut n = 0;
            loop {
                let mut size = String::new();
                conn.read_line(&mut size)?;
                let size =
                    usize::from_str_radix(size.trim_end().split(';').next().unwrap_or(""), 16)
                        .context("a chunk's size")?;
                let mut rest = vec![0u8; size + 2];
                conn.read_exact(&mut rest)?;
                if size == 0 {
                    break n;
                }
                n += size;
            }
        } else if let Some(length) = length {
            let mut body = vec![0u8; length];
            conn.read_exact(&mut body)?;
            length
        } else {
            close = true;
            let mut body = Vec::new();
            conn.read_to_end(&mut body)?;
            body.len()
        };
        if close {
            self.conn = None;
        }
        Ok(body)
    }
}
