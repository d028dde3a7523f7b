use super::*;
use std::sync::atomic::{AtomicU32, Ordering};

static STARTS: AtomicU32 = AtomicU32::new(0);

/// A source whose first task panics; the next one runs until shutdown.
const PANICKY: crate::agent::Component = crate::agent::Component {
    name: "panicky",
    enabled: |_| true,
    start: |_, ctx| {
        Box::pin(async move {
            let n = STARTS.fetch_add(1, Ordering::SeqCst);
            ctx.model.set_source_up("panicky", true);
            Ok(tokio::spawn(async move {
                assert!(n > 0, "the first run panics");
                ctx.shutdown.wait().await;
            }))
        })
    },
    once: None,
    inspect: None,
    derive: None,
    off_but_asked: None,
};

static SINK_STARTS: AtomicU32 = AtomicU32::new(0);

/// A sink (it says nothing of its own state) whose first run's thread panics, the way
/// the OTLP sink's exporter threads are watched; the next run lasts until shutdown.
const PANICKY_SINK: crate::agent::Component = crate::agent::Component {
    name: "panicky-sink",
    enabled: |_| true,
    start: |_, ctx| {
        Box::pin(async move {
            let n = SINK_STARTS.fetch_add(1, Ordering::SeqCst);
            let panics = crate::agent::ThreadPanics::default();
            let (go, wait) = std::sync::mpsc::channel::<()>();
            panics.spawn("exporter", move || {
                let _ = wait.recv();
                assert!(n > 0, "the first exporter panics");
            })?;
            Ok(tokio::spawn(async move {
                let _ = go.send(());
                if let Some(why) = ctx.shutdown.unless(panics.first()).await {
                    panic!("{why}");
                }
            }))
        })
    },
    once: None,
    inspect: None,
    derive: None,
    off_but_asked: None,
};

/// A sink whose thread panics is reported down with the thread's panic, started again,
/// and up once it has started: before, a sink's task was not watched, and an exporter
/// thread that died left nothing but a stale `junction_sink_last_success`.
// Its own runtime's threads are not named `junction-rt`, which the pool test counts.
#[tokio::test]
async fn a_sink_whose_thread_panics_is_reported_and_restarted() {
    let model = Model::new();
    let ctx = Ctx {
        model: model.clone(),
        shutdown: Shutdown::default(),
    };
    let config = Arc::new(Config::default());
    let first = (PANICKY_SINK.start)(config.clone(), ctx.clone())
        .await
        .expect("start");
    assert_eq!(
        model.sources().get("panicky-sink"),
        None,
        "no series before"
    );
    let watch = supervise(&PANICKY_SINK, Kind::Sink, config, ctx.clone(), first);
    let mut saw_down = false;
    for _ in 0..100 {
        if model.sources().get("panicky-sink") == Some(&false) {
            saw_down = true;
            let detail = model.source_details()["panicky-sink"].join(" ");
            assert!(
                detail.contains("thread exporter: the first exporter panics"),
                "{detail}"
            );
        }
        if model.sources().get("panicky-sink") == Some(&true) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(saw_down, "reported down");
    assert_eq!(SINK_STARTS.load(Ordering::SeqCst), 2, "restarted once");
    assert_eq!(model.sources().get("panicky-sink"), Some(&true), "up again");
    let detail = model.source_details()["panicky-sink"].join(" ");
    assert!(detail.contains("restarted 1 time(s)"), "{detail}");
    // Counted, so that one panicking again and again shows.
    let key = crate::internal_events::Key {
        source: "panicky-sink",
        stage: "task",
        error_type: "panic",
        subject: crate::internal_events::Subject::Node,
    };
    assert_eq!(model.errors.get(&key), 1);
    ctx.shutdown.trigger();
    tokio::time::timeout(std::time::Duration::from_secs(5), watch)
        .await
        .expect("the supervisor stops at shutdown")
        .expect("no panic");
}

/// Blocking work beyond the pool's bound waits for a thread instead of starting one: the
/// agent's threads (and the stacks glibc keeps for them) do not grow with a burst.
#[test]
fn the_blocking_pool_is_bounded() {
    let rt = runtime().expect("runtime");
    let most = rt.block_on(async {
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                tokio::task::spawn_blocking(|| {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                })
            })
            .collect();
        let mut most = 0;
        for _ in 0..10 {
            let named = std::fs::read_dir("/proc/self/task")
                .expect("tasks")
                .flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "junction-rt")
                })
                .count();
            most = most.max(named);
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        for t in tasks {
            t.await.expect("task");
        }
        most
    });
    // Two workers and the blocking pool, full (64 tasks, each a pool's worth of time).
    assert!(
        (crate::agent::BLOCKING_THREADS + 1..=crate::agent::BLOCKING_THREADS + 2).contains(&most),
        "{most} threads named junction-rt"
    );
}

/// A source that panics is reported down with the panic, and started again.
// Its own runtime's threads are not named `junction-rt`, which the pool test counts.
#[tokio::test]
async fn a_panicking_source_is_reported_and_restarted() {
    let model = Model::new();
    let ctx = Ctx {
        model: model.clone(),
        shutdown: Shutdown::default(),
    };
    let config = Arc::new(Config::default());
    let first = (PANICKY.start)(config.clone(), ctx.clone())
        .await
        .expect("start");
    let watch = supervise(&PANICKY, Kind::Source, config, ctx.clone(), first);
    let mut saw_down = false;
    for _ in 0..100 {
        if model.sources().get("panicky") == Some(&false) {
            saw_down = true;
            let detail = model.source_details()["panicky"].join(" ");
            assert!(detail.contains("the first run panics"), "{detail}");
        }
        if STARTS.load(Ordering::SeqCst) == 2 && model.sources()["panicky"] {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(saw_down, "reported down");
    assert_eq!(STARTS.load(Ordering::SeqCst), 2, "restarted once");
    assert!(model.sources()["panicky"], "up again");
    ctx.shutdown.trigger();
    tokio::time::timeout(std::time::Duration::from_secs(5), watch)
        .await
        .expect("the supervisor stops at shutdown")
        .expect("no panic");
}
