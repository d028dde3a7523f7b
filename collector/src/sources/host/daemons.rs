//! The NVIDIA daemons among the host's processes, found by reading `proc_root`.
//!
//! Who can write it: any process may name itself `nv-fabricmanager` (`prctl(PR_SET_NAME)`),
//! so a daemon counts only when its process runs as root and its executable (or, where the
//! link cannot be read, its `argv[0]`) has the daemon's name; a tenant's process cannot make
//! a stopped fabric manager look alive.
//!
//! What a poll costs: one directory read, and one small read (`comm`) of each process that is
//! not a kernel thread. Kernel threads, which on a many-core GPU node are most of `/proc` (a
//! few per CPU), are told by their `stat` (`PF_KTHREAD`, a child of `kthreadd`) at two polls,
//! then known by their pid and `/proc` inode without being opened: a kernel thread that runs
//! past one poll never becomes another program, and a new process under a pid gets a new
//! inode. Two polls, because one kind of task looks like a kernel thread for its first moments
//! and then does `exec` a program: an asynchronous usermode helper on kernels that start it
//! with `kernel_thread(…, CLONE_PARENT)` from a kworker (`kernel/umh.c`, before
//! `user_mode_thread`), which has the kworker's `PF_KTHREAD` and kthreadd for its parent until
//! `exec` clears the flag.

use std::collections::{BTreeMap, HashMap};
use std::io::Read as _;
use std::os::unix::fs::DirEntryExt as _;
use std::path::{Path, PathBuf};

use super::DAEMONS;
use crate::model::processes::basename;

/// Processes looked at per poll (and so the most remembered).
pub const MAX_PROCESSES: usize = 65_536;

/// `PF_KTHREAD`, in the flags of `/proc/PID/stat` (`include/linux/sched.h`).
const PF_KTHREAD: u64 = 0x0020_0000;

/// `kthreadd`'s pid: every kernel thread but the idle tasks is its child.
const KTHREADD: u32 = 2;

/// What a process was found to be, by pid and `/proc` inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A kernel thread at two polls: never a daemon, never opened again.
    Kernel,
    /// A kernel thread at one poll: read again at the next.
    NewKernel,
    /// Any other: its name is read at every poll (it may `exec` a daemon).
    User,
}

/// The processes seen by the last scan, and a path buffer kept between scans.
#[derive(Debug, Default)]
pub struct Scan {
    /// By (pid, inode of `/proc/PID`): what it is, and the scan that last saw it.
    seen: HashMap<(u32, u64), (Kind, u64), foldhash::fast::FixedState>,
    scan: u64,
    path: PathBuf,
    /// Files opened by the last scan (for the tests).
    #[cfg(test)]
    pub opened: usize,
}

impl Scan {
    /// The lowest pid of each daemon running under `proc`.
    pub fn daemons(&mut self, proc: &Path) -> BTreeMap<&'static str, u32> {
        let mut running: BTreeMap<&'static str, u32> = BTreeMap::new();
        self.scan += 1;
        #[cfg(test)]
        {
            self.opened = 0;
        }
        if let Ok(dir) = std::fs::read_dir(proc) {
            for e in dir.flatten().take(MAX_PROCESSES) {
                let name = e.file_name();
                let Some(pid) = name
                    .to_str()
                    .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|n| n.parse::<u32>().ok().map(|p| (n, p)))
                else {
                    continue;
                };
                let key = (pid.1, e.ino());
                let prior = match self.seen.get_mut(&key) {
                    Some((kind, at)) => {
                        *at = self.scan;
                        Some(*kind)
                    }
                    None => None,
                };
                let comm = match prior {
                    Some(Kind::Kernel) => continue,
                    Some(Kind::User) => self.comm(proc, pid.0),
                    Some(Kind::NewKernel) | None => match self.stat(proc, pid.0, pid.1) {
                        Some((kernel, comm)) => {
                            let kind = match (kernel, prior) {
                                (true, Some(Kind::NewKernel)) => Kind::Kernel,
                                (true, _) => Kind::NewKernel,
                                (false, _) => Kind::User,
                            };
                            self.seen.insert(key, (kind, self.scan));
                            if kernel {
                                continue;
                            }
                            Some(comm)
                        }
                        None => None,
                    },
                };
                let Some(name) = comm.and_then(|c| daemon_named(c.as_str())) else {
                    continue;
                };
                if is_daemon(proc, pid.0, name) {
                    let lowest = running.entry(name).or_insert(pid.1);
                    *lowest = (*lowest).min(pid.1);
                }
            }
        }
        let scan = self.scan;
        self.seen.retain(|_, (_, at)| *at == scan);
        running
    }

    /// Sets the path buffer to `proc/pid/file`.
    fn at(&mut self, proc: &Path, pid: &str, file: &str) -> &Path {
        self.path.as_mut_os_string().clear();
        self.path.push(proc);
        self.path.push(pid);
        self.path.push(file);
        &self.path
    }

    /// The process's name, from `comm`.
    fn comm(&mut self, proc: &Path, pid: &str) -> Option<Comm> {
        #[cfg(test)]
        {
            self.opened += 1;
        }
        let mut buf = [0u8; 64];
        let text = read_small(self.at(proc, pid, "comm"), &mut buf)?;
        Some(Comm::new(text.strip_suffix(b"\n").unwrap_or(text)))
    }

    /// Whether the process `pid` (`name` under `proc`) is a kernel thread now, and its name,
    /// from `stat`.
    fn stat(&mut self, proc: &Path, name: &str, pid: u32) -> Option<(bool, Comm)> {
        #[cfg(test)]
        {
            self.opened += 1;
        }
        let mut buf = [0u8; 1024];
        let text = read_small(self.at(proc, name, "stat"), &mut buf)?;
        // `pid (comm) state ppid pgrp session tty_nr tpgid flags …`; the name may hold
        // spaces and parentheses, so it ends at the last ')'.
        let open = text.iter().position(|b| *b == b'(')?;
        let close = text.iter().rposition(|b| *b == b')')?;
        let comm = Comm::new(text.get(open + 1..close)?);
        let rest = std::str::from_utf8(text.get(close + 1..)?).ok()?;
        let mut fields = rest.split_ascii_whitespace();
        let ppid: u32 = fields.nth(1)?.parse().ok()?;
        let flags: u64 = fields.nth(4)?.parse().ok()?;
        let kernel = flags & PF_KTHREAD != 0 && (pid == KTHREADD || ppid == KTHREADD);
        Some((kernel, comm))
    }
}

