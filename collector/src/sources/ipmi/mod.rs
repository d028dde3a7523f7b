//! The IPMI source: board and cooling sensors (temperatures, fans and pumps, coolant flow,
//! discrete leak sensors) with their thresholds and state, read through FreeIPMI's
//! `ipmi-sensors` — remotely over RMCP+ (lanplus) or in-band through `/dev/ipmi0` when no
//! host is given (the normal case for an agent on the host itself).
//!
//! Why FreeIPMI and not a native client: it is what prometheus' ipmi_exporter runs, it copes
//! with real BMCs' quirks (partial SDR reads, reservations, OEM workarounds via
//! `workaround_flags`), and it caches the SDR per target. The password goes to the tool in a
//! config file readable only by Junction, never on its command line; each run has a hard
//! timeout after which the tool is killed; one run per target at a time.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::agent::{Component as AgentComponent, Ctx};
use crate::config::{Config, Invalid, config_section};
use crate::model::Model;
use crate::model::bmc::{Component, Level, Poll, Quantity, Reading, Scope};
use crate::sources::polled::{self, PollError};

config_section! {
    /// `[[sources.ipmi.targets]]`: one BMC.
    pub struct IpmiTarget {
        /// Name of the target (`junction.target`); default: the host, or "local".
        pub name: String = String::new(),
        /// BMC address for IPMI over LAN; "" reads the local BMC through /dev/ipmi0.
        pub host: String = String::new(),
        /// UDP port of the BMC.
        pub port: u32 = 623,
        /// Account name (a USER-level account is enough to read sensors).
        pub username: String = String::new(),
        /// File holding the password (first line).
        pub password_file: String = String::new(),
        /// Environment variable holding the password (instead of password_file).
        pub password_env: String = String::new(),
        /// Privilege level to ask for: "user", "operator" or "admin".
        pub privilege: String = "user".into(),
        /// "lan_2_0" (RMCP+, lanplus) or "lan" (IPMI 1.5).
        pub driver: String = "lan_2_0".into(),
        /// FreeIPMI workaround flags for BMCs that need them (e.g. "opensesspriv").
        pub workaround_flags: String = String::new(),
        /// Hard limit on one read, seconds: past it the tool is killed.
        pub timeout_secs: u64 = 20,
        /// Seconds between reads.
        pub interval_secs: u64 = 30,
        /// The `ipmi-sensors` program (FreeIPMI, Debian package freeipmi-tools).
        pub tool: String = "ipmi-sensors".into(),
    }
}

config_section! {
    /// `[sources.ipmi]`
    pub struct IpmiConfig {
        /// The targets read (none by default).
        pub targets: Vec<IpmiTarget> = Vec::new(),
    }
}

