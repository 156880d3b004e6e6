//! The on-disk form of a [`State`] for Raft snapshots.
//!
//! Tables are written as lists (JSON maps need string keys) and secondary
//! indexes are rebuilt on load. Allocs do not each carry their job: the
//! distinct job versions they run are written once and shared again on load,
//! as they are in memory.

use std::collections::HashMap;
use std::sync::Arc;

use nomad_proto::{Allocation, Evaluation, Job, JobSummary, Namespace, NamespacedId, Node};
use serde::{Deserialize, Serialize};

use super::State;

#[derive(Serialize, Deserialize)]
struct Persisted {
    version: u32,
    index: u64,
    /// Per-table indexes in [`super::Table`] order; snapshots from before a table existed have
    /// fewer (the new tables start at 0).
    table_index: Vec<u64>,
    #[serde(default)]
    csi_volumes: Vec<Arc<nomad_proto::csi::CsiVolume>>,
    #[serde(default)]
    csi_plugins: Vec<Arc<nomad_proto::csi::CsiPlugin>>,
    #[serde(default)]
    services: Vec<Arc<nomad_proto::ServiceRegistration>>,
    #[serde(default)]
    si_token_accessors: Vec<Arc<super::SiTokenAccessor>>,
    #[serde(default)]
    cluster: Option<super::ClusterMetadata>,
    #[serde(default)]
    acl_policies: Vec<Arc<crate::acl::AclPolicy>>,
    #[serde(default)]
    acl_tokens: Vec<Arc<crate::acl::AclToken>>,
    #[serde(default)]
    acl_roles: Vec<Arc<crate::acl::AclRole>>,
    #[serde(default)]
    acl_bootstrap_index: u64,
    #[serde(default)]
    variables: Vec<Arc<crate::keyring::EncryptedVariable>>,
    #[serde(default)]
    root_keys: Vec<Arc<crate::keyring::StoredRootKey>>,
    #[serde(default)]
    scheduler_config: Option<Arc<super::SchedulerConfiguration>>,
    namespaces: Vec<Arc<Namespace>>,
    jobs: Vec<Arc<Job>>,
    /// Tracked versions other than the current ones (which `jobs` holds); snapshots from before
    /// versions were kept have none, and their jobs start with their current version.
    #[serde(default)]
    job_versions: Vec<Arc<Job>>,
    #[serde(default)]
    periodic_launches: Vec<Arc<super::PeriodicLaunch>>,
    #[serde(default)]
    deployments: Vec<Arc<nomad_proto::Deployment>>,
    #[serde(default)]
    scaling_events: Vec<Arc<nomad_proto::scaling::JobScalingEvents>>,
    job_summaries: Vec<Arc<JobSummary>>,
    nodes: Vec<Arc<Node>>,
    evals: Vec<Arc<Evaluation>>,
    /// Job versions referenced by allocs.
    alloc_jobs: Vec<Arc<Job>>,
    /// Allocs without their job, and which `alloc_jobs` entry they run.
    allocs: Vec<(Allocation, Option<usize>)>,
    alloc_removed: Vec<(String, u64)>,
}

const FORMAT_VERSION: u32 = 1;

type JobVersionKey = (String, String, u64, u64, u64);

fn job_key(j: &Job) -> JobVersionKey {
    (j.namespace.clone(), j.id.clone(), j.version, j.job_modify_index, j.create_index)
}

impl State {
    /// Serializes the whole state.
    pub fn to_bytes(&self) -> Result<Vec<u8>, String> {
        let mut alloc_jobs: Vec<Arc<Job>> = Vec::new();
        let mut seen: HashMap<JobVersionKey, usize> = HashMap::new();
        let allocs = self
            .allocs
            .values()
            .map(|a| {
                let job_ref = a.job.as_ref().map(|j| {
                    *seen.entry(job_key(j)).or_insert_with(|| {
                        alloc_jobs.push(j.clone());
                        alloc_jobs.len() - 1
                    })
                });
                let mut slim = (**a).clone();
                slim.job = None;
                (slim, job_ref)
            })
            .collect();
        let p = Persisted {
            version: FORMAT_VERSION,
            index: self.index,
            table_index: self.table_index.to_vec(),
            namespaces: self.namespaces.values().cloned().collect(),
            jobs: self.jobs.values().cloned().collect(),
            job_versions: self
                .job_versions
                .iter()
                .flat_map(|(key, versions)| {
                    let current = self.jobs.get(key).map(|j| j.version);
                    versions.iter().filter(move |v| Some(v.version) != current).cloned()
                })
                .collect(),
            periodic_launches: self.periodic_launches.values().cloned().collect(),
            deployments: self.deployments.values().cloned().collect(),
            scaling_events: self.all_scaling_events().cloned().collect(),
            job_summaries: self.job_summaries.values().cloned().collect(),
            nodes: self.nodes.values().cloned().collect(),
            evals: self.evals.values().cloned().collect(),
            alloc_jobs,
            allocs,
            alloc_removed: self.alloc_removed.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            services: self.services.values().cloned().collect(),
            csi_volumes: self.csi_volumes.values().cloned().collect(),
            csi_plugins: self.csi_plugins.values().cloned().collect(),
            si_token_accessors: self.si_accessors.values().cloned().collect(),
            cluster: self.cluster.clone(),
            acl_policies: self.acl_policies.values().cloned().collect(),
            acl_tokens: self.acl_tokens.values().cloned().collect(),
            acl_roles: self.acl_roles.values().cloned().collect(),
            acl_bootstrap_index: self.acl_bootstrap_index,
            variables: self.variables.values().cloned().collect(),
            root_keys: self.root_keys.values().cloned().collect(),
            scheduler_config: self.scheduler_config.clone(),
        };
        serde_json::to_vec(&p).map_err(|e| format!("encoding state snapshot: {e}"))
    }

