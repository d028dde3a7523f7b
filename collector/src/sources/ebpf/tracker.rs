//! What the BPF records mean, per process: the RM object tree per (process, client), the
//! GPUs a process uses, its live driver memory and contexts per GPU, its call aggregates.
//! Pure logic (no BPF, no `/proc`), fed by the drain loop and unit-tested on records.
//!
//! GPU of an object: the one GPU its client registered with UVM; else the `NV01_DEVICE_0` it
//! hangs under, whose device instance is mapped to a GPU UUID once a client with exactly one
//! device registers exactly one GPU with UVM (device instances are node-wide); else the one
//! `/dev/nvidiaN` the process used. Objects whose GPU stays unknown count in the process's
//! totals, not against a GPU.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use junction_common::nv::{Op, class, format_uuid};
use junction_common::{Call, Exit, ProcStats, flag, record};

/// An RM object a process allocated.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Object {
    parent: u32,
    class: u32,
    /// Bytes, for memory classes.
    size: u64,
    /// Device instance (`NV01_DEVICE_0`) or engine type (channel group).
    extra: u32,
}

/// One traced process.
#[derive(Debug, Clone)]
pub struct Proc {
    /// `comm` from the first record.
    pub comm: String,
    /// cgroup id from the first record.
    pub cgroup_id: u64,
    /// Aggregates (from the map while it lives, from the exit record after).
    pub stats: ProcStats,
    /// When it ended.
    pub ended: Option<Instant>,
    /// When its aggregates last changed.
    pub last_active: Instant,
    /// Device numbers it used (kernel `dev_t`).
    pub devices: BTreeSet<u32>,
    /// Bytes allocated and freed (memory classes, successful calls).
    pub allocated: u64,
    /// Bytes freed.
    pub freed: u64,
    /// Contexts (graphics/compute channel groups) created.
    pub contexts_created: u64,
    objects: HashMap<(u32, u32), Object>,
    /// GPUs each client registered with UVM.
    uvm: BTreeMap<u32, BTreeSet<String>>,
}

impl Proc {
    fn new(comm: String, cgroup_id: u64) -> Self {
        Self {
            comm,
            cgroup_id,
            stats: ProcStats::default(),
            ended: None,
            last_active: Instant::now(),
            devices: BTreeSet::new(),
            allocated: 0,
            freed: 0,
            contexts_created: 0,
            objects: HashMap::new(),
            uvm: BTreeMap::new(),
        }
    }

    /// At its end: the driver frees what a process held when its descriptors close (no
    /// `NV_ESC_RM_FREE` is issued), so its memory counts as freed and it holds nothing more.
    /// Its series stay for the retention with what it allocated and freed, and zero held.
    fn release(&mut self) {
        let held: u64 = self.objects.values().map(|o| o.size).sum();
        self.freed = self.freed.saturating_add(held);
        self.objects.clear();
    }
}

/// Per GPU, what a process holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holding {
    /// Live driver memory, bytes.
    pub memory: u64,
    /// Live contexts.
    pub contexts: u64,
}

/// What the tracker reports for user-facing events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// A process used an NVIDIA device for the first time.
    Started {
        /// Process.
        tgid: u32,
        /// Device number.
        rdev: u32,
    },
    /// A process registered a GPU with UVM.
    GpuRegistered {
        /// Process.
        tgid: u32,
        /// GPU UUID.
        uuid: String,
    },
    /// A call took longer than the threshold.
    Slow {
        /// Process.
        tgid: u32,
        /// Op.
        op: Op,
        /// Control command (0 for other ops).
        command: u32,
        /// Time in the call.
        latency: Duration,
    },
    /// A process ended.
    Ended {
        /// Process.
        tgid: u32,
    },
}

