//! The thread aya's loader runs on, confined by Landlock so that it cannot read the kernel's
//! BTF.
//!
//! aya 0.14's `EbpfLoader::new()` reads and parses `/sys/kernel/btf/vmlinux` whole, whether
//! the object needs it or not (about 20 MB of heap at its peak for a 5 MB file, freed at
//! once but left in the agent's peak RSS). Junction's programs carry no CO-RE relocations:
//! they take the few struct offsets they need as load-time globals, which [`super::btf`]
//! reads. Where that read fails, aya goes on without kernel BTF (`Btf::from_sys_fs().ok()`),
//! which is all these programs need. aya 0.15 parses only on demand, but needs Rust 1.98.
//!
//! The thread is one of its own, ended once the object is loaded: a Landlock domain cannot be
//! left, so it must not be a pool thread that later runs other work. Where the kernel has no
//! Landlock, the loader runs unconfined and parses the file as before.

use std::path::{Path, PathBuf};

/// What aya's loader must not read.
pub const KERNEL_BTF: &str = "/sys/kernel/btf";

/// How the confinement went, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confined {
    /// The thread could not read under [`KERNEL_BTF`].
    Yes,
    /// It could (no Landlock in this kernel, or it failed): why.
    No(String),
}

/// Runs `f` on a new thread that can read every file except those beneath `hidden`, and
/// returns what it returned with how the confinement went; an error if the thread could not
/// be started or panicked.
pub fn run_without<T: Send>(
    hidden: &Path,
    f: impl FnOnce() -> T + Send,
) -> std::io::Result<(T, Confined)> {
    std::thread::scope(|s| {
        let thread = std::thread::Builder::new()
            .name("ebpf-load".into())
            .spawn_scoped(s, || {
                let confined = match deny_reads_beneath(hidden) {
                    Ok(true) => Confined::Yes,
                    Ok(false) => Confined::No("this kernel has no Landlock".into()),
                    Err(e) => Confined::No(e),
                };
                (f(), confined)
            })?;
        thread
            .join()
            .map_err(|_| std::io::Error::other("the BPF loading thread panicked"))
    })
}

/// Restricts the calling thread (and only it) so that it cannot open for reading a file
/// beneath `hidden`: Landlock allows reading beneath every sibling of `hidden` and of each of
/// its ancestors, which together are every path but `hidden`'s. Ok(false): Landlock is not
/// available, nothing was restricted.
fn deny_reads_beneath(hidden: &Path) -> Result<bool, String> {
    use landlock::{
        AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
        path_beneath_rules,
    };
    let read = AccessFs::ReadFile;
    let allowed =
        siblings_along(hidden).map_err(|e| format!("listing {}: {e}", hidden.display()))?;
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(read)
        .and_then(|r| r.create())
        .and_then(|r| r.add_rules(path_beneath_rules(&allowed, read)))
        // A denied read is expected, not an event for the node's audit log.
        .and_then(|r| r.log_same_exec(false))
        .and_then(|r| r.restrict_self())
        .map_err(|e| format!("Landlock: {e}"))?;
    Ok(status.ruleset != RulesetStatus::NotEnforced)
}

/// The siblings of the absolute `path` and of each of its ancestors (for `/sys/kernel/btf`:
/// `/`'s entries but `sys`, `/sys`'s but `kernel`, `/sys/kernel`'s but `btf`): the
/// hierarchies that cover the file system except `path`. An ancestor that cannot be listed is
/// an error.
pub fn siblings_along(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut child = path;
    while let Some(parent) = child.parent() {
        for entry in std::fs::read_dir(parent)? {
            let entry = entry?;
            if Some(entry.file_name().as_os_str()) != child.file_name() {
                out.push(entry.path());
            }
        }
        child = parent;
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree with a hidden part, in a temporary directory of its own.
    struct Tree(PathBuf);

    impl Tree {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tree() -> Tree {
        let t = Tree(testkit::temp_dir());
        for d in ["a/b/hidden/deep", "a/b/seen", "a/other", "top"] {
            std::fs::create_dir_all(t.path().join(d)).expect("a directory");
        }
        for f in [
            "a/b/hidden/secret",
            "a/b/hidden/deep/secret",
            "a/b/seen/file",
            "a/b/file",
            "a/other/file",
            "top/file",
        ] {
            std::fs::write(t.path().join(f), f).expect("a file");
        }
        t
    }

    #[test]
    fn the_siblings_along_a_path_are_everything_but_it() {
        let t = tree();
        let got = siblings_along(&t.path().join("a/b/hidden")).expect("listed");
        let under: Vec<PathBuf> = got
            .iter()
            .filter_map(|p| p.strip_prefix(t.path()).ok().map(Path::to_path_buf))
            .collect();
        assert_eq!(
            under,
            ["a/b/file", "a/b/seen", "a/other", "top"].map(PathBuf::from),
            "{got:?}"
        );
        // Above the tree: the temporary directory's siblings, up to `/`'s entries.
        assert!(got.iter().any(|p| p == Path::new("/proc")), "{got:?}");
        assert!(!got.iter().any(|p| t.path().starts_with(p)), "{got:?}");
    }

    #[test]
    fn the_confined_thread_reads_everything_but_the_hidden_tree_and_no_other_thread_is_confined() {
        let t = tree();
        let read = |f: &str| std::fs::read_to_string(t.path().join(f)).map_err(|e| e.kind());
        let ((hidden, deep, seen, sibling, proc_file), confined) =
            run_without(&t.path().join("a/b/hidden"), || {
                (
                    read("a/b/hidden/secret"),
                    read("a/b/hidden/deep/secret"),
                    read("a/b/seen/file"),
                    read("a/other/file"),
                    std::fs::read_to_string("/proc/self/status").map(|_| ()),
                )
            })
            .expect("the loading thread");
        // This machine's kernel (and CI's) has Landlock; a kernel without it would be told.
        assert_eq!(confined, Confined::Yes);
        assert_eq!(hidden, Err(std::io::ErrorKind::PermissionDenied));
        assert_eq!(deep, Err(std::io::ErrorKind::PermissionDenied));
        assert_eq!(seen.as_deref(), Ok("a/b/seen/file"));
        assert_eq!(sibling.as_deref(), Ok("a/other/file"));
        assert!(proc_file.is_ok(), "{proc_file:?}");
        // The calling thread, and a new one, are not confined.
        assert_eq!(
            read("a/b/hidden/secret").as_deref(),
            Ok("a/b/hidden/secret")
        );
        let other = std::thread::scope(|s| {
            s.spawn(|| read("a/b/hidden/secret"))
                .join()
                .expect("a thread")
        });
        assert_eq!(other.as_deref(), Ok("a/b/hidden/secret"));
    }
}
