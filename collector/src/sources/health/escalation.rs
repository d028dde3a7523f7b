//! Escalation over the event history (`model::history`): what one boot cannot see.
//!
//! | reason | when | state | action | from |
//! |---|---|---|---|---|
//! | `hardware_inspection` | the same hardware or driver XID, or the same fatal kernel-log signature, on the same GPU in two or more boots within `escalate_boots_window_secs` (3 days) | failed | drain_and_service | GPUd (the same XID after two reboots in three days) |
//! | `xid_repeated` | one XID `xid_repeat_count` (5) times on one GPU within `xid_repeat_window_secs` (24 h) | degraded | none | NVSentinel's analyser (the same XID five times in a day) |
//! | `xid_repeated` | Xid 13 or 31 from `xid_repeat_processes` (3) different processes on one GPU within the same window: the GPU, not the application | degraded | drain_and_service | GPUd / NVIDIA's XID catalog (13/31 are the application's unless they follow the GPU) |
//! | `resets_ineffective` | the same reason raised on the same GPU in `reboots_count` (3) or more boots within `reboots_window_secs` (a week): each reboot (or reset) brought it back | failed | drain_and_service | GPUd's reboot threshold (a failure that survives reboots is the hardware's); NVSentinel's fault quarantine (repeated remediation that does not hold) |
//! | node: `kernel_panics_repeated` | kernel panics (recovered from pstore or kdump) in 2 or more boots within `reboots_window_secs` | — | — | the node reboot loops; node-problem-detector's KernelOops/Reboot conditions |
//!
//! The reasons clear like the other rules' once their condition has been absent for
//! `clear_after_secs`: a GPU that failed once and stayed quiet for the window clears.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::HealthState;
use crate::model::health::{Action, Code, Finding};
use crate::model::history::Entry;
use crate::model::signatures::{CATALOG, Effect};
use crate::model::xid_catalog::{self, Category};

/// The windows and counts.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Seconds within which two boots' occurrences escalate.
    pub boots_window_secs: f64,
    /// Occurrences of one XID that are too many.
    pub repeat_count: u32,
    /// Seconds they are counted over.
    pub repeat_window_secs: f64,
    /// Processes with Xid 13 / 31 that make it the GPU's.
    pub processes: u32,
    /// Boots with the same reason that make resets and reboots ineffective.
    pub reboots: u32,
    /// Seconds they are counted over.
    pub reboots_window_secs: f64,
}

/// Reasons the history rules raise themselves (not counted again by them).
const OWN: &[&str] = &["hardware_inspection", "xid_repeated", "resets_ineffective"];

/// A reason raised, from a `health` entry's code (`failed:rm_init_failed`).
fn raised(e: &Entry) -> Option<&str> {
    if e.kind != "health" || e.code.ends_with("-cleared") {
        return None;
    }
    let (state, code) = e.code.split_once(':')?;
    (matches!(state, "failed" | "degraded") && !OWN.contains(&code)).then_some(code)
}

/// The node reasons over the history at `now`: (reason, detail).
pub fn node_escalations(entries: &[Entry], now: f64, p: &Params) -> Vec<(&'static str, String)> {
    let panics: BTreeSet<&str> = entries
        .iter()
        .filter(|e| {
            e.kind == "signature"
                && e.code == "kernel_panic"
                && (0.0..=p.reboots_window_secs).contains(&(now - e.ms as f64 / 1000.0))
        })
        .map(|e| e.boot.as_str())
        .collect();
    if panics.len() >= 2 {
        vec![(
            "kernel_panics_repeated",
            format!(
                "the kernel panicked in {} boots within {:.0} days",
                panics.len(),
                p.reboots_window_secs / 86400.0
            ),
        )]
    } else {
        Vec::new()
    }
}

/// Whether an entry is a failure that, repeated across boots, points at the hardware.
fn escalates(e: &Entry) -> bool {
    match e.kind.as_str() {
        "xid" => e.code.parse::<u32>().is_ok_and(|c| {
            matches!(
                xid_catalog::lookup(c).category,
                Category::Hardware | Category::Driver
            )
        }),
        "signature" => CATALOG
            .iter()
            .any(|s| e.code == s.id && matches!(s.effect, Effect::GpuReason(_, true, _))),
        _ => false,
    }
}