/// Processes tracked at once, at most (a fork bomb of ioctl callers is not tracked past it).
pub const MAX_PROCS: usize = 4096;
/// RM objects kept per process, at most: more are counted in its totals, not kept.
pub const MAX_OBJECTS: usize = 16384;
/// Clients with UVM registrations per process, and GPUs per client, at most.
pub const MAX_UVM_CLIENTS: usize = 64;
/// GPUs one client may register, at most (an NVL72 rack's GPUs are 72).
pub const MAX_UVM_GPUS: usize = 72;
/// Device instances mapped to GPUs, at most.
pub const MAX_DEVICE_IDS: usize = 256;

/// Every traced process. What a process reports of itself (its parameter blocks) may be
/// wrong; it can never grow the tracker past the caps above, name a GPU the inventory does
/// not have, or count more memory for one object than the largest GPU has.
#[derive(Debug)]
pub struct Tracker {
    /// By tgid.
    pub procs: BTreeMap<u32, Proc>,
    /// Device instance → GPU UUID, learned.
    device_ids: BTreeMap<u32, String>,
    /// The inventory's GPU UUIDs (empty: not known, every UUID is taken, within the caps).
    pub inventory: BTreeSet<String>,
    /// The largest GPU's memory: no object is counted larger.
    pub max_object_bytes: u64,
    /// GPU minor numbers (`/dev/nvidiaN`) → UUIDs, from the inventory.
    pub minors: BTreeMap<u32, String>,
    /// Records dropped by the caps.
    pub dropped: u64,
}

impl Default for Tracker {
    fn default() -> Self {
        Self {
            procs: BTreeMap::new(),
            device_ids: BTreeMap::new(),
            inventory: BTreeSet::new(),
            max_object_bytes: u64::MAX,
            minors: BTreeMap::new(),
            dropped: 0,
        }
    }
}

fn comm_str(c: &[u8; 16]) -> String {
    let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
    String::from_utf8_lossy(&c[..end]).into_owned()
}

