//! A client as the servers see it: the calls Nomad's client (and ours,
//! `agent/src/client`) makes, and nothing else.
//!
//! - `register`: `Node.Register` with the node as the client knows it
//!   (status `ready` after its first registration).
//! - `heartbeat`: `Node.UpdateStatus` asking for `ready`; answered
//!   `initializing`, the client queues every alloc's current state again
//!   (`resend_alloc_states` in the agent), so the servers' gate can open even
//!   when nothing changed while it was away.
//! - `sync`: one `Node.UpdateAlloc` with the pending updates (newest per
//!   alloc); a refused batch is put back, except where a newer state arrived.
//!   Nothing is sent before the first successful alloc pull since the agent
//!   started. `sync_begin`/`sync_end` split it where the syncer takes the
//!   batch and where it reaches the servers, so other calls can land between.
//! - `pull`: `Node.GetClientAllocs`, then `Alloc.GetAllocs` for allocs that
//!   are new or whose `AllocModifyIndex` passed the local copy's, then the
//!   diff: the reconnect decision (`Allocation::client_should_reconnect`, the
//!   function the agent calls) for changed allocs, new allocs started, allocs
//!   the servers stopped killed (reported `complete`), allocs the servers
//!   no longer list dropped.

use std::collections::BTreeMap;

use nomad_proto::alloc::{TaskEvent, TaskState, task_state};
use nomad_proto::rpc::{AllocUpdateRequest, AllocsGetRequest, NodeRegisterRequest, NodeSpecificRequest, NodeUpdateStatusRequest};
use nomad_proto::{Allocation, ClientStatus, Node, NodeStatus, Timestamp};

use crate::sim::{Sim, block};

/// An alloc the client runs (or ran).
#[derive(Debug, Clone)]
pub struct Local {
    /// The client's copy of the server's alloc (indexes as last adopted).
    pub server: Allocation,
    /// What really happens on the node.
    pub status: ClientStatus,
    /// Task events (e.g. `Reconnected`).
    pub events: Vec<String>,
}

/// What a call did, for the step log.
pub type Outcome = String;

#[derive(Debug, Clone)]
pub struct Client {
    pub node: Node,
    pub allocs: BTreeMap<String, Local>,
    pub pending: BTreeMap<String, Allocation>,
    /// A batch the syncer took and has not delivered yet.
    pub in_flight: Option<Vec<Allocation>>,
    /// The first alloc pull since the agent started succeeded.
    pub contacted: bool,
    /// Highest `GetClientAllocs` index seen.
    pub index: u64,
    /// `UpdateAlloc` calls the servers accepted / refused.
    pub accepted: usize,
    pub refused: usize,
    /// Reconnect decisions taken.
    pub reconnects: usize,
}

impl Client {
    pub fn new(node: Node) -> Client {
        Client {
            node,
            allocs: BTreeMap::new(),
            pending: BTreeMap::new(),
            in_flight: None,
            contacted: false,
            index: 0,
            accepted: 0,
            refused: 0,
            reconnects: 0,
        }
    }

    pub fn id(&self) -> &str {
        &self.node.id
    }

    pub fn register(&mut self, sim: &Sim) -> Outcome {
        let r = block(sim.ep.node_register(NodeRegisterRequest { node: self.node.clone(), region: String::new() }));
        // After the first registration the client's own copy says ready.
        self.node.status = NodeStatus::Ready;
        match r {
            Ok(resp) => format!("register → {}", resp.status),
            Err(e) => format!("register → error {e}"),
        }
    }

    pub fn heartbeat(&mut self, sim: &Sim) -> Outcome {
        let req = NodeUpdateStatusRequest {
            node_id: self.node.id.clone(),
            status: NodeStatus::Ready,
            secret_id: self.node.secret_id.clone(),
            ..Default::default()
        };
        match block(sim.ep.node_update_status(req)) {
            Ok(resp) => {
                if resp.status == NodeStatus::Initializing {
                    let now = sim.now();
                    for id in self.allocs.keys().cloned().collect::<Vec<_>>() {
                        self.report(&id, now);
                    }
                }
                format!("heartbeat → {}", resp.status)
            }
            Err(e) => format!("heartbeat → error {e}"),
        }
    }

    /// Sends the pending updates (or delivers the batch already on its way);
    /// `Err` carries the server's refusal.
    pub fn sync(&mut self, sim: &Sim) -> Result<Outcome, String> {
        if self.in_flight.is_none() {
            self.sync_begin();
        }
        match self.in_flight.is_some() {
            true => self.sync_end(sim),
            false => Ok("sync → nothing to send".into()),
        }
    }

    /// The syncer takes the pending updates as one batch (sent by `sync_end`):
    /// whatever the client queues meanwhile goes into the next batch.
    pub fn sync_begin(&mut self) -> Outcome {
        if self.in_flight.is_some() || self.pending.is_empty() || !self.contacted {
            return "sync-begin → nothing taken".into();
        }
        let batch: Vec<Allocation> = std::mem::take(&mut self.pending).into_values().collect();
        let what: Vec<String> = batch.iter().map(|a| format!("{}={}", short(&a.id), a.client_status)).collect();
        self.in_flight = Some(batch);
        format!("sync-begin [{}]", what.join(" "))
    }

    /// The batch taken by `sync_begin` reaches the servers.
    pub fn sync_end(&mut self, sim: &Sim) -> Result<Outcome, String> {
        let Some(batch) = self.in_flight.take() else { return Ok("sync-end → nothing in flight".into()) };
        let what: Vec<String> = batch.iter().map(|a| format!("{}={}", short(&a.id), a.client_status)).collect();
        let req = AllocUpdateRequest { alloc: batch.clone(), evals: Vec::new(), secret_id: self.node.secret_id.clone() };
        match block(sim.ep.node_update_alloc(req)) {
            Ok(_) => {
                self.accepted += 1;
                Ok(format!("update-alloc [{}] → accepted", what.join(" ")))
            }
            Err(e) => {
                self.refused += 1;
                for a in batch {
                    self.pending.entry(a.id.clone()).or_insert(a);
                }
                Err(format!("update-alloc [{}] → {e}", what.join(" ")))
            }
        }
    }

