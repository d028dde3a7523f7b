//! The kubernetes source: which pod holds which GPU, and the names of the pods Junction's
//! processes run in.
//!
//! - The kubelet's pod-resources API (`List`, gRPC over its unix socket) says which devices
//!   each container was allocated: one `gpu.k8s.allocation` series per GPU or MIG device
//!   and container, for the resources named in `resources` (NVIDIA's device plugin: GPU and
//!   MIG UUIDs; time-sliced replicas `UUID::N` are folded onto their GPU).
//! - The kubelet's pod log directory (`/var/log/pods/<namespace>_<name>_<uid>`) maps the pod
//!   UIDs that processes' cgroups carry to namespaces and names: every per-process series
//!   (NVML's process list, eBPF's driver calls) of a process in a pod then carries
//!   `k8s.namespace.name` and `k8s.pod.name` besides `k8s.pod.uid`.
//!
//! Off a Kubernetes node (neither the socket nor the pod directory at start-up) the source does
//! not run, so that the default configuration is right on every host; once the socket has been
//! seen, a failed `List` marks the source down.

pub mod proto;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::agent::{Component, Ctx};
use crate::config::{Config, Invalid, config_section};
use crate::internal_events::{InternalEvent, KubeletListFailed, PodLogsUnreadable};
use crate::model::processes::PodName;
use crate::model::{Metric, Model, Sample};

config_section! {
    /// `[sources.kubernetes]`
    pub struct KubernetesConfig {
        /// Read the kubelet's pod-resources socket and pod directory when either exists at
        /// start-up (off Kubernetes the source does not run and reports nothing).
        pub enabled: bool = true,
        /// The kubelet's pod-resources socket (mount it read-only into the container).
        pub pod_resources_socket: String = "/var/lib/kubelet/pod-resources/kubelet.sock".into(),
        /// The kubelet's pod log directory, whose entries `<namespace>_<name>_<uid>` name the
        /// pods that processes' cgroups give only by UID; "" turns the naming off.
        pub pod_logs_dir: String = "/var/log/pods".into(),
        /// Resource-name prefixes that are GPUs.
        pub resources: Vec<String> = vec!["nvidia.com/".to_string()],
        /// Seconds between reads.
        pub interval_secs: u64 = 15,
        /// Seconds a `List` call may take.
        pub timeout_secs: u64 = 5,
        /// At most this many allocation series (the rest are counted in the log).
        pub max_allocations: u32 = 1024,
    }
}

/// At most this many pod names are kept.
const MAX_PODS: usize = 8192;

impl KubernetesConfig {
    /// Adds every problem with this section to `out`.
    pub fn validate(&self, prefix: &str, out: &mut Vec<Invalid>) {
        if !self.enabled {
            return;
        }
        if !Path::new(&self.pod_resources_socket).is_absolute() {
            out.push(Invalid {
                key: format!("{prefix}.pod_resources_socket"),
                message: format!(
                    "{:?} is not an absolute path (the kubelet's is /var/lib/kubelet/pod-resources/kubelet.sock)",
                    self.pod_resources_socket
                ),
            });
        }
        if self.interval_secs == 0 || self.timeout_secs == 0 {
            out.push(Invalid {
                key: format!("{prefix}.interval_secs"),
                message: "interval_secs and timeout_secs must be at least 1".into(),
            });
        }
        if self.resources.iter().any(String::is_empty) {
            out.push(Invalid {
                key: format!("{prefix}.resources"),
                message:
                    "an empty prefix would match every resource: name them, e.g. \"nvidia.com/\""
                        .into(),
            });
        }
    }
}

/// The kubernetes source.
pub const COMPONENT: Component = Component {
    name: "kubernetes",
    // Only on a Kubernetes node: the kubelet (which starts Junction's pod) has made its socket
    // or pod directory by then.
    enabled: |c| {
        let k = &c.sources.kubernetes;
        k.enabled
            && (Path::new(&k.pod_resources_socket).exists()
                || (!k.pod_logs_dir.is_empty() && Path::new(&k.pod_logs_dir).is_dir()))
    },
    start: |c, ctx| Box::pin(start(c, ctx)),
    once: Some(|c, model| Box::pin(once(c, model))),
    inspect: None,
    derive: None,
    off_but_asked: None,
};

/// One device allocated to one container.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Allocation {
    /// The device id, replica suffix removed (a GPU or MIG UUID for NVIDIA's plugin).
    pub device: String,
    /// The resource name.
    pub resource: String,
    /// `k8s.namespace.name`.
    pub namespace: String,
    /// `k8s.pod.name`.
    pub pod: String,
    /// `k8s.container.name`.
    pub container: String,
}