impl IpmiTarget {
    /// The name used in metrics.
    pub fn display_name(&self) -> String {
        if !self.name.is_empty() {
            self.name.clone()
        } else if self.host.is_empty() {
            "local".into()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl IpmiConfig {
    /// Adds every problem with this section to `out`.
    pub fn validate(&self, prefix: &str, out: &mut Vec<Invalid>) {
        let mut names = std::collections::BTreeSet::new();
        for (i, t) in self.targets.iter().enumerate() {
            let key = |k: &str| format!("{prefix}.targets[{i}].{k}");
            if !matches!(t.privilege.as_str(), "user" | "operator" | "admin") {
                out.push(Invalid {
                    key: key("privilege"),
                    message: format!("{:?}: use \"user\", \"operator\" or \"admin\"", t.privilege),
                });
            }
            if !matches!(t.driver.as_str(), "lan_2_0" | "lan") {
                out.push(Invalid {
                    key: key("driver"),
                    message: format!("{:?}: use \"lan_2_0\" (lanplus) or \"lan\"", t.driver),
                });
            }
            if t.port == 0 || t.port > 65535 {
                out.push(Invalid {
                    key: key("port"),
                    message: format!("{} is not a port", t.port),
                });
            }
            crate::config::check_target(
                &key,
                t.display_name(),
                &t.password_file,
                (t.timeout_secs, t.interval_secs),
                &mut names,
                out,
            );
        }
    }
}

/// The IPMI source.
pub const COMPONENT: AgentComponent = AgentComponent {
    name: "ipmi",
    enabled: |c| !c.sources.ipmi.targets.is_empty(),
    start: |c, ctx| Box::pin(start(c, ctx)),
    once: Some(|c, model| Box::pin(once(c, model))),
    inspect: None,
    derive: None,
    off_but_asked: None,
};

/// Why a read failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The tool ran past the timeout and was killed.
    #[error("no answer within {0} s (ipmi-sensors killed)")]
    Timeout(u64),
    /// The tool is missing.
    #[error("cannot run {0:?}: {1} (install FreeIPMI: apt-get install freeipmi-tools)")]
    Tool(String, String),
    /// The BMC refused the credentials.
    #[error("authentication failed: {0} (check username, password and privilege)")]
    Auth(String),
    /// Anything else the tool said.
    #[error("{0}")]
    Failed(String),
}

impl Error {
    fn kind(&self) -> &'static str {
        match self {
            Error::Timeout(_) => "timeout",
            Error::Tool(..) => "tool",
            Error::Auth(_) => "auth",
            Error::Failed(_) => "protocol",
        }
    }
}

/// A private directory for the tool's config (with the password) and SDR cache.
struct Workdir {
    dir: PathBuf,
    config: PathBuf,
    cache: PathBuf,
}

use std::os::unix::ffi::OsStringExt as _;

impl Workdir {
    fn new(t: &IpmiTarget, password: Option<&str>) -> Result<Self, String> {
        let safe: String = t
            .display_name()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        // A new directory of an unpredictable name, made by mkdtemp(3) (mode 0700, never one
        // that exists): another local user can neither guess it nor plant a link there, and
        // the password written into it stays ours.
        let template = std::env::temp_dir().join(format!("junction-ipmi-{safe}-XXXXXX"));
        let mut raw = std::ffi::CString::new(template.as_os_str().as_encoded_bytes())
            .map_err(|e| format!("{}: {e}", template.display()))?
            .into_bytes_with_nul();
        // SAFETY: `raw` is a writable NUL-terminated template ending in XXXXXX, as mkdtemp
        // requires; it rewrites the Xs in place.
        let made = unsafe { libc::mkdtemp(raw.as_mut_ptr().cast()) };
        if made.is_null() {
            return Err(format!(
                "{}: {}",
                template.display(),
                std::io::Error::last_os_error()
            ));
        }
        raw.pop();
        let dir = PathBuf::from(std::ffi::OsString::from_vec(raw));
        let cache = dir.join("sdr-cache");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&cache)
            .map_err(|e| format!("{}: {e}", cache.display()))?;
        let config = dir.join("freeipmi.conf");
        let mut text = String::new();
        if !t.username.is_empty() {
            text.push_str(&format!("username {}\n", t.username));
        }
        if let Some(p) = password {
            text.push_str(&format!("password {p}\n"));
        }
        use std::io::Write as _;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&config)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| format!("{}: {e}", config.display()))?;
        Ok(Self { dir, config, cache })
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn args(t: &IpmiTarget, w: &Workdir, recreate: bool) -> Vec<String> {
    let mut a = Vec::new();
    if !t.host.is_empty() {
        a.push(format!("--hostname={}:{}", t.host, t.port));
        a.push(format!(
            "--driver-type={}",
            if t.driver == "lan" { "LAN" } else { "LAN_2_0" }
        ));
        a.push(format!(
            "--privilege-level={}",
            t.privilege.to_ascii_uppercase()
        ));
    }
    a.push(format!("--config-file={}", w.config.display()));
    if !t.workaround_flags.is_empty() {
        a.push(format!("--workaround-flags={}", t.workaround_flags));
    }
    a.push(format!("--sdr-cache-directory={}", w.cache.display()));
    a.push("--quiet-cache".into());
    if recreate {
        a.push("--sdr-cache-recreate".into());
    }
    for f in [
        "--comma-separated-output",
        "--no-header-output",
        "--output-sensor-state",
        "--output-sensor-thresholds",
    ] {
        a.push(f.into());
    }
    a
}

