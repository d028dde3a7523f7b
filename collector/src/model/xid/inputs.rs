//! Where each input has read up to, saved with what it counted: the checkpoints of
//! `/dev/kmsg` and of followed files, the files a reader holds, and the state directory that
//! keeps them across restarts (opened at start, saved at most every [`FLUSH_EVERY`]).

use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use super::saved::Saved;
use super::{FLUSH_EVERY, policy};
use crate::model::health::{Action, Code, Reason};
use crate::model::state::StateDir;
use crate::model::{HealthState, Model, lock};

/// An input's position in a file.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FileCursor {
    /// The file's inode when read.
    pub inode: u64,
    /// Bytes consumed.
    pub offset: u64,
}

/// The files whose saved position ([`FileCursor`], by path) a reader of this process holds:
/// the kernel-log files' readers and the fabric manager log's polls. Two readers of one file
/// would each count the lines past the saved position, and each move it.
static READING: Mutex<std::collections::BTreeSet<String>> =
    Mutex::new(std::collections::BTreeSet::new());

/// A file taken for one reader ([`READING`]); given back when it is dropped.
#[derive(Debug)]
pub struct FileLease(String);

impl FileLease {
    /// Takes `path`, unless another reader has it.
    pub fn take(path: &str) -> Option<FileLease> {
        lock(&READING)
            .insert(path.to_string())
            .then(|| FileLease(path.to_string()))
    }
}

impl Drop for FileLease {
    fn drop(&mut self) {
        lock(&READING).remove(&self.0);
    }
}

/// Where an input has read up to; saved together with what it counted.
#[derive(Debug, Clone)]
pub enum Checkpoint {
    /// The next `/dev/kmsg` sequence number.
    Kmsg(u64),
    /// A followed file's position.
    File(std::sync::Arc<str>, FileCursor),
}

impl Model {
    /// Opens the state directory: restores the XID counters, the inputs' checkpoints and the
    /// held health reasons when they are from this boot; starts clean otherwise.
    pub fn open_state(&self, dir: &std::path::Path, proc_root: &std::path::Path) {
        let state = StateDir::open(dir);
        let boot = crate::model::state::boot_id(proc_root);
        let saved: Option<Saved> = state.load("xid");
        let saved = match saved {
            Some(s) if !boot.is_empty() && s.boot_id == boot => s,
            Some(_) => {
                tracing::info!("saved kernel-log state is from an earlier boot; starting clean");
                Saved::default()
            }
            None => Saved::default(),
        };
        for (id, reasons) in &saved.reasons {
            for r in reasons {
                if let Some(code) = Code::parse(&r.code).filter(|c| policy::CODES.contains(c)) {
                    self.health.restore(
                        id,
                        Reason {
                            code,
                            state: if r.failed {
                                HealthState::Failed
                            } else {
                                HealthState::Degraded
                            },
                            detail: r.detail.clone(),
                            action: Action::parse(&r.action).unwrap_or(Action::DrainAndService),
                            since: SystemTime::now(),
                        },
                    );
                }
            }
        }
        {
            let mut i = lock(&self.xids.inner);
            i.saved = Saved {
                boot_id: boot,
                ..saved
            };
        }
        self.history.open(state.path());
        // Each boot the agent runs in, once: what the crash records and the reboot rules
        // count boots by.
        let boot = self.boot_id();
        if !self.history.entries().iter().any(|e| e.boot == boot) {
            self.remember(
                "node",
                "boot",
                "started",
                "the agent's first start in this boot",
            );
        }
        *lock(&self.xids.state) = Some(state);
        self.publish_xids();
    }

    /// Runs `f` on the state directory, once it is open.
    pub fn with_state<R>(&self, f: impl FnOnce(&StateDir) -> R) -> Option<R> {
        lock(&self.xids.state).as_ref().map(f)
    }

    /// The boot this agent runs in (as the state directory was opened with).
    pub fn boot_id(&self) -> String {
        lock(&self.xids.inner).saved.boot_id.clone()
    }

    /// The `/dev/kmsg` sequence number to read from (0: the whole ring of this boot).
    pub fn kmsg_next_seq(&self) -> u64 {
        lock(&self.xids.inner).saved.kmsg_next_seq
    }

    /// Runs `count` (what one record says) and moves the input's checkpoint past the
    /// record, as one step for the saved state: a kill at any point neither counts the
    /// record twice nor loses it.
    pub fn checkpointed<R>(&self, at: Checkpoint, count: impl FnOnce() -> R) -> R {
        let _gate = lock(&self.xids.gate);
        let r = count();
        lock(&self.xids.inner).advance(&at);
        r
    }

    /// [`Model::checkpointed`] for the `/dev/kmsg` record `seq`, unless a reader has already
    /// moved past it (false, and `count` does not run): a record is counted once, however many
    /// readers came upon it.
    pub fn kmsg_checkpointed(&self, seq: u64, count: impl FnOnce()) -> bool {
        let _gate = lock(&self.xids.gate);
        if seq < lock(&self.xids.inner).saved.kmsg_next_seq {
            return false;
        }
        count();
        lock(&self.xids.inner).advance(&Checkpoint::Kmsg(seq + 1));
        true
    }

    /// Where a file was read up to.
    pub fn file_cursor(&self, path: &str) -> Option<FileCursor> {
        lock(&self.xids.inner).saved.files.get(path).cloned()
    }

    /// Records where a file has been read up to.
    pub fn set_file_cursor(&self, path: &str, cursor: FileCursor) {
        let _gate = lock(&self.xids.gate);
        lock(&self.xids.inner).advance(&Checkpoint::File(path.into(), cursor));
    }

    /// Saves the XID state if it changed and the last save is [`FLUSH_EVERY`] old (`force`:
    /// now, at shutdown).
    pub fn flush_xids(&self, force: bool) {
        // One save at a time, each of a state no older than the last one saved.
        let state = lock(&self.xids.state);
        let snapshot = {
            let _gate = lock(&self.xids.gate);
            let mut i = lock(&self.xids.inner);
            if !i.dirty || (!force && i.last_flush.is_some_and(|t| t.elapsed() < FLUSH_EVERY)) {
                return;
            }
            i.dirty = false;
            i.last_flush = Some(Instant::now());
            i.saved.clone()
        };
        if let Some(state) = state.as_ref()
            && let Err((file, error)) = state.store("xid", &snapshot)
        {
            crate::internal_events::InternalEvent::emit(
                crate::internal_events::StateSaveFailed {
                    file: &file,
                    error: &error,
                },
                self,
            );
        }
    }
}