/// The GPU allocations in a `List` answer (deduplicated: time-sliced replicas of one GPU
/// given to one container count once).
pub fn allocations(
    answer: &proto::ListPodResourcesResponse,
    prefixes: &[String],
) -> Vec<Allocation> {
    let mut out = BTreeSet::new();
    for pod in &answer.pod_resources {
        for c in &pod.containers {
            for d in &c.devices {
                if !prefixes
                    .iter()
                    .any(|p| d.resource_name.starts_with(p.as_str()))
                {
                    continue;
                }
                for id in &d.device_ids {
                    // NVIDIA's device plugin names time-sliced replicas `<UUID>::<n>`
                    // (NewAnnotatedID, internal/rm/devices.go in NVIDIA/k8s-device-plugin).
                    let device = id.split("::").next().unwrap_or(id).to_string();
                    out.insert(Allocation {
                        device,
                        resource: d.resource_name.clone(),
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: c.name.clone(),
                    });
                }
            }
        }
    }
    out.into_iter().collect()
}

/// Pod names by UID from the kubelet's pod log directory (`<namespace>_<name>_<uid>`:
/// namespaces and names are DNS labels / subdomains, so they hold no underscore).
pub fn pod_names(dir: &Path) -> std::io::Result<HashMap<String, PodName>> {
    let mut out = HashMap::new();
    for e in std::fs::read_dir(dir)?.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let mut parts = name.splitn(3, '_');
        let (Some(ns), Some(pod), Some(uid)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if ns.is_empty() || pod.is_empty() || uid.is_empty() {
            continue;
        }
        out.insert(
            uid.to_string(),
            PodName {
                namespace: ns.to_string(),
                name: pod.to_string(),
            },
        );
        if out.len() >= MAX_PODS {
            break;
        }
    }
    Ok(out)
}

/// Connects to the kubelet's socket.
async fn connect(socket: PathBuf, timeout: Duration) -> Result<tonic::transport::Channel, String> {
    // The URI is required by the API and unused: the connector dials the socket.
    let endpoint = tonic::transport::Endpoint::from_static("http://kubelet.pod-resources")
        .connect_timeout(timeout)
        .timeout(timeout);
    endpoint
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(&socket).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|e| {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg = format!("{msg}: {s}");
                src = s.source();
            }
            msg
        })
}

/// Why a `List` failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ListError {
    /// The socket does not answer.
    #[error("{0}")]
    Connect(String),
    /// The kubelet answered with an error.
    #[error("List answered {0:?}: {1}")]
    Status(tonic::Code, String),
    /// No answer in time.
    #[error("no answer to List within {0} s")]
    Timeout(u64),
}

impl ListError {
    /// Every `error.type` [`ListError::kind`] gives.
    pub const KINDS: [&'static str; 3] = ["connect", "status", "timeout"];

    /// `error.type`.
    pub fn kind(&self) -> &'static str {
        match self {
            ListError::Connect(_) => "connect",
            ListError::Status(..) => "status",
            ListError::Timeout(_) => "timeout",
        }
    }
}

/// One `List`: the allocations, or why not.
pub async fn list(
    socket: &Path,
    timeout: Duration,
) -> Result<proto::ListPodResourcesResponse, ListError> {
    let channel = connect(socket.to_path_buf(), timeout)
        .await
        .map_err(ListError::Connect)?;
    match tokio::time::timeout(timeout, proto::list(channel)).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(status)) => Err(ListError::Status(
            status.code(),
            status.message().to_string(),
        )),
        Err(_) => Err(ListError::Timeout(timeout.as_secs())),
    }
}

/// With the device plugin's `deviceIDStrategy: index`, device ids are NVML indexes ("3"):
/// those of the GPUs in `gpus` (index, UUID) become their UUIDs, so that `hw.id` joins with the
/// GPU's series. MIG ids in that strategy ("3:1") are left as they are.
pub fn uuids_for_indexes(allocs: &mut [Allocation], gpus: &[(u32, String)]) {
    for a in allocs.iter_mut() {
        if let Ok(i) = a.device.parse::<u32>()
            && let Some((_, uuid)) = gpus.iter().find(|(g, _)| *g == i)
        {
            a.device = uuid.clone();
        }
    }
}

fn samples(allocs: &[Allocation], cap: usize) -> Vec<Sample> {
    allocs
        .iter()
        .take(cap)
        .map(|a| {
            Sample::new(Metric::PodGpuAllocation, 1.0)
                .with("hw.id", a.device.clone())
                .with("k8s.namespace.name", a.namespace.clone())
                .with("k8s.pod.name", a.pod.clone())
                .with("k8s.container.name", a.container.clone())
                .with("gpu.resource.name", a.resource.clone())
        })
        .collect()
}

