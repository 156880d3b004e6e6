//! Raft layer tests: storage, crash recovery, snapshots, and clusters over real gRPC on 127.0.0.1:0.
//!
//! Nothing here sleeps to synchronise: every wait polls a condition under a deadline.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::testing::log_id;
use openraft::{Entry, EntryPayload, RaftLogReader, Vote};
use redb::{Database, TableDefinition};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

use super::log_store::LogStore;
use super::network::{PeerPool, never_sent};
use super::rpc::{InfoRequest, JoinRequest, RaftClient, VoteArgs};
use super::{RaftConfig, RaftError, RaftNode, TypeConfig};
use crate::fsm::{ApplyResult, Command, Fsm};
use crate::rpc_auth::{ClusterAuth, ClusterKey, RpcAuthLayer, Stamp};
use crate::test_support::wait_until as wait_for;
use tonic::service::interceptor::InterceptedService;

/// How long any awaited condition may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(30);

/// Records every applied command with its index; snapshots are that list as JSON.
#[derive(Default)]
struct TestFsm {
    applied: Mutex<Vec<(u64, Command)>>,
    restores: AtomicUsize,
}

impl TestFsm {
    fn entries(&self) -> Vec<(u64, Command)> {
        self.applied.lock().unwrap().clone()
    }

    fn restores(&self) -> usize {
        self.restores.load(Ordering::SeqCst)
    }
}

impl Fsm for TestFsm {
    fn apply(&self, index: u64, cmd: Command) -> ApplyResult {
        self.applied.lock().unwrap().push((index, cmd));
        ApplyResult::ok()
    }

    fn snapshot(&self) -> Result<Vec<u8>, String> {
        serde_json::to_vec(&*self.applied.lock().unwrap()).map_err(|e| e.to_string())
    }

