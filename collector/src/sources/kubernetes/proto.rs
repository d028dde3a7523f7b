//! The kubelet pod-resources API, v1 (`k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`,
//! package `v1`, service `PodResourcesLister`): the messages `List` uses, written with prost's
//! derive (the tags are the proto's), and a unary client over tonic.
//!
//! Only `List` is used: it is GA since Kubernetes 1.28 (beta, on by default, since 1.15), and
//! `GetAllocatableResources` / `Get` add nothing Junction needs. Fields Junction does not read
//! (CPU ids, memory, dynamic resources) are left out; prost skips unknown fields.

use tonic::codegen::http::uri::PathAndQuery;

/// `ListPodResourcesRequest {}`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesRequest {}

/// `ListPodResourcesResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesResponse {
    /// `repeated PodResources pod_resources = 1`.
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

/// `PodResources`: one pod.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodResources {
    /// `string name = 1`.
    #[prost(string, tag = "1")]
    pub name: String,
    /// `string namespace = 2`.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// `repeated ContainerResources containers = 3`.
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

/// `ContainerResources`: one container of a pod.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    /// `string name = 1`.
    #[prost(string, tag = "1")]
    pub name: String,
    /// `repeated ContainerDevices devices = 2`.
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
}

/// `ContainerDevices`: the devices of one resource allocated to a container.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerDevices {
    /// `string resource_name = 1`, e.g. `nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`.
    #[prost(string, tag = "1")]
    pub resource_name: String,
    /// `repeated string device_ids = 2`: what the device plugin calls them (GPU or MIG UUIDs
    /// for NVIDIA's plugin; `UUID::N` replicas when GPUs are time-sliced).
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
}

/// The gRPC method path.
pub const LIST: &str = "/v1.PodResourcesLister/List";

/// Calls `List` on a connected channel.
pub async fn list(
    channel: tonic::transport::Channel,
) -> Result<ListPodResourcesResponse, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("kubelet not ready: {e}")))?;
    let codec =
        tonic_prost::ProstCodec::<ListPodResourcesRequest, ListPodResourcesResponse>::default();
    let answer = grpc
        .unary(
            tonic::Request::new(ListPodResourcesRequest {}),
            PathAndQuery::from_static(LIST),
            codec,
        )
        .await?;
    Ok(answer.into_inner())
}
