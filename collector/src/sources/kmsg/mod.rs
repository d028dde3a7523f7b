//! The kernel-log source: NVIDIA XID and NVSwitch SXid errors from `/dev/kmsg` and/or from
//! kernel-log files (kern.log, syslog, `journalctl -k -f` output), each mapped to its GPU by
//! PCI address, counted per (GPU, XID), recorded as an event with the process and NVIDIA's
//! recommended action, and fed into the GPU's health.
//!
//! Needs: read access to `/dev/kmsg` (root, or CAP_SYSLOG where `kernel.dmesg_restrict` is
//! set) and/or to the files. How it fails: an input that cannot be opened is logged once
//! with the reason and the fix; the others go on. Only the kernel speaks: `/dev/kmsg`
//! records of any facility but the kernel's, and file lines without the kernel's syslog tag
//! (`kernel:`; see [`parser::file_line`] for the formats), are ignored and counted
//! (`junction_kmsg_ignored_total`) unless `accept_user_records`; the driver's text must start
//! the kernel message. Overwritten records are counted (`junction_kmsg_lost_total`). The
//! checkpoint and counters live in `state_dir`, saved with each record's count as one step.

mod crash;
mod device;
mod files;
mod input;
pub mod parser;
pub mod record;
pub mod signatures;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::agent::{Component, Ctx, Kept};
use crate::config::{Config, Invalid, config_section};
use crate::model::Model;
use crate::model::xid::Via;
use crate::shutdown::Shutdown;
pub use input::{Input, Stats};
use parser::{Parsed, Parser};

config_section! {
    /// `[sources.kmsg]`
    pub struct KmsgConfig {
        /// Read the kernel log for XID and SXid errors. Default: true.
        pub enabled: bool = true,
        /// The kernel's log device; "" to read only `files`. Default: "/dev/kmsg".
        pub device: String = "/dev/kmsg".into(),
        /// Kernel-log files to follow too (e.g. "/var/log/kern.log"), for hosts whose
        /// kernel messages land in files; rotation is followed and the read position is
        /// kept across restarts. Each file once (a second name of a listed file is refused).
        /// Not the fabric manager's log: `sources.host` reads that. Default: [].
        pub files: Vec<String> = Vec::new(),
        /// Accept records written from user space: /dev/kmsg records of a facility other
        /// than the kernel's, and file lines without the kernel's `kernel:` syslog tag
        /// (`dmesg` output, `logger` lines). Anyone who can write such a record or line
        /// could forge an XID. Tests and the demo set it. Default: false.
        pub accept_user_records: bool = false,
        /// Where the kernel leaves crash records of earlier boots, read once at start for
        /// their panics (`kernel_panic`, in the history under the boot that crashed):
        /// pstore, systemd-pstore's archive, kdump's dumps. In a container, mount them
        /// read-only at the same paths. [] to read none.
        pub crash_dirs: Vec<String> = vec![
            "/sys/fs/pstore".into(),
            "/var/lib/systemd/pstore".into(),
            "/var/crash".into(),
        ],
    }
}

impl KmsgConfig {
    /// Adds every problem with this section to `out`.
    pub fn validate(&self, prefix: &str, out: &mut Vec<Invalid>) {
        if !self.enabled {
            return;
        }
        // A device that is absent here (an unprivileged container) is not a configuration
        // error: the source says so at start and the others run.
        if !self.device.is_empty() && !std::path::Path::new(&self.device).is_absolute() {
            out.push(Invalid {
                key: format!("{prefix}.device"),
                message: format!(
                    "{:?} is not an absolute path; use \"/dev/kmsg\", or \"\" to read only files",
                    self.device
                ),
            });
        }
        for (i, d) in self.crash_dirs.iter().enumerate() {
            if !d.starts_with('/') {
                out.push(Invalid {
                    key: format!("{prefix}.crash_dirs"),
                    message: format!(
                        "entry {i} ({d:?}): give an absolute path (\"/sys/fs/pstore\", \"/var/crash\")"
                    ),
                });
            }
        }
        for (i, f) in self.files.iter().enumerate() {
            let parent = std::path::Path::new(f).parent();
            if !f.starts_with('/') || parent.is_none_or(|p| !p.is_dir()) {
                out.push(Invalid {
                    key: format!("{prefix}.files"),
                    message: format!(
                        "entry {i} ({f:?}): give an absolute path in an existing directory"
                    ),
                });
            }
        }
        // One file listed twice would be followed twice, from two saved positions, and each
        // of its XIDs counted twice: the same path however spelt (`//`, `/./`), or two names
        // of one file that exists now (a link).
        let inode = |f: &str| {
            use std::os::unix::fs::MetadataExt as _;
            std::fs::metadata(f).ok().map(|m| (m.dev(), m.ino()))
        };
        for (j, f) in self.files.iter().enumerate() {
            let same = self.files[..j].iter().position(|g| {
                std::path::Path::new(g) == std::path::Path::new(f)
                    || inode(g).is_some_and(|id| inode(f) == Some(id))
            });
            if let Some(i) = same {
                out.push(Invalid {
                    key: format!("{prefix}.files"),
                    message: format!(
                        "entry {j} ({f:?}) is the same file as entry {i} ({:?}): list it once \
                         (each entry is followed on its own, and would count the file's XIDs again)",
                        self.files[i]
                    ),
                });
            }
        }
    }
}