/// NVML's spelling of a raw UUID.
pub fn uuid_string(raw: &[u8; 16]) -> String {
    let mut out = [0u8; 40];
    format_uuid(raw, &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

impl Proc {
    /// An object freed: freeing the client frees everything under it; freeing an object
    /// frees its descendants.
    fn free(&mut self, client: u32, handle: u32) {
        let doomed: Vec<(u32, u32)> = if handle == client {
            self.objects
                .keys()
                .filter(|(cl, _)| *cl == client)
                .copied()
                .collect()
        } else {
            // One pass to index the client's children, one walk down: linear in the
            // objects, however deep or wide the tree.
            let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
            for ((cl, h), o) in &self.objects {
                if *cl == client && *h != o.parent {
                    children.entry(o.parent).or_default().push(*h);
                }
            }
            let mut seen: BTreeSet<u32> = BTreeSet::from([handle]);
            let mut stack = vec![handle];
            while let Some(h) = stack.pop() {
                for k in children.get(&h).into_iter().flatten() {
                    if seen.insert(*k) {
                        stack.push(*k);
                    }
                }
            }
            seen.into_iter().map(|h| (client, h)).collect()
        };
        for k in doomed {
            if let Some(o) = self.objects.remove(&k) {
                self.freed = self.freed.saturating_add(o.size);
            }
        }
        if handle == client {
            self.uvm.remove(&client);
        }
    }
}

impl Tracker {
    /// Applies one call record.
    pub fn call(&mut self, c: &Call, notes: &mut Vec<Note>) {
        let is_new = !self.procs.contains_key(&c.tgid);
        if is_new && self.procs.len() >= MAX_PROCS {
            self.dropped += 1;
            return;
        }
        let max_bytes = self.max_object_bytes;
        let p = self
            .procs
            .entry(c.tgid)
            .or_insert_with(|| Proc::new(comm_str(&c.comm), c.cgroup_id));
        if p.comm.is_empty() {
            p.comm = comm_str(&c.comm);
        }
        if c.kind == record::DEVICE {
            if is_new || p.devices.is_empty() {
                notes.push(Note::Started {
                    tgid: c.tgid,
                    rdev: c.rdev,
                });
            }
            p.devices.insert(c.rdev);
            return;
        }
        let Some(op) = Op::from_u32(c.op) else { return };
        if c.flags & flag::SLOW != 0 {
            notes.push(Note::Slow {
                tgid: c.tgid,
                op,
                command: if op == Op::RmControl {
                    c.value as u32
                } else {
                    0
                },
                latency: Duration::from_nanos(c.latency_ns),
            });
        }
        if c.flags & flag::OK == 0 {
            return;
        }
        match op {
            Op::RmAlloc => {
                let obj = Object {
                    parent: c.parent,
                    class: c.class,
                    size: if class::is_memory(c.class) {
                        c.value.min(max_bytes)
                    } else {
                        0
                    },
                    extra: c.extra,
                };
                p.allocated = p.allocated.saturating_add(obj.size);
                if c.class == class::CHANNEL_GROUP && c.extra == class::ENGINE_GRAPHICS {
                    p.contexts_created = p.contexts_created.saturating_add(1);
                }
                if p.objects.len() >= MAX_OBJECTS && !p.objects.contains_key(&(c.client, c.handle))
                {
                    // Counted in the totals, not kept (nor counted as live on a GPU).
                    p.freed = p.freed.saturating_add(obj.size);
                    self.dropped += 1;
                    return;
                }
                // A handle reused without a free (a lost record): the old object is gone.
                if let Some(old) = p.objects.insert((c.client, c.handle), obj) {
                    p.freed = p.freed.saturating_add(old.size);
                }
            }
            Op::RmFree => p.free(c.client, c.handle),
            Op::UvmRegisterGpu => {
                let uuid = uuid_string(&c.uuid);
                // Only GPUs this node has; within the caps.
                let known = self.inventory.is_empty() || self.inventory.contains(&uuid);
                let room = p.uvm.contains_key(&c.client) || p.uvm.len() < MAX_UVM_CLIENTS;
                let gpus = p.uvm.get(&c.client).map_or(0, BTreeSet::len);
                if !known || !room || gpus >= MAX_UVM_GPUS {
                    self.dropped += 1;
                    return;
                }
                if p.uvm.entry(c.client).or_default().insert(uuid.clone()) {
                    notes.push(Note::GpuRegistered { tgid: c.tgid, uuid });
                }
                self.learn(c.tgid, c.client);
            }
            _ => {}
        }
    }

    /// A client with one device object and one UVM GPU tells which GPU that device
    /// instance is — for every process (instances are node-wide), so only when the kernel
    /// agrees: the process has opened exactly one GPU's `/dev/nvidiaN` (the device number
    /// comes from the kernel, not from the caller's memory) and it is that GPU. A process that
    /// lies about its instance or its GPU misleads nobody but itself.
    fn learn(&mut self, tgid: u32, client: u32) {
        let Some(p) = self.procs.get(&tgid) else {
            return;
        };
        let Some(gpus) = p.uvm.get(&client) else {
            return;
        };
        let opened: BTreeSet<&String> = p
            .devices
            .iter()
            .filter_map(|r| gpu_minor(*r))
            .filter_map(|m| self.minors.get(&m))
            .collect();
        if opened.len() != 1 || gpus.len() != 1 || !gpus.iter().all(|g| opened.contains(g)) {
            return;
        }
        let devices: Vec<u32> = p
            .objects
            .iter()
            .filter(|((cl, _), o)| *cl == client && o.class == class::DEVICE)
            .map(|(_, o)| o.extra)
            .collect();
        if let ([d], 1) = (devices.as_slice(), gpus.len())
            && let Some(uuid) = gpus.iter().next()
            && (self.device_ids.len() < MAX_DEVICE_IDS || self.device_ids.contains_key(d))
        {
            self.device_ids.insert(*d, uuid.clone());
        }
    }

    /// Applies an exit record.
    pub fn exit(&mut self, e: &Exit, notes: &mut Vec<Note>) {
        let p = self
            .procs
            .entry(e.tgid)
            .or_insert_with(|| Proc::new(String::new(), e.stats.cgroup_id));
        p.stats = e.stats;
        if p.ended.is_none() {
            p.ended = Some(Instant::now());
            p.release();
            notes.push(Note::Ended { tgid: e.tgid });
        }
    }

    /// Updates a live process's aggregates from the map.
    pub fn stats(&mut self, tgid: u32, s: ProcStats) {
        let p = self
            .procs
            .entry(tgid)
            .or_insert_with(|| Proc::new(String::new(), s.cgroup_id));
        if p.ended.is_none() && p.stats != s {
            p.stats = s;
            p.last_active = Instant::now();
        }
    }

    /// Marks a process ended without an exit record (a lost record, or found gone).
    pub fn gone(&mut self, tgid: u32, notes: &mut Vec<Note>) {
        if let Some(p) = self.procs.get_mut(&tgid)
            && p.ended.is_none()
        {
            p.ended = Some(Instant::now());
            p.release();
            notes.push(Note::Ended { tgid });
        }
    }

    /// Drops processes that ended more than `retention` ago; returns them.
    pub fn expire(&mut self, retention: Duration) -> Vec<(u32, Proc)> {
        let old: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, p)| p.ended.is_some_and(|t| t.elapsed() >= retention))
            .map(|(t, _)| *t)
            .collect();
        old.into_iter()
            .filter_map(|t| self.procs.remove(&t).map(|p| (t, p)))
            .collect()
    }

    /// The GPU of an object, if it can be told: the one GPU its client registered with UVM
    /// (the most direct evidence), else its device object's learned instance, else the one
    /// `/dev/nvidiaN` the process used.
    fn gpu_of(
        &self,
        p: &Proc,
        client: u32,
        handle: u32,
        minor_gpus: &BTreeSet<String>,
    ) -> Option<String> {
        if let Some(gpus) = p.uvm.get(&client)
            && gpus.len() == 1
        {
            return gpus.iter().next().cloned();
        }
        // Up the tree to a device object.
        let mut h = handle;
        for _ in 0..16 {
            let Some(o) = p.objects.get(&(client, h)) else {
                break;
            };
            if o.class == class::DEVICE {
                if let Some(u) = self.device_ids.get(&o.extra) {
                    return Some(u.clone());
                }
                break;
            }
            h = o.parent;
        }
        if minor_gpus.len() == 1 {
            return minor_gpus.iter().next().cloned();
        }
        None
    }

    /// What a process holds per GPU: every GPU it is known to use (registered with UVM,
    /// its `/dev/nvidiaN`, or owning memory there), with live memory and contexts.
    pub fn holdings(
        &self,
        p: &Proc,
        minor_to_uuid: &dyn Fn(u32) -> Option<String>,
    ) -> BTreeMap<String, Holding> {
        let minor_gpus: BTreeSet<String> = p
            .devices
            .iter()
            .filter_map(|r| gpu_minor(*r))
            .filter_map(minor_to_uuid)
            .collect();
        let mut out: BTreeMap<String, Holding> = BTreeMap::new();
        for g in p.uvm.values().flatten().chain(&minor_gpus) {
            out.entry(g.clone()).or_default();
        }
        for ((client, handle), o) in &p.objects {
            let context = o.class == class::CHANNEL_GROUP && o.extra == class::ENGINE_GRAPHICS;
            if o.size == 0 && !context {
                continue;
            }
            let Some(g) = self.gpu_of(p, *client, *handle, &minor_gpus) else {
                continue;
            };
            let h = out.entry(g).or_default();
            h.memory = h.memory.saturating_add(o.size);
            h.contexts = h.contexts.saturating_add(u64::from(context));
        }
        out
    }
}

/// The GPU minor of a device (`rdev` as the probes encode it, major << 20 | minor): a
/// `/dev/nvidiaN`, not one of the driver's control devices, which take the minors from 248
/// up (`/dev/nvidiactl` 255, `/dev/nvidia-modeset` 254).
fn gpu_minor(rdev: u32) -> Option<u32> {
    let minor = rdev & 0xFFFFF;
    (rdev >> 20 == junction_common::nv::NV_MAJOR && minor < 248).then_some(minor)
}

#[cfg(test)]
mod tests;
