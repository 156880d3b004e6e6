//! Feasibility: every operator, every interpolation target, checkers,
//! class memoization, node readiness, datacenters and pools, resource
//! exhaustion.

use nomad_proto::node::HostVolume;
use nomad_proto::resources::{NodeDevice, NodeDeviceResource, RequestedDevice};
use nomad_proto::volume::VolumeRequest;
use nomad_proto::{AllocMetric, Constraint, Job, Node, NodeStatus, SchedulingEligibility};

use super::*;
use crate::scheduler::constraint::{CompiledConstraint, escapes};
use crate::scheduler::feasible::Feasibility;
use crate::scheduler::nodes::ready_nodes;

fn node() -> Node {
    let mut n = crate::testing::node("n1");
    n.name = "host-1".into();
    n.node_class = "large".into();
    n.node_pool = "gpu".into();
    n.attributes.insert("cpu.numcores".into(), "8".into());
    n.attributes.insert("os.version".into(), "22.04".into());
    n.attributes.insert("nomad.version".into(), "1.6.1".into());
    n.attributes.insert("features".into(), "a, b,c".into());
    n.meta.insert("rack".into(), "r1".into());
    n
}

fn check(l: &str, op: &str, r: &str) -> bool {
    CompiledConstraint::new(&Constraint { l_target: l.into(), r_target: r.into(), operand: op.into() }).matches(&node())
}

#[test]
fn equality_operators() {
    for op in ["=", "==", "is"] {
        assert!(check("${attr.kernel.name}", op, "linux"), "{op}");
        assert!(!check("${attr.kernel.name}", op, "darwin"), "{op}");
        assert!(!check("${attr.missing}", op, ""), "{op}: missing never equals");
    }
    for op in ["!=", "not"] {
        assert!(check("${attr.kernel.name}", op, "darwin"), "{op}");
        assert!(!check("${attr.kernel.name}", op, "linux"), "{op}");
        assert!(check("${attr.missing}", op, "x"), "{op}: missing differs from a value");
    }
}

#[test]
fn order_operators_are_numeric_when_both_parse() {
    assert!(check("${attr.cpu.numcores}", ">", "4"));
    assert!(check("${attr.cpu.numcores}", "<", "10"), "numeric, not lexical");
    assert!(check("${attr.cpu.numcores}", ">=", "8") && check("${attr.cpu.numcores}", "<=", "8"));
    assert!(check("${attr.os.version}", ">", "9.10"), "floats");
    assert!(check("${attr.kernel.name}", "<", "mac"), "lexical");
    assert!(!check("${attr.missing}", "<", "1"));
}

#[test]
fn regexp_version_and_semver() {
    assert!(check("${attr.kernel.name}", "regexp", "^li.ux$"));
    assert!(!check("${attr.kernel.name}", "regexp", "^dar"));
    assert!(!check("${attr.kernel.name}", "regexp", "(unclosed"));
    assert!(check("${attr.nomad.version}", "version", ">= 1.2, < 3"));
    assert!(!check("${attr.nomad.version}", "version", "< 1.6"));
    assert!(check("${attr.nomad.version}", "version", "~> 1.6.0"));
    assert!(check("${attr.nomad.version}", "semver", ">= 1.6.0-beta.1"));
    assert!(!check("${attr.nomad.version}", "semver", "> 1.6.1"));
}

#[test]
fn set_operators() {
    assert!(check("${attr.features}", "set_contains", "a,c"));
    assert!(check("${attr.features}", "set_contains_all", "b"));
    assert!(!check("${attr.features}", "set_contains", "a,d"));
    assert!(check("${attr.features}", "set_contains_any", "d, c"));
    assert!(!check("${attr.features}", "set_contains_any", "d,e"));
}

#[test]
fn set_and_unset() {
    assert!(check("${meta.rack}", "is_set", ""));
    assert!(!check("${meta.zone}", "is_set", ""));
    assert!(check("${meta.zone}", "is_not_set", ""));
    assert!(!check("${meta.rack}", "is_not_set", ""));
    assert!(!check("${meta.rack}", "bogus_op", "r1"));
}