/// The kernel-log source.
pub const COMPONENT: Component = Component {
    name: "kmsg",
    enabled: |c| {
        c.sources.kmsg.enabled
            && (!c.sources.kmsg.device.is_empty() || !c.sources.kmsg.files.is_empty())
    },
    start: |c, ctx| Box::pin(start(c, ctx)),
    once: None,
    inspect: Some(|c, model| {
        Box::pin(async move { model.set_source_detail("kmsg", describe(&c.sources.kmsg)) })
    }),
    derive: None,
    off_but_asked: None,
};

/// What `junction inventory` shows about the source: each input and whether it can be read
/// now (the source itself follows them only under `junction run`).
fn describe(c: &KmsgConfig) -> Vec<String> {
    let mut lines = Vec::new();
    if !c.device.is_empty() {
        lines.push(match std::fs::File::open(&c.device) {
            Ok(_) => format!("device {}: readable", c.device),
            Err(e) => format!(
                "device {}: cannot open ({e}); run as root (CAP_SYSLOG) with the host's /dev/kmsg",
                c.device
            ),
        });
    }
    for f in &c.files {
        lines.push(match std::fs::File::open(f) {
            Ok(_) => format!("file {f}: readable"),
            Err(e) => format!("file {f}: cannot open ({e}); followed once it appears"),
        });
    }
    for d in &c.crash_dirs {
        if std::path::Path::new(d).is_dir() {
            lines.push(format!("crash records {d}: present"));
        }
    }
    lines
}

/// XIDs are mapped to GPUs by PCI address: reading waits (at most NVML's own start-up
/// deadline) until NVML has listed the GPUs, so that the log read from boot is attributed to
/// GPU UUIDs rather than to bare PCI addresses. False if shutdown came first.
fn wait_for_gpus(config: &Config, model: &Model, shutdown: &Shutdown) -> bool {
    if config.sources.nvml.enabled {
        let limit = Duration::from_secs(config.sources.nvml.init_timeout_secs.max(1));
        match model.wait_inventory_unless(limit, shutdown) {
            None => return false,
            Some(false) => tracing::warn!(
                "NVML has not listed the GPUs yet; reading the kernel log anyway (XIDs of unlisted GPUs are counted by PCI address)"
            ),
            Some(true) => {}
        }
    }
    true
}

/// The kernel log's descriptor while a reader holds it, left here for the next start by a
/// reader whose run ended before the agent's shutdown (a panic, its own or a sibling's; the
/// next start reads on from the record after the one it was at).
static DEVICE: Mutex<Option<std::fs::File>> = Mutex::new(None);

