//! The OTLP section: bytes and CPU per export beside a scrape of the same state.

use super::{CAVEAT, Measurement, Scrape};

/// The threads an OTLP metrics export runs on (`comm` prefixes): its loop, which also sends,
/// and its runtime's blocking threads (`otlp-metrics-io`, a host-name lookup).
const EXPORT_THREADS: &[&str] = &["otlp-metrics"];
/// The threads a `/metrics` scrape runs on: the Tokio runtime's.
const SCRAPE_THREADS: &[&str] = &["junction-rt"];

/// Seconds the Tokio runtime's threads ran in `m` beyond what they ran in the
/// collection-only row `base`, scaled to `m`'s window.
fn runtime_beyond(m: &Measurement, base: &Measurement) -> f64 {
    m.thread_secs(SCRAPE_THREADS)
        - base.thread_secs(SCRAPE_THREADS) * m.window.as_secs_f64() / base.window.as_secs_f64()
}

/// The OTLP table: bytes on the wire per export, per data point and per GPU, and CPU per
/// export, beside one `/metrics` scrape of the same state.
pub(super) fn report(results: &[Measurement], command: &str) -> String {
    let base = |gpus: u32| {
        results
            .iter()
            .find(|m| m.gpus == gpus && m.label.contains("collection only"))
    };
    let scraped_as = |gpus: u32, how: Scrape| {
        results.iter().find(move |m| {
            m.gpus == gpus && m.scrape == how && m.scrapes > 0 && m.label.starts_with("junction")
        })
    };
    let scraped = |gpus: u32| scraped_as(gpus, Scrape::Text);
    // CPU per scrape of a row scraped `how`: the runtime's threads (hyper and the render, and
    // gzip when asked), less what they did in the collection-only row, per scrape.
    let cpu_scrape = |gpus: u32, how: Scrape| match (scraped_as(gpus, how), base(gpus)) {
        (Some(s), Some(b)) => Some(runtime_beyond(s, b) * 1000.0 / f64::from(s.scrapes.max(1))),
        _ => None,
    };
    let mut out = String::from(
        "\n## OTLP export\n\n\
         Produced by `COMMAND` (release build). OTLP/HTTP protobuf to a counting receiver on\n\
         loopback, one export a second, not scraped. Bytes are request bodies as sent (gzip or\n\
         not); data points per export are the series of the same state on `/metrics`. CPU per\n\
         export is what the export's thread ran (`otlp-metrics`, which encodes, compresses,\n\
         sends and reads the answer on a single-threaded runtime of its own;\n\
         `/proc/PID/task/TID/schedstat`) over the minute, with what the Tokio runtime's threads\n\
         ran beyond the collection-only row's, per request; CPU per scrape is\n\
         what the Tokio runtime's threads (hyper and the render) ran in the scraped row, less what\n\
         they ran in the collection-only row, per scrape. Both come from the threads alone, so the\n\
         collection's cost, which differs from one run of the agent to the next by more than an\n\
         export costs, does not enter them. An export writes the protobuf\n\
         request straight from the model's snapshot, as `/metrics` writes its text, reading\n\
         each sample once: the data points into a buffer kept across exports, then with gzip\n\
         into the compressor a metric at a time, the headers between (flate2 over zlib-rs, level\n\
         2, one compressor reset for each export); without, the headers are put in place around\n\
         the points in that buffer, which the sender borrows. Where the instructions go\n\
         (callgrind on the running agent, the build of accbb7e, 8-GPU node, OTLP/HTTP gzip once\n\
         a second and `/metrics` asked for gzip once a second; 21 exports, 20 scrapes): an\n\
         export 5.34 M instructions on its thread, of which gzip 3.88 M (the compressor's reset\n\
         0.18 M of it), the protobuf encode 1.24 M (was 2.12 M: what the first pass finds about\n\
         each point is kept for the second, constant attributes are copied, each GPU's identity\n\
         written once an export), taking the snapshot 0.14 M, and the HTTP request and its\n\
         answer 0.05 M; a scrape asking for gzip 5.43 M on the runtime's threads. A text scrape\n\
         1.5 M (the render and its snapshot; the build of 8522e43, 10 scrapes of each\n\
         kind in 20 s), with its compressor and the page's buffer kept from one scrape to the\n\
         next (before 8522e43, tower-http's compressor, made anew for each answer, took 0.45 M\n\
         more to set up, and both kinds wrote the page into pages faulted in anew). gzip at level 2\n\
         costs what it costs on either side, two and a half text scrapes: against a scrape that asks for gzip, as Prometheus\n\
         does, an export costs about as much; against a text scrape, it cannot. Level 1 would cut\n\
         gzip by a quarter and make the body 13 % larger (10.3 bytes a point on the 8-GPU node,\n\
         over the 10 a point aimed for). The 64-GPU request's encode (`junction once --format\n\
         otlp`, callgrind): 11.06 M instructions, was 18.17 M. On the\n\
         64-GPU node gzip of the 2.38 MB request takes 1.7 ms in a warm loop on this machine,\n\
         where flate2's default miniz_oxide took 4.6 ms. Measured again on the build of 56ab316\n\
         (2026-12-07, the same callgrind runs, 21 exports and 20 scrapes): an export 5.10 M\n\
         instructions, gzip 3.67 M and the encode 1.08 M of them; a scrape asking for gzip\n\
         (the build of cd2e5f2; the render is the same) about 4.9 M, gzip 3.55 M and the render\n\
         1.10 M. The request is larger than the page (297\n\
         against 283 KB: each point's time stamp, where the text repeats the metric's name) and\n\
         gzip costs about 12.6 instructions a byte of either. An export also wakes its thread\n\
         twice (the timer, then the receiver's answer) where a scrape over a kept connection\n\
         wakes the runtime once, at 40 to 55 µs of CPU a wake-up on this virtual machine. The\n\
         two are within the runs' spread of each other: on the 8-GPU node 1.05 against 0.96 ms\n\
         an export and a gzip scrape in one run, 1.18 against 0.88 in the next, 0.98 against\n\
         0.85 in the run of 67a1fde's build (2026-12-07), 1.11 against 0.91 in b260182's, then\n\
         this table's; on the 64-GPU node 4.06 against 4.39, then 4.43 against 4.20, 4.51\n\
         against 4.09, 4.32 against 4.01.\n\n\
         The export's peak memory (2026-12-07): the 64-GPU node's RSS rose by 8.3 MiB at the first\n\
         export and fell back over the next seconds (sampled every 50 ms), where without OTLP it\n\
         did not. The data points' buffer, kept across exports, grew by doubling to the request's\n\
         2.3 MB: a dozen copies, whose freed pages jemalloc keeps until their decay. It is now\n\
         sized once, for the last request (the first: 160 bytes a sample; b260182). Peak RSS of\n\
         that node with OTLP/HTTP gzip every second, 8 s from start, six runs alternated: 27.9,\n\
         25.9, 28.1, 27.4, 28.1, 27.0 MiB before (mean 27.4), 26.3, 24.9, 24.6, 26.2, 25.0, 23.7\n\
         after (mean 25.1); in the run of 67a1fde's build, 31.8 MiB over the minute.\n\n\
         The last two columns are the whole agent's (collection and export): its CPU in percent of\n\
         one core and its peak RSS (`VmHWM`). The scrape columns come from rows of their own, not\n\
         exported: `/metrics` as text (no `Accept-Encoding`), and asking for gzip as Prometheus\n\
         does on every scrape (`/metrics` answers it at the same level 2).\n\n\
         | GPUs | compression | bytes per export | data points | bytes per point | bytes per GPU per export | CPU ms per export | `/metrics` bytes | CPU ms per scrape | `/metrics` gzip bytes | CPU ms per gzip scrape | % of one core | peak RSS (MiB) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for m in results {
        let Some((requests, bytes)) = m.otlp else {
            continue;
        };
        let per_export = bytes as f64 / requests.max(1) as f64;
        // The export's own threads, and whatever the runtime's ran beyond the collection-only
        // row's, per request; the scrape's are the runtime's (hyper and the render), less
        // what they did in the collection-only row, per scrape.
        let cpu_export = base(m.gpus).map(|b| {
            (m.thread_secs(EXPORT_THREADS) + runtime_beyond(m, b)) * 1000.0 / requests.max(1) as f64
        });
        let fmt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
        out.push_str(&format!(
            "| {} | {} | {:.0} | {} | {:.2} | {:.0} | {} | {} | {} | {} | {} | {:.2} | {:.1} |\n",
            m.gpus,
            if m.label.contains("gzip") {
                "gzip"
            } else {
                "none"
            },
            per_export,
            m.series,
            per_export / m.series.max(1) as f64,
            per_export / f64::from(m.gpus.max(1)),
            fmt(cpu_export),
            scraped(m.gpus).map_or(0, |s| s.scrape_bytes),
            fmt(cpu_scrape(m.gpus, Scrape::Text)),
            scraped_as(m.gpus, Scrape::Gzip).map_or(0, |s| s.scrape_gzip_bytes),
            fmt(cpu_scrape(m.gpus, Scrape::Gzip)),
            m.core_percent(),
            m.peak_rss_kib as f64 / 1024.0,
        ));
    }
    out.replace("COMMAND", command) + CAVEAT
}
