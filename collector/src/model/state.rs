//! The state directory: the little that survives a restart (the kernel-log checkpoint, the
//! XID counters, health reasons that hold until a reset or reboot), one JSON file per owner,
//! written atomically (a temporary file, fsync, rename). A missing, unwritable or corrupt
//! directory is a warning and a clean start, never a crash.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The state directory (or none, when it cannot be used).
#[derive(Debug, Default)]
pub struct StateDir {
    dir: Option<PathBuf>,
}

impl StateDir {
    /// Opens (creating it if needed) the directory; warns and keeps no state if it cannot.
    pub fn open(dir: &Path) -> Self {
        let usable = std::fs::create_dir_all(dir).and_then(|()| {
            let probe = dir.join(".junction-write-test");
            std::fs::write(&probe, b"")?;
            std::fs::remove_file(&probe)
        });
        match usable {
            Ok(()) => Self {
                dir: Some(dir.to_path_buf()),
            },
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "state directory is not writable (state_dir): starting clean, and a restart will start clean again (XID counters restart at 0, the kernel log is read again from boot)");
                Self::default()
            }
        }
    }

    /// The directory, if usable.
    pub fn path(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Reads `<name>.json`; `None` if absent, unusable or corrupt (corrupt: warned).
    pub fn load<T: DeserializeOwned>(&self, name: &str) -> Option<T> {
        let path = self.dir.as_ref()?.join(format!("{name}.json"));
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "cannot read saved state; starting clean");
                return None;
            }
        };
        match serde_json::from_slice(&bytes) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "saved state is corrupt; starting clean (it will be rewritten)");
                None
            }
        }
    }

    /// Writes `<name>.json` atomically; an error names the file (the caller reports it
    /// through `internal_events`).
    pub fn store<T: Serialize>(
        &self,
        name: &str,
        value: &T,
    ) -> Result<(), (PathBuf, std::io::Error)> {
        let Some(dir) = &self.dir else { return Ok(()) };
        let path = dir.join(format!("{name}.json"));
        let result = serde_json::to_vec(value)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                write_atomically(&path, |f| {
                    use std::io::Write;
                    f.write_all(&bytes)
                })
            });
        result.map_err(|e| (path, e))
    }

    /// Removes `<name>.json` (nothing to do if it is absent); an error names the file.
    pub fn remove(&self, name: &str) -> Result<(), (PathBuf, std::io::Error)> {
        let Some(dir) = &self.dir else { return Ok(()) };
        let path = dir.join(format!("{name}.json"));
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err((path, e)),
            _ => Ok(()),
        }
    }
}

/// Replaces `path` in one step: `write` fills a temporary file beside it, which is synced and
/// renamed over `path`, and the directory synced (the rename is durable once the directory
/// is). On an error the temporary file is removed and `path` is as it was.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| -> std::io::Result<()> {
        {
            let mut f = std::fs::File::create(&tmp)?;
            write(&mut f)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// When this boot began (Unix ns): `btime` in `/proc/stat` (whole seconds), under `proc_root`
/// or else the process's own; `None` if neither has it.
pub fn boot_time_ns(proc_root: &Path) -> Option<u64> {
    let btime = |text: String| {
        text.lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    std::fs::read_to_string(proc_root.join("stat"))
        .ok()
        .and_then(btime)
        .or_else(|| std::fs::read_to_string("/proc/stat").ok().and_then(btime))
        .filter(|&s| s > 0)
        .map(|s| s.saturating_mul(1_000_000_000))
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`), empty if unreadable.
pub fn boot_id(proc_root: &Path) -> String {
    std::fs::read_to_string(proc_root.join("sys/kernel/random/boot_id"))
        .or_else(|_| std::fs::read_to_string("/proc/sys/kernel/random/boot_id"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("junction-state-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// `btime` under `proc_root`, in ns; the host's `/proc/stat` where `proc_root` has none.
    #[test]
    fn boot_time_is_read_from_proc_stat() {
        let d = dir("btime");
        std::fs::create_dir_all(&d).expect("dir");
        std::fs::write(
            d.join("stat"),
            "cpu  1 2 3\nintr 5\nbtime 1764547200\nprocesses 9\n",
        )
        .expect("stat");
        assert_eq!(boot_time_ns(&d), Some(1_764_547_200_000_000_000));
        std::fs::write(d.join("stat"), "cpu  1 2 3\nbtime x\n").expect("stat");
        assert_eq!(boot_time_ns(&d), boot_time_ns(Path::new("/proc")));
        assert!(boot_time_ns(Path::new("/proc")).is_some_and(|ns| ns > 0));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn round_trip_and_corrupt_files_start_clean() {
        let d = dir("rt");
        let s = StateDir::open(&d);
        assert_eq!(s.load::<Vec<u32>>("x"), None);
        s.store("x", &vec![1u32, 2, 3]).expect("stored");
        assert_eq!(s.load::<Vec<u32>>("x"), Some(vec![1, 2, 3]));
        std::fs::write(d.join("x.json"), b"{not json").expect("write");
        assert_eq!(s.load::<Vec<u32>>("x"), None);
        let leftovers: Vec<_> = std::fs::read_dir(&d)
            .expect("dir")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn an_unusable_directory_keeps_no_state() {
        let f = dir("file");
        std::fs::write(&f, b"a file, not a directory").expect("write");
        let s = StateDir::open(&f);
        assert!(s.path().is_none());
        let _ = s.store("x", &1u32);
        assert_eq!(s.load::<u32>("x"), None);
        let _ = std::fs::remove_file(&f);
    }
}
