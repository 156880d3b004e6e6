//! Job specification support: what nomad-rs does with every block and attribute a job can
//! carry. Nothing accepted is silently ignored: each one is
//!
//! - **honoured** by the cluster (the note says how, or that Nomad ignores it too),
//! - **refused** at admission (`Job.Register`, `Job.Plan`, `job validate`: HTTP 400) with a
//!   message that names the block and where it is in the job, e.g.
//!   `group "cache" task "redis": the "vault" block is not supported by nomad-rs yet`,
//! - or **constrained**: accepted, and kept from placement on nodes that cannot run it, with
//!   the reason the eval's failed placement shows.
//!
//! [`TABLE`] decides, one entry per feature; the issue that builds a feature flips its entry.
//! [`check`] walks a canonicalized job with exhaustive destructuring (no `..`), so a field added
//! to any job type fails to compile here until someone decides about it; the tests check that
//! the walk reaches every entry and that each refused entry is refused.

use std::fmt;

use crate::job::{
    Affinity, Constraint, CsiPluginConfig, EphemeralDisk, Job, LogConfig, MigrateStrategy, ParameterizedJobConfig, PeriodicConfig,
    ReschedulePolicy, RestartPolicy, Spread, SpreadTarget, Task, TaskArtifact, TaskGroup, TaskLifecycle, Template, UpdateStrategy,
};
use crate::resources::{DnsConfig, NetworkResource, Port, RequestedDevice, Resources};
use crate::scaling::ScalingPolicy;
use crate::service::{
    CheckRestart, ConsulConnect, ConsulGateway, ConsulLinkedService, ConsulProxy, ConsulSidecarService, ConsulTerminatingConfigEntry,
    ConsulUpstream, SERVICE_PROVIDER_CONSUL, SERVICE_PROVIDER_NOMAD, Service, ServiceCheck, SidecarTask,
};
use crate::validate::escape_unsafe_chars;
use crate::volume::{CsiMountOptions, VolumeMount, VolumeRequest};

/// What the cluster does with a feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Done as Nomad does; the note says by what (or that Nomad ignores it as well).
    Honoured(&'static str),
    /// Refused at admission; the text (may be empty) is added to the message as advice.
    Refused(&'static str),
    /// Accepted; allocs are placed only on nodes that can run it, else the placement fails
    /// with this reason.
    Constrained(&'static str),
}

/// How a feature is written in a job file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `name { ... }`.
    Block,
    /// `name = value`.
    Attribute,
    /// A particular value of an attribute (`mode = "bridge"`).
    Value,
}

/// One row of [`TABLE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The feature.
    pub feature: Feature,
    /// Its name in the job file (or the value, for [`Kind::Value`]).
    pub name: &'static str,
    /// Block, attribute or value.
    pub kind: Kind,
    /// The blocks it appears in.
    pub scope: &'static str,
    /// What happens to it.
    pub fate: Fate,
}

