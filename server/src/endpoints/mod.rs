//! Server endpoints: the logic behind each RPC and HTTP route.
//!
//! Every write follows one skeleton: authenticate → check the request
//! against a state snapshot → build one [`Command`](crate::fsm::Command)
//! carrying everything (IDs, timestamps, evals) → apply it through
//! [`Consensus`]. Endpoints never mutate state themselves.

mod alloc;
mod csi;
mod csi_claim;
mod csi_controller;
mod csi_release;
mod deployment;
mod dispatch;
mod drain;
mod eligibility;
mod error;
mod eval_delete;
mod gc;
mod identity;
mod job;
mod job_diff;
mod job_plan;
mod job_versions;
mod namespace;
mod node;
mod node_evals;
mod periodic;
mod scaling;
mod services;
mod si_token;
mod snapshot;

use std::sync::Arc;

pub use alloc::AllocStopResponse;
pub use csi_controller::{CSI_CLIENT_RETRYABLE, UNKNOWN_NODE, controller_nodes, passes_on};
pub use csi_release::ReleaseBy;
pub use deployment::DeploymentUpdateResponse;
pub use dispatch::{DISPATCH_PAYLOAD_SIZE_LIMIT, DispatchRequest, DispatchResponse};
pub use drain::{DrainRequest, DrainSpec, NodeWriteResponse};
pub use error::EndpointError;
pub use eval_delete::{EvalSelection, MAX_UUIDS_PER_WRITE_REQUEST, eval_is_user_delete_safe};
pub use gc::{GcConfig, GcCutoffs, GcReport, collect_garbage};
pub use job::{JobDeregisterResponse, JobRegisterOptions, JobRegisterResponse, JobValidateResponse};
pub use job_plan::JobPlanResponse;
pub use job_versions::{JobRevertRequest, JobVersionsResponse};
pub use node_evals::{create_node_evals, should_create_node_eval};
pub use scaling::{JobScaleRequest, job_scale_status};
pub use snapshot::SavedSnapshot;

use crate::consensus::Consensus;
use crate::heartbeat::Heartbeater;
use crate::scheduler::Scheduler;
use crate::state::StateStore;

/// Settings endpoints need.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// This server's region.
    pub region: String,
    /// This server's datacenter.
    pub datacenter: String,
    /// Longest blocking query.
    pub max_query_time: std::time::Duration,
    /// This server's advertised HTTP address (told to clients).
    pub http_addr: String,
    /// Admission limits for jobs (`server { job_max_count }`).
    pub job_limits: nomad_proto::JobLimits,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            region: nomad_proto::job::DEFAULT_REGION.to_string(),
            datacenter: "dc1".to_string(),
            max_query_time: std::time::Duration::from_secs(300),
            http_addr: String::new(),
            job_limits: nomad_proto::JobLimits::default(),
        }
    }
}

/// Where endpoints read the time: the system clock, or a test's virtual clock.
pub type Clock = Arc<dyn Fn() -> nomad_proto::Timestamp + Send + Sync>;

/// The endpoints of one server.
#[derive(Clone)]
pub struct Endpoints {
    store: Arc<StateStore>,
    consensus: Arc<dyn Consensus>,
    heartbeats: Arc<Heartbeater>,
    config: EndpointConfig,
    events: Option<Arc<crate::events::EventBroker>>,
    /// Runs `Job.Plan` dry runs; `None` until the server sets one.
    scheduler: Option<Arc<dyn Scheduler>>,
    /// The node and job endpoints' clock (alloc expiry, eval and event times).
    clock: Clock,
    /// Controller and node plugin calls on clients (`ClientCSI.*`).
    client_csi: Arc<dyn crate::csi::ClientCsi>,
    /// One controller RPC per plugin at a time (`serializedControllerRPC`).
    controller_locks: csi_controller::ControllerLocks,
    /// Consul: SI tokens and config entries (none without a `consul {}` block).
    consul: crate::consul::ConsulHandles,
    /// ACL settings (off by default).
    acl: Arc<crate::acl::AclConfig>,
    /// Root key material: encrypts variables, signs workload identities.
    keyring: Arc<crate::keyring::Keyring>,
}

