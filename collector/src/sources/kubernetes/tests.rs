use super::proto::*;
use super::*;

fn devices(resource: &str, ids: &[&str]) -> ContainerDevices {
    ContainerDevices {
        resource_name: resource.into(),
        device_ids: ids.iter().map(|s| s.to_string()).collect(),
    }
}

#[test]
fn allocations_keep_gpus_fold_replicas_and_skip_other_resources() {
    let answer = ListPodResourcesResponse {
        pod_resources: vec![PodResources {
            name: "train-0".into(),
            namespace: "ml".into(),
            containers: vec![ContainerResources {
                name: "worker".into(),
                devices: vec![
                    devices("nvidia.com/gpu", &["GPU-a::0", "GPU-a::1", "GPU-b"]),
                    devices("nvidia.com/mig-1g.10gb", &["MIG-c"]),
                    devices("example.com/nic", &["eth9"]),
                ],
            }],
        }],
    };
    let got = allocations(&answer, &["nvidia.com/".to_string()]);
    let ids: Vec<&str> = got.iter().map(|a| a.device.as_str()).collect();
    assert_eq!(ids, ["GPU-a", "GPU-b", "MIG-c"]);
    assert!(
        got.iter()
            .all(|a| a.pod == "train-0" && a.container == "worker")
    );
}

#[test]
fn index_device_ids_become_the_gpus_uuids() {
    let answer = ListPodResourcesResponse {
        pod_resources: vec![PodResources {
            name: "p".into(),
            namespace: "n".into(),
            containers: vec![ContainerResources {
                name: "c".into(),
                devices: vec![devices("nvidia.com/gpu", &["1", "7::2", "0:1"])],
            }],
        }],
    };
    let mut got = allocations(&answer, &["nvidia.com/".to_string()]);
    uuids_for_indexes(&mut got, &[(0, "GPU-a".into()), (1, "GPU-b".into())]);
    let ids: Vec<&str> = got.iter().map(|a| a.device.as_str()).collect();
    // 7 is no GPU here: left as the plugin named it; a MIG index pair too.
    assert_eq!(ids, ["0:1", "GPU-b", "7"]);
}

#[test]
fn pod_names_from_the_log_directory() {
    let dir = std::env::temp_dir().join(format!("junction-pods-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for d in [
        "ml_train-0_0f6e1c2a-1b2c-4d5e-8f90-123456789abc",
        "kube-system_nvidia-device-plugin-x2x_11111111-2222-3333-4444-555555555555",
        "stray",
    ] {
        std::fs::create_dir_all(dir.join(d)).expect("mkdir");
    }
    let names = pod_names(&dir).expect("read");
    assert_eq!(names.len(), 2);
    assert_eq!(
        names["0f6e1c2a-1b2c-4d5e-8f90-123456789abc"],
        PodName {
            namespace: "ml".into(),
            name: "train-0".into()
        }
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_messages_decode_what_the_kubelet_encodes() {
    use prost::Message as _;
    // Encoded by hand from the proto: pod_resources { name "p" namespace "n" containers {
    // name "c" devices { resource_name "nvidia.com/gpu" device_ids "GPU-1" } cpu_ids 3 } }.
    let dev = [&[0x0a, 14][..], b"nvidia.com/gpu", &[0x12, 5], b"GPU-1"].concat();
    let container = [
        &[0x0a, 1][..],
        b"c",
        &[0x12, dev.len() as u8],
        &dev,
        &[0x18, 3],
    ]
    .concat();
    let pod = [
        &[0x0a, 1][..],
        b"p",
        &[0x12, 1],
        b"n",
        &[0x1a, container.len() as u8],
        &container,
    ]
    .concat();
    let msg = [&[0x0a, pod.len() as u8][..], &pod].concat();
    let answer = ListPodResourcesResponse::decode(msg.as_slice()).expect("decode");
    let got = allocations(&answer, &["nvidia.com/".to_string()]);
    assert_eq!(
        got,
        vec![Allocation {
            device: "GPU-1".into(),
            resource: "nvidia.com/gpu".into(),
            namespace: "n".into(),
            pod: "p".into(),
            container: "c".into(),
        }]
    );
}
