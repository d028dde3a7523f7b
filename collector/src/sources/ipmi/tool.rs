//! Running FreeIPMI's `ipmi-sensors`: its private directory (the config with the password,
//! the SDR cache), its arguments, and one run under the hard timeout.

use std::os::unix::ffi::OsStringExt as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;
use std::time::Duration;

use super::{Error, IpmiTarget};

/// A private directory for the tool's config (with the password) and SDR cache.
pub(super) struct Workdir {
    dir: PathBuf,
    config: PathBuf,
    cache: PathBuf,
}

impl Workdir {
    pub(super) fn new(t: &IpmiTarget, password: Option<&str>) -> Result<Self, String> {
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
pub(super) async fn run_tool(t: &IpmiTarget, w: &Workdir, recreate: bool) -> Result<String, Error> {
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