/// The escalation findings per GPU at `now` (Unix seconds).
pub fn escalations(entries: &[Entry], now: f64, p: &Params) -> BTreeMap<String, Vec<Finding>> {
    let mut boots: BTreeMap<(&str, &str, &str), BTreeSet<&str>> = BTreeMap::new();
    let mut counts: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    let mut pids: BTreeMap<(&str, &str), BTreeSet<u32>> = BTreeMap::new();
    let mut reasons: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
    for e in entries {
        let age = now - e.ms as f64 / 1000.0;
        if age < 0.0 {
            continue;
        }
        if age <= p.reboots_window_secs
            && let Some(code) = raised(e)
        {
            reasons
                .entry((e.id.as_str(), code))
                .or_default()
                .insert(e.boot.as_str());
        }
        if age <= p.boots_window_secs && escalates(e) {
            boots
                .entry((e.id.as_str(), e.kind.as_str(), e.code.as_str()))
                .or_default()
                .insert(e.boot.as_str());
        }
        if e.kind == "xid" && age <= p.repeat_window_secs {
            *counts.entry((e.id.as_str(), e.code.as_str())).or_default() += 1;
            if let (Some(pid), "13" | "31") = (e.pid, e.code.as_str()) {
                pids.entry((e.id.as_str(), e.code.as_str()))
                    .or_default()
                    .insert(pid);
            }
        }
    }
    let mut out: BTreeMap<String, Vec<Finding>> = BTreeMap::new();
    for ((id, kind, code), b) in boots {
        if b.len() >= 2 {
            let what = if kind == "xid" {
                format!("Xid {code}")
            } else {
                code.to_string()
            };
            out.entry(id.to_string()).or_default().push(Finding {
                code: Code::HardwareInspection,
                state: HealthState::Failed,
                action: Action::DrainAndService,
                detail: format!(
                    "{what} in {} boots within {:.0} h: have the GPU inspected",
                    b.len(),
                    p.boots_window_secs / 3600.0
                ),
            });
        }
    }
    for ((id, code), b) in reasons {
        if b.len() as u32 >= p.reboots {
            out.entry(id.to_string()).or_default().push(Finding {
                code: Code::ResetsIneffective,
                state: HealthState::Failed,
                action: Action::DrainAndService,
                detail: format!(
                    "{code} came back in {} boots within {:.0} days: reboots and resets do not clear it",
                    b.len(),
                    p.reboots_window_secs / 86400.0
                ),
            });
        }
    }
    for ((id, code), n) in counts {
        if n >= p.repeat_count {
            out.entry(id.to_string()).or_default().push(Finding {
                code: Code::XidRepeated,
                state: HealthState::Degraded,
                action: Action::None,
                detail: format!(
                    "Xid {code} {n} times within {:.0} h",
                    p.repeat_window_secs / 3600.0
                ),
            });
        }
    }
    for ((id, code), set) in pids {
        if set.len() as u32 >= p.processes {
            out.entry(id.to_string()).or_default().push(Finding {
                code: Code::XidRepeated,
                state: HealthState::Degraded,
                action: Action::DrainAndService,
                detail: format!(
                    "Xid {code} from {} different processes within {:.0} h: the GPU, not the application",
                    set.len(),
                    p.repeat_window_secs / 3600.0
                ),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Params = Params {
        boots_window_secs: 3.0 * 86400.0,
        repeat_count: 5,
        repeat_window_secs: 86400.0,
        processes: 3,
        reboots: 3,
        reboots_window_secs: 7.0 * 86400.0,
    };
    const DAY: f64 = 86400.0;

    fn e(t: f64, boot: &str, gpu: &str, kind: &str, code: &str, pid: Option<u32>) -> Entry {
        Entry {
            ms: (t * 1000.0) as u64,
            boot: boot.into(),
            id: gpu.into(),
            kind: kind.into(),
            code: code.into(),
            pid,
            detail: String::new(),
        }
    }

    fn codes(out: &BTreeMap<String, Vec<Finding>>, gpu: &str) -> Vec<(Code, Action)> {
        out.get(gpu)
            .map(|v| v.iter().map(|f| (f.code, f.action)).collect())
            .unwrap_or_default()
    }

    #[test]
    fn the_table() {
        let now = 10.0 * DAY;
        let x = |t, boot, gpu, code, pid| e(now - t, boot, gpu, "xid", code, pid);
        type Case = (&'static str, Vec<Entry>, &'static str, Vec<(Code, Action)>);
        let cases: Vec<Case> = vec![
            (
                "one boot, one hardware XID",
                vec![x(DAY, "a", "G", "48", None)],
                "G",
                vec![],
            ),
            (
                "Xid 48 in two boots within three days",
                vec![
                    x(2.0 * DAY, "a", "G", "48", None),
                    x(DAY, "b", "G", "48", None),
                ],
                "G",
                vec![(Code::HardwareInspection, Action::DrainAndService)],
            ),
            (
                "two boots, but the first is older than the window: quiet long enough",
                vec![
                    x(4.0 * DAY, "a", "G", "48", None),
                    x(DAY, "b", "G", "48", None),
                ],
                "G",
                vec![],
            ),
            (
                "two boots, two GPUs: each once",
                vec![
                    x(2.0 * DAY, "a", "G", "48", None),
                    x(DAY, "b", "H", "48", None),
                ],
                "G",
                vec![],
            ),
            (
                "an application XID across boots is the application's",
                vec![
                    x(2.0 * DAY, "a", "G", "13", Some(1)),
                    x(DAY, "b", "G", "13", Some(1)),
                ],
                "G",
                vec![],
            ),
            (
                "a fatal signature (RmInitAdapter) across boots",
                vec![
                    e(
                        now - 2.0 * DAY,
                        "a",
                        "G",
                        "signature",
                        "rm_init_failed",
                        None,
                    ),
                    e(now - DAY, "b", "G", "signature", "rm_init_failed", None),
                ],
                "G",
                vec![(Code::HardwareInspection, Action::DrainAndService)],
            ),
            (
                "an OOM kill across boots escalates nothing",
                vec![
                    e(now - 2.0 * DAY, "a", "G", "signature", "oom_kill", None),
                    e(now - DAY, "b", "G", "signature", "oom_kill", None),
                ],
                "G",
                vec![],
            ),
            (
                "Xid 79 five times in a day (and in two boots)",
                (0..5)
                    .map(|i| {
                        x(
                            100.0 * f64::from(i),
                            if i < 2 { "a" } else { "b" },
                            "G",
                            "79",
                            None,
                        )
                    })
                    .collect(),
                "G",
                vec![
                    (Code::HardwareInspection, Action::DrainAndService),
                    (Code::XidRepeated, Action::None),
                ],
            ),
            (
                "four times in a day is not yet too many",
                (0..4)
                    .map(|i| x(100.0 * f64::from(i), "a", "G", "79", None))
                    .collect(),
                "G",
                vec![],
            ),
            (
                "Xid 31 from three processes: the GPU",
                (0..3)
                    .map(|i| x(10.0 * f64::from(i), "a", "G", "31", Some(100 + i)))
                    .collect(),
                "G",
                vec![(Code::XidRepeated, Action::DrainAndService)],
            ),
            (
                "Xid 31 four times from one process: the application",
                (0..4)
                    .map(|i| x(10.0 * f64::from(i), "a", "G", "31", Some(100)))
                    .collect(),
                "G",
                vec![],
            ),
            (
                "the same reason after three reboots in a week",
                ["a", "b", "c"]
                    .iter()
                    .enumerate()
                    .map(|(i, b)| {
                        e(
                            now - 2.0 * DAY * i as f64,
                            b,
                            "G",
                            "health",
                            "degraded:row_remap_pending",
                            None,
                        )
                    })
                    .collect(),
                "G",
                vec![(Code::ResetsIneffective, Action::DrainAndService)],
            ),
            (
                "twice is not yet three; a clearing, the reasons the history raises and another GPU's count for nothing",
                vec![
                    e(
                        now - 3.0 * DAY,
                        "a",
                        "G",
                        "health",
                        "degraded:row_remap_pending",
                        None,
                    ),
                    e(
                        now - 2.0 * DAY,
                        "b",
                        "G",
                        "health",
                        "degraded:row_remap_pending",
                        None,
                    ),
                    e(
                        now - DAY,
                        "c",
                        "G",
                        "health",
                        "ok:row_remap_pending-cleared",
                        None,
                    ),
                    e(
                        now - DAY,
                        "c",
                        "H",
                        "health",
                        "degraded:row_remap_pending",
                        None,
                    ),
                    e(
                        now - 3.0 * DAY,
                        "a",
                        "G",
                        "health",
                        "failed:hardware_inspection",
                        None,
                    ),
                    e(
                        now - 2.0 * DAY,
                        "b",
                        "G",
                        "health",
                        "failed:hardware_inspection",
                        None,
                    ),
                    e(
                        now - DAY,
                        "c",
                        "G",
                        "health",
                        "failed:hardware_inspection",
                        None,
                    ),
                ],
                "G",
                vec![],
            ),
            (
                "three boots, but the first is older than a week",
                vec![
                    e(
                        now - 8.0 * DAY,
                        "a",
                        "G",
                        "health",
                        "failed:rm_init_failed",
                        None,
                    ),
                    e(
                        now - 2.0 * DAY,
                        "b",
                        "G",
                        "health",
                        "failed:rm_init_failed",
                        None,
                    ),
                    e(now - DAY, "c", "G", "health", "failed:rm_init_failed", None),
                ],
                "G",
                vec![],
            ),
        ];
        for (name, entries, gpu, want) in cases {
            assert_eq!(codes(&escalations(&entries, now, &P), gpu), want, "{name}");
        }
    }

    #[test]
    fn panics_in_two_boots_are_a_node_reason() {
        let now = 10.0 * DAY;
        let panic = |t: f64, boot| e(now - t, boot, "node", "signature", "kernel_panic", None);
        let one = node_escalations(&[panic(DAY, "a")], now, &P);
        assert!(one.is_empty());
        let two = node_escalations(&[panic(2.0 * DAY, "a"), panic(DAY, "b")], now, &P);
        assert_eq!(two.len(), 1);
        assert_eq!(two[0].0, "kernel_panics_repeated");
        let old = node_escalations(&[panic(9.0 * DAY, "a"), panic(DAY, "b")], now, &P);
        assert!(old.is_empty(), "a week apart");
    }
}
