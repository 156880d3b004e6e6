//! CSI test helpers: [`RecordingClientCsi`], the one fake of the server-to-client calls, and
//! the fixtures the claim, release and volume watcher tests share (plugin `hostpath` on nodes
//! whose plugin node ID is `ext-<node>`, volumes in `default`, allocs of job `web`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use nomad_proto::csi::{
    CsiControllerInfo, CsiInfo, CsiNodeInfo, CsiVolume, CsiVolumeAccessMode, CsiVolumeAttachmentMode, CsiVolumeCapability, CsiVolumeClaim,
    CsiVolumeClaimMode, CsiVolumeClaimState,
};
use nomad_proto::rpc::client_csi::{
    ClientCsiControllerAttachRequest, ClientCsiControllerAttachResponse, ClientCsiControllerCreateRequest,
    ClientCsiControllerCreateResponse, ClientCsiControllerDeleteRequest, ClientCsiControllerDetachRequest,
    ClientCsiControllerValidateVolumeRequest, ClientCsiNodeDetachRequest,
};
use nomad_proto::{Allocation, ClientStatus, Node, NodeStatus};

use super::{TestServer, job, node};
use crate::consensus::{BoxFuture, Consensus};
use crate::csi::{ClientCallError, ClientCsi};
use crate::fsm::Command;

/// The plugin of every fixture.
pub const PLUGIN: &str = "hostpath";

/// Registers node `id` running `hostpath`'s node plugin (plugin node ID `ext-<id>`) when
/// `node_plugin`, and a healthy attach/detach controller when `controller`. It is not ready
/// until [`ready`] or [`set_status`].
pub async fn plugin_node(ts: &TestServer, id: &str, node_plugin: bool, controller: bool) -> Node {
    let mut n = node(id);
    let info = CsiInfo { plugin_id: PLUGIN.into(), healthy: true, alloc_id: format!("plugin-{id}"), ..CsiInfo::default() };
    if node_plugin {
        n.csi_node_plugins.insert(
            PLUGIN.into(),
            CsiInfo { node_info: Some(CsiNodeInfo { id: format!("ext-{id}"), ..CsiNodeInfo::default() }), ..info.clone() },
        );
    }
    if controller {
        let caps = CsiControllerInfo { supports_attach_detach: true, ..CsiControllerInfo::default() };
        n.csi_controller_plugins.insert(PLUGIN.into(), CsiInfo { requires_controller_plugin: true, controller_info: Some(caps), ..info });
    }
    ts.register_node(n).await
}

/// Makes a registered node ready, as its first heartbeat does.
pub async fn ready(ts: &TestServer, n: &Node) {
    let hb = nomad_proto::rpc::NodeUpdateStatusRequest {
        node_id: n.id.clone(),
        secret_id: n.secret_id.clone(),
        status: NodeStatus::Ready,
        ..Default::default()
    };
    ts.endpoints.node_update_status(hb).await.unwrap();
    assert_eq!(ts.store.snapshot().node(&n.id).unwrap().status, NodeStatus::Ready);
}

/// Sets a node's status in the store directly (no heartbeat, no evals).
pub fn set_status(ts: &TestServer, id: &str, status: NodeStatus) {
    let idx = ts.store.snapshot().index + 1;
    ts.store.write(idx, |tx| tx.update_node_status(id, status, None, 0).map(|_| ())).unwrap();
}

/// Volume `id` of `hostpath` in `default`, asking for `access_mode` on a file system.
pub fn volume(id: &str, access_mode: CsiVolumeAccessMode) -> CsiVolume {
    CsiVolume {
        id: id.into(),
        namespace: "default".into(),
        plugin_id: PLUGIN.into(),
        requested_capabilities: vec![CsiVolumeCapability { access_mode, attachment_mode: CsiVolumeAttachmentMode::FileSystem }],
        ..CsiVolume::default()
    }
}

/// Registers `vol` as the register command does (no controller asked).
pub async fn register(ts: &TestServer, vol: CsiVolume) {
    ts.consensus.apply(Command::CsiVolumeRegister { volumes: vec![vol] }).await.unwrap();
}