    fn restore(&self, data: &[u8]) -> Result<(), String> {
        *self.applied.lock().unwrap() = serde_json::from_slice(data).map_err(|e| e.to_string())?;
        self.restores.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn command(n: usize) -> Command {
    Command::EvalDelete { eval_ids: vec![format!("eval-{n}")], alloc_ids: Vec::new() }
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).try_init();
}

/// The cluster key every test server of this process shares.
fn test_auth() -> Arc<ClusterAuth> {
    static AUTH: std::sync::OnceLock<Arc<ClusterAuth>> = std::sync::OnceLock::new();
    AUTH.get_or_init(|| ClusterAuth::new(ClusterKey::generate(), "global")).clone()
}

/// Test timings: fast elections, but loose enough for a busy 2-core machine.
fn config(dir: &Path, addr: &str) -> RaftConfig {
    RaftConfig {
        heartbeat_interval_ms: 150,
        election_timeout_min_ms: 800,
        election_timeout_max_ms: 1600,
        apply_timeout_ms: 15_000,
        ..RaftConfig::new(dir, addr, test_auth())
    }
}

/// A single server is never contacted, so it advertises an address nothing listens on.
const UNUSED_ADDR: &str = "127.0.0.1:0";

/// A runtime of its own, so dropping it kills every Raft task mid-flight like a crash.
fn crashable_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

async fn apply_all(node: &RaftNode, commands: impl IntoIterator<Item = usize>) -> Vec<(u64, Command)> {
    let mut applied = Vec::new();
    for n in commands {
        let (index, result) = node.apply(command(n)).await.unwrap();
        assert_eq!(result, ApplyResult::ok());
        applied.push((index, command(n)));
    }
    applied
}

#[test]
fn single_server_rebuilds_fsm_from_log_after_crash() {
    init_tracing();
    let dir = TempDir::new().unwrap();
    let before = Arc::new(TestFsm::default());

    let runtime = crashable_runtime();
    let written = runtime.block_on(async {
        let node = RaftNode::start(config(dir.path(), UNUSED_ADDR), before.clone()).await.unwrap();
        apply_all(&node, 0..20).await
    });
    drop(runtime); // crash: no shutdown, tasks dropped wherever they were

    assert!(written.windows(2).all(|w| w[0].0 < w[1].0), "indexes increase: {written:?}");
    assert_eq!(before.entries(), written, "the fsm saw every write, in order, at its index");

    let after = Arc::new(TestFsm::default());
    let runtime = crashable_runtime();
    runtime.block_on(async {
        let node = RaftNode::start(config(dir.path(), UNUSED_ADDR), after.clone()).await.unwrap();
        // Rebuilt by the time start() returns, without any new write.
        assert_eq!(after.entries(), written);
        assert_eq!(after.restores(), 0, "no snapshot was taken, so it all came from the log");

        let (index, _) = node.apply(command(99)).await.unwrap();
        assert!(index > written.last().unwrap().0, "new writes continue the log");
        node.shutdown().await;
    });
}

#[test]
fn snapshot_purges_log_and_restart_restores_snapshot_plus_trailing_log() {
    init_tracing();
    let dir = TempDir::new().unwrap();
    let cfg = RaftConfig { snapshot_logs: 10, ..config(dir.path(), UNUSED_ADDR) };
    let before = Arc::new(TestFsm::default());

    let runtime = crashable_runtime();
    let written = runtime.block_on(async {
        let node = RaftNode::start(cfg.clone(), before.clone()).await.unwrap();
        let written = apply_all(&node, 0..45).await;
        let metrics = node.metrics();
        wait_for("a snapshot and a log purge", || {
            let m = metrics.borrow();
            m.snapshot.is_some_and(|s| s.index >= 30) && m.purged.is_some()
        })
        .await;
        // Trailing entries after the snapshot, so the restart needs both.
        let mut written = written;
        written.extend(apply_all(&node, 45..48).await);
        written
    });
    drop(runtime);

    let after = Arc::new(TestFsm::default());
    let runtime = crashable_runtime();
    runtime.block_on(async {
        let node = RaftNode::start(cfg, after.clone()).await.unwrap();
        assert_eq!(after.restores(), 1, "started from the snapshot");
        assert_eq!(after.entries(), written, "snapshot plus trailing log rebuild the same state");
        let purged = node.metrics().borrow().purged.expect("the log was purged");
        assert!(purged.index > 1, "the log alone could not have rebuilt the state");
        node.shutdown().await;
    });
}

#[tokio::test]
async fn corrupt_snapshot_fails_start_with_a_clear_error() {
    init_tracing();
    let dir = TempDir::new().unwrap();
    let node = RaftNode::start(config(dir.path(), UNUSED_ADDR), Arc::new(TestFsm::default())).await.unwrap();
    apply_all(&node, 0..3).await;
    node.shared.raft.trigger().snapshot().await.unwrap();
    let metrics = node.metrics();
    wait_for("a snapshot", || metrics.borrow().snapshot.is_some()).await;
    node.shutdown().await;

    let path = dir.path().join("raft/snapshots/current.snap");
    let mut bytes = std::fs::read(&path).unwrap();
    *bytes.last_mut().unwrap() ^= 0xff;
    std::fs::write(&path, bytes).unwrap();

    let err = RaftNode::start(config(dir.path(), UNUSED_ADDR), Arc::new(TestFsm::default())).await.err().unwrap();
    assert!(matches!(err, RaftError::Snapshot(_)), "{err}");
    assert!(err.to_string().contains("checksum mismatch"), "{err}");
}

#[tokio::test]
async fn corrupt_log_entry_fails_start_with_a_clear_error() {
    init_tracing();
    let dir = TempDir::new().unwrap();
    let node = RaftNode::start(config(dir.path(), UNUSED_ADDR), Arc::new(TestFsm::default())).await.unwrap();
    let written = apply_all(&node, 0..3).await;
    node.shutdown().await;
    drop(node);

    let db = Database::create(dir.path().join("raft/raft.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    let logs: TableDefinition<u64, &[u8]> = TableDefinition::new("logs");
    txn.open_table(logs).unwrap().insert(written.last().unwrap().0, b"not json".as_slice()).unwrap();
    txn.commit().unwrap();
    drop(db);

    let err = RaftNode::start(config(dir.path(), UNUSED_ADDR), Arc::new(TestFsm::default())).await.err().unwrap();
    assert!(matches!(err, RaftError::Storage(_)), "{err}");
    assert!(err.to_string().contains("decoding log entry"), "{err}");
}

#[tokio::test]
async fn a_zeroed_log_tail_fails_open_with_a_clear_error_not_a_panic() {
    let big_entry = |index| Entry::<TypeConfig> {
        log_id: log_id(1, 7, index),
        payload: EntryPayload::Normal(std::sync::Arc::new(Command::EvalDelete {
            eval_ids: (0..200).map(|n| format!("eval-{index}-{n}")).collect(),
            alloc_ids: Vec::new(),
        })),
    };
    // The tail a crash or a full disk can leave: the last KBs of the file zeroed.
    let mut refused = 0;
    for zeroed_kb in [4, 32, 256] {
        let dir = TempDir::new().unwrap();
        let path = dir.path().join("raft.redb");
        {
            let mut store = LogStore::open(&path).unwrap();
            store.blocking_append((1..=300).map(big_entry)).await.unwrap();
            store.save_vote(&Vote::new(1, 7)).await.unwrap();
        }
        let len = std::fs::metadata(&path).unwrap().len();
        let zeroed = (zeroed_kb * 1024).min(len);
        {
            use std::io::{Seek, SeekFrom, Write};
            let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            file.seek(SeekFrom::Start(len - zeroed)).unwrap();
            file.write_all(&vec![0; zeroed as usize]).unwrap();
            file.sync_all().unwrap();
        }

        let err = match LogStore::open(&path) {
            Err(err) => err,
            // redb may find the zeroed pages unused (free space at the end): then the log must read back whole.
            Ok(mut store) => {
                let entries = store.try_get_log_entries(..).await.expect("an opened store reads back");
                assert_eq!(entries.len(), 300, "zeroing {zeroed_kb} KB lost entries without an error");
                continue;
            }
        };
        refused += 1;
        let message = err.to_string();
        assert!(matches!(err, RaftError::Storage(_)), "{message}");
        assert!(message.contains(&path.display().to_string()), "names the file: {message}");
        assert!(message.contains("is corrupt"), "says it is corrupt: {message}");
        assert!(message.contains("Move the file aside"), "says what to do: {message}");
    }
    assert!(refused > 0, "no zeroed tail hit the log's pages: the test does not test anything");
}

#[tokio::test]
async fn log_store_truncates_purges_and_persists() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("raft.redb");
    let entry = |index| Entry::<TypeConfig> {
        log_id: log_id(1, 7, index),
        payload: EntryPayload::Normal(std::sync::Arc::new(command(index as usize))),
    };
    let indexes = |entries: Vec<Entry<TypeConfig>>| entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>();
    {
        let mut store = LogStore::open(&path).unwrap();
        store.blocking_append((1..=10).map(entry)).await.unwrap();
        store.truncate(log_id(1, 7, 8)).await.unwrap();
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(log_id(1, 7, 7)), "truncate removes 8.. inclusive");

        store.purge(log_id(1, 7, 3)).await.unwrap();
        store.save_vote(&Vote::new(2, 7)).await.unwrap();
        store.save_committed(Some(log_id(1, 7, 6))).await.unwrap();
    }
    let mut store = LogStore::open(&path).unwrap();
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 7, 3)));
    assert_eq!(state.last_log_id, Some(log_id(1, 7, 7)));
    assert_eq!(indexes(store.try_get_log_entries(0..100).await.unwrap()), vec![4, 5, 6, 7]);
    assert_eq!(indexes(store.try_get_log_entries(5..7).await.unwrap()), vec![5, 6]);
    assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(2, 7)));
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 7, 6)));

    // Purging past the last entry (a snapshot from the leader) leaves the pointer as the last log id.
    store.purge(log_id(2, 7, 20)).await.unwrap();
    let state = store.get_log_state().await.unwrap();
    assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(log_id(2, 7, 20)), Some(log_id(2, 7, 20))));
    assert!(store.try_get_log_entries(0..100).await.unwrap().is_empty());

    store.save_committed(None).await.unwrap();
    drop(store);
    let mut store = LogStore::open(&path).expect("an unset committed pointer is valid");
    assert_eq!(store.read_committed().await.unwrap(), None);
}

