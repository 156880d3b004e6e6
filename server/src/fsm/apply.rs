//! Applying commands to the state store.

use std::collections::BTreeSet;
use std::sync::Arc;

use nomad_proto::{Evaluation, Job, NamespacedId};

use super::{ApplyResult, Command, Fsm, PlanApply};
use crate::events::EventBroker;
use crate::state::{State, StateStore, Txn, TxnError};

/// The server's state machine: applies commands to a [`StateStore`] and
/// publishes what each one changed to the event broker.
#[derive(Debug, Clone)]
pub struct ServerFsm {
    store: Arc<StateStore>,
    events: Option<Arc<EventBroker>>,
}

impl ServerFsm {
    /// A state machine over `store`, without an event stream.
    pub fn new(store: Arc<StateStore>) -> ServerFsm {
        ServerFsm { store, events: None }
    }

    /// A state machine over `store` publishing to `events`.
    pub fn with_events(store: Arc<StateStore>, events: Arc<EventBroker>) -> ServerFsm {
        ServerFsm { store, events: Some(events) }
    }

    /// The store it writes to.
    pub fn store(&self) -> &Arc<StateStore> {
        &self.store
    }
}

impl ServerFsm {
    /// Applies an operator's restore at `index`: the restored state is stamped with `index`
    /// (every table too), so each blocking query answers and every client pulls its allocs
    /// anew, whatever indexes the snapshot was saved at.
    fn restore_at(&self, index: u64, bytes: &[u8]) -> ApplyResult {
        match State::from_bytes(bytes) {
            Ok(mut state) => {
                state.stamp_all(index);
                self.store.restore(state);
                ApplyResult::ok()
            }
            Err(e) => {
                // Still record that this index was applied, so replays line up.
                let _ = self.store.write(index, |_| Ok(()));
                ApplyResult::err(e)
            }
        }
    }
}

impl Fsm for ServerFsm {
    fn apply(&self, index: u64, mut cmd: Command) -> ApplyResult {
        if let Command::SnapshotRestore { state } = &cmd {
            return self.restore_at(index, state.0.as_bytes());
        }
        // A plan's allocs move into the state rather than being copied out of the command.
        let plans = match &mut cmd {
            Command::PlanApply(plan) => Some(vec![std::mem::take(plan)]),
            Command::PlanApplyBatch(plans) => Some(std::mem::take(plans)),
            _ => None,
        };
        let result = self.store.write_with_changes(index, |txn| match plans {
            Some(plans) => apply_plans(txn, plans),
            None => apply_command(txn, &cmd),
        });
        match result {
            Ok(((), changes)) => {
                if let Some(broker) = &self.events
                    && let Some(batch) = crate::events::batch_for(index, &cmd, &changes)
                {
                    broker.publish(batch);
                }
                ApplyResult::ok()
            }
            Err(TxnError(msg)) => {
                // Still record that this index was applied, so replays line up.
                let _ = self.store.write(index, |_| Ok(()));
                ApplyResult::err(msg)
            }
        }
    }

    fn snapshot(&self) -> Result<Vec<u8>, String> {
        self.store.snapshot().to_bytes()
    }

    fn restore(&self, data: &[u8]) -> Result<(), String> {
        let state = State::from_bytes(data)?;
        self.store.restore(state);
        Ok(())
    }
}

