//! A `/metrics` answer (the Prometheus and the dcgm-exporter sinks): the page rendered into a
//! buffer kept from one scrape to the next, gzipped by a compressor kept the same way for a
//! scraper that asks for it.
//!
//! The 64-GPU node's page is 2.2 MB. Rendered into a fresh buffer each time, every scrape
//! wrote it into pages jemalloc had handed back to the kernel after the last one (unused
//! dirty pages go back after a second, `allocator::JEMALLOC_CONF`) and took a page fault on
//! each 4 KiB of it; a compressor made anew for each answer (tower-http's, before) zeroed and
//! faulted in its tables the same way. The answer's body now owns its buffer
//! ([`bytes::Bytes::from_owner`]) and gives it back once hyper has let go of it; the next
//! scrape renders into it again. A scrape that finds a buffer or the compressor out (two
//! scrapes at once) uses a new one; of the two buffers, one is kept.

use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use super::gzip::Gzip;

/// A kept buffer holds at most this much more than the body it last held (a node whose page
/// shrank, its GPUs gone, does not keep the larger buffer for good).
const SLACK: usize = 64 * 1024;

/// The text exposition format's content type.
const TEXT: HeaderValue = HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8");

/// What a `/metrics` route keeps between scrapes.
#[derive(Clone)]
pub struct Pages {
    text: Kept,
    /// With gzip on: the compressor and its output's buffer.
    gzip: Option<(Arc<Mutex<Gzip>>, Kept)>,
}

impl Pages {
    /// With `gzip`, a scraper that asks for gzip gets it.
    pub fn new(gzip: bool) -> Self {
        Self {
            text: Kept::default(),
            gzip: gzip.then(|| (Arc::new(Mutex::new(Gzip::new())), Kept::default())),
        }
    }

    /// The page `render` writes (into an empty string), gzipped where the request asks for
    /// it and gzip is on; with gzip on, every answer says `Vary: Accept-Encoding`.
    pub fn answer(&self, request: &HeaderMap, render: impl FnOnce(&mut String)) -> Response {
        let mut text = String::from_utf8(self.text.take()).unwrap_or_default();
        render(&mut text);
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, TEXT);
        let Some((gzip, out)) = &self.gzip else {
            return (headers, self.text.lend(text.into_bytes())).into_response();
        };
        headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
        if !accepts_gzip(request) {
            return (headers, self.text.lend(text.into_bytes())).into_response();
        }
        let compressed = {
            let mut fresh = None;
            let mut kept = gzip.try_lock().ok();
            let z = match kept.as_deref_mut() {
                Some(z) => z,
                None => fresh.insert(Gzip::new()),
            };
            z.keep_buffer(out.take());
            z.start();
            z.feed(text.as_bytes());
            z.finish_vec()
        };
        match compressed {
            Ok(body) => {
                self.text.keep(text.into_bytes());
                headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                (headers, out.lend(body)).into_response()
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot gzip /metrics; answering with the text");
                (headers, self.text.lend(text.into_bytes())).into_response()
            }
        }
    }
}

/// Whether `Accept-Encoding` takes gzip (RFC 9110 12.5.3): `gzip` or `x-gzip` with a
/// weight above 0, else `*` with one; no header, or a malformed weight, is no.
fn accepts_gzip(request: &HeaderMap) -> bool {
    let (mut gzip, mut any) = (None, None);
    for value in request.get_all(header::ACCEPT_ENCODING) {
        let Ok(value) = value.to_str() else {
            continue;
        };
        for item in value.split(',') {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or_default().trim();
            let weight = parts
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    k.trim().eq_ignore_ascii_case("q").then_some(v.trim())
                })
                .next()
                .map_or(Some(1.0), |q| q.parse::<f32>().ok());
            let Some(weight) = weight else {
                continue;
            };
            if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
                gzip = Some(weight > 0.0);
            } else if coding == "*" {
                any = Some(weight > 0.0);
            }
        }
    }
    gzip.or(any).unwrap_or(false)
}

/// A buffer kept between scrapes (empty before the first, or while an answer holds it).
#[derive(Clone, Default)]
struct Kept(Arc<Mutex<Vec<u8>>>);

impl Kept {
    /// The kept buffer, emptied (a new one if an answer holds it).
    fn take(&self) -> Vec<u8> {
        let mut buf = std::mem::take(&mut *crate::model::lock(&self.0));
        buf.clear();
        buf
    }

    /// Keeps `buf` unless one is kept already (the larger of two at once is not sought).
    fn keep(&self, mut buf: Vec<u8>) {
        buf.shrink_to(buf.len() + SLACK);
        let mut kept = crate::model::lock(&self.0);
        if kept.capacity() == 0 {
            *kept = buf;
        }
    }

    /// `buf` as a body that gives it back here once the body is dropped.
    fn lend(&self, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Lent {
            buf,
            home: Arc::downgrade(&self.0),
        })
    }
}

