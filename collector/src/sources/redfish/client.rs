//! A Redfish client for one target: rustls (verification on unless `insecure`), basic auth or
//! one session (created once, reused, re-created on 401, deleted at shutdown), a bound on
//! requests in flight, every request counted. Credentials never reach a log.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use tokio::sync::Semaphore;

use super::RedfishTarget;

/// Why a request failed, by what an operator does about it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// No answer in time.
    #[error("timed out")]
    Timeout,
    /// Credentials refused.
    #[error(
        "authentication failed (HTTP {0}): check username and the password file for this target"
    )]
    Auth(u16),
    /// The certificate was not trusted.
    #[error("TLS: {0} (give the BMC's CA in ca_file, or set insecure = true to skip verification)")]
    Tls(String),
    /// Could not connect.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// An HTTP error status.
    #[error("HTTP {0} for {1}")]
    Status(u16, String),
    /// Not JSON, or not the expected shape.
    #[error("bad answer from {0}: {1}")]
    Protocol(String, String),
}

impl Error {
    /// The `error.type` of `junction.target.poll.failures`.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Timeout => "timeout",
            Error::Auth(_) => "auth",
            Error::Tls(_) => "tls",
            Error::Connect(_) => "connect",
            Error::Status(..) => "http",
            Error::Protocol(..) => "protocol",
        }
    }
}

fn classify(e: &reqwest::Error) -> Error {
    if e.is_timeout() {
        return Error::Timeout;
    }
    // The chain says whether TLS refused the certificate.
    let mut chain = String::new();
    let mut src: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = src {
        chain.push_str(&s.to_string());
        chain.push_str(": ");
        src = s.source();
    }
    let lower = chain.to_ascii_lowercase();
    if lower.contains("certificate") || lower.contains("unknownissuer") || lower.contains("tls") {
        let why = chain
            .split(": ")
            .filter(|p| !p.is_empty())
            .last()
            .unwrap_or("certificate not trusted")
            .to_string();
        return Error::Tls(why);
    }
    Error::Connect(
        chain
            .trim_end_matches(": ")
            .rsplit(": ")
            .next()
            .unwrap_or("")
            .to_string(),
    )
}

enum Auth {
    None,
    Basic {
        user: String,
        password: String,
    },
    Session {
        user: String,
        password: String,
        /// (X-Auth-Token, the session's URI).
        session: Mutex<Option<(String, Option<String>)>>,
        /// Held while a session is created, so that requests that fail together create one
        /// session, not one each: a BMC has few session slots (Supermicro documents 16 at
        /// most, redfish-ref-guide "Using Restful APIs"), and sessions left behind hold them
        /// until they time out.
        login: tokio::sync::Mutex<()>,
    },
}

/// A response larger than this is not read (a whole `$expand`ed chassis is a few MiB).
pub const MAX_RESPONSE: usize = 16 << 20;
/// Members read of one collection, at most.
pub const MAX_MEMBERS: usize = 1024;
/// Redirects followed, at most, and only on the target's own origin.
const MAX_REDIRECTS: usize = 5;

