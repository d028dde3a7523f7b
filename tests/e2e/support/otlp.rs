//! An OTLP receiver inside the tests: the `opentelemetry-proto` gRPC services over tonic, and
//! the shared OTLP/HTTP receiver (`testkit::otlp`), with scripted behaviour (accept, down,
//! slow, UNAVAILABLE / 503 with a retry hint, 400 / INVALID_ARGUMENT) and optional TLS.

use std::io::Read;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message;
use testkit::otlp::{Answer, Request};

/// How the receiver answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// 200 / OK, and keeps what it got.
    Accept,
    /// 503 with `Retry-After` / UNAVAILABLE; keeps nothing.
    Unavailable,
    /// 400 / INVALID_ARGUMENT with this message; keeps nothing.
    Reject(String),
    /// Answers after this long; keeps nothing (the client has given up by then).
    Slow(Duration),
}

/// What the receiver got.
#[derive(Default)]
pub struct Received {
    /// Accepted metric requests.
    pub metrics: Vec<ExportMetricsServiceRequest>,
    /// Accepted log requests.
    pub logs: Vec<ExportLogsServiceRequest>,
    /// Requests of any outcome.
    pub requests: u64,
    /// Request headers / metadata of the last request (lower-case names).
    pub headers: Vec<(String, String)>,
}

#[derive(Clone)]
struct Shared {
    mode: Arc<Mutex<Mode>>,
    got: Arc<Mutex<Received>>,
}

impl Shared {
    fn mode(&self) -> Mode {
        self.mode.lock().expect("mode").clone()
    }

    fn seen(&self, headers: Vec<(String, String)>) {
        let mut g = self.got.lock().expect("got");
        g.requests += 1;
        g.headers = headers;
    }
}

/// TLS material for the receiver.
pub struct ServerTls {
    /// Server certificate chain (PEM).
    pub cert: String,
    /// Its key (PEM).
    pub key: String,
}

/// A running receiver; stopped on drop.
pub struct Receiver {
    /// gRPC address.
    pub grpc: SocketAddr,
    /// HTTP address.
    pub http: SocketAddr,
    http_sink: testkit::otlp::Sink,
    shared: Shared,
    rt: tokio::runtime::Runtime,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    tls: Option<(String, String)>,
    /// Both ports while down.
    held: Vec<Held>,
}

/// A port held while the receiver is down: each connection is accepted and closed at once,
/// so that the agent finds the receiver unreachable and no other test's server, started
/// meanwhile on a port the kernel handed out as free, receives what the agent sends.
struct Held {
    addr: SocketAddr,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Held {
    /// Holds `addr` on `rt` ([`bind`] retries while the server's own listener, stopped a
    /// moment ago, lets go).
    fn hold(rt: &tokio::runtime::Runtime, addr: SocketAddr) -> Held {
        let listener = rt
            .block_on(async { bind(addr).await.into_std() })
            .expect("the held listener");
        listener
            .set_nonblocking(false)
            .expect("a blocking listener");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            for c in listener.incoming() {
                drop(c);
                if s.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
            }
        });
        Held { addr, stop, thread }
    }

    /// Lets the port go (the listener is closed when this returns).
    fn release(self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = std::net::TcpStream::connect(self.addr);
        let _ = self.thread.join();
    }
}

impl Receiver {
    /// Starts on two free loopback ports.
    pub fn start() -> Receiver {
        Receiver::start_tls(None)
    }

    /// Starts with TLS on the gRPC port when `tls` is given.
    pub fn start_tls(tls: Option<ServerTls>) -> Receiver {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let grpc = free_addr();
        let shared = Shared {
            mode: Arc::new(Mutex::new(Mode::Accept)),
            got: Arc::new(Mutex::new(Received::default())),
        };
        let sh = shared.clone();
        let http_sink = testkit::otlp::Sink::start_with(Some(Arc::new(move |req: &Request| {
            http_request(&sh, req)
        })))
        .expect("OTLP/HTTP receiver");
        let http = SocketAddr::from(([127, 0, 0, 1], http_sink.port));
        let mut r = Receiver {
            grpc,
            http,
            http_sink,
            shared,
            rt,
            tasks: Vec::new(),
            tls: tls.map(|t| (t.cert, t.key)),
            held: Vec::new(),
        };
        r.serve_grpc();
        r
    }