/// What the last read left to say.
#[derive(Default)]
struct State {
    socket_seen: bool,
    /// Why the last `List` failed (for `junction once`, and to say when it answers again).
    last_error: Option<String>,
    capped: bool,
}

async fn poll(cfg: &KubernetesConfig, model: &Model, state: &mut State) {
    // Pod names first: they do not need the kubelet to answer.
    if !cfg.pod_logs_dir.is_empty() {
        // Directory reads are blocking I/O: off the async workers.
        let dir = PathBuf::from(&cfg.pod_logs_dir);
        let read = tokio::task::spawn_blocking(move || pod_names(&dir))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        match read {
            Ok(names) => model.processes.set_pod_names(names),
            // Said only on a Kubernetes node (where the socket has been seen).
            Err(e) if state.socket_seen => PodLogsUnreadable {
                dir: &cfg.pod_logs_dir,
                error: &e,
            }
            .emit(model),
            Err(_) => {}
        }
    }
    let socket = Path::new(&cfg.pod_resources_socket);
    if !socket.exists() {
        if state.socket_seen {
            // The kubelet restarts: down until it is back.
            model.set_source_up("kubernetes", false);
        }
        return;
    }
    if !state.socket_seen {
        tracing::info!(socket = %socket.display(), "reading GPU allocations from the kubelet");
        state.socket_seen = true;
    }
    match list(socket, Duration::from_secs(cfg.timeout_secs.max(1))).await {
        Ok(answer) => {
            let mut allocs = allocations(&answer, &cfg.resources);
            let gpus: Vec<(u32, String)> = model
                .snapshot()
                .into_iter()
                .map(|g| (g.info.index, g.info.uuid.clone()))
                .collect();
            uuids_for_indexes(&mut allocs, &gpus);
            let cap = cfg.max_allocations as usize;
            if allocs.len() > cap && !state.capped {
                tracing::warn!(
                    allocations = allocs.len(),
                    max_allocations = cap,
                    "more GPU allocations than sources.kubernetes.max_allocations: the rest are not exported"
                );
            }
            state.capped = allocs.len() > cap;
            if state.last_error.take().is_some() {
                tracing::info!("the kubelet answers again");
                // Its next failure is news again, whatever the limiter's window.
                for error_type in ListError::KINDS {
                    let failed = KubeletListFailed {
                        socket,
                        error_type,
                        error: "",
                    };
                    crate::internal_events::recovered(&failed.key());
                }
            }
            model.publish("kubernetes", "allocations", samples(&allocs, cap));
            model.set_source_detail(
                "kubernetes",
                vec![format!(
                    "{} GPU allocation(s) from {}",
                    allocs.len(),
                    socket.display()
                )],
            );
            model.set_source_up("kubernetes", true);
        }
        Err(e) => {
            let error = e.to_string();
            KubeletListFailed {
                socket,
                error_type: e.kind(),
                error: &error,
            }
            .emit(model);
            state.last_error = Some(error);
            // The last known allocations are dropped: a stale pod on a GPU misleads.
            model.publish("kubernetes", "allocations", Vec::new());
            model.set_source_detail("kubernetes", vec![format!("{}: {e}", socket.display())]);
            model.set_source_up("kubernetes", false);
        }
    }
}

async fn start(config: Arc<Config>, ctx: Ctx) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let cfg = config.sources.kubernetes.clone();
    if !Path::new(&cfg.pod_resources_socket).exists() {
        tracing::debug!(socket = %cfg.pod_resources_socket, "no kubelet pod-resources socket: not a Kubernetes node (or not mounted)");
    }
    Ok(tokio::spawn(async move {
        let interval = Duration::from_secs(cfg.interval_secs.max(1));
        let mut state = State::default();
        crate::privileges::gate().await;
        let mut ticks = ctx.shutdown.ticks(interval);
        while ticks.next().await {
            if ctx
                .shutdown
                .unless(poll(&cfg, &ctx.model, &mut state))
                .await
                .is_none()
            {
                break;
            }
        }
    }))
}

async fn once(config: Arc<Config>, model: Arc<Model>) -> anyhow::Result<()> {
    let cfg = &config.sources.kubernetes;
    let mut state = State::default();
    poll(cfg, &model, &mut state).await;
    match state.last_error {
        Some(e) => anyhow::bail!("{e}"),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
