//! A whole Redfish walk against a BMC that serves the input: a JSON object of
//! `{"/redfish/v1/...": document}` (the seed corpus packs real trees so), or one document
//! served at every path. One loopback server and one model for the whole run.
#![no_main]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use junction::model::Model;
use junction::sources::redfish::RedfishTarget;
use junction::sources::redfish::client::Client;
use junction::sources::redfish::walk::walk;
use libfuzzer_sys::fuzz_target;

static TREE: LazyLock<Mutex<(HashMap<String, String>, Option<String>)>> =
    LazyLock::new(|| Mutex::new((HashMap::new(), None)));

fn answer(path: &str) -> (u16, String) {
    let tree = TREE.lock().unwrap_or_else(|e| e.into_inner());
    let path = path.split('?').next().unwrap_or(path).trim_end_matches('/');
    match tree.0.get(path).or(tree.1.as_ref()) {
        Some(doc) => (200, doc.clone()),
        None => (404, "{}".into()),
    }
}

static SERVER: LazyLock<u16> = LazyLock::new(|| {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let mut buf = vec![0u8; 16 * 1024];
            let n = c.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]).to_string();
            let path = req.split(' ').nth(1).unwrap_or("/").to_string();
            let (status, body) = answer(&path);
            let _ = c.write_all(
                format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        }
    });
    port
});

static RT: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
});

static CLIENT: LazyLock<Arc<Client>> = LazyLock::new(|| {
    junction::install_tls_provider();
    let t = RedfishTarget {
        url: format!("http://127.0.0.1:{}", *SERVER),
        timeout_secs: 2,
        ..RedfishTarget::default()
    };
    Arc::new(Client::new(&t, None).expect("client"))
});

static MODEL: LazyLock<Arc<Model>> = LazyLock::new(Model::new);

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    {
        let mut tree = TREE.lock().unwrap_or_else(|e| e.into_inner());
        tree.0.clear();
        tree.1 = None;
        match doc.as_object() {
            Some(m) if m.keys().any(|k| k.starts_with("/redfish/v1")) => {
                for (k, v) in m {
                    tree.0
                        .insert(k.trim_end_matches('/').to_string(), v.to_string());
                }
            }
            _ => tree.1 = Some(doc.to_string()),
        }
    }
    let client = CLIENT.clone();
    let model = MODEL.clone();
    RT.block_on(async move {
        let _ =
            tokio::time::timeout(Duration::from_secs(5), walk(client, "fuzz", true, model)).await;
    });
});