#[tokio::test]
async fn entries_are_read_from_memory_until_applied_then_from_disk() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("raft.redb");
    let entry = |term, index| Entry::<TypeConfig> {
        log_id: log_id(term, 7, index),
        payload: EntryPayload::Normal(std::sync::Arc::new(command(index as usize))),
    };
    let ids = |entries: Vec<Entry<TypeConfig>>| entries.iter().map(|e| (e.log_id.leader_id.term, e.log_id.index)).collect::<Vec<_>>();
    {
        let mut store = LogStore::open(&path).unwrap();
        let unapplied = store.unapplied();
        store.blocking_append((1..=5).map(|i| entry(1, i))).await.unwrap();
        assert_eq!(ids(store.try_get_log_entries(1..=5).await.unwrap()), [(1, 1), (1, 2), (1, 3), (1, 4), (1, 5)]);

        // Applied entries leave memory; reads join disk and memory.
        for i in 1..=3 {
            unapplied.applying(&log_id(1, 7, i));
        }
        assert_eq!(ids(store.try_get_log_entries(2..).await.unwrap()), [(1, 2), (1, 3), (1, 4), (1, 5)]);

        // A new leader's entries replace a truncated tail, in memory and on disk.
        store.truncate(log_id(1, 7, 4)).await.unwrap();
        store.blocking_append([entry(2, 4)]).await.unwrap();
        assert_eq!(ids(store.try_get_log_entries(..).await.unwrap()), [(1, 1), (1, 2), (1, 3), (2, 4)]);
        assert_eq!(store.get_log_state().await.unwrap().last_log_id, Some(log_id(2, 7, 4)));
    }
    let mut store = LogStore::open(&path).expect("the writer released the database");
    assert_eq!(ids(store.try_get_log_entries(..).await.unwrap()), [(1, 1), (1, 2), (1, 3), (2, 4)], "all of it was on disk");
}