/// The tool's path: as given, or found on PATH, or in the sbin directories FreeIPMI installs
/// to (not on every service's PATH).
fn tool_path(tool: &str) -> PathBuf {
    if tool.contains('/') {
        return PathBuf::from(tool);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(tool))
}

/// Runs the tool once under the timeout; the whole process group is killed past it.
async fn run_tool(t: &IpmiTarget, w: &Workdir, recreate: bool) -> Result<String, Error> {
    let mut cmd = tokio::process::Command::new(tool_path(&t.tool));
    cmd.args(args(t, w, recreate))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    let child = cmd
        .spawn()
        .map_err(|e| Error::Tool(t.tool.clone(), e.to_string()))?;
    let pid = child.id();
    let limit = Duration::from_secs(t.timeout_secs.max(1));
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(Ok(out)) => {
            let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
            if !out.status.success() {
                let lower = stderr.to_ascii_lowercase();
                if lower.contains("password")
                    || lower.contains("username")
                    || lower.contains("privilege")
                {
                    return Err(Error::Auth(stderr));
                }
                return Err(Error::Failed(if stderr.is_empty() {
                    format!("ipmi-sensors exited with {}", out.status)
                } else {
                    stderr
                }));
            }
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        }
        Ok(Err(e)) => Err(Error::Tool(t.tool.clone(), e.to_string())),
        Err(_) => {
            if let Some(pid) = pid {
                // SAFETY: kill(2) on the process group this child leads.
                unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
            }
            Err(Error::Timeout(t.timeout_secs))
        }
    }
}

fn threshold_names() -> [&'static str; 6] {
    [
        "lower_fatal",
        "lower_critical",
        "lower_caution",
        "upper_caution",
        "upper_critical",
        "upper_fatal",
    ]
}

/// One line of `ipmi-sensors --comma-separated-output --output-sensor-state
/// --output-sensor-thresholds`: `ID,Name,Type,State,Reading,Units,Lower NR,Lower C,Lower NC,
/// Upper NC,Upper C,Upper NR,Event`.
pub fn parse_line(target: &str, line: &str) -> Option<Reading> {
    let fields: Vec<&str> = line.split(',').collect();
    if fields.len() < 13 {
        return None;
    }
    // A name with commas: everything between the id and the last eleven fields.
    let n = fields.len();
    let name = fields[1..n - 11].join(",");
    let rest = &fields[n - 11..];
    let (ty, state, reading, units, event) = (rest[0], rest[1], rest[2], rest[3], rest[10]);
    let mut level = match state {
        "Nominal" => Some(Level::Ok),
        "Warning" => Some(Level::Warning),
        "Critical" => Some(Level::Critical),
        _ => None,
    };
    let value: Option<f64> = reading.parse().ok().filter(|v: &f64| v.is_finite());
    let lname = name.to_ascii_lowercase();
    let (quantity, factor) = if lname.contains("leak") && value.is_none() {
        // A generic digital discrete leak sensor FreeIPMI has no interpretation for: its
        // asserted state is the leak.
        if level.is_none() {
            if event.contains("'State Asserted'") {
                level = Some(Level::Critical);
            } else if event.contains("'State Deasserted'") {
                level = Some(Level::Ok);
            }
        }
        (Quantity::Leak, 1.0)
    } else {
        match units {
            "C" | "degrees C" => (Quantity::Temperature, 1.0),
            "RPM" if lname.contains("pump") => (Quantity::PumpRpm, 1.0),
            "RPM" => (Quantity::FanRpm, 1.0),
            "L per minute" | "liters per minute" => (Quantity::Flow, 1.0),
            "W" | "Watts" => (Quantity::Power, 1.0),
            "V" | "Volts" => (Quantity::Voltage, 1.0),
            "kPa" => (Quantity::Pressure, 1.0),
            _ => (Quantity::Other, 1.0),
        }
    };
    let thresholds = threshold_names()
        .into_iter()
        .zip(&rest[4..10])
        .filter_map(|(n, v)| v.parse::<f64>().ok().map(|x| (n, x * factor)))
        .collect();
    let value = match quantity {
        Quantity::Leak => match level {
            Some(Level::Ok) => 0.0,
            Some(Level::Warning) => 1.0,
            Some(Level::Critical) => 2.0,
            None => 3.0,
        },
        _ => value.map_or(f64::NAN, |v| v * factor),
    };
    let (location, scope) = ipmi_context(&lname, ty);
    Some(Reading {
        id: format!("{target}:sensor/{}", name.trim()),
        hw_type: if quantity == Quantity::Other {
            crate::model::bmc::snake(&ty.replace(' ', ""))
        } else {
            quantity.sensor_type().to_string()
        },
        name: name.trim().to_string(),
        parent: Some(target.to_string()),
        quantity,
        value,
        unit: units.to_string(),
        location,
        point: None,
        thresholds,
        state: if quantity == Quantity::Leak {
            None
        } else {
            level
        },
        scope: if quantity == Quantity::Power {
            scope
        } else {
            Scope::Auto
        },
    })
}

