//! A real Prometheus (Debian's) for a test: scraping one target every second, with rules or
//! without, and its HTTP query API.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// A running Prometheus; killed on drop.
pub struct Prometheus {
    child: Child,
    /// Its web port.
    pub port: u16,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Scrapes `127.0.0.1:target_port` every second (`None` where the test skips: no
    /// Prometheus and not in CI), evaluating `rules` if given.
    pub fn start(target_port: u16, rules: Option<&Path>) -> Option<Prometheus> {
        let bin = super::require_tool("prometheus", None)?;
        let dir = super::temp_dir();
        let port = super::free_port();
        let rule_files = match rules {
            Some(r) => {
                std::fs::copy(r, dir.join("rules.yml")).expect("rules");
                "rule_files: [rules.yml]\n"
            }
            None => "",
        };
        std::fs::write(
            dir.join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n{rule_files}scrape_configs:\n  - job_name: junction\n    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
            ),
        )
        .expect("config");
        let child = Command::new(bin)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).expect("log"))
            .spawn()
            .expect("start prometheus");
        Some(Prometheus { child, port })
    }

    /// An instant query's `data.result` (an error: what Prometheus said). While Prometheus
    /// starts (it answers 503 until its storage is ready, or refuses connections), the query
    /// is tried again, for up to 30 s.
    pub fn result(&self, expr: &str) -> Result<Value, String> {
        let url = format!("http://127.0.0.1:{}/api/v1/query", self.port);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let body = loop {
            match ureq::get(&url).query("query", expr).call() {
                Ok(mut r) => break r.body_mut().read_to_string().map_err(|e| e.to_string())?,
                Err(ureq::Error::StatusCode(503) | ureq::Error::Io(_))
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                Err(e) => return Err(e.to_string()),
            }
        };
        let v: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        if v["status"] != "success" {
            return Err(body);
        }
        Ok(v["data"]["result"].clone())
    }
}

/// Runs an instant query; the number of series it returns.
pub fn query(prom: &Prometheus, expr: &str) -> Result<usize, String> {
    Ok(match prom.result(expr)? {
        Value::Array(a) => a.len(),
        Value::Null => 0,
        _ => 1,
    })
}