/// An alloc of job `web` (registered with it) on `node_id` with `status`, as a plan writes it.
pub fn place_alloc(ts: &TestServer, node_id: &str, status: ClientStatus) -> Allocation {
    let mut j = job("web", 1);
    j.canonicalize();
    let idx = ts.store.snapshot().index + 1;
    ts.store.write(idx, |tx| tx.upsert_job(j.clone()).map(|_| ())).unwrap();
    let a = Allocation {
        id: nomad_proto::new_id(),
        namespace: "default".into(),
        job_id: "web".into(),
        job: ts.store.snapshot().job("default", "web").cloned(),
        task_group: "web".into(),
        name: "web.web[0]".into(),
        node_id: node_id.into(),
        client_status: status,
        ..Allocation::default()
    };
    ts.store.write(idx + 1, |tx| Ok(tx.upsert_allocs_from_plan(vec![a.clone()]))).unwrap();
    a
}

/// `alloc`'s write claim with `access_mode` on a file system, in `state`.
pub fn claim_of(alloc: &Allocation, access_mode: CsiVolumeAccessMode, state: CsiVolumeClaimState) -> CsiVolumeClaim {
    CsiVolumeClaim {
        allocation_id: alloc.id.clone(),
        node_id: alloc.node_id.clone(),
        mode: CsiVolumeClaimMode::Write,
        access_mode,
        attachment_mode: CsiVolumeAttachmentMode::FileSystem,
        state,
        ..CsiVolumeClaim::default()
    }
}

/// The alloc ends as lost (with its node, say) and its client never reports: a write to the
/// allocs table only, nothing on the volume. (A plan keeps the client's status; `lost` is the
/// server's to write.)
pub fn finish_lost(ts: &TestServer, a: &Allocation) {
    let mut done = (**ts.store.snapshot().alloc(&a.id).unwrap()).clone();
    done.client_status = ClientStatus::Lost;
    let idx = ts.store.snapshot().index + 1;
    ts.store.write(idx, |tx| Ok(tx.upsert_allocs_from_plan(vec![done]))).unwrap();
}

/// Volume `id` of `default` as stored.
pub fn stored(ts: &TestServer, id: &str) -> CsiVolume {
    (**ts.store.snapshot().csi_volume("default", id).unwrap()).clone()
}

/// One server-to-client CSI call, summed up as most tests compare it (the whole request is
/// in [`CsiRequest`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CsiCall {
    /// `ClientCSI.NodeDetachVolume` to `node_id` for `alloc_id`.
    NodeDetach {
        /// Target node.
        node_id: String,
        /// The alloc whose claim is released.
        alloc_id: String,
        /// The provider's ID of the volume.
        external_id: String,
    },
    /// `ClientCSI.ControllerDetachVolume` to `controller_node_id`.
    ControllerDetach {
        /// The node running the controller asked.
        controller_node_id: String,
        /// The provider's ID of the volume.
        volume_id: String,
        /// The provider's ID of the node it is unpublished from.
        client_csi_node_id: String,
    },
    /// `ClientCSI.ControllerAttachVolume` to `controller_node_id`.
    ControllerAttach {
        /// The node running the controller asked.
        controller_node_id: String,
        /// The provider's ID of the volume.
        volume_id: String,
    },
    /// `ClientCSI.ControllerCreateVolume` to `controller_node_id`.
    ControllerCreate {
        /// The node running the controller asked.
        controller_node_id: String,
    },
    /// `ClientCSI.ControllerDeleteVolume` to `controller_node_id`.
    ControllerDelete {
        /// The node running the controller asked.
        controller_node_id: String,
    },
    /// `ClientCSI.ControllerValidateVolume` to `controller_node_id`.
    ControllerValidate {
        /// The node running the controller asked.
        controller_node_id: String,
        /// The provider's ID of the volume.
        volume_id: String,
    },
}