/// What an IPMI sensor is about, from its name (lower case) and SDR sensor type: the SDR
/// carries an entity ID, which `ipmi-sensors` does not print, so the names BMC vendors give
/// decide: `hw.sensor_location` (cpu, memory, gpu, power_supply, fan, liquid_inlet,
/// liquid_outlet, intake) and, for a
/// power sensor, whether it is the host's total (`Pwr Consumption`, `Total Power`, `System
/// Power`, `Avg Power`) or a supply's output.
fn ipmi_context(lname: &str, ty: &str) -> (Option<String>, Scope) {
    let words: Vec<&str> = lname
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let has = |w: &str| words.contains(&w);
    let starts = |p: &str| words.iter().any(|x| x.starts_with(p));
    let supply = ty == "Power Supply"
        || has("psu")
        || has("ps")
        || lname.contains("power supply")
        || words.iter().any(|w| {
            w.strip_prefix("psu")
                .or_else(|| w.strip_prefix("ps"))
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        });
    let location = if supply {
        Some("power_supply")
    } else if starts("cpu") || has("proc") || has("processor") || has("soc") {
        Some("cpu")
    } else if starts("gpu") {
        Some("gpu")
    } else if has("mem") || has("memory") || starts("dimm") {
        Some("memory")
    } else if starts("fan") {
        Some("fan")
    } else if has("coolant") || has("liquid") || has("water") {
        if has("inlet") || has("supply") {
            Some("liquid_inlet")
        } else if has("outlet") || has("return") {
            Some("liquid_outlet")
        } else {
            None
        }
    } else if has("inlet") || has("ambient") || has("intake") {
        Some("intake")
    } else {
        None
    };
    let scope = if supply {
        if has("out") || has("output") {
            Scope::SupplyOutput
        } else {
            Scope::Auto
        }
    } else if location.is_none()
        && (has("total")
            || has("system")
            || has("sys")
            || has("consumption")
            || has("node")
            || has("avg")
            || words == ["power"])
    {
        Scope::Host
    } else {
        Scope::Auto
    };
    (location.map(str::to_string), scope)
}

/// One read: the tool under the timeout (again with a fresh SDR cache if the cache is stale).
async fn read(t: &IpmiTarget, w: &Workdir, requests: &mut u64) -> Result<Poll, Error> {
    *requests += 1;
    let out = match run_tool(t, w, false).await {
        Err(Error::Failed(m)) if m.to_ascii_lowercase().contains("cache") => {
            *requests += 1;
            run_tool(t, w, true).await?
        }
        r => r?,
    };
    let target = t.display_name();
    let readings: Vec<Reading> = out.lines().filter_map(|l| parse_line(&target, l)).collect();
    Ok(Poll {
        target: target.clone(),
        components: vec![Component {
            id: target.clone(),
            hw_type: "bmc".into(),
            name: if t.host.is_empty() {
                "local BMC (in-band)".into()
            } else {
                t.host.clone()
            },
            parent: None,
            model: None,
            serial: None,
            health: None,
        }],
        readings,
        notes: Vec::new(),
        // A BMC on IPMI is the host's own.
        host: Some(target.clone()),
    })
}