#[test]
fn every_interpolation_target() {
    assert!(check("${node.unique.id}", "=", "n1"));
    assert!(check("${node.unique.name}", "=", "host-1"));
    assert!(check("${node.datacenter}", "=", "dc1"));
    assert!(check("${node.class}", "=", "large"));
    assert!(check("${node.pool}", "=", "gpu"));
    assert!(check("${attr.unique.hostname}", "=", "n1"));
    assert!(check("${meta.rack}", "=", "r1"));
    assert!(check("r1", "=", "${meta.rack}"), "either side");
    assert!(!check("${node.nope}", "is_set", ""));
    assert!(escapes(&Constraint { l_target: "${node.unique.name}".into(), ..Default::default() }));
    assert!(escapes(&Constraint { r_target: "${meta.unique.x}".into(), ..Default::default() }));
    assert!(!escapes(&Constraint { l_target: "${meta.rack}".into(), ..Default::default() }));
}

fn job_with(f: impl FnOnce(&mut Job)) -> Job {
    let mut j = service_job("web", 1);
    f(&mut j);
    j.canonicalize();
    j
}

fn feasible(job: &Job, node: &Node) -> (bool, AllocMetric) {
    let mut n = node.clone();
    n.compute_class();
    let mut f = Feasibility::new(job);
    let mut m = AllocMetric::default();
    let ok = f.check(&n, 0, "web.web[0]", &mut m);
    (ok, m)
}

#[test]
fn drivers_must_be_detected_and_healthy() {
    let job = job_with(|_| {});
    assert!(feasible(&job, &node()).0);
    let mut unhealthy = node();
    unhealthy.drivers.get_mut("raw_exec").unwrap().healthy = false;
    let (ok, m) = feasible(&job, &unhealthy);
    assert!(!ok);
    assert_eq!(m.constraint_filtered["missing drivers"], 1);
    // Older clients only set the attribute.
    let mut attr_only = node();
    attr_only.drivers.clear();
    assert!(feasible(&job, &attr_only).0);
    attr_only.attributes.insert("driver.raw_exec".into(), "false".into());
    assert!(!feasible(&job, &attr_only).0);
}

#[test]
fn group_and_task_constraints_apply() {
    let task_level = job_with(|j| {
        j.task_groups[0].tasks[0].constraints.push(Constraint {
            l_target: "${meta.rack}".into(),
            r_target: "r2".into(),
            operand: "=".into(),
        })
    });
    let (ok, m) = feasible(&task_level, &node());
    assert!(!ok);
    assert_eq!(m.constraint_filtered["${meta.rack} = r2"], 1);
    assert_eq!(m.class_filtered["large"], 1);
    let group_level = job_with(|j| {
        j.task_groups[0].constraints.push(Constraint { l_target: "${meta.rack}".into(), r_target: "r1".into(), operand: "=".into() })
    });
    assert!(feasible(&group_level, &node()).0);
}

#[test]
fn host_volumes_and_devices() {
    let job = job_with(|j| {
        j.task_groups[0].volumes.insert(
            "data".into(),
            VolumeRequest { name: "data".into(), volume_type: "host".into(), source: "data".into(), ..Default::default() },
        );
        j.task_groups[0].tasks[0].resources.devices.push(RequestedDevice { name: "nvidia/gpu".into(), count: 1, ..Default::default() });
    });
    let (ok, m) = feasible(&job, &node());
    assert!(!ok);
    assert_eq!(m.constraint_filtered["missing compatible host volumes"], 1);
    let mut n = node();
    n.host_volumes.insert("data".into(), HostVolume { name: "data".into(), path: "/d".into(), read_only: false });
    let (ok, m) = feasible(&job, &n);
    assert!(!ok);
    assert_eq!(m.constraint_filtered["missing devices"], 1);
    n.node_resources.as_mut().unwrap().devices.push(NodeDeviceResource {
        vendor: "nvidia".into(),
        device_type: "gpu".into(),
        name: "a100".into(),
        instances: vec![NodeDevice { id: "0".into(), healthy: true, ..Default::default() }],
        ..Default::default()
    });
    assert!(feasible(&job, &n).0);
    n.host_volumes.get_mut("data").unwrap().read_only = true;
    assert!(!feasible(&job, &n).0, "read-write ask on a read-only volume");
}

