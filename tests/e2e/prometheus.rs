//! Junction's `/metrics` as Prometheus' own tools read it: `promtool check metrics` on the live
//! endpoint, a real Prometheus scraping and querying it, and gzip to a scraper that asks.

use std::time::Duration;

use crate::support::{self, Agent, parse};

/// `promtool check metrics` on the live endpoint reports nothing.
#[test]
fn promtool_finds_nothing() {
    let Some(promtool) = support::require_tool("promtool", None) else {
        return;
    };
    let mut agent = Agent::start("h100-training.toml", "current");
    let body = agent.wait_for(Duration::from_secs(20), |m| {
        m.contains("gpu_sm_activity_ratio")
    });
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("promtool output");
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && findings.trim().is_empty(),
        "promtool findings:\n{findings}"
    );
}

/// A real Prometheus server scrapes the endpoint and answers a query with the scenario's
/// value: the exposition is accepted end to end, not only by `promtool`.
#[test]
fn prometheus_scrapes_and_queries() {
    let agent = Agent::start("h100-training.toml", "current");
    let Some(prom) = support::prometheus::Prometheus::start(agent.port, None) else {
        return;
    };
    let start = std::time::Instant::now();
    let result = loop {
        let r = prom
            .result("sum(hw_gpu_utilization_ratio{hw_gpu_task=\"general\"})")
            .expect("query");
        if let Some(value) = r[0]["value"][1].as_str() {
            break value.parse::<f64>().expect("number");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "prometheus never ingested junction's series"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    // Eight GPUs at 97 % each.
    assert!(
        (result - 8.0 * 0.97).abs() < 1e-9,
        "sum of GPU utilization: {result}"
    );
}

/// `/metrics` with `Accept-Encoding` as a scraper sends it: the page as gzip, with its
/// `Content-Encoding` and `Vary`, to a peer that asks (Prometheus does, on every scrape); as
/// text otherwise, to a peer that refuses gzip (`q=0`), and with `sinks.prometheus.gzip =
/// false`. The gzip page is the same series.
#[test]
fn metrics_come_gzipped_to_a_scraper_that_asks() {
    use std::io::Read as _;
    let mut agent = Agent::start("h100-training.toml", "current");
    let get_from = |port: u16, accept: Option<&str>| {
        let client: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        let mut req = client.get(&format!("http://127.0.0.1:{port}/metrics"));
        if let Some(a) = accept {
            req = req.header("Accept-Encoding", a);
        }
        let mut resp = req.call().expect("scrape");
        let header = |k: &str| {
            resp.headers()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_ascii_lowercase()
        };
        let (encoding, vary) = (header("content-encoding"), header("vary"));
        let body = resp.body_mut().read_to_vec().expect("body");
        (encoding, vary, body)
    };
    let get = |accept: Option<&str>| get_from(agent.port, accept);
    // The series of a page: names and labels (values move between scrapes).
    let keys = |text: &str| {
        let mut k: Vec<String> = parse(text)
            .iter()
            .map(|s| format!("{}{:?}", s.name, s.labels))
            .collect();
        k.sort();
        k
    };
    let (encoding, _, plain) = get(None);
    assert_eq!(encoding, "", "no encoding asked, none given");
    let plain = String::from_utf8(plain).expect("text");
    let (encoding, vary, gz) = get(Some("gzip, deflate"));
    assert_eq!(encoding, "gzip");
    assert!(vary.contains("accept-encoding"), "Vary: {vary}");
    let mut text = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut text)
        .expect("a gzip body");
    assert!(
        gz.len() * 5 < text.len(),
        "{} bytes compressed to {}",
        text.len(),
        gz.len()
    );
    assert_eq!(keys(&text), keys(&plain), "the same series, gzip or not");
    let (encoding, _, refused) = get(Some("gzip;q=0, identity"));
    assert_eq!(encoding, "", "gzip refused, text given");
    assert!(
        String::from_utf8(refused)
            .expect("text")
            .contains("gpu_info{")
    );
    assert!(agent.terminate().success(), "{}", agent.log());
    // Turned off: text to every scraper.
    let port = support::free_port();
    let config = support::sim_config("current", port, "")
        .replace("[sinks.prometheus]\n", "[sinks.prometheus]\ngzip = false\n");
    let mut plain = Agent::spawn_config("h100-training.toml", &config);
    plain.wait_for(Duration::from_secs(30), |m| m.contains("gpu_info{"));
    let (encoding, _, body) = get_from(port, Some("gzip"));
    assert_eq!(encoding, "", "gzip off, text given");
    assert!(String::from_utf8(body).expect("text").contains("gpu_info{"));
    assert!(plain.terminate().success(), "{}", plain.log());
}