    /// One pass of the alloc watch.
    pub fn pull(&mut self, sim: &Sim, now: Timestamp) -> Outcome {
        let req = NodeSpecificRequest {
            node_id: self.node.id.clone(),
            secret_id: self.node.secret_id.clone(),
            min_query_index: 0,
            max_query_time: 0,
        };
        let resp = match block(sim.ep.node_get_client_allocs(req)) {
            Ok(r) => r,
            Err(e) => return format!("pull → error {e}"),
        };
        if resp.index <= self.index && self.contacted {
            return "pull → nothing new".into();
        }
        let pull: Vec<String> = resp
            .allocs
            .iter()
            .filter(|(id, ami)| self.allocs.get(*id).is_none_or(|l| **ami > l.server.alloc_modify_index))
            .map(|(id, _)| id.clone())
            .collect();
        let mut pulled = Vec::new();
        if !pull.is_empty() {
            let req = AllocsGetRequest {
                alloc_ids: pull.clone(),
                node_id: self.node.id.clone(),
                secret_id: self.node.secret_id.clone(),
                min_query_index: 0,
                max_query_time: 0,
            };
            match block(sim.ep.alloc_get_allocs(req)) {
                Ok(got) if got.allocs.len() == pull.len() => pulled = got.allocs,
                Ok(_) => return "pull → fewer allocs than asked for".into(),
                Err(e) => return format!("pull → error {e}"),
            }
        }
        self.index = resp.index;
        let mut did = Vec::new();
        let gone: Vec<String> = self.allocs.keys().filter(|id| !resp.allocs.contains_key(*id)).cloned().collect();
        for id in gone {
            self.allocs.remove(&id);
            did.push(format!("{} gc", short(&id)));
        }
        for update in pulled {
            did.push(self.apply_pulled(update, now));
        }
        self.contacted = true;
        format!("pull → [{}]", did.join(" "))
    }

    fn apply_pulled(&mut self, update: Allocation, now: Timestamp) -> String {
        let id = update.id.clone();
        let Some(local) = self.allocs.get_mut(&id) else {
            // A new alloc: start it, unless the servers already want it stopped.
            let status = if update.server_terminal() { ClientStatus::Complete } else { ClientStatus::Running };
            let local = Local { server: update, status, events: vec!["Started".into()] };
            let tag = format!("{} start→{status}", short(&id));
            self.allocs.insert(id.clone(), local);
            self.report(&id, now);
            return tag;
        };
        if update.client_should_reconnect(local.server.alloc_modify_index) {
            local.server.alloc_modify_index = update.alloc_modify_index;
            local.server.modify_index = update.modify_index;
            local.events.push("Reconnected".into());
            self.reconnects += 1;
            self.report(&id, now);
            return format!("{} reconnect", short(&id));
        }
        let stop = update.server_terminal() && !local.status.is_terminal();
        local.server = update;
        if stop {
            local.status = ClientStatus::Complete;
            local.events.push("Killed".into());
            self.report(&id, now);
            return format!("{} stop", short(&id));
        }
        format!("{} update", short(&id))
    }

    /// Something happened to the alloc on the node (it failed, ...).
    pub fn set_status(&mut self, id: &str, status: ClientStatus, now: Timestamp) {
        if let Some(l) = self.allocs.get_mut(id) {
            l.status = status;
            l.events.push(format!("→{status}"));
            self.report(id, now);
        }
    }

    /// Queues the alloc's current state for the servers (newest wins).
    fn report(&mut self, id: &str, now: Timestamp) {
        let Some(l) = self.allocs.get(id) else { return };
        let dead = l.status.is_terminal();
        let state = TaskState {
            state: if dead { task_state::DEAD } else { task_state::RUNNING }.into(),
            failed: l.status == ClientStatus::Failed,
            started_at: now,
            finished_at: if dead { now } else { Timestamp::default() },
            events: l.events.iter().map(|e| TaskEvent { event_type: e.clone(), time: now.unix_nanos(), ..TaskEvent::default() }).collect(),
            ..TaskState::default()
        };
        let tasks = l.server.job.as_ref().and_then(|j| j.lookup_task_group(&l.server.task_group)).map(|g| g.tasks.clone());
        let states = tasks.unwrap_or_default().into_iter().map(|t| (t.name, state.clone())).collect();
        // In a deployment, a running alloc is healthy at once (a real client waits for
        // min_healthy_time) and a failed one unhealthy.
        let healthy = match l.status {
            ClientStatus::Running => Some(true),
            ClientStatus::Failed => Some(false),
            _ => None,
        };
        let deployment_status = healthy
            .filter(|_| !l.server.deployment_id.is_empty())
            .map(|healthy| serde_json::json!({ "Healthy": healthy, "Timestamp": now }));
        let update = Allocation {
            id: id.to_string(),
            node_id: self.node.id.clone(),
            client_status: l.status,
            task_states: Some(states),
            deployment_status,
            ..Allocation::default()
        };
        self.pending.insert(id.to_string(), update);
    }

    /// Allocs the node really runs.
    pub fn running(&self) -> Vec<&Local> {
        self.allocs.values().filter(|l| !l.status.is_terminal()).collect()
    }
}

/// The first 8 characters of an ID, for logs.
pub fn short(id: &str) -> &str {
    &id[..id.len().min(8)]
}
