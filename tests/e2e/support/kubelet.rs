//! A kubelet pod-resources server inside the tests: `v1.PodResourcesLister/List` over gRPC
//! on a unix socket (tonic's server, a hand-written service as tonic's generated code would
//! be), answering what the test sets: an answer, or an error status.
//!
//! The messages are written here from the kubelet's `api.proto` on their own (not shared with
//! Junction's client), so the test checks the wire format and not one copy against itself.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;

/// `ListPodResourcesRequest {}`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListRequest {}

/// `ListPodResourcesResponse { repeated PodResources pod_resources = 1; }`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListResponse {
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

/// `PodResources`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

/// `ContainerResources` (with `cpu_ids`, which Junction does not read).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
    #[prost(int64, repeated, tag = "3")]
    pub cpu_ids: Vec<i64>,
}

/// `ContainerDevices` (with its `TopologyInfo`, as the kubelet sends it).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerDevices {
    #[prost(string, tag = "1")]
    pub resource_name: String,
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
    #[prost(message, optional, tag = "3")]
    pub topology: Option<TopologyInfo>,
}

/// `TopologyInfo { repeated NUMANode nodes = 1; }`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TopologyInfo {
    #[prost(message, repeated, tag = "1")]
    pub nodes: Vec<NumaNode>,
}

/// `NUMANode { int64 ID = 1; }`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NumaNode {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// One pod with one container holding `devices` of `resource`.
pub fn pod(
    namespace: &str,
    name: &str,
    container: &str,
    resource: &str,
    devices: &[&str],
) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers: vec![ContainerResources {
            name: container.into(),
            devices: vec![ContainerDevices {
                resource_name: resource.into(),
                device_ids: devices.iter().map(|d| d.to_string()).collect(),
                topology: Some(TopologyInfo {
                    nodes: vec![NumaNode { id: 0 }],
                }),
            }],
            cpu_ids: vec![2, 3],
        }],
    }
}

type Answer = Result<ListResponse, (tonic::Code, String)>;

#[derive(Clone)]
struct Lister(Arc<Mutex<Answer>>);

impl NamedService for Lister {
    const NAME: &'static str = "v1.PodResourcesLister";
}

struct ListMethod(Arc<Mutex<Answer>>);

impl tonic::server::UnaryService<ListRequest> for ListMethod {
    type Response = ListResponse;
    type Future = std::future::Ready<Result<tonic::Response<ListResponse>, tonic::Status>>;
    fn call(&mut self, _: tonic::Request<ListRequest>) -> Self::Future {
        let answer = self.0.lock().expect("answer").clone();
        std::future::ready(
            answer
                .map(tonic::Response::new)
                .map_err(|(code, msg)| tonic::Status::new(code, msg)),
        )
    }
}

impl tower::Service<http::Request<Body>> for Lister {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>,
    >;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let answer = self.0.clone();
        Box::pin(async move {
            if req.uri().path() != "/v1.PodResourcesLister/List" {
                return Ok(tonic::Status::unimplemented(req.uri().path().to_string()).into_http());
            }
            let codec = tonic_prost::ProstCodec::<ListResponse, ListRequest>::default();
            let mut grpc = tonic::server::Grpc::new(codec);
            Ok(grpc.unary(ListMethod(answer), req).await)
        })
    }
}

/// A running fake kubelet; stops (and removes its socket) on drop.
pub struct Kubelet {
    pub socket: PathBuf,
    answer: Arc<Mutex<Answer>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Kubelet {
    /// Serves on `socket`.
    pub fn start(socket: &Path) -> Kubelet {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let answer: Arc<Mutex<Answer>> = Arc::new(Mutex::new(Ok(ListResponse::default())));
        let _ = std::fs::remove_file(socket);
        let listener = rt
            .block_on(async { tokio::net::UnixListener::bind(socket) })
            .expect("bind the socket");
        let svc = Lister(answer.clone());
        rt.spawn(async move {
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(incoming)
                .await;
        });
        Kubelet {
            socket: socket.to_path_buf(),
            answer,
            rt: Some(rt),
        }
    }

    /// Answers `List` with these pods from now on.
    pub fn set_pods(&self, pods: Vec<PodResources>) {
        *self.answer.lock().expect("answer") = Ok(ListResponse {
            pod_resources: pods,
        });
    }

    /// Fails `List` with this status from now on.
    pub fn fail(&self, code: tonic::Code, message: &str) {
        *self.answer.lock().expect("answer") = Err((code, message.to_string()));
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}