/// A process name as the kernel keeps it (at most 15 bytes, `TASK_COMM_LEN`), on the stack.
struct Comm {
    bytes: [u8; 16],
    len: usize,
}

impl Comm {
    fn new(b: &[u8]) -> Self {
        let len = b.len().min(16);
        let mut bytes = [0u8; 16];
        bytes[..len].copy_from_slice(&b[..len]);
        Self { bytes, len }
    }

    fn as_str(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The daemon whose name the kernel would keep as `comm`, if any.
fn daemon_named(comm: &[u8]) -> Option<&'static str> {
    DAEMONS
        .iter()
        .find(|d| d.as_bytes().get(..d.len().min(15)) == Some(comm))
        .copied()
}

/// A procfs file of at most `buf`'s size: one read gives all of `comm` and `stat` (the
/// kernel writes them whole; the text ends with a newline), so no second read is made to
/// find the end unless the first stopped short of one.
fn read_small<'b>(path: &Path, buf: &'b mut [u8]) -> Option<&'b [u8]> {
    let mut f = std::fs::File::open(path).ok()?;
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => {
                n += k;
                if buf[n - 1] == b'\n' {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(&buf[..n])
}

/// Whether the process `pid` under `proc`, named like `name`, is that daemon: it runs as root
/// and its executable (else its `argv[0]`) has the daemon's name.
fn is_daemon(proc: &Path, pid: &str, name: &str) -> bool {
    let dir = proc.join(pid);
    let root = std::fs::read_to_string(dir.join("status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|u| u.split_whitespace().next().map(|r| r == "0"))
        })
        .unwrap_or(false);
    if !root {
        return false;
    }
    let base = |p: &str| basename(p).to_string();
    let exe = std::fs::read_link(dir.join("exe"))
        .ok()
        .map(|p| base(&p.to_string_lossy()));
    let argv0 = || {
        std::fs::read(dir.join("cmdline")).ok().and_then(|c| {
            c.split(|b| *b == 0)
                .next()
                .map(|a| base(&String::from_utf8_lossy(a)))
        })
    };
    exe.or_else(argv0).is_some_and(|n| n == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process directory under `proc`: its `stat` (kernel thread or not, its parent), `comm`,
    /// `status` (its uid) and `cmdline`.
    fn process(proc: &Path, pid: u32, comm: &str, uid: u32, argv0: &str, kthread_of: Option<u32>) {
        let d = proc.join(pid.to_string());
        std::fs::create_dir_all(&d).expect("dir");
        let (ppid, flags) = match kthread_of {
            Some(parent) => (parent, 0x0020_8040u64),
            None => (1, 0x0040_0100),
        };
        std::fs::write(
            d.join("stat"),
            format!("{pid} ({comm}) S {ppid} 0 0 0 -1 {flags} 0 0 0 0 0 0 0 0 20 0 1 0 7\n"),
        )
        .expect("stat");
        std::fs::write(d.join("comm"), format!("{comm}\n")).expect("comm");
        std::fs::write(
            d.join("status"),
            format!("Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
        )
        .expect("status");
        std::fs::write(d.join("cmdline"), format!("{argv0}\0-c\0x\0")).expect("cmdline");
    }

    #[test]
    fn a_daemon_is_roots_and_named_by_its_executable() {
        let proc = testkit::temp_dir().join("proc");
        process(
            &proc,
            100,
            "nv-fabricmanage",
            0,
            "/usr/bin/nv-fabricmanager",
            None,
        );
        process(
            &proc,
            200,
            "nvidia-persiste",
            1000,
            "/usr/bin/nvidia-persistenced",
            None,
        );
        process(&proc, 300, "nvidia-imex", 0, "/tmp/not-imex", None);
        // A name with a space and parentheses in it: the name ends at the last ')'.
        process(&proc, 400, "a) (b", 0, "/bin/a", None);
        let mut scan = Scan::default();
        let running = scan.daemons(&proc);
        assert_eq!(
            running,
            BTreeMap::from([("nv-fabricmanager", 100)]),
            "200 is not root; 300's executable is another"
        );
        // The second scan reads each one's name again: the same answer.
        assert_eq!(scan.daemons(&proc), running);
    }

    /// A kernel thread is read at two scans, then not again; a process is read at every scan,
    /// so that one that `exec`s a daemon under the pid it had is found, as is a usermode
    /// helper that looked like a kernel thread at the first; a pid gone is forgotten.
    #[test]
    fn kernel_threads_are_read_twice_and_processes_every_time() {
        let proc = testkit::temp_dir().join("proc");
        process(&proc, 2, "kthreadd", 0, "", Some(0));
        for pid in 3..40 {
            process(&proc, pid, "kworker/0:1", 0, "", Some(2));
        }
        // A usermode helper before its exec: the kworker's flags, kthreadd its parent.
        process(&proc, 41, "kworker/u4:0", 0, "", Some(2));
        process(&proc, 500, "bash", 0, "/bin/bash", None);
        let mut scan = Scan::default();
        assert!(scan.daemons(&proc).is_empty());
        assert_eq!(scan.opened, 40, "each one's stat");
        // The helper execs (say) the host engine: the same pid and /proc directory.
        process(
            &proc,
            41,
            "nv-hostengine",
            0,
            "/usr/bin/nv-hostengine",
            None,
        );
        assert_eq!(scan.daemons(&proc), BTreeMap::from([("nv-hostengine", 41)]));
        assert_eq!(
            scan.opened, 40,
            "the kernel threads' stat again, the process's comm"
        );
        assert_eq!(scan.daemons(&proc), BTreeMap::from([("nv-hostengine", 41)]));
        assert_eq!(scan.opened, 2, "the two processes' comm alone");
        // The shell execs the fabric manager: the same pid and /proc directory.
        process(
            &proc,
            500,
            "nv-fabricmanage",
            0,
            "/usr/bin/nv-fabricmanager",
            None,
        );
        assert_eq!(
            scan.daemons(&proc),
            BTreeMap::from([("nv-fabricmanager", 500), ("nv-hostengine", 41)])
        );
        // A kernel thread whose files now name a daemon is still a kernel thread (its
        // directory is the one seen); a task that is no child of kthreadd is not one.
        process(
            &proc,
            7,
            "nv-fabricmanage",
            0,
            "/usr/bin/nv-fabricmanager",
            Some(2),
        );
        process(
            &proc,
            600,
            "nvidia-imex",
            0,
            "/usr/bin/nvidia-imex",
            Some(77),
        );
        assert_eq!(
            scan.daemons(&proc),
            BTreeMap::from([
                ("nv-fabricmanager", 500),
                ("nv-hostengine", 41),
                ("nvidia-imex", 600)
            ])
        );
        std::fs::remove_dir_all(proc.join("500")).expect("rm");
        std::fs::remove_dir_all(proc.join("3")).expect("rm");
        assert_eq!(
            scan.daemons(&proc),
            BTreeMap::from([("nv-hostengine", 41), ("nvidia-imex", 600)])
        );
        assert_eq!(scan.seen.len(), 39, "what is gone is forgotten");
    }

    /// This machine's own /proc: its kernel threads are told by the kernel's `stat`
    /// (kthreadd, pid 2, among them), and from the third scan on only the processes and the
    /// pids new to the scan before are opened.
    #[test]
    fn this_machines_kernel_threads() {
        let proc = Path::new("/proc");
        let mut scan = Scan::default();
        scan.daemons(proc);
        scan.daemons(proc);
        let second = scan.seen.clone();
        let kernel = second.values().filter(|(k, _)| *k == Kind::Kernel).count();
        assert!(kernel > 0, "kthreadd and its children are kernel threads");
        let kthreadd =
            std::fs::metadata("/proc/2").map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        if let Ok(ino) = kthreadd {
            assert_eq!(second.get(&(2, ino)).map(|(k, _)| *k), Some(Kind::Kernel));
        }
        scan.daemons(proc);
        // Of what the third scan kept: all but the kernel threads the second had known twice
        // (the processes read again, kernel threads new at the second, pids new to the third).
        let expected = scan
            .seen
            .keys()
            .filter(|k| second.get(k).is_none_or(|(kind, _)| *kind != Kind::Kernel))
            .count();
        // Those that ended between the directory read and the open were opened but not kept.
        assert!(
            scan.opened >= expected && scan.opened <= expected + 64,
            "third scan opened {} files for {expected} processes (of {} kernel threads)",
            scan.opened,
            kernel
        );
        assert!(
            scan.opened < scan.seen.len(),
            "kernel threads are not opened again"
        );
    }
}