impl CsiCall {
    /// The node the call went to.
    pub fn target(&self) -> &str {
        match self {
            CsiCall::NodeDetach { node_id, .. } => node_id,
            CsiCall::ControllerDetach { controller_node_id, .. }
            | CsiCall::ControllerAttach { controller_node_id, .. }
            | CsiCall::ControllerCreate { controller_node_id }
            | CsiCall::ControllerDelete { controller_node_id }
            | CsiCall::ControllerValidate { controller_node_id, .. } => controller_node_id,
        }
    }
}

/// One server-to-client CSI call, whole, as [`RecordingClientCsi`] saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum CsiRequest {
    /// `ClientCSI.ControllerAttachVolume`.
    ControllerAttach(ClientCsiControllerAttachRequest),
    /// `ClientCSI.ControllerDetachVolume`.
    ControllerDetach(ClientCsiControllerDetachRequest),
    /// `ClientCSI.ControllerCreateVolume`.
    ControllerCreate(ClientCsiControllerCreateRequest),
    /// `ClientCSI.ControllerDeleteVolume`.
    ControllerDelete(ClientCsiControllerDeleteRequest),
    /// `ClientCSI.ControllerValidateVolume`.
    ControllerValidate(ClientCsiControllerValidateVolumeRequest),
    /// `ClientCSI.NodeDetachVolume`.
    NodeDetach(ClientCsiNodeDetachRequest),
}

impl CsiRequest {
    /// The call summed up.
    pub fn summary(&self) -> CsiCall {
        match self {
            CsiRequest::ControllerAttach(r) => {
                CsiCall::ControllerAttach { controller_node_id: r.controller.controller_node_id.clone(), volume_id: r.volume_id.clone() }
            }
            CsiRequest::ControllerDetach(r) => CsiCall::ControllerDetach {
                controller_node_id: r.controller.controller_node_id.clone(),
                volume_id: r.volume_id.clone(),
                client_csi_node_id: r.client_csi_node_id.clone(),
            },
            CsiRequest::ControllerCreate(r) => CsiCall::ControllerCreate { controller_node_id: r.controller.controller_node_id.clone() },
            CsiRequest::ControllerDelete(r) => CsiCall::ControllerDelete { controller_node_id: r.controller.controller_node_id.clone() },
            CsiRequest::ControllerValidate(r) => {
                CsiCall::ControllerValidate { controller_node_id: r.controller.controller_node_id.clone(), volume_id: r.volume_id.clone() }
            }
            CsiRequest::NodeDetach(r) => {
                CsiCall::NodeDetach { node_id: r.node_id.clone(), alloc_id: r.alloc_id.clone(), external_id: r.external_id.clone() }
            }
        }
    }
}

/// The one fake [`ClientCsi`]: records every call and answers `Ok` (with the publish context
/// and create answer set), or the next error queued by [`RecordingClientCsi::fail_next`], or
/// the error set for the target node (for a number of calls, or until healed).
#[derive(Default)]
pub struct RecordingClientCsi {
    requests: Mutex<Vec<CsiRequest>>,
    failing: Mutex<BTreeMap<String, (ClientCallError, Option<usize>)>>,
    next_errors: Mutex<VecDeque<ClientCallError>>,
    publish_context: Mutex<BTreeMap<String, String>>,
    created: Mutex<ClientCsiControllerCreateResponse>,
    called: tokio::sync::Notify,
}

impl RecordingClientCsi {
    /// A fake where every call succeeds.
    pub fn new() -> Arc<RecordingClientCsi> {
        Arc::new(RecordingClientCsi::default())
    }

    /// Calls to `node_id` fail with `err`: the next `times` of them, or all (`None`) until
    /// [`RecordingClientCsi::heal`].
    pub fn fail(&self, node_id: &str, err: ClientCallError, times: Option<usize>) {
        self.failing.lock().unwrap().insert(node_id.to_string(), (err, times));
    }

    /// Calls to `node_id` succeed again.
    pub fn heal(&self, node_id: &str) {
        self.failing.lock().unwrap().remove(node_id);
    }