const H: fn(&'static str) -> Fate = Fate::Honoured;
const R: fn(&'static str) -> Fate = Fate::Refused;

macro_rules! table {
    ($($feature:ident: $kind:ident $name:literal in $scope:literal => $fate:expr,)*) => {
        /// A block, attribute or attribute value of the job specification.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Feature { $(#[doc = $name] $feature),* }

        /// The fate of every feature, in the order of [`Feature`].
        pub static TABLE: std::sync::LazyLock<Vec<Entry>> = std::sync::LazyLock::new(|| vec![
            $(Entry { feature: Feature::$feature, name: $name, kind: Kind::$kind, scope: $scope, fate: $fate }),*
        ]);
    };
}

table! {
    // Job.
    Name: Attribute "name" in "job, group, task" => H("names the object"),
    JobId: Attribute "id" in "job" => H("the job's key"),
    JobRegion: Attribute "region" in "job" => H("must be the cluster's region: the servers refuse another, as they do not forward between regions"),
    JobNamespace: Attribute "namespace" in "job" => H("the namespace must exist"),
    JobType: Attribute "type" in "job" => H("service, batch, system and sysbatch schedulers"),
    JobPriority: Attribute "priority" in "job" => H("eval broker order"),
    JobAllAtOnce: Attribute "all_at_once" in "job" => H("the plan applier places all or nothing"),
    JobDatacenters: Attribute "datacenters" in "job" => H("placement filter, globs allowed"),
    JobNodePool: Attribute "node_pool" in "job" => H("placement filter"),
    JobStop: Attribute "stop" in "job" => H("every alloc is stopped"),
    JobServerSet: Attribute "status, version, index and dispatch bookkeeping fields" in "job (JSON)" => H("set by the servers"),
    ConsulToken: Attribute "consul_token" in "job" => H("accepted and not checked, as Nomad's servers do with their default consul.allow_unauthenticated = true"),
    VaultToken: Attribute "vault_token" in "job" => H("accepted and unused: it only authorizes vault blocks, which are refused"),
    ConsulNamespace: Attribute "consul_namespace" in "job" => R(""),
    VaultNamespace: Attribute "vault_namespace" in "job" => R(""),
    Multiregion: Block "multiregion" in "job" => R(""),
    Periodic: Block "periodic" in "job" => H("the leader launches a child <job>/periodic-<unix> at each cron time (cron or crons, time_zone from the servers' tz database, prohibit_overlap, enabled); after a leader change one missed launch runs at once"),
    Parameterized: Block "parameterized" in "job" => H("PUT /v1/job/:id/dispatch and job dispatch make children <job>/dispatch-<unix>-<8 hex> (payload rule and 16 KiB limit, meta_required and meta_optional, idempotency tokens)"),
    Payload: Attribute "payload" in "job (JSON)" => R("job can't be submitted with a payload, only dispatched"),
    Meta: Attribute "meta" in "job, group, task" => H("NOMAD_META_* and ${meta.*}"),
    Constraint: Block "constraint" in "job, group, task" => H("scheduler feasibility"),
    Affinity: Block "affinity" in "job, group, task" => H("scheduler ranking"),
    Spread: Block "spread" in "job, group" => H("scheduler ranking"),
    // update, job or group.
    UpdateMaxParallel: Attribute "max_parallel" in "update" => H("a service job's new version rolls out in a deployment, this many allocs at a time, each batch once the last is healthy; system jobs: this many at a time"),
    UpdateStagger: Attribute "stagger" in "update" => H("system jobs: wait between batches"),
    UpdateMinHealthyTime: Attribute "min_healthy_time" in "update" => H("the client reports an alloc healthy once its tasks (and checks) have been fine this long"),
    UpdateHealthCheck: Attribute "health_check" in "update" => H("\"checks\" (the default) waits for the tasks and for the alloc's Consul checks, per their on_update; \"task_states\" for the tasks only"),
    UpdateManualHealth: Value "health_check = \"manual\"" in "update" => H("the client reports nothing: PUT /v1/deployment/allocation-health/:id sets it"),
    UpdateHealthyDeadline: Attribute "healthy_deadline" in "update" => H("the client reports an alloc unhealthy if it is not healthy by then"),
    UpdateProgressDeadline: Attribute "progress_deadline" in "update" => H("the deployment fails when a group is not healthy this long after its last progress (0: at its first unhealthy alloc)"),
    UpdateCanary: Attribute "canary" in "update" => H("a destructive update first places this many canaries beside the old allocs; the rest waits for deployment promote (or auto_promote), then replaces the old allocs max_parallel at a time"),
    UpdateAutoRevert: Attribute "auto_revert" in "update" => H("a failed deployment reverts the job to its latest stable version (not when that has the same spec)"),
    UpdateAutoPromote: Attribute "auto_promote" in "update" => H("the leader promotes the deployment once every canary group has auto_promote and all its canaries are healthy"),
    // Group.
    GroupCount: Attribute "count" in "group" => H("the reconciler keeps this many allocs"),
    Migrate: Block "migrate" in "group" => H("the drainer migrates max_parallel at a time, health judged as health_check says (Consul checks included with \"checks\")"),
    Scaling: Block "scaling" in "group" => H("job scale and PUT /v1/job/:id/scale keep the count within min and max, recording scaling events; the policy is listed at /v1/scaling/policies for an autoscaler"),
    TaskScaling: Block "scaling \"cpu\"|\"mem\"" in "task" => R("vertical scaling policies are a Nomad Enterprise feature"),
    Restart: Block "restart" in "group, task" => H("the task runner's restart tracker (render_templates: templates are rendered afresh before a restart)"),
    Reschedule: Block "reschedule" in "group" => H("the reconciler's reschedule tracker"),
    EphemeralDiskSize: Attribute "size" in "ephemeral_disk" => H("disk the scheduler reserves"),
    EphemeralDiskSticky: Attribute "sticky" in "ephemeral_disk" => R("the alloc's data is not carried to its replacement"),
    EphemeralDiskMigrate: Attribute "migrate" in "ephemeral_disk" => R("the alloc's data is not carried to its replacement"),
    ShutdownDelay: Attribute "shutdown_delay" in "group, task" => H("waited for after services are deregistered"),
    StopAfterClientDisconnect: Attribute "stop_after_client_disconnect" in "group" => H("the reconciler"),
    MaxClientDisconnect: Attribute "max_client_disconnect" in "group" => H("the reconciler keeps allocs unknown"),
    GroupConsul: Block "consul" in "group" => R(""),
    // network, group or task.
    NetworkModeHost: Value "mode = \"host\"" in "network" => H("ports on the host's addresses"),
    NetworkModeBridge: Value "mode = \"bridge\"" in "network" => Fate::Constrained("missing network"),
    NetworkModeCni: Value "mode = \"cni/<name>\"" in "network" => Fate::Constrained("missing network"),
    NetworkModeNone: Value "mode = \"none\"" in "network" => H("a network namespace with only a loopback interface, down, as Nomad's"),
    NetworkMode: Attribute "mode" in "network" => R("host, bridge, none and cni/<name> are run"),
    NetworkHostname: Attribute "hostname" in "network" => R("the network namespace's hostname is not set yet"),
    NetworkDns: Block "dns" in "network" => H("exec and oci tasks get a resolv.conf made from it bound over /etc/resolv.conf; fields left unset are the host's"),
    NetworkDnsRawExec: Value "dns {} in a group with a raw_exec task" in "network" => R("raw_exec tasks read the host's /etc/resolv.conf: nothing can be bound over it"),
    NetworkDevice: Attribute "device" in "network" => R(""),
    NetworkCidr: Attribute "cidr" in "network" => R(""),
    NetworkIp: Attribute "ip" in "network" => R(""),
    NetworkMbits: Attribute "mbits" in "network" => H("ignored, as Nomad does (deprecated)"),
    Port: Block "port" in "network" => H("static and dynamic ports, to, host_network"),
    // service, group or task.
    ServiceNomad: Value "provider = \"nomad\"" in "service" => H("registered by the client in Nomad's service catalog"),
    ServiceConsul: Value "provider = \"consul\"" in "service" => Fate::Constrained("${attr.consul.version} semver >= 1.7.0"),
    ServiceFields: Attribute "name, port, tags, address, task" in "service" => H("the registration"),
    OnUpdate: Attribute "on_update" in "service, check" => H("a Consul check counts toward the alloc's health (deployments, migrations) as require_healthy (passing), ignore_warnings (passing or warning) or ignore (registered, any status); a Nomad check as require_healthy (success) or ignore (a readiness check: success or failure)"),
    ServiceAddressMode: Attribute "address_mode" in "service, check" => R("\"auto\" and \"host\" are run, and \"alloc\" for Consul services and Nomad checks; no driver advertises a network for \"driver\""),
    ServiceConsulOnly: Attribute "enable_tag_override, canary_tags, canary_meta, tagged_addresses, meta" in "service" => H("registered in Consul for Consul services (canary_tags and canary_meta while the alloc is an unpromoted canary); canary_tags also tag nomad services, the rest is ignored for them, as Nomad does"),
    ServiceCheck: Block "check" in "service" => H("http, tcp and grpc checks of Consul services, registered for the Consul agent to run"),
    ServiceCheckNomad: Value "check in a provider = \"nomad\" service" in "service" => H("http and tcp checks run by the client (the first at interval/2, then every interval), results at /v1/allocation/<id>/checks, counted in deployment and migration health and by check_restart"),
    ServiceCheckNomadConsulOnly: Attribute "expose, success_before_passing, failures_before_critical, tls_server_name, address_mode = \"driver\", on_update = \"ignore_warnings\", check_restart ignore_warnings" in "check of a provider = \"nomad\" service" => H("refused by validation with Nomad's messages (Consul checks only)"),
    ServiceCheckNomadIgnored: Attribute "tls_skip_verify, initial_status" in "check of a provider = \"nomad\" service" => H("ignored, as Nomad does: a check starts pending, and an https check verifies the certificate against the host's roots"),
    ServiceCheckScript: Value "type = \"script\"" in "check" => H("run by the client in the task through its driver, reported to Consul as a TTL check"),
    ServiceCheckExpose: Attribute "expose" in "check" => H("an http or grpc check of a group service with a Connect sidecar gets the dynamic port svc_<service>_ck_<hash> and an expose path in the sidecar's proxy, as Nomad's servers add them"),
    CheckRestart: Block "check_restart" in "service, check" => H("the client watches the check statuses (Consul's, or its own for Nomad checks) and restarts the task (task services)"),
    GroupCheckRestart: Value "check_restart in a group service" in "service, check" => R("Nomad restarts the whole allocation for those; put the service in the task"),
    Connect: Block "connect" in "service" => H("validated as Nomad does: exactly one of sidecar_service, native and gateway, lower-case service and group names"),
    ConnectTaskService: Value "connect in a task service" in "service" => R("Nomad runs Consul Connect for group services: move the service into the group"),
    ConnectSidecarService: Block "sidecar_service" in "service connect" => Fate::Constrained("${attr.consul.version} semver >= 1.8.0"),
    ConnectSidecarTask: Block "sidecar_task" in "service connect" => H("merged over the injected Envoy task as Nomad's MergeIntoTask (without resources, logs or shutdown_delay it has Nomad's task defaults)"),
    ConnectProxy: Block "proxy" in "sidecar_service" => H("local_service_address, local_service_port, expose and config are passed to Consul in the sidecar's registration"),
    ConnectUpstreams: Block "upstreams" in "proxy" => H("passed to Consul in the sidecar's registration; listeners (local_bind_address:local_bind_port) unique in the group as Nomad checks"),
    ConnectNative: Attribute "native" in "service connect" => H("the backing task (service.task, or the group's only task) gets kind connect-native:<service>"),
    ConnectGateway: Block "gateway" in "service connect" => Fate::Constrained("${attr.consul.version} semver >= 1.8.0"),
    ConnectGatewayMesh: Block "mesh" in "gateway" => R("ingress and terminating gateways are run; the client does not register mesh gateways"),
    // volume (group).
    HostVolume: Value "type = \"host\"" in "volume" => Fate::Constrained("missing compatible host volumes"),
    CsiVolume: Value "type = \"csi\"" in "volume" => H("claimed through CSIVolume.Claim (retried while the volume has no free claim), staged and published by the node plugin, bound into exec and oci tasks by volume_mount, published first by a controller of the plugin when it attaches volumes, unpublished and released when the alloc stops"),
    // Task.
    Driver: Attribute "driver" in "task" => Fate::Constrained("missing drivers"),
    User: Attribute "user" in "task" => H("exec and oci drivers"),
    RawExecUser: Value "user with driver = \"raw_exec\"" in "task" => R("raw_exec runs tasks as the agent's user"),
    Config: Block "config" in "task" => H("checked by the driver when the task starts"),
    Env: Block "env" in "task" => H("the task's environment"),
    Lifecycle: Block "lifecycle" in "task" => H("prestart, poststart, poststop, sidecar"),
    Leader: Attribute "leader" in "task" => H("the alloc runner stops the group when the leader exits"),
    KillTimeout: Attribute "kill_timeout" in "task" => H("capped by the client's max_kill_timeout"),
    KillSignal: Attribute "kill_signal" in "task" => H("sent by the executor on stop"),
    Logs: Block "logs" in "task" => H("max_files and max_file_size rotate the task's logs"),
    LogsDisabled: Attribute "disabled" in "logs" => R("the executor always collects logs"),
    Vault: Block "vault" in "group, task" => R(""),
    Template: Block "template" in "task" => H("rendered by the client before the task starts and again when its data changes (Go text/template with consul-template's functions: Nomad variables and services, Consul keys and services through the agent's consul {} block, sockaddr, env, file and the pure helpers; Vault functions fail the task with a message naming them), change_mode restart, signal, script or noop with splay, env = true into the task's environment, destinations beneath the alloc dir"),
    Artifact: Block "artifact" in "task" => H("fetched by the client before the task starts, over http and https (headers, options as query parameters, checksum, zip and tar/gz/bz2/xz/zst unpacking), written beneath the task's dirs"),
    ArtifactSource: Value "source other than http:// or https://" in "artifact" => R("nomad-rs fetches only http and https artifacts (no git, hg, s3, gcs or local files)"),
    DispatchPayload: Block "dispatch_payload" in "task" => H("a dispatched child's payload is written to local/<file> before the task starts"),
    VolumeMount: Block "volume_mount" in "task" => R("only CSI volumes are mounted into tasks: host volumes are not"),
    VolumeMountCsi: Value "volume_mount of a type = \"csi\" volume" in "task" => H("bound at destination (read_only and propagation_mode honoured) for exec and oci tasks; refused when the task's driver takes no mounts (raw_exec)"),
    TaskKind: Attribute "kind" in "task" => H("marks Consul Connect tasks: a task of kind connect-proxy:<service> is that service's sidecar, and none is injected"),
    CsiPlugin: Block "csi_plugin" in "task" => H("raw_exec and exec tasks: the plugin supervisor gives the task CSI_ENDPOINT (exec: the socket dir at mount_dir and the staging root at stage_publish_base_dir, bidirectional, and /dev), probes it and registers it with the client's CSI manager, which fingerprints it into the node"),
    CsiPluginIsolated: Value "csi_plugin with a driver other than \"raw_exec\" or \"exec\"" in "task" => R("only those drivers run a plugin that can mount volumes (oci containers get no capability to mount with)"),
    Identity: Block "identity" in "task" => H("the servers sign the task's workload identity (EdDSA JWT, the keyring's active key): NOMAD_TOKEN with env = true, secrets/nomad_token with file = true, and the task API on secrets/api.sock; it reads and lists the task's nomad/jobs/<job>[/<group>[/<task>]] variables and reads its namespace's Nomad services, until the alloc finishes"),
    IdentityFields: Value "identity fields other than env and file" in "identity" => R("Nomad 1.6 has only env and file (name, aud and ttl are later Nomad's)"),
    // resources (task).
    Cpu: Attribute "cpu" in "resources" => H("scheduler fit, cgroup weight"),
    Cores: Attribute "cores" in "resources" => R("tasks are not pinned to reserved cores"),
    Memory: Attribute "memory" in "resources" => H("scheduler fit, cgroup limit"),
    MemoryMax: Attribute "memory_max" in "resources" => H("cgroup limit (exec, oci)"),
    Disk: Attribute "disk" in "resources" => H("refused by validation, as Nomad does (ephemeral_disk is the group's disk)"),
    Device: Block "device" in "resources" => R("devices are not assigned to tasks"),
}

impl Feature {
    /// This feature's row of [`TABLE`].
    pub fn entry(self) -> &'static Entry {
        &TABLE[self as usize]
    }
}

impl Entry {
    /// How the message names it: `the "template" block`, `provider = "consul"`.
    fn described(&self) -> String {
        match self.kind {
            Kind::Block => format!("the {:?} block", self.name),
            Kind::Attribute => format!("the {:?} attribute", self.name),
            Kind::Value => self.name.to_string(),
        }
    }
}

/// The features of a job that nomad-rs does not run, one message each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported(pub Vec<String>);

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [one] => f.write_str(one),
            all => {
                writeln!(f, "{} errors occurred:", all.len())?;
                for e in all {
                    writeln!(f, "\t* {e}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for Unsupported {}

impl Job {
    /// Refuses a canonicalized job that uses anything [`TABLE`] refuses, naming each use.
    pub fn check_supported(&self) -> Result<(), Unsupported> {
        let mut w = Walk::default();
        w.job(self);
        if w.refused.is_empty() { Ok(()) } else { Err(Unsupported(w.refused)) }
    }
}

/// The attribute Nomad's implied constraint on Consul services reads.
pub const CONSUL_VERSION_ATTRIBUTE: &str = "${attr.consul.version}";
/// The attribute Nomad's implied constraint on Nomad services reads.
pub const NOMAD_SERVICE_DISCOVERY_ATTRIBUTE: &str = "${attr.nomad.service_discovery}";
/// The attribute Nomad's implied constraint on Nomad service checks reads.
pub const NOMAD_VERSION_ATTRIBUTE: &str = "${attr.nomad.version}";
/// The attribute Nomad's implied constraint on signals reads.
pub const OS_SIGNALS_ATTRIBUTE: &str = "${attr.os.signals}";

impl Job {
    /// Nomad's `jobImpliedConstraints` (`nomad/job_endpoint_hooks.go`) for what nomad-rs runs,
    /// so the scheduler keeps a group off nodes that cannot run it:
    /// - a Consul service (the group's or a task's): `${attr.consul.version} semver >= 1.7.0`,
    ///   unless the group already constrains that attribute;
    /// - a Nomad service: `${attr.nomad.service_discovery} = true`; with checks, also
    ///   `${attr.nomad.version} semver >= 1.4.0`;
    /// - a task's `kill_signal` or a template's `change_signal`: `${attr.os.signals}
    ///   set_contains` the group's signals, sorted and unique.
    ///
    /// Those three are added unless an equal constraint is there already.
    pub fn add_implied_constraints(&mut self) {
        for g in &mut self.task_groups {
            let services = || g.services.iter().chain(g.tasks.iter().flat_map(|t| t.services.iter()));
            let consul = services().any(|s| s.provider == SERVICE_PROVIDER_CONSUL || s.provider.is_empty());
            let native = services().any(|s| s.provider == SERVICE_PROVIDER_NOMAD);
            let native_checks = services().any(|s| s.provider == SERVICE_PROVIDER_NOMAD && !s.checks.is_empty());
            let mut signals: Vec<&str> = g
                .tasks
                .iter()
                .flat_map(|t| {
                    let changes = t.templates.iter().filter(|tpl| tpl.change_mode == "signal").map(|tpl| tpl.change_signal.as_str());
                    changes.chain((!t.kill_signal.is_empty()).then_some(t.kill_signal.as_str()))
                })
                .collect();
            signals.sort_unstable();
            signals.dedup();
            let signals = (!signals.is_empty()).then(|| signals.join(","));
            let mut add_unless_equal = |c: crate::Constraint| {
                if !g.constraints.contains(&c) {
                    g.constraints.push(c);
                }
            };
            if let Some(set) = signals {
                add_unless_equal(crate::Constraint {
                    l_target: OS_SIGNALS_ATTRIBUTE.into(),
                    r_target: set,
                    operand: "set_contains".into(),
                });
            }
            if native {
                add_unless_equal(crate::Constraint {
                    l_target: NOMAD_SERVICE_DISCOVERY_ATTRIBUTE.into(),
                    r_target: "true".into(),
                    operand: "=".into(),
                });
            }
            if native_checks {
                add_unless_equal(crate::Constraint {
                    l_target: NOMAD_VERSION_ATTRIBUTE.into(),
                    r_target: ">= 1.4.0".into(),
                    operand: "semver".into(),
                });
            }
            if consul && !g.constraints.iter().any(|c| c.l_target == CONSUL_VERSION_ATTRIBUTE) {
                g.constraints.push(crate::Constraint {
                    l_target: CONSUL_VERSION_ATTRIBUTE.into(),
                    r_target: ">= 1.7.0".into(),
                    operand: "semver".into(),
                });
            }
        }
    }
}

/// The features a job uses, whatever their fate (for tests and tools).
pub fn features_used(job: &Job) -> Vec<Feature> {
    let mut w = Walk::default();
    w.job(job);
    w.used
}

/// Every feature the walk decided about, used or not: the walk reaches every [`TABLE`] entry.
pub fn features_visited(job: &Job) -> Vec<Feature> {
    let mut w = Walk::default();
    w.job(job);
    w.visited
}

#[derive(Default)]
struct Walk {
    path: Vec<String>,
    refused: Vec<String>,
    used: Vec<Feature>,
    visited: Vec<Feature>,
    /// The CSI volumes of the group being walked, by name (`volume_mount` onto them is run).
    csi_volumes: Vec<String>,
}

/// [`Walk::service`] of a group's service (a task's: `!IN_GROUP`).
const IN_GROUP: bool = true;

fn named(kind: &str, name: &str) -> String {
    format!("{kind} \"{}\"", escape_unsafe_chars(name, &[]).replace('"', "\\\""))
}

impl Walk {
    /// Decides `feature` at the current path; `used` says whether the job uses it.
    fn decide(&mut self, feature: Feature, used: bool) {
        if !self.visited.contains(&feature) {
            self.visited.push(feature);
        }
        if !used {
            return;
        }
        if !self.used.contains(&feature) {
            self.used.push(feature);
        }
        let entry = feature.entry();
        if let Fate::Refused(advice) = entry.fate {
            let at = if self.path.is_empty() { String::new() } else { format!("{}: ", self.path.join(" ")) };
            let advice = if advice.is_empty() { String::new() } else { format!("; {advice}") };
            let msg = format!("{at}{} is not supported by nomad-rs yet{advice}", entry.described());
            if !self.refused.contains(&msg) {
                self.refused.push(msg);
            }
        }
    }

    fn within<F: FnOnce(&mut Walk)>(&mut self, segment: String, f: F) {
        self.path.push(segment);
        f(self);
        self.path.pop();
    }

    fn job(&mut self, job: &Job) {
        let Job {
            stop: _,
            region: _,
            namespace: _,
            id,
            parent_id: _,
            name: _,
            job_type: _,
            priority: _,
            all_at_once: _,
            datacenters: _,
            node_pool: _,
            constraints,
            affinities,
            spreads,
            task_groups,
            update,
            multiregion,
            periodic,
            parameterized_job,
            dispatched: _,
            dispatch_idempotency_token: _,
            payload,
            meta: _,
            consul_token,
            consul_namespace,
            vault_token,
            vault_namespace,
            nomad_token_id: _,
            status: _,
            status_description: _,
            stable: _,
            version: _,
            submit_time: _,
            create_index: _,
            modify_index: _,
            job_modify_index: _,
        } = job;
        self.within(named("job", id), |w| {
            for f in [
                Feature::Name,
                Feature::JobId,
                Feature::JobRegion,
                Feature::JobNamespace,
                Feature::JobType,
                Feature::JobPriority,
                Feature::JobAllAtOnce,
                Feature::JobDatacenters,
                Feature::JobNodePool,
                Feature::JobStop,
                Feature::JobServerSet,
                Feature::Meta,
            ] {
                w.decide(f, true);
            }
            w.decide(Feature::ConsulToken, !consul_token.is_empty());
            w.decide(Feature::VaultToken, !vault_token.is_empty());
            w.decide(Feature::ConsulNamespace, !consul_namespace.is_empty());
            w.decide(Feature::VaultNamespace, !vault_namespace.is_empty());
            w.decide(Feature::Multiregion, multiregion.as_ref().is_some_and(|m| !m.is_null()));
            w.periodic(periodic.as_ref());
            w.parameterized(parameterized_job.as_ref());
            w.decide(Feature::Payload, payload.as_ref().is_some_and(|p| !p.is_empty()));
            w.placement(constraints, affinities, spreads);
            if let Some(u) = update {
                w.within("update".into(), |w| w.update(u));
            }
        });
        for g in task_groups {
            self.within(named("group", &g.name), |w| w.group(g));
        }
    }

    fn periodic(&mut self, p: Option<&PeriodicConfig>) {
        // The whole block is one entry.
        if let Some(PeriodicConfig { enabled: _, spec: _, specs: _, spec_type: _, prohibit_overlap: _, time_zone: _ }) = p {}
        self.decide(Feature::Periodic, p.is_some());
    }

    fn parameterized(&mut self, p: Option<&ParameterizedJobConfig>) {
        if let Some(ParameterizedJobConfig { payload: _, meta_required: _, meta_optional: _ }) = p {}
        self.decide(Feature::Parameterized, p.is_some());
    }

    fn placement(&mut self, constraints: &[Constraint], affinities: &[Affinity], spreads: &[Spread]) {
        for Constraint { l_target: _, r_target: _, operand: _ } in constraints {}
        for Affinity { l_target: _, r_target: _, operand: _, weight: _ } in affinities {}
        for Spread { attribute: _, weight: _, spread_target } in spreads {
            for SpreadTarget { value: _, percent: _ } in spread_target {}
        }
        self.decide(Feature::Constraint, !constraints.is_empty());
        self.decide(Feature::Affinity, !affinities.is_empty());
        self.decide(Feature::Spread, !spreads.is_empty());
    }

    fn update(&mut self, u: &UpdateStrategy) {
        let UpdateStrategy {
            stagger,
            max_parallel,
            health_check,
            min_healthy_time,
            healthy_deadline,
            progress_deadline,
            auto_revert,
            auto_promote,
            canary,
        } = u;
        let d = UpdateStrategy::default_service();
        // Canonicalizing fills the defaults of service jobs; other types may leave zeros.
        let differs = |v: i64, default: i64| v != 0 && v != default;
        self.decide(Feature::UpdateStagger, *stagger != 0);
        self.decide(Feature::UpdateMaxParallel, *max_parallel != 0);
        self.decide(Feature::UpdateMinHealthyTime, *min_healthy_time != 0);
        self.decide(Feature::UpdateHealthCheck, !health_check.is_empty());
        self.decide(Feature::UpdateManualHealth, health_check == "manual");
        self.decide(Feature::UpdateHealthyDeadline, differs(*healthy_deadline, d.healthy_deadline));
        self.decide(Feature::UpdateProgressDeadline, differs(*progress_deadline, d.progress_deadline));
        self.decide(Feature::UpdateCanary, *canary > 0);
        self.decide(Feature::UpdateAutoRevert, *auto_revert);
        self.decide(Feature::UpdateAutoPromote, *auto_promote);
    }

    fn group(&mut self, g: &TaskGroup) {
        let TaskGroup {
            name: _,
            count: _,
            update,
            migrate,
            constraints,
            affinities,
            spreads,
            scaling,
            restart_policy,
            tasks,
            ephemeral_disk,
            meta: _,
            reschedule_policy,
            networks,
            consul,
            services,
            volumes,
            shutdown_delay,
            stop_after_client_disconnect,
            max_client_disconnect,
        } = g;
        self.decide(Feature::Name, true);
        self.decide(Feature::GroupCount, true);
        self.decide(Feature::Meta, !g.meta.is_empty());
        if let Some(u) = update {
            self.within("update".into(), |w| w.update(u));
        }
        if let Some(MigrateStrategy { max_parallel: _, health_check: _, min_healthy_time: _, healthy_deadline: _ }) = migrate {}
        self.decide(Feature::Migrate, migrate.is_some());
        self.placement(constraints, affinities, spreads);
        if let Some(ScalingPolicy {
            id: _,
            policy_type: _,
            target: _,
            policy: _,
            min: _,
            max: _,
            enabled: _,
            create_index: _,
            modify_index: _,
        }) = scaling
        {}
        self.decide(Feature::Scaling, scaling.is_some());
        self.restart(restart_policy.as_ref());
        if let Some(ReschedulePolicy { attempts: _, interval: _, delay: _, delay_function: _, max_delay: _, unlimited: _ }) =
            reschedule_policy
        {}
        self.decide(Feature::Reschedule, reschedule_policy.is_some());
        let EphemeralDisk { sticky, size_mb, migrate: disk_migrate } = ephemeral_disk;
        self.within("ephemeral_disk".into(), |w| {
            w.decide(Feature::EphemeralDiskSize, *size_mb != 0);
            w.decide(Feature::EphemeralDiskSticky, *sticky);
            w.decide(Feature::EphemeralDiskMigrate, *disk_migrate);
        });
        for n in networks {
            self.within("network".into(), |w| w.network(n));
        }
        let raw_exec = g.tasks.iter().any(|t| t.driver == "raw_exec");
        self.within("network".into(), |w| w.decide(Feature::NetworkDnsRawExec, raw_exec && networks.iter().any(|n| n.dns.is_some())));
        self.decide(Feature::GroupConsul, consul.as_ref().is_some_and(|c| !c.is_null()));
        for s in services {
            self.within(named("service", &s.name), |w| w.service(s, IN_GROUP));
        }
        for (name, v) in volumes {
            self.within(named("volume", name), |w| w.volume(v));
        }
        self.csi_volumes = volumes.iter().filter(|(_, v)| v.volume_type == "csi").map(|(name, _)| name.clone()).collect();
        self.decide(Feature::ShutdownDelay, shutdown_delay.is_some());
        self.decide(Feature::StopAfterClientDisconnect, stop_after_client_disconnect.is_some());
        self.decide(Feature::MaxClientDisconnect, max_client_disconnect.is_some());
        for t in tasks {
            self.within(named("task", &t.name), |w| w.task(t));
        }
    }

    fn restart(&mut self, r: Option<&RestartPolicy>) {
        // `unset` is decoding bookkeeping, empty once canonicalized: not a key of the block.
        if let Some(RestartPolicy { attempts: _, interval: _, delay: _, mode: _, render_templates: _, unset: _ }) = r {}
        self.decide(Feature::Restart, r.is_some());
    }

    fn network(&mut self, n: &NetworkResource) {
        let NetworkResource { mode, device, cidr, ip, hostname, mbits, dns, reserved_ports, dynamic_ports } = n;
        let host = mode.is_empty() || mode == "host";
        let cni = mode.strip_prefix("cni/").is_some_and(|name| !name.is_empty());
        self.decide(Feature::NetworkModeHost, host);
        self.decide(Feature::NetworkModeBridge, mode == "bridge");
        self.decide(Feature::NetworkModeCni, cni);
        self.decide(Feature::NetworkModeNone, mode == "none");
        self.decide(Feature::NetworkMode, false);
        if !host && !cni && mode != "bridge" && mode != "none" {
            self.refuse_value(Feature::NetworkMode, "mode", mode);
        }
        self.decide(Feature::NetworkDevice, !device.is_empty());
        self.decide(Feature::NetworkCidr, !cidr.is_empty());
        self.decide(Feature::NetworkIp, !ip.is_empty());
        self.decide(Feature::NetworkHostname, !hostname.is_empty());
        self.decide(Feature::NetworkMbits, *mbits != 0);
        if let Some(DnsConfig { servers: _, searches: _, options: _ }) = dns {}
        self.decide(Feature::NetworkDns, dns.is_some());
        for Port { label: _, value: _, to: _, host_network: _ } in reserved_ports.iter().chain(dynamic_ports) {}
        self.decide(Feature::Port, !reserved_ports.is_empty() || !dynamic_ports.is_empty());
    }

    /// Refuses an attribute for its value: `network: mode = "bridge" is not supported ...`.
    fn refuse_value(&mut self, feature: Feature, attribute: &str, value: &str) {
        if !self.used.contains(&feature) {
            self.used.push(feature);
        }
        if let Fate::Refused(advice) = feature.entry().fate {
            let advice = if advice.is_empty() { String::new() } else { format!("; {advice}") };
            let msg = format!(
                "{}: {attribute} = \"{}\" is not supported by nomad-rs yet{advice}",
                self.path.join(" "),
                escape_unsafe_chars(value, &[]).replace('"', "\\\"")
            );
            if !self.refused.contains(&msg) {
                self.refused.push(msg);
            }
        }
    }

    fn service(&mut self, s: &Service, in_group: bool) {
        let Service {
            name: _,
            task_name: _,
            port_label: _,
            address_mode,
            address: _,
            enable_tag_override,
            tags: _,
            canary_tags,
            checks,
            connect,
            meta,
            canary_meta,
            tagged_addresses,
            namespace: _,
            on_update,
            provider,
            check_restart: _,
        } = s;
        let consul = provider == SERVICE_PROVIDER_CONSUL || provider.is_empty();
        self.decide(Feature::ServiceNomad, !consul);
        self.decide(Feature::ServiceConsul, consul);
        self.decide(Feature::ServiceFields, true);
        self.decide(Feature::OnUpdate, !on_update.is_empty() || checks.iter().any(|c| !c.on_update.is_empty()));
        self.decide(
            Feature::ServiceConsulOnly,
            *enable_tag_override || !canary_tags.is_empty() || !meta.is_empty() || !canary_meta.is_empty() || !tagged_addresses.is_empty(),
        );
        let known_mode = |mode: &str| matches!(mode, "" | "auto" | "host") || (consul && mode == "alloc");
        self.decide(Feature::ServiceAddressMode, false);
        if !known_mode(address_mode) {
            self.refuse_value(Feature::ServiceAddressMode, "address_mode", address_mode);
        }
        for f in [
            Feature::ServiceCheckNomad,
            Feature::ServiceCheckNomadConsulOnly,
            Feature::ServiceCheckNomadIgnored,
            Feature::ServiceCheckScript,
            Feature::ServiceCheckExpose,
            Feature::CheckRestart,
            Feature::GroupCheckRestart,
        ] {
            self.decide(f, false);
        }
        for c in checks {
            let ServiceCheck {
                name,
                check_type,
                command: _,
                args: _,
                path: _,
                protocol: _,
                port_label: _,
                expose,
                address_mode: check_address_mode,
                interval: _,
                timeout: _,
                initial_status,
                tls_skip_verify,
                tls_server_name,
                method: _,
                header: _,
                check_restart,
                grpc_service: _,
                grpc_use_tls: _,
                task_name: _,
                success_before_passing,
                failures_before_critical,
                body: _,
                on_update: _,
            } = c;
            if let Some(CheckRestart { limit: _, grace: _, ignore_warnings: _ }) = check_restart {}
            self.within(named("check", name), |w| {
                w.decide(Feature::ServiceCheckScript, check_type == "script");
                w.decide(Feature::ServiceCheckExpose, *expose);
                w.decide(Feature::CheckRestart, check_restart.is_some());
                w.decide(Feature::GroupCheckRestart, in_group && check_restart.as_ref().is_some_and(|r| r.limit > 0));
                // Nomad's validation refuses these in its own words (`validateNomad`).
                let consul_only = *expose
                    || *success_before_passing != 0
                    || *failures_before_critical != 0
                    || !tls_server_name.is_empty()
                    || check_address_mode == "driver"
                    || c.on_update == "ignore_warnings"
                    || check_restart.as_ref().is_some_and(|r| r.ignore_warnings);
                w.decide(Feature::ServiceCheckNomadConsulOnly, !consul && consul_only);
                w.decide(Feature::ServiceCheckNomadIgnored, !consul && (*tls_skip_verify || !initial_status.is_empty()));
                // A Nomad check's modes are all run ("driver" is refused by validation).
                if consul && !known_mode(check_address_mode)
                    || !consul && !matches!(check_address_mode.as_str(), "" | "host" | "alloc" | "driver" | "auto")
                {
                    w.refuse_value(Feature::ServiceAddressMode, "address_mode", check_address_mode);
                }
            });
        }
        self.decide(Feature::ServiceCheck, !checks.is_empty());
        self.decide(Feature::ServiceCheckNomad, !consul && !checks.is_empty());
        self.decide(Feature::Connect, connect.is_some());
        self.decide(Feature::ConnectTaskService, !in_group && connect.is_some());
        if let Some(c) = connect {
            self.within("connect".into(), |w| w.connect(c));
        }
    }

    fn connect(&mut self, c: &ConsulConnect) {
        let ConsulConnect { native, sidecar_service, sidecar_task, gateway } = c;
        let mut proxy_used = false;
        let mut upstreams_used = false;
        if let Some(ConsulSidecarService { tags: _, port: _, proxy, disable_default_tcp_check: _, meta: _ }) = sidecar_service
            && let Some(p) = proxy
        {
            proxy_used = true;
            upstreams_used = proxy_fields(p);
        }
        if let Some(SidecarTask {
            name: _,
            driver: _,
            user: _,
            config: _,
            env: _,
            resources: _,
            meta: _,
            kill_timeout: _,
            log_config: _,
            shutdown_delay: _,
            kill_signal: _,
        }) = sidecar_task
        {}
        let mut mesh_used = false;
        if let Some(ConsulGateway { proxy: _, ingress: _, terminating, mesh }) = gateway {
            mesh_used = mesh.is_some();
            if let Some(ConsulTerminatingConfigEntry { services }) = terminating {
                for ConsulLinkedService { name: _, ca_file: _, cert_file: _, key_file: _, sni: _ } in services {}
            }
        }
        self.decide(Feature::ConnectSidecarService, sidecar_service.is_some());
        self.decide(Feature::ConnectSidecarTask, sidecar_task.is_some());
        self.decide(Feature::ConnectProxy, proxy_used);
        self.decide(Feature::ConnectUpstreams, upstreams_used);
        self.decide(Feature::ConnectNative, *native);
        self.decide(Feature::ConnectGateway, gateway.is_some());
        self.within("gateway".into(), |w| w.decide(Feature::ConnectGatewayMesh, mesh_used));
    }

    fn volume(&mut self, v: &VolumeRequest) {
        let VolumeRequest { name: _, volume_type, source: _, read_only: _, access_mode, attachment_mode, mount_options, per_alloc: _ } = v;
        if let Some(CsiMountOptions { fs_type: _, mount_flags: _ }) = mount_options {}
        let csi = volume_type == "csi" || !access_mode.is_empty() || !attachment_mode.is_empty() || mount_options.is_some();
        self.decide(Feature::HostVolume, volume_type == "host" && !csi);
        self.decide(Feature::CsiVolume, csi);
    }

    fn task(&mut self, t: &Task) {
        let Task {
            name: _,
            driver,
            user,
            config: _,
            env,
            services,
            vault,
            templates,
            constraints,
            affinities,
            resources,
            restart_policy,
            dispatch_payload,
            lifecycle,
            meta,
            kill_timeout: _,
            log_config,
            artifacts,
            leader,
            shutdown_delay,
            volume_mounts,
            scaling_policies,
            kill_signal,
            kind,
            csi_plugin_config,
            identity,
        } = t;
        self.decide(Feature::Name, true);
        self.decide(Feature::Driver, true);
        self.decide(Feature::Config, true);
        self.decide(Feature::KillTimeout, true);
        self.decide(Feature::User, !user.is_empty());
        self.decide(Feature::RawExecUser, !user.is_empty() && driver == "raw_exec");
        self.decide(Feature::Env, !env.is_empty());
        self.decide(Feature::Meta, !meta.is_empty());
        for s in services {
            self.within(named("service", &s.name), |w| w.service(s, !IN_GROUP));
        }
        self.decide(Feature::Vault, vault.as_ref().is_some_and(|v| !v.is_null()));
        for Template {
            source_path: _,
            dest_path: _,
            embedded_tmpl: _,
            change_mode: _,
            change_signal: _,
            splay: _,
            perms: _,
            envvars: _,
            left_delim: _,
            right_delim: _,
            change_script: _,
            uid: _,
            gid: _,
            err_missing_key: _,
            wait: _,
            vault_grace: _,
        } in templates
        {}
        self.decide(Feature::Template, !templates.is_empty());
        self.placement(constraints, affinities, &[]);
        self.within("resources".into(), |w| w.resources(resources));
        self.restart(restart_policy.as_ref());
        self.decide(Feature::DispatchPayload, dispatch_payload.as_ref().is_some_and(|d| !d.is_null()));
        if let Some(TaskLifecycle { hook: _, sidecar: _ }) = lifecycle {}
        self.decide(Feature::Lifecycle, lifecycle.is_some());
        let LogConfig { max_files: _, max_file_size_mb: _, disabled } = log_config;
        self.decide(Feature::Logs, true);
        self.within("logs".into(), |w| w.decide(Feature::LogsDisabled, *disabled));
        self.decide(Feature::Artifact, !artifacts.is_empty());
        self.decide(Feature::ArtifactSource, false);
        for TaskArtifact { getter_source, getter_options: _, getter_headers: _, getter_mode: _, relative_dest: _ } in artifacts {
            if !artifact_source_supported(getter_source) {
                self.within("artifact".into(), |w| w.refuse_value(Feature::ArtifactSource, "source", getter_source));
            }
        }
        self.decide(Feature::Leader, *leader);
        self.decide(Feature::ShutdownDelay, *shutdown_delay != 0);
        for VolumeMount { volume: _, destination: _, read_only: _, propagation_mode: _ } in volume_mounts {}
        let csi = |m: &VolumeMount| self.csi_volumes.contains(&m.volume);
        let (on_csi, other) = (volume_mounts.iter().any(csi), volume_mounts.iter().any(|m| !csi(m)));
        self.decide(Feature::VolumeMountCsi, on_csi);
        self.decide(Feature::VolumeMount, other);
        self.decide(Feature::TaskScaling, scaling_policies.iter().any(|s| !s.is_null()));
        self.decide(Feature::KillSignal, !kill_signal.is_empty());
        self.decide(Feature::TaskKind, !kind.is_empty());
        if let Some(CsiPluginConfig { id: _, plugin_type: _, mount_dir: _, stage_publish_base_dir: _, health_timeout: _ }) =
            csi_plugin_config
        {}
        self.decide(Feature::CsiPlugin, csi_plugin_config.is_some());
        self.decide(Feature::CsiPluginIsolated, csi_plugin_config.is_some() && !["raw_exec", "exec"].contains(&driver.as_str()));
        self.decide(Feature::Identity, identity.as_ref().is_some_and(|i| !i.is_null()));
        let other_fields =
            identity.as_ref().and_then(|i| i.as_object()).is_some_and(|o| o.keys().any(|k| !["Env", "File"].contains(&k.as_str())));
        self.decide(Feature::IdentityFields, other_fields);
    }

    fn resources(&mut self, r: &Resources) {
        let Resources { cpu, cores, memory_mb: _, memory_max_mb, disk_mb, networks, devices } = r;
        self.decide(Feature::Cpu, *cpu != 0);
        self.decide(Feature::Cores, *cores != 0);
        self.decide(Feature::Memory, true);
        self.decide(Feature::MemoryMax, *memory_max_mb != 0);
        self.decide(Feature::Disk, *disk_mb != 0);
        for n in networks {
            self.within("network".into(), |w| w.network(n));
        }
        for RequestedDevice { name: _, count: _, constraints: _, affinities: _ } in devices {}
        self.decide(Feature::Device, !devices.is_empty());
    }
}

/// Whether nomad-rs fetches an artifact `source`: an `http://` or `https://` URL (an
/// `http::`/`https::` forced getter allowed). A source whose scheme is interpolated (it starts
/// with `${`) is accepted here and checked by the client once interpolated. Everything else
/// (`git::`, `s3::`, the github.com, bitbucket and S3/GCS shorthands, which have no scheme,
/// local paths) is refused.
pub fn artifact_source_supported(source: &str) -> bool {
    crate::job::artifact_unforced_source(source).is_some_and(|url| crate::job::is_http_url(url) || url.starts_with("${"))
}

/// Whether the proxy has upstreams.
fn proxy_fields(p: &ConsulProxy) -> bool {
    let ConsulProxy { local_service_address: _, local_service_port: _, upstreams, expose: _, config: _ } = p;
    for ConsulUpstream {
        destination_name: _,
        destination_namespace: _,
        local_bind_port: _,
        datacenter: _,
        local_bind_address: _,
        mesh_gateway: _,
        config: _,
    } in upstreams
    {}
    !upstreams.is_empty()
}

/// The README's "Job specification support" table, from [`TABLE`].
pub fn markdown_table() -> String {
    let mut out = String::from("| block or attribute | in | nomad-rs |\n|---|---|---|\n");
    for e in TABLE.iter() {
        let fate = match e.fate {
            Fate::Honoured(how) => format!("honoured: {how}"),
            Fate::Refused("") => "refused".to_string(),
            Fate::Refused(why) => format!("refused: {why}"),
            Fate::Constrained(reason) => format!("constrained: placed only where it can run, else \"{reason}\""),
        };
        let name = match e.kind {
            Kind::Block => format!("`{} {{}}`", e.name),
            Kind::Attribute | Kind::Value => format!("`{}`", e.name),
        };
        out.push_str(&format!("| {name} | {} | {fate} |\n", e.scope));
    }
    out
}

/// A job that uses `feature` (and nothing else that is refused): the fixture every table
/// entry is tested with, here and through the servers' endpoints and HTTP API.
pub fn sample_job_using(feature: Feature) -> Job {
    use serde_json::json;
    let mut job = Job {
        id: "sample".into(),
        datacenters: vec!["dc1".into()],
        task_groups: vec![TaskGroup {
            name: "cache".into(),
            tasks: vec![Task { name: "redis".into(), driver: "raw_exec".into(), ..Task::default() }],
            ..TaskGroup::default()
        }],
        ..Job::default()
    };
    job.task_groups[0].tasks[0].config.insert("command".into(), json!("/bin/sleep"));
    let nomad_service = || Service { name: "redis".into(), provider: "nomad".into(), ..Service::default() };
    // A Consul service on port 6379, and a check that needs nothing refused.
    let consul_service = || Service { name: "redis".into(), port_label: "6379".into(), ..Service::default() };
    let bridge = || NetworkResource { mode: "bridge".into(), ..NetworkResource::default() };
    // A Consul service with a Connect sidecar (which needs a bridge network).
    let sidecar_service = |sidecar: ConsulSidecarService| Service {
        connect: Some(ConsulConnect { sidecar_service: Some(sidecar), ..ConsulConnect::default() }),
        ..consul_service()
    };
    let tcp_check = || ServiceCheck {
        name: "alive".into(),
        check_type: "tcp".into(),
        interval: 10_000_000_000,
        timeout: 2_000_000_000,
        ..ServiceCheck::default()
    };
    let g = &mut job.task_groups[0];
    let t = &mut g.tasks[0];
    match feature {
        Feature::ConsulNamespace => job.consul_namespace = "team".into(),
        Feature::VaultNamespace => job.vault_namespace = "team".into(),
        Feature::ConsulToken => job.consul_token = "token".into(),
        Feature::VaultToken => job.vault_token = "token".into(),
        Feature::Multiregion => job.multiregion = Some(json!({"Regions": [{"Name": "east"}]})),
        Feature::Periodic => {
            job.job_type = crate::JobType::Batch;
            job.periodic = Some(PeriodicConfig { enabled: true, spec: "*/5 * * * *".into(), ..PeriodicConfig::default() });
        }
        Feature::Parameterized => {
            job.job_type = crate::JobType::Batch;
            job.parameterized_job = Some(ParameterizedJobConfig::default());
        }
        Feature::Payload => job.payload = Some("aGk=".into()),
        Feature::UpdateManualHealth => {
            job.update = Some(UpdateStrategy { health_check: "manual".into(), ..UpdateStrategy::default_service() })
        }
        Feature::UpdateHealthyDeadline => {
            job.update = Some(UpdateStrategy { healthy_deadline: 60_000_000_000, ..UpdateStrategy::default_service() })
        }
        Feature::UpdateProgressDeadline => {
            job.update = Some(UpdateStrategy { progress_deadline: 3_600_000_000_000, ..UpdateStrategy::default_service() })
        }
        Feature::UpdateCanary => g.update = Some(UpdateStrategy { canary: 1, ..UpdateStrategy::default_service() }),
        Feature::UpdateAutoRevert => g.update = Some(UpdateStrategy { auto_revert: true, ..UpdateStrategy::default_service() }),
        Feature::UpdateAutoPromote => {
            g.update = Some(UpdateStrategy { auto_promote: true, canary: 1, ..UpdateStrategy::default_service() })
        }
        Feature::UpdateMaxParallel => job.update = Some(UpdateStrategy { max_parallel: 2, ..UpdateStrategy::default_service() }),
        Feature::Scaling => {
            g.scaling = Some(ScalingPolicy { min: Some(1), max: Some(3), ..ScalingPolicy::default() });
        }
        Feature::TaskScaling => t.scaling_policies = vec![json!({"Type": "vertical_cpu", "Min": 100, "Max": 500})],
        Feature::EphemeralDiskSticky => g.ephemeral_disk.sticky = true,
        Feature::EphemeralDiskMigrate => g.ephemeral_disk.migrate = true,
        Feature::GroupConsul => g.consul = Some(json!({"Namespace": "team"})),
        Feature::NetworkMode => g.networks = vec![NetworkResource { mode: "driver".into(), ..NetworkResource::default() }],
        Feature::NetworkModeBridge => g.networks = vec![NetworkResource { mode: "bridge".into(), ..NetworkResource::default() }],
        Feature::NetworkModeCni => g.networks = vec![NetworkResource { mode: "cni/mine".into(), ..NetworkResource::default() }],
        Feature::NetworkModeNone => g.networks = vec![NetworkResource { mode: "none".into(), ..NetworkResource::default() }],
        Feature::NetworkHostname => g.networks = vec![NetworkResource { hostname: "cache".into(), ..NetworkResource::default() }],
        Feature::NetworkDns | Feature::NetworkDnsRawExec => {
            if feature == Feature::NetworkDns {
                t.driver = "exec".into();
            }
            g.networks = vec![NetworkResource {
                dns: Some(DnsConfig { servers: vec!["1.1.1.1".into()], ..DnsConfig::default() }),
                ..NetworkResource::default()
            }]
        }
        Feature::NetworkDevice => g.networks = vec![NetworkResource { device: "eth0".into(), ..NetworkResource::default() }],
        Feature::NetworkCidr => g.networks = vec![NetworkResource { cidr: "10.0.0.0/8".into(), ..NetworkResource::default() }],
        Feature::NetworkIp => g.networks = vec![NetworkResource { ip: "10.0.0.1".into(), ..NetworkResource::default() }],
        Feature::Port | Feature::NetworkModeHost => {
            g.networks =
                vec![NetworkResource { dynamic_ports: vec![Port { label: "db".into(), ..Port::default() }], ..NetworkResource::default() }]
        }
        Feature::ServiceNomad | Feature::ServiceFields => g.services = vec![nomad_service()],
        Feature::OnUpdate => {
            let check = ServiceCheck { on_update: "ignore".into(), ..tcp_check() };
            g.services = vec![Service { on_update: "ignore_warnings".into(), checks: vec![check], ..consul_service() }]
        }
        Feature::ServiceConsulOnly => g.services = vec![Service { canary_tags: vec!["canary".into()], ..nomad_service() }],
        Feature::ServiceConsul => g.services = vec![Service { provider: String::new(), ..nomad_service() }],
        Feature::ServiceCheckNomad => {
            g.services = vec![Service { port_label: "6379".into(), checks: vec![tcp_check()], ..nomad_service() }]
        }
        Feature::ServiceCheckNomadIgnored => {
            let check = ServiceCheck { initial_status: "passing".into(), tls_skip_verify: true, ..tcp_check() };
            g.services = vec![Service { port_label: "6379".into(), checks: vec![check], ..nomad_service() }]
        }
        Feature::ServiceCheckScript => {
            let check = ServiceCheck { check_type: "script".into(), command: "/bin/true".into(), ..tcp_check() };
            t.services = vec![Service { checks: vec![check], ..consul_service() }]
        }
        Feature::ServiceCheckExpose => {
            let check = ServiceCheck { check_type: "http".into(), path: "/health".into(), expose: true, ..tcp_check() };
            g.networks = vec![bridge()];
            g.services = vec![Service { checks: vec![check], ..sidecar_service(ConsulSidecarService::default()) }]
        }
        Feature::CheckRestart => {
            let check = ServiceCheck { check_restart: Some(CheckRestart { limit: 3, ..CheckRestart::default() }), ..tcp_check() };
            t.services = vec![Service { checks: vec![check], ..consul_service() }]
        }
        Feature::GroupCheckRestart => {
            let check = ServiceCheck { check_restart: Some(CheckRestart { limit: 3, ..CheckRestart::default() }), ..tcp_check() };
            g.services = vec![Service { checks: vec![check], ..consul_service() }]
        }
        Feature::ServiceAddressMode => g.services = vec![Service { address_mode: "driver".into(), ..nomad_service() }],
        Feature::ServiceCheck => g.services = vec![Service { checks: vec![tcp_check()], ..consul_service() }],
        Feature::Connect | Feature::ConnectSidecarService => {
            g.networks = vec![bridge()];
            g.services = vec![sidecar_service(ConsulSidecarService::default())];
        }
        Feature::ConnectTaskService => {
            g.networks = vec![bridge()];
            t.services = vec![sidecar_service(ConsulSidecarService::default())];
        }
        Feature::ConnectSidecarTask => {
            g.networks = vec![bridge()];
            let mut s = sidecar_service(ConsulSidecarService::default());
            let over = SidecarTask { driver: "raw_exec".into(), config: t.config.clone(), ..SidecarTask::default() };
            s.connect.as_mut().unwrap().sidecar_task = Some(over);
            g.services = vec![s];
        }
        Feature::ConnectProxy | Feature::ConnectUpstreams => {
            let mut proxy = ConsulProxy { local_service_port: 6379, ..ConsulProxy::default() };
            if feature == Feature::ConnectUpstreams {
                let db = ConsulUpstream { destination_name: "db".into(), local_bind_port: 5432, ..ConsulUpstream::default() };
                proxy.upstreams = vec![db];
            }
            g.networks = vec![bridge()];
            g.services = vec![sidecar_service(ConsulSidecarService { proxy: Some(proxy), ..ConsulSidecarService::default() })];
        }
        Feature::ConnectNative => {
            let connect = ConsulConnect { native: true, ..ConsulConnect::default() };
            g.services = vec![Service { connect: Some(connect), task_name: "redis".into(), ..consul_service() }]
        }
        Feature::ConnectGateway | Feature::ConnectGatewayMesh => {
            // As Nomad's jobspec leaves it: a group with no task of its own.
            let gateway = if feature == Feature::ConnectGateway {
                let ingress = json!({"Listeners": [{"Port": 8080, "Protocol": "tcp", "Services": [{"Name": "redis"}]}]});
                ConsulGateway { ingress: Some(ingress), ..ConsulGateway::default() }
            } else {
                ConsulGateway { mesh: Some(json!({})), ..ConsulGateway::default() }
            };
            let connect = ConsulConnect { gateway: Some(gateway), ..ConsulConnect::default() };
            g.tasks.clear();
            g.networks = vec![bridge()];
            g.services = vec![Service { name: "gateway".into(), connect: Some(connect), ..consul_service() }];
        }
        Feature::HostVolume => {
            g.volumes.insert(
                "data".into(),
                VolumeRequest { name: "data".into(), volume_type: "host".into(), source: "data".into(), ..VolumeRequest::default() },
            );
        }
        Feature::CsiVolume => {
            g.volumes.insert(
                "data".into(),
                VolumeRequest {
                    name: "data".into(),
                    volume_type: "csi".into(),
                    source: "data".into(),
                    access_mode: "single-node-writer".into(),
                    attachment_mode: "file-system".into(),
                    ..VolumeRequest::default()
                },
            );
        }
        Feature::RawExecUser => t.user = "nobody".into(),
        Feature::User => {
            t.driver = "exec".into();
            t.user = "nobody".into();
        }
        Feature::LogsDisabled => t.log_config.disabled = true,
        Feature::Vault => t.vault = Some(json!({"Policies": ["read"]})),
        Feature::Template => {
            t.templates = vec![Template {
                embedded_tmpl: "hi".into(),
                dest_path: "local/hi".into(),
                change_mode: "restart".into(),
                ..Template::default()
            }]
        }
        Feature::Artifact => {
            t.artifacts = vec![TaskArtifact { getter_source: "https://example.com/x.tgz".into(), ..TaskArtifact::default() }]
        }
        Feature::ArtifactSource => {
            t.artifacts = vec![TaskArtifact { getter_source: "git::https://example.com/repo.git".into(), ..TaskArtifact::default() }]
        }
        Feature::DispatchPayload => t.dispatch_payload = Some(json!({"File": "input.txt"})),
        Feature::VolumeMountCsi => {
            g.volumes.insert(
                "data".into(),
                VolumeRequest {
                    name: "data".into(),
                    volume_type: "csi".into(),
                    source: "data".into(),
                    access_mode: "single-node-writer".into(),
                    attachment_mode: "file-system".into(),
                    ..VolumeRequest::default()
                },
            );
            let t = &mut g.tasks[0];
            t.driver = "exec".into();
            t.volume_mounts = vec![VolumeMount { volume: "data".into(), destination: "/data".into(), ..VolumeMount::default() }];
        }
        Feature::VolumeMount => {
            g.volumes.insert(
                "data".into(),
                VolumeRequest { name: "data".into(), volume_type: "host".into(), source: "data".into(), ..VolumeRequest::default() },
            );
            let t = &mut g.tasks[0];
            t.volume_mounts = vec![VolumeMount { volume: "data".into(), destination: "/data".into(), ..VolumeMount::default() }];
        }
        Feature::TaskKind => {
            // The group's own Envoy task: the servers inject none.
            t.kind = "connect-proxy:redis".into();
            g.networks = vec![bridge()];
            g.services = vec![sidecar_service(ConsulSidecarService::default())];
        }
        Feature::CsiPlugin | Feature::CsiPluginIsolated => {
            if feature == Feature::CsiPluginIsolated {
                t.driver = "docker".into();
            }
            t.csi_plugin_config = Some(CsiPluginConfig {
                id: "ebs".into(),
                plugin_type: "node".into(),
                mount_dir: "/csi".into(),
                ..CsiPluginConfig::default()
            })
        }
        Feature::Identity => t.identity = Some(json!({"Env": true})),
        Feature::IdentityFields => t.identity = Some(json!({"Env": true, "Name": "vault", "Audience": ["vault.io"]})),
        Feature::Cores => t.resources.cores = 1,
        Feature::MemoryMax => t.resources.memory_max_mb = 600,
        Feature::Device => {
            t.resources.devices = vec![RequestedDevice { name: "nvidia/gpu".into(), count: 1, ..RequestedDevice::default() }]
        }
        Feature::KillSignal => t.kill_signal = "SIGTERM".into(),
        Feature::Leader => t.leader = true,
        Feature::Lifecycle => {
            let mut pre = t.clone();
            pre.name = "init".into();
            pre.lifecycle = Some(TaskLifecycle { hook: "prestart".into(), sidecar: false });
            g.tasks.push(pre);
        }
        Feature::ShutdownDelay => g.shutdown_delay = Some(5_000_000_000),
        Feature::MaxClientDisconnect => g.max_client_disconnect = Some(3_600_000_000_000),
        Feature::StopAfterClientDisconnect => g.stop_after_client_disconnect = Some(60_000_000_000),
        Feature::Constraint => {
            job.constraints = vec![Constraint { l_target: "${attr.kernel.name}".into(), r_target: "linux".into(), operand: "=".into() }]
        }
        Feature::Meta => {
            job.meta.insert("team".into(), "cache".into());
        }
        Feature::NetworkMbits => g.networks = vec![NetworkResource { mbits: 10, ..NetworkResource::default() }],
        Feature::Name
        | Feature::JobId
        | Feature::JobRegion
        | Feature::JobNamespace
        | Feature::JobType
        | Feature::JobPriority
        | Feature::JobAllAtOnce
        | Feature::JobDatacenters
        | Feature::JobNodePool
        | Feature::JobStop
        | Feature::JobServerSet
        | Feature::Affinity
        | Feature::Spread
        | Feature::UpdateStagger
        | Feature::UpdateMinHealthyTime
        | Feature::UpdateHealthCheck
        | Feature::GroupCount
        | Feature::Migrate
        | Feature::Restart
        | Feature::Reschedule
        | Feature::EphemeralDiskSize
        | Feature::Driver
        | Feature::Config
        | Feature::Env
        | Feature::KillTimeout
        | Feature::Logs
        | Feature::Cpu
        | Feature::Disk
        | Feature::ServiceCheckNomadConsulOnly
        | Feature::Memory => {}
    }
    job
}

#[cfg(test)]
mod tests;