async fn start(config: Arc<Config>, ctx: Ctx) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let c = config.sources.kmsg.clone();
    let stats = Arc::new(Stats::default());
    let mut up = false;
    // A panic on one of the source's threads panics its task: reported down, started again.
    let mut threads = crate::agent::SourceThreads::new(&ctx.shutdown);
    if !c.device.is_empty() {
        // Opened again only where no earlier start left it: after the capability drop, a
        // start that follows a panic could not open it (CAP_SYSLOG).
        let opened = match Kept::left(&DEVICE) {
            Some(file) => Ok(file),
            None => device::open(std::path::Path::new(&c.device)),
        };
        match opened {
            Ok(file) => {
                up = true;
                let input = Input::new(Via::Kmsg, c.accept_user_records, stats.clone());
                let (model, shutdown, cfg) =
                    (ctx.model.clone(), threads.stop().clone(), config.clone());
                let mut file = Kept::new(&DEVICE, file, &ctx.shutdown);
                threads.spawn("kmsg", move || {
                    if wait_for_gpus(&cfg, &model, &shutdown) {
                        crate::privileges::wait_gate();
                        device::run(&mut file, &input, &model, &shutdown);
                    }
                })?;
                tracing::info!(device = %c.device, "reading the kernel log");
            }
            Err(e) => tracing::error!(
                device = %c.device,
                error = %e,
                "cannot open the kernel log: run as root, or grant CAP_SYSLOG (kernel.dmesg_restrict is set); in a container, mount the host's /dev/kmsg (or run privileged); or set sources.kmsg.device = \"\"; XIDs are not read from it"
            ),
        }
    }
    // Files are read with blocking I/O: on a thread (and a small runtime for the inotify
    // notifications) of their own, off the shared async workers.
    if !c.files.is_empty() {
        up = true;
        let input = Input::new(Via::File, c.accept_user_records, stats.clone());
        let (model, shutdown, cfg, files) = (
            ctx.model.clone(),
            threads.stop().clone(),
            config.clone(),
            c.files.clone(),
        );
        threads.spawn("kmsg-files", move || {
            if !wait_for_gpus(&cfg, &model, &shutdown) {
                return;
            }
            crate::privileges::wait_gate();
            // The files' reads (tokio's file I/O) go to the blocking pool: a thread or two,
            // named for the reader, that stay between appends.
            let mut builder = tokio::runtime::Builder::new_current_thread();
            builder.thread_name("kmsg-files-io");
            match crate::agent::bound_blocking_pool(&mut builder, 2)
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(files::run(files, input, model, shutdown)),
                Err(e) => tracing::error!(error = %e, "cannot start the kernel-log file reader"),
            }
        })?;
    }
    // The panics of earlier boots: once, off the async workers.
    if !c.crash_dirs.is_empty() {
        let (model, dirs) = (ctx.model.clone(), c.crash_dirs.clone());
        threads.spawn("kmsg-crash", move || {
            crate::privileges::wait_gate();
            crash::scan(&dirs, &model);
        })?;
    }
    ctx.model.set_source_up("kmsg", up);
    Ok(tokio::spawn(async move {
        threads.watch(&ctx.shutdown).await;
        ctx.model.flush_xids(true);
    }))
}

/// Parses every line of `file` `rounds` times on one thread; returns
/// `lines=N relevant=M secs=S lines_per_sec=R` for the benchmark.
pub fn parse_bench(file: &std::path::Path, rounds: u32) -> std::io::Result<String> {
    let text = std::fs::read_to_string(file)?;
    let lines: Vec<&str> = text.lines().collect();
    let mut relevant = 0u64;
    let start = Instant::now();
    for _ in 0..rounds {
        let mut p = Parser::default();
        for l in &lines {
            if !matches!(p.line(l), Parsed::Other) {
                relevant += 1;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let n = lines.len() as u64 * u64::from(rounds);
    Ok(format!(
        "lines={n} relevant={relevant} secs={secs:.4} lines_per_sec={:.0}",
        n as f64 / secs
    ))
}

/// Entry points for the fuzz targets (`fuzz/`): outside input through the same code the
/// source runs.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// Every line of `text` as a followed file's line would be read.
    pub fn feed_file_text(model: &Model, text: &str, accept_user_records: bool) {
        let input = Input::new(Via::File, accept_user_records, Arc::new(Stats::default()));
        let mut p = Parser::default();
        for line in text.split('\n') {
            input.file_line(&mut p, line, SystemTime::now(), model);
        }
    }

    /// One `/dev/kmsg` record as the device reader takes it.
    pub fn feed_record(model: &Model, bytes: &[u8], accept_user_records: bool) {
        let input = Input::new(Via::Kmsg, accept_user_records, Arc::new(Stats::default()));
        if let Some(rec) = record::parse(bytes) {
            input.record(&mut Parser::default(), &rec, SystemTime::now(), model);
        }
    }

    pub use super::files::follow_chunks;
}