pub(crate) fn apply_command(txn: &mut Txn<'_>, cmd: &Command) -> Result<(), TxnError> {
    let mut jobs: BTreeSet<NamespacedId> = BTreeSet::new();
    match cmd {
        Command::NodeRegister { node, evals, now } => {
            txn.upsert_node(node.clone(), *now);
            jobs.extend(txn.upsert_evals(evals.clone()));
        }
        Command::NodeUpdateStatus { node_id, status, event, updated_at, evals } => {
            txn.update_node_status(node_id, *status, event.clone(), *updated_at)?;
            if *status == nomad_proto::NodeStatus::Down {
                // A down node's services are gone with it (not while merely disconnected).
                txn.delete_service_registrations(|r| r.node_id == *node_id);
            }
            jobs.extend(txn.upsert_evals(evals.clone()));
        }
        Command::NodeDeregister { node_ids, evals } => {
            for id in node_ids {
                txn.delete_node(id)?;
            }
            jobs.extend(txn.upsert_evals(evals.clone()));
        }
        Command::NodeUpdateEligibility { node_id, eligibility, event, evals, now: _ } => {
            txn.update_node_eligibility(node_id, *eligibility, event.clone())?;
            jobs.extend(txn.upsert_evals(evals.clone()));
        }
        Command::NodeUpdateDrain { node_id, drain, mark_eligible, event, evals, now } => {
            txn.update_node_drain(node_id, drain.clone(), *mark_eligible, event.clone(), *now)?;
            jobs.extend(txn.upsert_evals(evals.clone()));
        }
        Command::JobRegister { job, eval, now } => {
            let mut job = job.clone();
            job.submit_time = now.unix_nanos();
            let stored = txn.upsert_job(job)?;
            // A periodic job is tracked from its registration: a leader that takes over before
            // its first launch measures the missed launch from here.
            if stored.is_periodic_active() && txn.state().periodic_launch(&stored.namespace, &stored.id).is_none() {
                txn.record_periodic_launch(&stored.namespace, &stored.id, now.unix_nanos());
            }
            if let Some(e) = eval {
                let mut e = e.clone();
                e.job_modify_index = stored.job_modify_index;
                jobs.extend(txn.upsert_evals(vec![e]));
            }
            jobs.insert(stored.namespaced_id());
        }
        Command::JobScale { namespace, job_id, group, count, event, eval, now } => {
            if let Some((count, job_modify_index)) = count {
                let stored = txn.scale_job(namespace, job_id, group, *count, *job_modify_index, *now)?;
                if let Some(e) = eval {
                    let mut e = e.clone();
                    e.job_modify_index = stored.job_modify_index;
                    jobs.extend(txn.upsert_evals(vec![e]));
                }
                jobs.insert(stored.namespaced_id());
            }
            txn.record_scaling_event(namespace, job_id, group, event.clone());
        }
        Command::ReconcileJobSummaries => txn.reconcile_job_summaries(),
        Command::JobDeregister { namespace, job_id, purge, eval, now: _ } => {
            let existing = txn.state().job(namespace, job_id).cloned();
            match (existing, purge) {
                (Some(_), true) => txn.delete_job(namespace, job_id)?,
                (Some(j), false) => {
                    let mut j: Job = (*j).clone();
                    j.stop = true;
                    txn.upsert_job(j)?;
                }
                (None, _) => {}
            }
            if let Some(e) = eval {
                jobs.extend(txn.upsert_evals(vec![e.clone()]));
            }
            jobs.insert(NamespacedId::new(namespace, job_id));
        }
        Command::EvalUpsert { evals } => {
            jobs.extend(txn.upsert_evals(evals.clone()));
        }
        Command::EvalDelete { eval_ids, alloc_ids } => {
            jobs.extend(txn.delete_evals(eval_ids));
            jobs.extend(txn.delete_allocs(alloc_ids));
        }
        Command::AllocClientUpdate { allocs, evals, now } => {
            jobs.extend(txn.update_allocs_from_client(allocs, now.unix_nanos()));
            let finished: std::collections::BTreeSet<&str> =
                allocs.iter().filter(|a| a.client_status.is_terminal()).map(|a| a.id.as_str()).collect();
            if !finished.is_empty() {
                txn.delete_service_registrations(|r| finished.contains(r.alloc_id.as_str()));
            }
            jobs.extend(txn.upsert_evals(evals.clone()));
        }
        Command::AllocDesiredTransition { transitions, evals } => {
            txn.update_desired_transitions(transitions)?;
            jobs.extend(txn.upsert_evals(evals.clone()));
        }
        Command::PlanApply(plan) => apply_plan(txn, plan.clone(), &mut jobs)?,
        Command::ServiceRegistrationUpsert { services } => txn.upsert_service_registrations(services),
        Command::ServiceRegistrationDeleteByAlloc { alloc_ids } => {
            txn.delete_service_registrations(|r| alloc_ids.contains(&r.alloc_id));
        }
        Command::ServiceRegistrationDeleteById { namespace, id } => {
            txn.delete_service_registrations(|r| r.id == *id && r.namespace == *namespace);
        }
        Command::NamespaceUpsert { namespaces } => {
            for ns in namespaces {
                txn.upsert_namespace(ns.clone());
            }
        }
        Command::NamespaceDelete { names } => {
            for n in names {
                txn.delete_namespace(n)?;
            }
        }
        Command::PlanApplyBatch(plans) => {
            for plan in plans {
                apply_plan(txn, plan.clone(), &mut jobs)?;
            }
        }
        Command::CsiVolumeRegister { volumes } => txn.upsert_csi_volumes(volumes)?,
        Command::CsiVolumeDeregister { namespace, volume_ids, force } => txn.deregister_csi_volumes(namespace, volume_ids, *force)?,
        Command::CsiVolumeClaim { namespace, volume_id, claim } => txn.claim_csi_volume(namespace, volume_id, claim)?,
        Command::SiTokenAccessorsRegister { accessors } => txn.upsert_si_token_accessors(accessors),
        Command::SiTokenAccessorsDeregister { accessor_ids } => txn.delete_si_token_accessors(accessor_ids),
        Command::ClusterMetadata { metadata } => txn.set_cluster_metadata(metadata),
        Command::AclPolicyUpsert { policies } => txn.upsert_acl_policies(policies),
        Command::AclPolicyDelete { names } => txn.delete_acl_policies(names)?,
        Command::AclTokenUpsert { tokens } => txn.upsert_acl_tokens(tokens),
        Command::AclTokenDelete { accessor_ids } => txn.delete_acl_tokens(accessor_ids)?,
        Command::AclTokenBootstrap { token, reset_index } => txn.bootstrap_acl_token(token, *reset_index)?,
        Command::AclRoleUpsert { roles } => txn.upsert_acl_roles(roles)?,
        Command::AclRoleDelete { ids } => txn.delete_acl_roles(ids)?,
        Command::VariableApply { op, variable, now } => txn.apply_variable(*op, variable, now.unix_nanos())?,
        Command::RootKeyUpsert { key } => txn.upsert_root_key(key),
        Command::RootKeySetState { key_id, state } => txn.set_root_key_state(key_id, state)?,
        Command::RootKeyDelete { key_id } => txn.delete_root_key(key_id)?,
        Command::DeploymentStatusUpdate { update, eval, revert_to } => {
            let reverted = match revert_to {
                Some(job) => Some(txn.upsert_job((**job).clone())?),
                None => None,
            };
            txn.update_deployment_status(std::slice::from_ref(update))?;
            let mut evals: Vec<Evaluation> = eval.iter().cloned().collect();
            if let Some(stored) = &reverted {
                for e in &mut evals {
                    e.job_modify_index = stored.job_modify_index;
                }
                jobs.insert(stored.namespaced_id());
            }
            jobs.extend(txn.upsert_evals(evals));
        }
        Command::DeploymentPromotion { deployment_id, all, groups, eval, now } => {
            txn.promote_deployment(deployment_id, *all, groups, *now)?;
            jobs.extend(txn.upsert_evals(eval.iter().cloned().collect()));
        }
        Command::DeploymentDelete { deployment_ids } => txn.delete_deployments(deployment_ids),
        Command::DeploymentAllocHealth { deployment_id, healthy, unhealthy, eval, now } => {
            txn.set_alloc_health(deployment_id, healthy, unhealthy, *now)?;
            jobs.extend(txn.upsert_evals(eval.iter().cloned().collect()));
        }
        Command::JobStability { namespace, job_id, version, stable } => txn.set_job_stability(namespace, job_id, *version, *stable)?,
        Command::PeriodicLaunch { namespace, job_id, launch, child, eval, now } => {
            txn.record_periodic_launch(namespace, job_id, *launch);
            if txn.state().job(&child.namespace, &child.id).is_none() {
                let mut child = child.clone();
                child.submit_time = now.unix_nanos();
                let stored = txn.upsert_job(child)?;
                let mut e = eval.clone();
                e.job_modify_index = stored.job_modify_index;
                jobs.extend(txn.upsert_evals(vec![e]));
                jobs.insert(stored.namespaced_id());
            }
        }
        Command::NodeDrainComplete { nodes, now } => {
            for n in nodes {
                txn.complete_node_drain(&n.node_id, n.event.clone(), *now);
            }
        }
        Command::SchedulerSetConfig { config, cas } => {
            txn.set_scheduler_config(config, *cas);
        }
        // Replaces the store rather than writing through a transaction (`ServerFsm::apply`).
        Command::SnapshotRestore { .. } => return Err(TxnError("a snapshot restore is not applied in a transaction".into())),
    }
    for key in &jobs {
        txn.refresh_job_status(key);
    }
    Ok(())
}