/// An IPMI target being read.
pub struct Ipmi {
    cfg: IpmiTarget,
    workdir: Workdir,
    requests: AtomicU64,
}

impl polled::Target for Ipmi {
    const SOURCE: &'static str = "ipmi";
    type Config = IpmiTarget;

    fn open(t: &IpmiTarget) -> Result<Self, String> {
        if t.host.is_empty() && !Path::new("/dev/ipmi0").exists() {
            return Err("no /dev/ipmi0 for in-band IPMI: load the drivers (modprobe ipmi_devintf ipmi_si), or give host".into());
        }
        let password = polled::read_secret(&t.password_file, &t.password_env)?;
        Ok(Self {
            cfg: t.clone(),
            workdir: Workdir::new(t, password.as_deref())?,
            requests: AtomicU64::new(0),
        })
    }

    fn name_of(t: &IpmiTarget) -> String {
        t.display_name()
    }

    fn interval(&self) -> Duration {
        Duration::from_secs(self.cfg.interval_secs.max(1))
    }

    /// The tool is killed past `timeout_secs` itself, and may run twice (a stale SDR cache):
    /// the outer bound leaves it room to.
    fn timeout(&self) -> Duration {
        Duration::from_secs(self.cfg.timeout_secs.max(1) * 2 + 5)
    }

    fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    async fn poll(&self, _model: &Arc<Model>) -> Result<Poll, PollError> {
        let mut n = 0;
        let r = read(&self.cfg, &self.workdir, &mut n).await;
        self.requests.fetch_add(n, Ordering::Relaxed);
        r.map_err(|e| PollError {
            kind: e.kind(),
            message: e.to_string(),
        })
    }
}

async fn start(config: Arc<Config>, ctx: Ctx) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let targets = config.sources.ipmi.targets.clone();
    tracing::info!(targets = targets.len(), "reading IPMI targets");
    Ok(polled::start::<Ipmi>(targets, &ctx.model, &ctx.shutdown))
}

async fn once(config: Arc<Config>, model: Arc<Model>) -> anyhow::Result<()> {
    polled::once::<Ipmi>(config.sources.ipmi.targets.clone(), model).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipmi_sensors_lines() {
        let r = parse_line(
            "bmc",
            "2,GPU1 Temp,Temperature,Critical,95.00,C,N/A,N/A,N/A,80.00,90.00,100.00,0018h",
        )
        .expect("parsed");
        assert_eq!(r.quantity, Quantity::Temperature);
        assert_eq!(r.value, 95.0);
        assert_eq!(r.state, Some(Level::Critical));
        assert_eq!(
            r.thresholds,
            vec![
                ("upper_caution", 80.0),
                ("upper_critical", 90.0),
                ("upper_fatal", 100.0)
            ]
        );
        let f = parse_line("bmc", "5,Coolant Flow,Other Units Based Sensor,Nominal,42.00,L per minute,N/A,N/A,N/A,N/A,N/A,N/A,0000h").expect("flow");
        assert_eq!((f.quantity, f.value), (Quantity::Flow, 42.0));
        let p = parse_line(
            "bmc",
            "4,Pump1 Tach,Fan,Nominal,3000.00,RPM,N/A,N/A,N/A,N/A,N/A,N/A,0000h",
        )
        .expect("pump");
        assert_eq!(p.quantity, Quantity::PumpRpm);
        let l = parse_line(
            "bmc",
            "9,Leak Sensor, Cold Plate,OEM Reserved,Critical,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,0002h",
        )
        .expect("leak");
        assert_eq!(
            (l.quantity, l.value, l.name.as_str()),
            (Quantity::Leak, 2.0, "Leak Sensor, Cold Plate")
        );
        let dry = parse_line(
            "bmc",
            "6,Leak Manifold,Cooling Device,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,'State Deasserted'",
        )
        .expect("dry");
        assert_eq!(dry.value, 0.0);
        let wet = parse_line(
            "bmc",
            "6,Leak Manifold,Cooling Device,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,'State Asserted'",
        )
        .expect("wet");
        assert_eq!(wet.value, 2.0);
        assert!(parse_line("bmc", "garbage").is_none());
    }
}