    /// Rebuilds a state from [`State::to_bytes`] output.
    pub fn from_bytes(bytes: &[u8]) -> Result<State, String> {
        let p: Persisted = serde_json::from_slice(bytes).map_err(|e| format!("decoding state snapshot: {e}"))?;
        if p.version != FORMAT_VERSION {
            return Err(format!("decoding state snapshot: unsupported format version {}", p.version));
        }
        if p.table_index.len() > super::TABLES {
            return Err(format!("decoding state snapshot: {} table indexes, this version knows {}", p.table_index.len(), super::TABLES));
        }
        let mut table_index = [0; super::TABLES];
        table_index[..p.table_index.len()].copy_from_slice(&p.table_index);
        let mut s = State { index: p.index, table_index, ..State::default() };
        for v in p.csi_volumes {
            s.csi_volumes.insert(NamespacedId::new(&v.namespace, &v.id), v);
        }
        for pl in p.csi_plugins {
            s.csi_plugins.insert(pl.id.clone(), pl);
        }
        for ns in p.namespaces {
            s.namespaces.insert(ns.name.clone(), ns);
        }
        let mut versions: HashMap<NamespacedId, Vec<Arc<Job>>> = HashMap::new();
        for j in p.job_versions {
            versions.entry(j.namespaced_id()).or_default().push(j);
        }
        for j in p.jobs {
            let key = j.namespaced_id();
            let mut tracked = versions.remove(&key).unwrap_or_default();
            tracked.push(j.clone());
            tracked.sort_by_key(|v| std::cmp::Reverse(v.version));
            s.job_versions.insert(key.clone(), Arc::new(tracked));
            s.jobs.insert(key, j);
        }
        for d in p.deployments {
            let id: super::Key = d.id.as_str().into();
            s.deployments_by_job.entry(NamespacedId::new(&d.namespace, &d.job_id)).or_default().insert(id.clone());
            s.deployments.insert(id, d);
        }
        s.index_scaling_policies();
        for e in p.scaling_events {
            s.scaling_events.insert(NamespacedId::new(&e.namespace, &e.job_id), e);
        }
        for l in p.periodic_launches {
            s.periodic_launches.insert(NamespacedId::new(&l.namespace, &l.id), l);
        }
        for js in p.job_summaries {
            s.job_summaries.insert(NamespacedId::new(&js.namespace, &js.job_id), js);
        }
        for n in p.nodes {
            s.nodes.insert(n.id.clone(), n);
        }
        for e in p.evals {
            let key = e.namespaced_job_id();
            let id: super::Key = e.id.as_str().into();
            s.evals_by_job.entry(key).or_default().insert(id.clone());
            s.evals.insert(id, e);
        }
        for (mut a, job_ref) in p.allocs {
            if let Some(i) = job_ref {
                let job = p
                    .alloc_jobs
                    .get(i)
                    .ok_or_else(|| format!("decoding state snapshot: alloc {} refers to missing job version {i}", a.id))?;
                a.job = Some(job.clone());
            }
            let a = Arc::new(a);
            let id: super::Key = a.id.as_str().into();
            s.allocs_by_node.entry(a.node_id.as_str().into()).or_default().insert(id.clone(), a.clone());
            s.allocs_by_job.entry(NamespacedId::new(&a.namespace, &a.job_id)).or_default().insert(id.clone(), a.clone());
            s.allocs.insert(id, a);
        }
        for r in p.services {
            s.services.insert(r.id.clone(), r);
        }
        for a in p.si_token_accessors {
            s.si_accessors.insert(a.accessor_id.clone(), a);
        }
        s.cluster = p.cluster;
        for pol in p.acl_policies {
            s.acl_policies.insert(pol.name.clone(), pol);
        }
        for t in p.acl_tokens {
            s.acl_tokens_by_secret.insert(t.secret_id.clone(), t.accessor_id.clone());
            s.acl_tokens.insert(t.accessor_id.clone(), t);
        }
        for r in p.acl_roles {
            s.acl_roles.insert(r.id.clone(), r);
        }
        s.acl_bootstrap_index = p.acl_bootstrap_index;
        for v in p.variables {
            s.variables.insert(NamespacedId::new(&v.meta.namespace, &v.meta.path), v);
        }
        for k in p.root_keys {
            s.root_keys.insert(k.meta.key_id.clone(), k);
        }
        s.scheduler_config = p.scheduler_config;
        for (node, idx) in p.alloc_removed {
            s.alloc_removed.insert(node, idx);
        }
        Ok(s)
    }
}