    /// Serves again on the same ports (after [`Receiver::down`]).
    pub fn up(&mut self) {
        for h in self.held.drain(..) {
            h.release();
        }
        self.http_sink.up();
        self.serve_grpc();
    }

    fn serve_grpc(&mut self) {
        let shared = self.shared.clone();
        let grpc = self.grpc;
        let tls = self.tls.clone();
        let g = self.rt.spawn(async move {
            let mut server = tonic::transport::Server::builder();
            if let Some((cert, key)) = tls {
                server = server
                    .tls_config(
                        tonic::transport::ServerTlsConfig::new()
                            .identity(tonic::transport::Identity::from_pem(cert, key)),
                    )
                    .expect("tls config");
            }
            let listener = bind(grpc).await;
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            let _ = server
                .add_service(
                    MetricsServiceServer::new(Grpc(shared.clone()))
                        .accept_compressed(tonic::codec::CompressionEncoding::Gzip),
                )
                .add_service(
                    LogsServiceServer::new(Grpc(shared.clone()))
                        .accept_compressed(tonic::codec::CompressionEncoding::Gzip),
                )
                .serve_with_incoming(incoming)
                .await;
        });
        self.tasks = vec![g];
        // Let the listeners come up.
        std::thread::sleep(Duration::from_millis(100));
    }

    /// Stops serving (the receiver is unreachable): its ports stay held, each connection
    /// closed at once, so that no other server takes them meanwhile.
    pub fn down(&mut self) {
        self.http_sink.down();
        for t in self.tasks.drain(..) {
            t.abort();
        }
        self.held = vec![
            Held::hold(&self.rt, self.http),
            Held::hold(&self.rt, self.grpc),
        ];
    }

    /// Changes how it answers.
    pub fn set_mode(&self, m: Mode) {
        *self.shared.mode.lock().expect("mode") = m;
    }

    /// Reads what it got.
    pub fn with<T>(&self, f: impl FnOnce(&Received) -> T) -> T {
        f(&self.shared.got.lock().expect("got"))
    }

    /// Waits until `ok` holds (panics after `limit`).
    pub fn wait_for(&self, limit: Duration, what: &str, ok: impl Fn(&Received) -> bool) {
        let start = Instant::now();
        while !self.with(&ok) {
            assert!(
                start.elapsed() < limit,
                "receiver: {what} not within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The gRPC endpoint URL.
    pub fn grpc_url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.grpc)
    }

    /// The HTTP base URL.
    pub fn http_url(&self) -> String {
        format!("http://{}", self.http)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        for h in self.held.drain(..) {
            h.release();
        }
    }
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
}

async fn bind(addr: SocketAddr) -> tokio::net::TcpListener {
    // The port was free a moment ago (or was ours before `down`): retry briefly.
    for _ in 0..50 {
        if let Ok(l) = tokio::net::TcpListener::bind(addr).await {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("cannot bind {addr}");
}

struct Grpc(Shared);

fn metadata_headers(m: &tonic::metadata::MetadataMap) -> Vec<(String, String)> {
    m.iter()
        .filter_map(|kv| match kv {
            tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                Some((k.to_string(), v.to_str().unwrap_or_default().to_string()))
            }
            tonic::metadata::KeyAndValueRef::Binary(..) => None,
        })
        .collect()
}

impl Grpc {
    async fn answer(&self) -> Result<(), tonic::Status> {
        match self.0.mode() {
            Mode::Accept => Ok(()),
            Mode::Unavailable => Err(tonic::Status::unavailable("receiver is restarting")),
            Mode::Reject(m) => Err(tonic::Status::invalid_argument(m)),
            Mode::Slow(d) => {
                tokio::time::sleep(d).await;
                Err(tonic::Status::deadline_exceeded("too late"))
            }
        }
    }
}

#[tonic::async_trait]
impl MetricsService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.0.seen(metadata_headers(request.metadata()));
        self.answer().await?;
        self.0
            .got
            .lock()
            .expect("got")
            .metrics
            .push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl LogsService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        self.0.seen(metadata_headers(request.metadata()));
        self.answer().await?;
        self.0
            .got
            .lock()
            .expect("got")
            .logs
            .push(request.into_inner());
        Ok(tonic::Response::new(ExportLogsServiceResponse::default()))
    }
}