impl Endpoints {
    /// Endpoints over a store, writing through `consensus`.
    pub fn new(store: Arc<StateStore>, consensus: Arc<dyn Consensus>, heartbeats: Arc<Heartbeater>, config: EndpointConfig) -> Endpoints {
        Endpoints {
            store,
            consensus,
            heartbeats,
            config,
            events: None,
            scheduler: None,
            clock: Arc::new(nomad_proto::Timestamp::now),
            client_csi: crate::csi::NoClientCalls::shared(),
            controller_locks: Default::default(),
            consul: crate::consul::ConsulHandles::default(),
            acl: Arc::default(),
            keyring: Arc::default(),
        }
    }

    /// These endpoints, enforcing ACLs as `acl` says.
    pub fn with_acl(mut self, acl: crate::acl::AclConfig) -> Endpoints {
        self.acl = Arc::new(acl);
        self
    }

    /// The ACL settings.
    pub fn acl_config(&self) -> &crate::acl::AclConfig {
        &self.acl
    }

    /// These endpoints, with the cluster's keyring (every server derives the same one).
    pub fn with_keyring(mut self, keyring: Arc<crate::keyring::Keyring>) -> Endpoints {
        self.keyring = keyring;
        self
    }

    /// The keyring.
    pub fn keyring(&self) -> &Arc<crate::keyring::Keyring> {
        &self.keyring
    }

    /// These endpoints, reaching Consul through `consul`.
    pub fn with_consul(mut self, consul: crate::consul::ConsulHandles) -> Endpoints {
        self.consul = consul;
        self
    }

    /// The handles to Consul.
    pub fn consul(&self) -> &crate::consul::ConsulHandles {
        &self.consul
    }

    /// These endpoints, reading the time from `clock` (deterministic tests drive a virtual clock).
    pub fn with_clock(mut self, clock: Clock) -> Endpoints {
        self.clock = clock;
        self
    }

    /// These endpoints, reaching CSI plugins on clients through `calls`.
    pub fn with_client_csi(mut self, calls: Arc<dyn crate::csi::ClientCsi>) -> Endpoints {
        self.client_csi = calls;
        self
    }

    /// The handle to CSI plugins on clients.
    pub fn client_csi(&self) -> &Arc<dyn crate::csi::ClientCsi> {
        &self.client_csi
    }

    /// The current time, as the endpoints' clock tells it.
    pub fn now(&self) -> nomad_proto::Timestamp {
        (self.clock)()
    }

    /// Serves the event stream from `broker`.
    pub fn with_events(mut self, broker: Arc<crate::events::EventBroker>) -> Endpoints {
        self.events = Some(broker);
        self
    }

    /// The event broker, when this server streams events.
    pub fn events(&self) -> Option<&Arc<crate::events::EventBroker>> {
        self.events.as_ref()
    }

    /// These endpoints, answering `Job.Plan` with `scheduler`.
    pub fn with_scheduler(mut self, scheduler: Arc<dyn Scheduler>) -> Endpoints {
        self.scheduler = Some(scheduler);
        self
    }

    /// The state store.
    pub fn store(&self) -> &Arc<StateStore> {
        &self.store
    }

    /// The consensus handle.
    pub fn consensus(&self) -> &Arc<dyn Consensus> {
        &self.consensus
    }

    /// The heartbeat timers.
    pub fn heartbeats(&self) -> &Arc<Heartbeater> {
        &self.heartbeats
    }

    /// Settings.
    pub fn config(&self) -> &EndpointConfig {
        &self.config
    }
}

#[cfg(test)]
mod admission_tests;
#[cfg(test)]
mod connect_tests;
#[cfg(test)]
mod support_tests;
#[cfg(test)]
mod tests;