    /// The next call, whatever its target, fails with `err` (queued after earlier ones).
    pub fn fail_next(&self, err: ClientCallError) {
        self.next_errors.lock().unwrap().push_back(err);
    }

    /// What controller attaches answer.
    pub fn set_publish_context(&self, context: BTreeMap<String, String>) {
        *self.publish_context.lock().unwrap() = context;
    }

    /// What controller creates answer.
    pub fn set_created(&self, created: ClientCsiControllerCreateResponse) {
        *self.created.lock().unwrap() = created;
    }

    /// The calls so far, summed up, in order.
    pub fn calls(&self) -> Vec<CsiCall> {
        self.requests.lock().unwrap().iter().map(CsiRequest::summary).collect()
    }

    /// The calls so far, whole, in order.
    pub fn requests(&self) -> Vec<CsiRequest> {
        self.requests.lock().unwrap().clone()
    }

    /// Waits (at most 30 s) until `cond` holds on the calls so far;
    /// panics naming `what` otherwise.
    pub async fn wait_for(&self, what: &str, cond: impl Fn(&[CsiCall]) -> bool) -> Vec<CsiCall> {
        let deadline = tokio::time::Instant::now() + CSI_CALLS_DEADLINE;
        loop {
            let notified = self.called.notified();
            let calls = self.calls();
            if cond(&calls) {
                return calls;
            }
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for CSI calls: {what}; calls: {calls:?}");
            let _ = tokio::time::timeout(std::time::Duration::from_millis(100), notified).await;
        }
    }

    fn answer<T: Send + 'static>(&self, request: CsiRequest, ok: T) -> BoxFuture<'static, Result<T, ClientCallError>> {
        let target = request.summary().target().to_string();
        self.requests.lock().unwrap().push(request);
        self.called.notify_waiters();
        let queued = self.next_errors.lock().unwrap().pop_front();
        let mut failing = self.failing.lock().unwrap();
        let result = match (queued, failing.get_mut(&target)) {
            (Some(err), _) => Err(err),
            (None, None) => Ok(ok),
            (None, Some((err, None))) => Err(err.clone()),
            (None, Some((err, Some(n)))) => {
                let err = err.clone();
                *n -= 1;
                if *n == 0 {
                    failing.remove(&target);
                }
                Err(err)
            }
        };
        Box::pin(async move { result })
    }
}

/// How long [`RecordingClientCsi::wait_for`] waits.
const CSI_CALLS_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

impl ClientCsi for RecordingClientCsi {
    fn controller_attach(
        &self,
        req: ClientCsiControllerAttachRequest,
    ) -> BoxFuture<'_, Result<ClientCsiControllerAttachResponse, ClientCallError>> {
        let answer = ClientCsiControllerAttachResponse { publish_context: self.publish_context.lock().unwrap().clone() };
        self.answer(CsiRequest::ControllerAttach(req), answer)
    }
    fn controller_detach(&self, req: ClientCsiControllerDetachRequest) -> BoxFuture<'_, Result<(), ClientCallError>> {
        self.answer(CsiRequest::ControllerDetach(req), ())
    }
    fn controller_create(
        &self,
        req: ClientCsiControllerCreateRequest,
    ) -> BoxFuture<'_, Result<ClientCsiControllerCreateResponse, ClientCallError>> {
        let answer = self.created.lock().unwrap().clone();
        self.answer(CsiRequest::ControllerCreate(req), answer)
    }
    fn controller_delete(&self, req: ClientCsiControllerDeleteRequest) -> BoxFuture<'_, Result<(), ClientCallError>> {
        self.answer(CsiRequest::ControllerDelete(req), ())
    }
    fn controller_validate(&self, req: ClientCsiControllerValidateVolumeRequest) -> BoxFuture<'_, Result<(), ClientCallError>> {
        self.answer(CsiRequest::ControllerValidate(req), ())
    }
    fn node_detach(&self, req: ClientCsiNodeDetachRequest) -> BoxFuture<'_, Result<(), ClientCallError>> {
        self.answer(CsiRequest::NodeDetach(req), ())
    }
}