#[tokio::test]
async fn write_without_a_leader_fails_within_the_apply_timeout() {
    init_tracing();
    let dir = TempDir::new().unwrap();
    // Expects three servers but knows of none: it never forms a cluster, so there is never a leader.
    let cfg = RaftConfig { bootstrap_expect: 3, apply_timeout_ms: 300, ..config(dir.path(), UNUSED_ADDR) };
    let node = RaftNode::start(cfg, Arc::new(TestFsm::default())).await.unwrap();

    let started = tokio::time::Instant::now();
    let outcome = tokio::time::timeout(DEADLINE, node.apply(command(1))).await.expect("apply must not hang");
    let err = outcome.expect_err("no leader, no write");
    assert!(matches!(err, RaftError::NoLeader), "{err}");
    assert_eq!(err.to_string(), "no cluster leader");
    assert!(started.elapsed() >= Duration::from_millis(300), "it waited the apply timeout for a leader");
    node.shutdown().await;
}

#[tokio::test]
async fn refused_connection_counts_as_never_sent() {
    // Reserve a port, then free it: nothing listens there.
    let addr = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().to_string();
    let status = PeerPool::new(test_auth()).client(&addr).unwrap().info(InfoRequest {}).await.err().unwrap();
    assert!(never_sent(&status), "{status:?}");
}

/// One server of a test cluster, serving `Raft` on its own listener.
struct TestServer {
    node: RaftNode,
    fsm: Arc<TestFsm>,
    addr: String,
    stop: Option<oneshot::Sender<()>>,
    serving: JoinHandle<()>,
    dir: TempDir,
}

impl TestServer {
    async fn start(listener: TcpListener, configure: impl FnOnce(&mut RaftConfig)) -> TestServer {
        TestServer::start_in(TempDir::new().unwrap(), listener, configure).await
    }

    /// Starts a server on the state in `dir` (a restart when it holds some).
    async fn start_in(dir: TempDir, listener: TcpListener, configure: impl FnOnce(&mut RaftConfig)) -> TestServer {
        let addr = listener.local_addr().unwrap().to_string();
        let mut cfg = config(dir.path(), &addr);
        configure(&mut cfg);
        let fsm = Arc::new(TestFsm::default());
        let node = RaftNode::start(cfg, fsm.clone()).await.unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let service = node.service();
        let serving = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .layer(RpcAuthLayer::new(test_auth()))
                .add_service(service)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        TestServer { node, fsm, addr, stop: Some(stop), serving, dir }
    }