/// A buffer lent to a response body.
struct Lent {
    buf: Vec<u8>,
    home: std::sync::Weak<Mutex<Vec<u8>>>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(home) = self.home.upgrade() {
            Kept(home).keep(std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_gives_its_buffer_back_once_dropped() {
        let kept = Kept::default();
        let mut page = kept.take();
        page.extend_from_slice(b"gpu_up 1\n");
        let at = page.as_ptr();
        let body = kept.lend(page);
        assert_eq!(&body[..], b"gpu_up 1\n");
        // Held by the body (a scrape in flight): the next scrape gets a buffer of its own.
        let other = kept.take();
        assert_ne!(other.as_ptr(), at);
        assert_eq!(other.capacity(), 0);
        let clone = body.clone();
        drop(body);
        assert_eq!(kept.take().capacity(), 0, "a clone still holds it");
        drop(clone);
        let again = kept.take();
        assert_eq!(again.as_ptr(), at, "the same buffer, back");
        assert!(again.is_empty());
    }

    #[test]
    fn a_buffer_far_larger_than_its_body_is_shrunk_and_one_of_two_is_kept() {
        let kept = Kept::default();
        let mut big = Vec::with_capacity(4 * SLACK);
        big.push(b'x');
        let small = kept.lend(b"y".to_vec());
        drop(kept.lend(big));
        let back = kept.take();
        assert!(
            (1..=1 + SLACK).contains(&back.capacity()),
            "{}",
            back.capacity()
        );
        // The second buffer back while one is kept: dropped, not swapped in.
        drop(kept.lend(back));
        drop(small);
        assert!(kept.take().capacity() > 1);
    }

    #[test]
    fn a_body_outliving_its_route_frees_its_buffer() {
        let kept = Kept::default();
        let body = kept.lend(b"gpu_up 1\n".to_vec());
        drop(kept);
        assert_eq!(&body[..], b"gpu_up 1\n");
        drop(body);
    }

    #[test]
    fn gzip_is_taken_as_rfc_9110_weighs_it() {
        let asks = |values: &[&str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(
                    header::ACCEPT_ENCODING,
                    HeaderValue::from_str(v).expect("header"),
                );
            }
            accepts_gzip(&h)
        };
        // What Prometheus, curl --compressed and browsers send.
        assert!(asks(&["gzip"]));
        assert!(asks(&["deflate, gzip, br, zstd"]));
        assert!(asks(&["gzip, deflate"]));
        assert!(asks(&["GZIP;Q=0.5"]));
        assert!(asks(&["x-gzip"]));
        assert!(asks(&["br", "gzip;q=0.1"]));
        assert!(asks(&["*"]));
        assert!(asks(&["identity;q=1, *;q=0.2"]));
        // Refused, absent or unreadable.
        assert!(!asks(&[]));
        assert!(!asks(&["identity"]));
        assert!(!asks(&["br, deflate"]));
        assert!(!asks(&["gzip;q=0, identity"]));
        assert!(!asks(&["gzip;q=0.000"]));
        assert!(!asks(&["*, gzip;q=0"]), "named refusal wins over *");
        assert!(!asks(&["*;q=0"]));
        assert!(!asks(&["gzip;q=high"]), "a malformed weight is not a yes");
        assert!(!asks(&["gzipped"]));
    }

    #[test]
    fn an_answer_is_gzip_to_a_scraper_that_asks_and_text_otherwise() {
        use std::io::Read as _;
        let page = "gpu_up{gpu=\"0\"} 1\n".repeat(2000);
        let ask = |pages: &Pages, accept: Option<&str>| {
            let mut h = HeaderMap::new();
            if let Some(a) = accept {
                h.insert(
                    header::ACCEPT_ENCODING,
                    HeaderValue::from_str(a).expect("header"),
                );
            }
            let resp = pages.answer(&h, |out| {
                assert!(out.is_empty(), "rendered into an emptied buffer");
                out.push_str(&page);
            });
            let head = |k| {
                resp.headers()
                    .get(k)
                    .map(|v: &HeaderValue| v.to_str().expect("ascii").to_string())
            };
            let (encoding, vary) = (head(header::CONTENT_ENCODING), head(header::VARY));
            assert_eq!(head(header::CONTENT_TYPE).as_deref(), TEXT.to_str().ok());
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime");
            let body = rt
                .block_on(axum::body::to_bytes(resp.into_body(), usize::MAX))
                .expect("body");
            (encoding, vary, body)
        };
        let on = Pages::new(true);
        for _ in 0..3 {
            let (encoding, vary, body) = ask(&on, Some("gzip"));
            assert_eq!(encoding.as_deref(), Some("gzip"));
            assert_eq!(vary.as_deref(), Some("accept-encoding"));
            assert!(body.len() * 20 < page.len(), "{} bytes", body.len());
            let mut text = String::new();
            flate2::read::GzDecoder::new(&body[..])
                .read_to_string(&mut text)
                .expect("gzip");
            assert_eq!(text, page);
            let (encoding, vary, body) = ask(&on, Some("gzip;q=0"));
            assert_eq!((encoding, vary.as_deref()), (None, Some("accept-encoding")));
            assert_eq!(body, page.as_bytes());
        }
        let off = Pages::new(false);
        let (encoding, vary, body) = ask(&off, Some("gzip"));
        assert_eq!((encoding, vary), (None, None));
        assert_eq!(body, page.as_bytes());
    }
}