#[test]
fn class_memo_skips_rechecks_unless_escaped() {
    let job = job_with(|j| {
        j.constraints.push(Constraint { l_target: "${attr.kernel.name}".into(), r_target: "darwin".into(), operand: "=".into() })
    });
    let mut a = node();
    a.compute_class();
    let mut b = node();
    b.id = "n2".into();
    b.attributes.insert("unique.hostname".into(), "n2".into());
    b.compute_class();
    assert_eq!(a.computed_class, b.computed_class);
    let mut f = Feasibility::new(&job);
    let mut m = AllocMetric::default();
    assert!(!f.check(&a, 0, "x", &mut m));
    assert!(!f.check(&b, 0, "x", &mut m));
    assert_eq!(m.constraint_filtered["${attr.kernel.name} = darwin"], 1);
    assert_eq!(m.constraint_filtered["computed class ineligible"], 1);
    assert_eq!(f.class_eligibility().get(&a.computed_class), Some(&false));
    assert!(!f.escaped());

    let escaped =
        job_with(|j| j.constraints.push(Constraint { l_target: "${node.unique.id}".into(), r_target: "n2".into(), operand: "=".into() }));
    let mut f = Feasibility::new(&escaped);
    let mut m = AllocMetric::default();
    assert!(!f.check(&a, 0, "x", &mut m));
    assert!(f.check(&b, 0, "x", &mut m), "escaped constraints are checked per node");
    assert!(f.escaped());
}

#[test]
fn only_ready_eligible_undrained_nodes_in_dcs_and_pool() {
    let mut h = Harness::new();
    let mk = |id: &str, f: &dyn Fn(&mut Node)| {
        let mut n = crate::testing::node(id);
        f(&mut n);
        n
    };
    h.add_node(mk("ok", &|_| {}));
    h.add_node(mk("other-dc", &|n| n.datacenter = "eu-1".into()));
    h.add_node(mk("glob-dc", &|n| n.datacenter = "dc7".into()));
    h.add_node(mk("other-pool", &|n| n.node_pool = "gpu".into()));
    h.add_node(mk("init", &|n| n.status = NodeStatus::Initializing));
    h.set_node_status("init", NodeStatus::Initializing);
    h.add_node(mk("down", &|_| {}));
    h.set_node_status("down", NodeStatus::Down);
    h.add_node(mk("disc", &|_| {}));
    h.set_node_status("disc", NodeStatus::Disconnected);
    h.add_node(mk("inel", &|n| n.scheduling_eligibility = SchedulingEligibility::Ineligible));
    h.add_node(mk("drain", &|_| {}));
    h.drain_node("drain");
    let state = h.state();
    let job = job_with(|j| j.datacenters = vec!["dc1".into(), "dc*".into()]);
    let ready = ready_nodes(&state, &job);
    let mut ids: Vec<&str> = ready.nodes.iter().map(|n| n.id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, vec!["glob-dc", "ok"]);
    assert!(ready.not_ready.contains("drain") && ready.not_ready.contains("init") && ready.not_ready.contains("disc"));
    let all_pools = job_with(|j| j.node_pool = "all".into());
    assert!(ready_nodes(&state, &all_pools).nodes.iter().any(|n| n.id == "other-pool"));
}

#[test]
fn exhaustion_names_the_dimension() {
    for (dim, f) in [
        ("cpu", (|j: &mut Job| j.task_groups[0].tasks[0].resources.cpu = 5000) as fn(&mut Job)),
        ("memory", |j: &mut Job| j.task_groups[0].tasks[0].resources.memory_mb = 10_000),
        ("disk", |j: &mut Job| j.task_groups[0].ephemeral_disk.size_mb = 200_000),
        ("cores", |j: &mut Job| j.task_groups[0].tasks[0].resources.cores = 2),
    ] {
        let mut h = Harness::new();
        h.add_nodes(1);
        let mut job = service_job("web", 1);
        f(&mut job);
        h.register_job(job);
        let out = h.run_job("web");
        let m = &out.eval_update.failed_tg_allocs["web"];
        assert_eq!(m.dimension_exhausted.get(dim), Some(&1), "{dim}: {:?}", m.dimension_exhausted);
        assert_eq!(m.nodes_exhausted, 1);
    }
}

#[test]
fn reserved_resources_count_against_capacity() {
    let mut h = Harness::new();
    let mut n = crate::testing::node("n");
    n.reserved_resources = Some(nomad_proto::resources::NodeReservedResources {
        memory: nomad_proto::resources::NodeReservedMemoryResources { memory_mb: 8000 },
        ..Default::default()
    });
    h.add_node(n);
    h.register_job(service_job("web", 1));
    let out = h.run_job("web");
    assert_eq!(out.eval_update.failed_tg_allocs["web"].dimension_exhausted["memory"], 1);
}