/// An OTLP/HTTP request: the scripted answer, and what an accepted one carried.
fn http_request(shared: &Shared, req: &Request) -> Answer {
    shared.seen(req.headers.clone());
    match shared.mode() {
        Mode::Accept => {}
        Mode::Unavailable => {
            return Answer {
                headers: vec![("retry-after", "1".into())],
                body: "restarting".into(),
                ..Answer::status(503)
            };
        }
        Mode::Reject(m) => {
            return Answer {
                body: m,
                ..Answer::status(400)
            };
        }
        Mode::Slow(d) => {
            return Answer {
                delay: Some(d),
                body: "too late".into(),
                ..Answer::status(504)
            };
        }
    }
    let raw = if req.gzip {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(req.body.as_slice())
            .read_to_end(&mut out)
            .expect("gzip body");
        out
    } else {
        req.body.clone()
    };
    let mut got = shared.got.lock().expect("got");
    match req.path.as_str() {
        "/v1/metrics" => got
            .metrics
            .push(ExportMetricsServiceRequest::decode(raw.as_slice()).expect("protobuf body")),
        "/v1/logs" => got
            .logs
            .push(ExportLogsServiceRequest::decode(raw.as_slice()).expect("protobuf body")),
        _ => return Answer::status(404),
    }
    Answer::ok()
}

/// A string attribute value.
pub fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(any_value::Value::StringValue(s)) => Some(s.as_str()),
            _ => None,
        }
    })
}

/// An integer attribute value.
pub fn attr_int(attrs: &[KeyValue], key: &str) -> Option<i64> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(any_value::Value::IntValue(i)) => Some(*i),
            _ => None,
        }
    })
}

/// The body of a log record as text.
pub fn body(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        _ => String::new(),
    }
}

/// A test CA and a server certificate for 127.0.0.1 / localhost signed by it.
pub struct TestCa {
    /// The CA certificate (PEM).
    pub ca: String,
    /// The server's certificate and key.
    pub server: ServerTls,
}

/// Makes a CA and a server certificate.
pub fn test_ca() -> TestCa {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "junction test CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("ca cert");
    let key = KeyPair::generate().expect("server key");
    let params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .expect("params");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let cert = params.signed_by(&key, &issuer).expect("server cert");
    TestCa {
        ca: ca_cert.pem(),
        server: ServerTls {
            cert: cert.pem(),
            key: key.serialize_pem(),
        },
    }
}

/// Every log record named `event`, as its attributes (strings and integers as text) and its
/// body (under `body`).
pub fn records(r: &Received, event: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    r.logs
        .iter()
        .flat_map(|l| &l.resource_logs)
        .flat_map(|rl| &rl.scope_logs)
        .flat_map(|sl| &sl.log_records)
        .filter(|lr| lr.event_name == event)
        .map(|lr| {
            let mut a: std::collections::BTreeMap<String, String> = lr
                .attributes
                .iter()
                .filter_map(|kv| {
                    let one = std::slice::from_ref(kv);
                    let v = attr(one, &kv.key)
                        .map(str::to_string)
                        .or_else(|| attr_int(one, &kv.key).map(|i| i.to_string()))?;
                    Some((kv.key.clone(), v))
                })
                .collect();
            a.insert("body".into(), body(&lr.body));
            a
        })
        .collect()
}