/// Whether two URLs share an origin (scheme, host and port).
fn same_origin(a: &reqwest::Url, b: &reqwest::Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// The client. Every request and every credential stays on the target's origin: links
/// (`@odata.id`, `Location`) and redirects elsewhere are not followed.
pub struct Client {
    http: reqwest::Client,
    base: reqwest::Url,
    auth: Auth,
    limit: Semaphore,
    requests: AtomicU64,
    /// Whether `$expand` failed once on this target (then it is not tried again).
    pub expand_failed: AtomicBool,
}

impl Client {
    /// Builds the client (reads the CA file; the password was read by the caller).
    pub fn new(t: &RedfishTarget, password: Option<String>) -> Result<Self, String> {
        let base = reqwest::Url::parse(&t.url)
            .map_err(|e| format!("url {:?}: {e}", crate::redact::url(&t.url)))?;
        let timeout = Duration::from_secs(t.timeout_secs.max(1));
        let mut b = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .tls_backend_rustls()
            .pool_max_idle_per_host(t.max_concurrent_requests.max(1) as usize)
            .redirect(reqwest::redirect::Policy::custom(|attempt| {
                let first = attempt.previous().first().cloned();
                if attempt.previous().len() > MAX_REDIRECTS
                    || first.is_none_or(|f| !same_origin(&f, attempt.url()))
                {
                    attempt.stop()
                } else {
                    attempt.follow()
                }
            }))
            .user_agent(concat!("junction/", env!("CARGO_PKG_VERSION")));
        if !t.ca_file.is_empty() {
            let pem =
                std::fs::read(&t.ca_file).map_err(|e| format!("ca_file {:?}: {e}", t.ca_file))?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("ca_file {:?}: not PEM certificates: {e}", t.ca_file))?
            {
                b = b.add_root_certificate(cert);
            }
        }
        if t.insecure {
            b = b.tls_danger_accept_invalid_certs(true);
        }
        let http = b.build().map_err(|e| e.to_string())?;
        let auth = match (t.username.is_empty(), password, t.auth.as_str()) {
            (true, _, _) => Auth::None,
            (false, p, "session") => Auth::Session {
                user: t.username.clone(),
                password: p.unwrap_or_default(),
                session: Mutex::new(None),
                login: tokio::sync::Mutex::new(()),
            },
            (false, p, _) => Auth::Basic {
                user: t.username.clone(),
                password: p.unwrap_or_default(),
            },
        };
        Ok(Self {
            http,
            base,
            auth,
            limit: Semaphore::new(t.max_concurrent_requests.max(1) as usize),
            requests: AtomicU64::new(0),
            expand_failed: AtomicBool::new(false),
        })
    }

    /// Requests made so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// A link the BMC gave, resolved against the target: only on the target's origin (a BMC
    /// must not be able to send Junction's credentials to another host).
    fn url(&self, path: &str) -> Result<reqwest::Url, Error> {
        let url = self
            .base
            .join(path)
            .map_err(|e| Error::Protocol(crate::redact::url(path), e.to_string()))?;
        if !same_origin(&url, &self.base) {
            return Err(Error::Protocol(
                crate::redact::url(path),
                "a link to another host, port or scheme than the target's; not followed".into(),
            ));
        }
        Ok(url)
    }

    fn session_token(&self) -> Option<String> {
        match &self.auth {
            Auth::Session { session, .. } => {
                crate::model::lock(session).as_ref().map(|(t, _)| t.clone())
            }
            _ => None,
        }
    }

    /// Creates a session unless one exists that is not `stale` (the token a request was
    /// refused with): of the requests refused together, the first creates the session and
    /// the others use it.
    async fn login(&self, stale: Option<&str>) -> Result<(), Error> {
        let Auth::Session {
            user,
            password,
            session,
            login,
        } = &self.auth
        else {
            return Ok(());
        };
        let _one = login.lock().await;
        if let Some(current) = self.session_token()
            && Some(current.as_str()) != stale
        {
            return Ok(());
        }
        let url = self.url("/redfish/v1/SessionService/Sessions")?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        let resp = self
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(serde_json::json!({ "UserName": user, "Password": password }).to_string())
            .send()
            .await
            .map_err(|e| classify(&e))?;
        let status = resp.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(Error::Auth(status.as_u16()));
        }
        let token = resp
            .headers()
            .get("X-Auth-Token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let Some(token) = token.filter(|_| status.is_success()) else {
            return Err(Error::Status(
                status.as_u16(),
                "SessionService/Sessions (no X-Auth-Token)".into(),
            ));
        };
        *crate::model::lock(session) = Some((token, location));
        Ok(())
    }

    /// Deletes the session, if one was created.
    pub async fn logout(&self) {
        let Auth::Session { session, .. } = &self.auth else {
            return;
        };
        let Some((token, Some(location))) = crate::model::lock(session).take() else {
            return;
        };
        if let Ok(url) = self.url(&location) {
            self.requests.fetch_add(1, Ordering::Relaxed);
            let _ = self
                .http
                .delete(url)
                .header("X-Auth-Token", token)
                .timeout(Duration::from_secs(2))
                .send()
                .await;
        }
    }

    /// GETs a resource as JSON. A 401 with a session re-creates it and tries once more.
    pub async fn get(&self, path: &str) -> Result<Value, Error> {
        let _permit = self.limit.acquire().await.map_err(|_| Error::Timeout)?;
        if matches!(self.auth, Auth::Session { .. }) && self.session_token().is_none() {
            self.login(None).await?;
        }
        for attempt in 0..2 {
            let url = self.url(path)?;
            let mut req = self.http.get(url).header("Accept", "application/json");
            let token = self.session_token();
            match &self.auth {
                Auth::None => {}
                Auth::Basic { user, password } => req = req.basic_auth(user, Some(password)),
                Auth::Session { .. } => {
                    if let Some(t) = &token {
                        req = req.header("X-Auth-Token", t);
                    }
                }
            }
            self.requests.fetch_add(1, Ordering::Relaxed);
            let resp = req.send().await.map_err(|e| classify(&e))?;
            let status = resp.status();
            if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                if attempt == 0 && matches!(self.auth, Auth::Session { .. }) {
                    self.login(token.as_deref()).await?;
                    continue;
                }
                return Err(Error::Auth(status.as_u16()));
            }
            if status.is_redirection() {
                return Err(Error::Protocol(
                    path.to_string(),
                    "redirected to another host, port or scheme (or too often); not followed"
                        .into(),
                ));
            }
            if !status.is_success() {
                return Err(Error::Status(status.as_u16(), path.to_string()));
            }
            let too_big = || {
                Error::Protocol(
                    path.to_string(),
                    format!("the answer is over {} MiB; not read", MAX_RESPONSE >> 20),
                )
            };
            if resp
                .content_length()
                .is_some_and(|n| n > MAX_RESPONSE as u64)
            {
                return Err(too_big());
            }
            let mut resp = resp;
            let mut bytes = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| classify(&e))? {
                if bytes.len() + chunk.len() > MAX_RESPONSE {
                    return Err(too_big());
                }
                bytes.extend_from_slice(&chunk);
            }
            return serde_json::from_slice(&bytes)
                .map_err(|e| Error::Protocol(path.to_string(), format!("not JSON: {e}")));
        }
        Err(Error::Auth(401))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A loopback HTTP server answering every request with `answer(path)`; counts requests
    /// and those that carried credentials.
    async fn server(answer: fn(&str, u16) -> String) -> (u16, Arc<AtomicU64>, Arc<AtomicU64>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        let (seen, creds) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (s2, c2) = (seen.clone(), creds.clone());
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                let mut buf = vec![0u8; 8192];
                let n = c.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).to_string();
                s2.fetch_add(1, Ordering::SeqCst);
                let lower = req.to_ascii_lowercase();
                if lower.contains("authorization:") || lower.contains("x-auth-token:") {
                    c2.fetch_add(1, Ordering::SeqCst);
                }
                let path = req.split(' ').nth(1).unwrap_or("/").to_string();
                let _ = c.write_all(answer(&path, port).as_bytes()).await;
            }
        });
        (port, seen, creds)
    }

    /// A BMC whose links and redirects point at another loopback server: that server never
    /// sees a request (let alone one with credentials); an answer over the cap is not read.
    #[test]
    fn links_and_redirects_stay_on_the_targets_origin() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let (other, seen, _) = server(|_, _| {
                "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}".into()
            })
            .await;
            static OTHER: AtomicU64 = AtomicU64::new(0);
            OTHER.store(u64::from(other), Ordering::SeqCst);
            let (bmc, _, creds) = server(|path, _| {
                let other = OTHER.load(Ordering::SeqCst);
                match path {
                    "/redfish/v1/redirect" => format!(
                        "HTTP/1.1 302 Found\r\nlocation: http://127.0.0.1:{other}/steal\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    ),
                    "/redfish/v1/big" => "HTTP/1.1 200 OK\r\ncontent-length: 20000000\r\nconnection: close\r\n\r\n{".into(),
                    _ => "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}".into(),
                }
            })
            .await;
            let t = RedfishTarget {
                url: format!("http://127.0.0.1:{bmc}"),
                username: "admin".into(),
                timeout_secs: 5,
                ..Default::default()
            };
            let _ = rustls::crypto::ring::default_provider().install_default();
            let c = Client::new(&t, Some("secret".into())).expect("client");
            assert!(c.get("/redfish/v1").await.is_ok());
            assert_eq!(creds.load(Ordering::SeqCst), 1, "the target itself gets them");
            for link in [
                format!("http://127.0.0.1:{other}/steal"),
                format!("//127.0.0.1:{other}/steal"),
                format!("https://127.0.0.1:{bmc}/redfish/v1"),
                "/redfish/v1/redirect".to_string(),
            ] {
                let e = c.get(&link).await.expect_err(&link);
                assert!(matches!(e, Error::Protocol(..)), "{link}: {e}");
            }
            assert_eq!(seen.load(Ordering::SeqCst), 0, "the other server saw nothing");
            let e = c.get("/redfish/v1/big").await.expect_err("too big");
            assert!(e.to_string().contains("MiB"), "{e}");
        });
    }
}