#[test]
fn reserved_cores_are_exclusive() {
    let mut h = Harness::new();
    let mut n = crate::testing::node("n");
    n.node_resources.as_mut().unwrap().cpu.reservable_cpu_cores = vec![0, 1, 2, 3];
    h.add_node(n);
    let mut job = service_job("web", 3);
    job.task_groups[0].tasks[0].resources.cores = 2;
    h.register_job(job);
    let out = h.run_job("web");
    let mut cores: Vec<u16> =
        placed(&out).iter().flat_map(|a| a.allocated_resources.as_ref().unwrap().tasks["server"].cpu.reserved_cores.clone()).collect();
    cores.sort();
    assert_eq!(cores, vec![0, 1, 2, 3]);
    assert_eq!(placed(&out)[0].allocated_resources.as_ref().unwrap().tasks["server"].cpu.cpu_shares, 2000, "cores stand for their MHz");
    assert_eq!(out.eval_update.failed_tg_allocs["web"].dimension_exhausted["cores"], 1);
}

#[test]
fn distinct_hosts_and_distinct_property() {
    let mut h = Harness::new();
    for (i, rack) in ["r1", "r1", "r2"].iter().enumerate() {
        let mut n = crate::testing::node(&format!("n{i}"));
        n.meta.insert("rack".into(), (*rack).into());
        h.add_node(n);
    }
    let mut job = service_job("hosts", 4);
    job.constraints.push(Constraint { operand: "distinct_hosts".into(), ..Default::default() });
    h.register_job(job);
    let out = h.run_job("hosts");
    assert_eq!(per_node(&out).len(), 3, "one per host");
    assert_eq!(out.eval_update.failed_tg_allocs["web"].constraint_filtered["distinct_hosts"], 3);

    let mut job = service_job("racks", 3);
    job.task_groups[0].constraints.push(Constraint {
        l_target: "${meta.rack}".into(),
        r_target: "1".into(),
        operand: "distinct_property".into(),
    });
    h.register_job(job);
    let out = h.run_job("racks");
    assert_eq!(placed(&out).len(), 2, "one per rack");
    let f = &out.eval_update.failed_tg_allocs["web"];
    assert!(f.constraint_filtered.keys().any(|k| k.starts_with("distinct_property: ${meta.rack}=")), "{:?}", f.constraint_filtered);
}

#[test]
fn affinity_and_spread_steer_placements() {
    let mut h = Harness::new();
    for (i, rack) in ["r1", "r1", "r1", "r2", "r2", "r2"].iter().enumerate() {
        let mut n = crate::testing::node(&format!("n{i}"));
        n.meta.insert("rack".into(), (*rack).into());
        h.add_node(n);
    }
    let mut job = service_job("aff", 2);
    job.affinities.push(nomad_proto::Affinity { l_target: "${meta.rack}".into(), r_target: "r2".into(), operand: "=".into(), weight: 100 });
    h.register_job(job);
    let out = h.run_job("aff");
    let state = h.state();
    assert!(placed(&out).iter().all(|a| state.node(&a.node_id).unwrap().meta["rack"] == "r2"));
    assert!(placed(&out)[0].metrics.as_ref().unwrap().score_meta_data[0].scores.contains_key("node-affinity"));

    let mut job = service_job("spread", 4);
    job.spreads.push(nomad_proto::Spread { attribute: "${meta.rack}".into(), weight: 100, spread_target: vec![] });
    h.register_job(job);
    let out = h.run_job("spread");
    let mut per_rack = BTreeMap::new();
    for a in placed(&out) {
        *per_rack.entry(state.node(&a.node_id).unwrap().meta["rack"].clone()).or_insert(0) += 1;
    }
    assert_eq!(per_rack.values().copied().collect::<Vec<_>>(), vec![2, 2], "{per_rack:?}");

    let mut job = service_job("target", 4);
    job.spreads.push(nomad_proto::Spread {
        attribute: "${meta.rack}".into(),
        weight: 100,
        spread_target: vec![
            nomad_proto::job::SpreadTarget { value: "r1".into(), percent: 75 },
            nomad_proto::job::SpreadTarget { value: "r2".into(), percent: 25 },
        ],
    });
    h.register_job(job);
    let out = h.run_job("target");
    let mut per_rack = BTreeMap::new();
    for a in placed(&out) {
        *per_rack.entry(state.node(&a.node_id).unwrap().meta["rack"].clone()).or_insert(0) += 1;
    }
    assert_eq!(per_rack.get("r1"), Some(&3), "{per_rack:?}");
}