/// Applies plans taken out of their command (see [`ServerFsm::apply`]).
fn apply_plans(txn: &mut Txn<'_>, plans: Vec<PlanApply>) -> Result<(), TxnError> {
    let mut jobs = BTreeSet::new();
    for plan in plans {
        apply_plan(txn, plan, &mut jobs)?;
    }
    for key in &jobs {
        txn.refresh_job_status(key);
    }
    Ok(())
}

fn apply_plan(txn: &mut Txn<'_>, plan: PlanApply, jobs: &mut BTreeSet<NamespacedId>) -> Result<(), TxnError> {
    // Allocs in the log carry no job when they run the plan's job; they share one copy.
    let job = plan.job.map(Arc::new);
    let now = plan.now.unix_nanos();
    let allocs = plan
        .allocs_upserted
        .into_iter()
        .map(|mut a| {
            if a.job.is_none() {
                a.job = job.clone();
            }
            if a.create_time == 0 {
                a.create_time = now;
            }
            a.modify_time = now;
            a
        })
        .collect();
    // The deployment first: the allocs placed in it are counted as they go in.
    if let Some(d) = plan.deployment {
        txn.upsert_deployment(*d);
    }
    txn.update_deployment_status(&plan.deployment_updates)?;
    jobs.extend(txn.stop_allocs(&plan.allocs_stopped, now));
    jobs.extend(txn.upsert_allocs_from_plan(allocs));
    let mut evals = plan.evals;
    evals.extend(plan.eval);
    jobs.extend(txn.upsert_evals(evals));
    Ok(())
}
