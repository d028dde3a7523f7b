//! Misbehaving BMCs: one that accepts connections and answers late or never.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A connection's accept time and, once the client closed it, when that was seen.
type Interval = (Instant, Option<Instant>);

/// A BMC that accepts connections and answers after `delay` (never, with `None`); counts
/// connections and the most open at once.
pub struct BadBmc {
    pub port: u16,
    /// One per connection.
    intervals: Arc<Mutex<Vec<Interval>>>,
    stop: Arc<AtomicBool>,
}

impl BadBmc {
    pub fn start(delay: Option<Duration>) -> BadBmc {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let intervals = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (iv, s) = (intervals.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Ok((mut stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let started = Instant::now();
                let index = {
                    let mut v = iv.lock().expect("intervals");
                    v.push((started, None));
                    v.len() - 1
                };
                let (iv, s) = (iv.clone(), s.clone());
                std::thread::spawn(move || {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(Duration::from_millis(20)));
                    let mut buf = [0u8; 4096];
                    let mut answered = false;
                    // Until the client closes the connection (or the test ends).
                    while !s.load(Ordering::Relaxed) {
                        if let Ok(0) = stream.read(&mut buf) {
                            break;
                        }
                        if let Some(d) = delay
                            && !answered
                            && started.elapsed() >= d
                        {
                            let body = br#"{"@odata.id": "/redfish/v1", "Name": "slow"}"#;
                            let _ = write!(
                                stream,
                                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                                body.len()
                            );
                            let _ = stream.write_all(body);
                            answered = true;
                        }
                    }
                    iv.lock().expect("intervals")[index].1 = Some(Instant::now());
                });
            }
        });
        BadBmc {
            port,
            intervals,
            stop,
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.intervals.lock().expect("intervals").len()
    }

    /// The most connections open at one moment. The server sees a close some time after the
    /// client closed (a read timeout, a thread not yet scheduled on a busy machine), so each
    /// connection counts as open until `grace` before the close was seen: a poll that started
    /// right after its predecessor timed out is not an overlap, a poll started while another
    /// was still waiting (for up to its timeout) is.
    pub fn max_open(&self, grace: Duration) -> usize {
        let now = Instant::now();
        let v = self.intervals.lock().expect("intervals").clone();
        (0..v.len())
            .map(|i| {
                let t = v[i].0;
                1 + (0..v.len())
                    .filter(|&j| j != i)
                    .filter(|&j| {
                        let (a, b) = v[j];
                        let end = b.unwrap_or(now + grace);
                        a <= t && end.checked_sub(grace).is_some_and(|e| e > t)
                    })
                    .count()
            })
            .max()
            .unwrap_or(0)
    }
}

impl Drop for BadBmc {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