    /// Takes the server off the network, then stops its Raft.
    async fn stop(&mut self) {
        let Some(stop) = self.stop.take() else { return };
        let _ = stop.send(());
        if tokio::time::timeout(Duration::from_secs(5), &mut self.serving).await.is_err() {
            self.serving.abort();
        }
        self.node.shutdown().await;
    }
}

async fn listeners(n: usize) -> Vec<TcpListener> {
    let mut listeners = Vec::new();
    for _ in 0..n {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    listeners
}

/// Starts `n` servers that bootstrap together (`bootstrap_expect = n`, each told all addresses).
async fn start_cluster(n: usize, snapshot_logs: u64) -> Vec<TestServer> {
    let listeners = listeners(n).await;
    let addrs: Vec<String> = listeners.iter().map(|l| l.local_addr().unwrap().to_string()).collect();
    let mut servers = Vec::new();
    for listener in listeners {
        let join = addrs.clone();
        servers.push(
            TestServer::start(listener, |cfg| {
                cfg.bootstrap_expect = n;
                cfg.join = join;
                cfg.snapshot_logs = snapshot_logs;
            })
            .await,
        );
    }
    servers
}

/// Waits until one of `servers` leads and all of them agree on it; returns its position.
async fn wait_for_leader(servers: &[&TestServer]) -> usize {
    wait_for("one leader all servers agree on", || {
        let leaders: Vec<usize> = (0..servers.len()).filter(|&i| servers[i].node.is_leader()).collect();
        leaders.len() == 1 && servers.iter().all(|s| s.node.leader_addr() == Some(servers[leaders[0]].addr.clone()))
    })
    .await;
    servers.iter().position(|s| s.node.is_leader()).unwrap()
}

async fn wait_for_fsms(servers: &[&TestServer], expected: &[(u64, Command)]) {
    wait_for("every fsm to hold exactly the written commands", || servers.iter().all(|s| s.fsm.entries() == expected)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_bootstrap_commit_on_the_leader_and_fail_over() {
    init_tracing();
    let mut servers = start_cluster(3, 8192).await;
    let all: Vec<&TestServer> = servers.iter().collect();
    let leader = wait_for_leader(&all).await;
    let follower = (leader + 1) % 3;
    let mut peers = servers[follower].node.peers();
    peers.sort();
    let mut addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
    addrs.sort();
    assert_eq!(peers, addrs, "all three bootstrapped as voters");

    // A command never travels between servers: a follower refuses it (the API request that
    // makes it is what a follower forwards), and nothing is written.
    let err = servers[follower].node.apply(command(100)).await.unwrap_err();
    assert!(matches!(err, RaftError::NotLeader), "{err}");
    let mut written = apply_all(&servers[leader].node, 0..5).await;
    wait_for_fsms(&all, &written).await;

    let old_leader = servers[leader].addr.clone();
    servers[leader].stop().await;
    let survivors: Vec<&TestServer> = (0..3).filter(|&i| i != leader).map(|i| &servers[i]).collect();
    let new_leader = wait_for_leader(&survivors).await;
    assert_ne!(survivors[new_leader].addr, old_leader);
    written.extend(apply_all(&survivors[new_leader].node, 5..12).await);
    wait_for_fsms(&survivors, &written).await;

    for server in &mut servers {
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_follower_reapplies_committed_entries_without_a_leader() {
    init_tracing();
    let mut servers = start_cluster(3, 8192).await;
    let all: Vec<&TestServer> = servers.iter().collect();
    let leader = wait_for_leader(&all).await;
    let written = apply_all(&servers[leader].node, 0..5).await;
    wait_for_fsms(&all, &written).await;
    for server in &mut servers {
        server.stop().await;
    }

    // With every other server down no leader can exist, so only the committed pointer the follower
    // persisted tells it how far it may apply.
    let follower = &servers[(leader + 1) % 3];
    let fsm = Arc::new(TestFsm::default());
    let node = RaftNode::start(config(follower.dir.path(), &follower.addr), fsm.clone()).await.unwrap();
    assert_eq!(fsm.entries(), written);
    assert!(!node.is_leader());
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fourth_server_joins_and_catches_up_from_a_snapshot() {
    init_tracing();
    let mut servers = start_cluster(3, 10).await;
    let all: Vec<&TestServer> = servers.iter().collect();
    let leader = wait_for_leader(&all).await;
    let mut written = apply_all(&servers[leader].node, 0..40).await;
    let metrics = servers[leader].node.metrics();
    // Once the leader has purged its log, a new server can only catch up by installing a snapshot.
    wait_for("the leader to purge its log", || metrics.borrow().purged.is_some()).await;

    let follower_addr = servers[(leader + 1) % 3].addr.clone();
    let listener = listeners(1).await.remove(0);
    let fourth = TestServer::start(listener, |cfg| {
        cfg.bootstrap_expect = 3;
        cfg.join = vec![follower_addr]; // a follower: the Join is passed on to the leader
        cfg.snapshot_logs = 10;
    })
    .await;
    let fourth_id = fourth.node.node_id();
    wait_for("the fourth server to become a voter", || metrics.borrow().membership_config.voter_ids().any(|id| id == fourth_id)).await;
    wait_for_fsms(&[&fourth], &written).await;
    assert!(fourth.fsm.restores() >= 1, "it caught up by installing the leader's snapshot");

    written.extend(apply_all(&servers[leader].node, 40..42).await);
    let mut everyone: Vec<&TestServer> = servers.iter().collect();
    everyone.push(&fourth);
    wait_for_fsms(&everyone, &written).await;
    assert_eq!(fourth.node.peers().len(), 4);

    let mut fourth = fourth;
    fourth.stop().await;
    for server in &mut servers {
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_server_is_removed_by_the_leader_and_the_rest_keep_committing() {
    init_tracing();
    let mut servers = start_cluster(3, 8192).await;
    let all: Vec<&TestServer> = servers.iter().collect();
    let leader = wait_for_leader(&all).await;
    let (dead, follower) = ((leader + 1) % 3, (leader + 2) % 3);
    let dead_id = servers[dead].node.node_id();
    servers[dead].stop().await;

    let err = servers[leader].node.remove_peer(999).await.unwrap_err();
    assert!(err.to_string().contains("no server with id 999"), "{err}");
    // Only the leader changes the configuration (the operator API forwards the request to it).
    let err = servers[follower].node.remove_peer(dead_id).await.unwrap_err();
    assert!(matches!(err, RaftError::NotLeader), "{err}");
    assert_eq!(servers[leader].node.configuration().len(), 3, "a refused removal changes nothing");

    servers[leader].node.remove_peer(dead_id).await.unwrap();
    let two_voters = |i: usize| {
        let c = servers[i].node.configuration();
        c.len() == 2 && c.iter().all(|p| p.voter && p.id != dead_id) && c.iter().filter(|p| p.leader).count() == 1
    };
    wait_for("both survivors see two voters and the leader", || two_voters(leader) && two_voters(follower)).await;
    // Two of two voters commit: the dead server no longer counts towards the quorum.
    let written = apply_all(&servers[leader].node, 0..3).await;
    wait_for_fsms(&[&servers[leader], &servers[follower]], &written).await;

    // The last voter is never removed.
    let follower_id = servers[follower].node.node_id();
    servers[leader].node.remove_peer(follower_id).await.unwrap();
    servers[follower].stop().await;
    let leader_id = servers[leader].node.node_id();
    wait_for("the leader alone", || servers[leader].node.configuration().iter().map(|p| p.id).collect::<Vec<_>>() == [leader_id]).await;
    let err = servers[leader].node.remove_peer(leader_id).await.unwrap_err();
    assert!(err.to_string().contains("only voting server"), "{err}");
    assert_eq!(apply_all(&servers[leader].node, 3..4).await.len(), 1, "a cluster of one still commits");
    servers[leader].stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_at_a_new_address_is_recorded_there_and_catches_up() {
    init_tracing();
    let mut servers = start_cluster(3, 8192).await;
    let all: Vec<&TestServer> = servers.iter().collect();
    let leader = wait_for_leader(&all).await;
    let moved = (leader + 1) % 3;
    let mut written = apply_all(&servers[leader].node, 0..3).await;
    wait_for_fsms(&all, &written).await;

    // The server stops and comes back on another port with the same state.
    servers[moved].stop().await;
    let id = servers[moved].node.node_id();
    let dir = std::mem::replace(&mut servers[moved].dir, TempDir::new().unwrap());
    let listener = listeners(1).await.pop().unwrap();
    let new_addr = listener.local_addr().unwrap().to_string();
    assert_ne!(new_addr, servers[moved].addr);
    servers[moved] = TestServer::start_in(dir, listener, |_| {}).await;

    let recorded = |s: &TestServer| s.node.configuration().iter().any(|p| p.id == id && p.addr == new_addr && p.voter);
    wait_for("every server to record the new address", || servers.iter().all(recorded)).await;
    assert_eq!(servers[leader].node.configuration().len(), 3, "still three servers, none added");
    let all: Vec<&TestServer> = servers.iter().collect();
    let leader = wait_for_leader(&all).await;
    written.extend(apply_all(&servers[leader].node, 3..6).await);
    wait_for_fsms(&all, &written).await;
    for s in &mut servers {
        s.stop().await;
    }
}

/// Stamps calls with a proof made with some key, or sends none.
#[derive(Clone)]
struct MaybeProof(Option<Stamp>);

impl tonic::service::Interceptor for MaybeProof {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        match &mut self.0 {
            Some(stamp) => stamp.call(request),
            None => Ok(request),
        }
    }
}

/// A `Raft` client on `addr` whose calls carry a proof made with `auth`'s key (none without).
async fn client_with(addr: &str, auth: Option<Arc<ClusterAuth>>) -> RaftClient<InterceptedService<tonic::transport::Channel, MaybeProof>> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    RaftClient::with_interceptor(channel, MaybeProof(auth.map(|a| a.interceptor())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_can_neither_join_vote_replicate_nor_ask_who_is_there() {
    init_tracing();
    let mut servers = start_cluster(3, 8192).await;
    let all: Vec<&TestServer> = servers.iter().collect();
    let leader = wait_for_leader(&all).await;
    let written = apply_all(&servers[leader].node, 0..3).await;
    wait_for_fsms(&all, &written).await;
    let before = servers[leader].node.configuration();

    for target in [leader, (leader + 1) % 3] {
        let addr = servers[target].addr.clone();
        // Without a proof, and with a proof made with another cluster's key: both refused.
        for auth in [None, Some(ClusterAuth::new(ClusterKey::generate(), "global"))] {
            let mut client = client_with(&addr, auth).await;
            let join = client.join(JoinRequest { node_id: 4242, addr: "127.0.0.1:1".into(), forwarded: false }).await.unwrap_err();
            assert_eq!(join.code(), tonic::Code::Unauthenticated, "{join:?}");
            assert!(join.message().contains("servers of this cluster only"), "{}", join.message());
            let info = client.info(InfoRequest {}).await.unwrap_err();
            assert_eq!(info.code(), tonic::Code::Unauthenticated);
            let vote = VoteArgs { vote: Vote::new(1_000, 4242), last_log_id: Some(log_id(1_000, 4242, 1_000)) };
            assert_eq!(client.vote(vote).await.unwrap_err().code(), tonic::Code::Unauthenticated);
        }
    }
    // The stranger's join changed nothing, and the cluster keeps its leader and keeps committing.
    assert_eq!(servers[leader].node.configuration(), before);
    assert!(servers[leader].node.is_leader(), "a stranger's vote request unseated no one");
    let mut written = written;
    written.extend(apply_all(&servers[leader].node, 3..5).await);
    wait_for_fsms(&all, &written).await;

    // A server given the cluster's key is a server: the same calls are answered.
    let mut peer = client_with(&servers[leader].addr, Some(test_auth())).await;
    assert_eq!(peer.info(InfoRequest {}).await.unwrap().into_inner().node_id, servers[leader].node.node_id());
    for server in &mut servers {
        server.stop().await;
    }
}
