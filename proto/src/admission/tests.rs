use super::*;

fn admitted(mut job: Job) -> Result<Job, String> {
    job.canonicalize();
    job.check_supported().map_err(|e| e.to_string())?;
    Ok(job)
}

#[test]
fn the_table_has_one_row_per_feature_in_order() {
    for (i, e) in TABLE.iter().enumerate() {
        assert_eq!(e.feature as usize, i, "{e:?}");
        assert_eq!(e.feature.entry(), e);
    }
}

/// A job that uses every block and attribute of the model: the walk must decide about every
/// entry of the table (together with the exhaustive destructuring in the walk, which makes a
/// new field a compile error, nothing can be left undecided).
#[test]
fn the_walk_reaches_every_table_entry() {
    let mut visited = std::collections::BTreeSet::new();
    for e in TABLE.iter() {
        let mut job = sample_job_using(e.feature);
        job.canonicalize();
        visited.extend(features_visited(&job));
    }
    let missing: Vec<_> = TABLE.iter().filter(|e| !visited.contains(&e.feature)).map(|e| e.feature).collect();
    assert!(missing.is_empty(), "the walk never decides about {missing:?}");
}

/// Every entry: its sample uses it; a refused entry is refused naming the block and where it
/// is, anything else is admitted.
#[test]
fn each_entry_is_refused_or_admitted_as_the_table_says() {
    for e in TABLE.iter() {
        let mut job = sample_job_using(e.feature);
        job.canonicalize();
        let used = features_used(&job);
        match e.fate {
            Fate::Refused(advice) => {
                assert!(used.contains(&e.feature), "the sample of {:?} does not use it: {used:?}", e.feature);
                let msg = job.check_supported().expect_err(&format!("{:?} is refused", e.feature)).to_string();
                let named = match e.kind {
                    Kind::Value => msg.contains(e.name.split(' ').next().unwrap()),
                    Kind::Block => msg.contains(&format!("the {:?} block", e.name)),
                    // An attribute refused for its value names both: `mode = "bridge"`.
                    Kind::Attribute => msg.contains(&format!("the {:?} attribute", e.name)) || msg.contains(&format!("{} = ", e.name)),
                };
                assert!(named, "{:?}: {msg}", e.feature);
                assert!(msg.contains("is not supported by nomad-rs yet"), "{:?}: {msg}", e.feature);
                assert!(msg.contains("group \"cache\"") || msg.contains("job \"sample\""), "{:?} names where: {msg}", e.feature);
                assert!(msg.contains(advice), "{:?}: {msg}", e.feature);
            }
            Fate::Honoured(_) | Fate::Constrained(_) => {
                if let Err(msg) = job.check_supported() {
                    panic!("{:?} is {:?} but its sample is refused: {msg}", e.feature, e.fate);
                }
            }
        }
    }
}

#[test]
fn a_plain_job_is_admitted() {
    let job = sample_job_using(Feature::Cpu);
    admitted(job).unwrap();
}

#[test]
fn messages_name_the_path_as_the_issue_shows() {
    let msg = admitted(sample_job_using(Feature::Vault)).unwrap_err();
    assert_eq!(msg, "group \"cache\" task \"redis\": the \"vault\" block is not supported by nomad-rs yet");
    let msg = admitted(sample_job_using(Feature::Payload)).unwrap_err();
    assert_eq!(
        msg,
        "job \"sample\": the \"payload\" attribute is not supported by nomad-rs yet; job can't be submitted with a payload, only dispatched"
    );
    admitted(sample_job_using(Feature::Periodic)).unwrap();
    let msg = admitted(sample_job_using(Feature::NetworkMode)).unwrap_err();
    assert_eq!(
        msg,
        "group \"cache\" network: mode = \"driver\" is not supported by nomad-rs yet; host, bridge, none and cni/<name> are run"
    );
    for mode in ["bridge", "none", "cni/mine"] {
        let mut job = sample_job_using(Feature::NetworkModeHost);
        job.task_groups[0].networks[0].mode = mode.into();
        admitted(job).unwrap();
    }
    let mut job = sample_job_using(Feature::NetworkModeHost);
    job.task_groups[0].networks[0].mode = "cni/".into();
    assert!(admitted(job).unwrap_err().contains("mode = \"cni/\" is not supported"));
}

#[test]
fn consul_and_nomad_checks_are_admitted_and_group_check_restart_and_driver_mode_are_not() {
    // A service without a provider is a Consul service; it and its tcp check are admitted.
    admitted(sample_job_using(Feature::ServiceConsul)).unwrap();
    admitted(sample_job_using(Feature::ServiceCheck)).unwrap();
    admitted(sample_job_using(Feature::ServiceNomad)).unwrap();
    // The client runs Nomad checks; tls_skip_verify and initial_status are ignored, as Nomad does.
    admitted(sample_job_using(Feature::ServiceCheckNomad)).unwrap();
    admitted(sample_job_using(Feature::ServiceCheckNomadIgnored)).unwrap();
    // Script checks and a task service's check_restart are run by the client.
    admitted(sample_job_using(Feature::ServiceCheckScript)).unwrap();
    admitted(sample_job_using(Feature::CheckRestart)).unwrap();
    // A group service's check_restart would restart the whole allocation in Nomad: refused.
    let msg = admitted(sample_job_using(Feature::GroupCheckRestart)).unwrap_err();
    assert!(msg.contains("service \"redis\" check \"alive\": check_restart in a group service is not supported"), "{msg}");
    // A check_restart without a limit restarts nothing, so it is no group restart either.
    let mut job = sample_job_using(Feature::GroupCheckRestart);
    job.task_groups[0].services[0].checks[0].check_restart.as_mut().unwrap().limit = 0;
    admitted(job).unwrap();

    // alloc for Consul services and their checks; never driver; nomad services only auto/host.
    let mut job = sample_job_using(Feature::ServiceCheck);
    job.task_groups[0].services[0].address_mode = "alloc".into();
    job.task_groups[0].services[0].checks[0].address_mode = "alloc".into();
    admitted(job.clone()).unwrap();
    job.task_groups[0].services[0].checks[0].address_mode = "driver".into();
    let msg = admitted(job).unwrap_err();
    assert!(msg.contains("check \"alive\": address_mode = \"driver\" is not supported"), "{msg}");
    let mut job = sample_job_using(Feature::ServiceNomad);
    job.task_groups[0].services[0].address_mode = "alloc".into();
    assert!(admitted(job).unwrap_err().contains("address_mode = \"alloc\" is not supported"));
    // A Nomad check probes in alloc mode; driver mode is left to validation's own message.
    let mut job = sample_job_using(Feature::ServiceCheckNomad);
    job.task_groups[0].services[0].checks[0].address_mode = "alloc".into();
    admitted(job.clone()).unwrap();
    job.task_groups[0].services[0].checks[0].address_mode = "driver".into();
    let job = admitted(job).unwrap();
    let msg = job.validate().unwrap_err().to_string();
    assert!(msg.contains("address_mode = driver may only be set for Consul service checks"), "{msg}");
}

#[test]
fn groups_with_consul_services_get_nomads_implied_constraint_once() {
    let consul_version = Constraint { l_target: "${attr.consul.version}".into(), r_target: ">= 1.7.0".into(), operand: "semver".into() };
    let mut job = sample_job_using(Feature::ServiceConsul);
    let mut plain = job.task_groups[0].clone();
    plain.name = "plain".into();
    plain.services.clear();
    let mut in_task = plain.clone();
    in_task.name = "in-task".into();
    in_task.tasks[0].services = job.task_groups[0].services.clone();
    job.task_groups.extend([plain, in_task]);
    job.add_implied_constraints();
    assert_eq!(job.task_groups[0].constraints, std::slice::from_ref(&consul_version));
    assert!(job.task_groups[1].constraints.is_empty(), "no Consul service, no constraint");
    assert_eq!(job.task_groups[2].constraints, std::slice::from_ref(&consul_version), "task services count");
    job.add_implied_constraints();
    assert_eq!(job.task_groups[0].constraints.len(), 1, "added once");

    // A constraint of the job's own on the same attribute wins (Nomad matches on LTarget).
    let mut job = sample_job_using(Feature::ServiceConsul);
    let own = Constraint { r_target: ">= 1.10.0".into(), ..consul_version };
    job.task_groups[0].constraints = vec![own.clone()];
    job.add_implied_constraints();
    assert_eq!(job.task_groups[0].constraints, [own]);
    // Nomad services need a client that registers them; with checks, Nomad 1.4 or later.
    let mut job = sample_job_using(Feature::ServiceNomad);
    let has_checks = !job.task_groups[0].services[0].checks.is_empty();
    job.add_implied_constraints();
    let discovery = Constraint { l_target: "${attr.nomad.service_discovery}".into(), r_target: "true".into(), operand: "=".into() };
    let checks = Constraint { l_target: "${attr.nomad.version}".into(), r_target: ">= 1.4.0".into(), operand: "semver".into() };
    let want = if has_checks { vec![discovery.clone(), checks.clone()] } else { vec![discovery.clone()] };
    assert_eq!(job.task_groups[0].constraints, want);
    job.task_groups[0].services[0].checks.clear();
    job.task_groups[0].constraints.clear();
    job.add_implied_constraints();
    assert_eq!(job.task_groups[0].constraints, [discovery], "no checks, no version constraint");
}

#[test]
fn kill_and_change_signals_imply_one_sorted_signal_constraint_per_group() {
    let mut job = sample_job_using(Feature::ServiceNomad);
    job.task_groups[0].services.clear();
    let mut second = job.task_groups[0].tasks[0].clone();
    second.name = "second".into();
    job.task_groups[0].tasks[0].kill_signal = "SIGUSR1".into();
    second.kill_signal = "SIGINT".into();
    second.templates = vec![
        Template { change_mode: "signal".into(), change_signal: "SIGHUP".into(), ..Template::default() },
        Template { change_mode: "restart".into(), change_signal: "SIGTERM".into(), ..Template::default() },
        Template { change_mode: "signal".into(), change_signal: "SIGUSR1".into(), ..Template::default() },
    ];
    job.task_groups[0].tasks.push(second);
    job.add_implied_constraints();
    let signals =
        Constraint { l_target: "${attr.os.signals}".into(), r_target: "SIGHUP,SIGINT,SIGUSR1".into(), operand: "set_contains".into() };
    assert_eq!(job.task_groups[0].constraints, std::slice::from_ref(&signals));
    job.add_implied_constraints();
    assert_eq!(job.task_groups[0].constraints, [signals], "added once");
}

/// The admission check sees the job as the Connect mutator leaves it: the injected tasks are
/// judged as any task is.
#[test]
fn connect_jobs_are_judged_after_the_servers_add_their_tasks() {
    let mutated = |mut job: Job| {
        job.canonicalize();
        job.mutate_connect().unwrap_or_else(|e| panic!("{e}"));
        job.check_supported().map(|_| job).map_err(|e| e.to_string())
    };
    let job = mutated(sample_job_using(Feature::ConnectGateway)).unwrap();
    let used = features_used(&job);
    for f in [Feature::ConnectGateway, Feature::TaskKind, Feature::Driver, Feature::Constraint] {
        assert!(used.contains(&f), "{f:?} in {used:?}");
    }
    let msg = mutated(sample_job_using(Feature::ConnectGatewayMesh)).unwrap_err();
    assert_eq!(
        msg,
        "group \"cache\" service \"gateway\" connect gateway: the \"mesh\" block is not supported by nomad-rs yet; ingress and terminating gateways are run; the client does not register mesh gateways"
    );
    let msg = mutated(sample_job_using(Feature::ConnectTaskService)).unwrap_err();
    assert!(msg.starts_with("group \"cache\" task \"redis\" service \"redis\": connect in a task service is not supported"), "{msg}");
    // A raw_exec Envoy with a user of its own is refused where the merge put it.
    let mut job = sample_job_using(Feature::ConnectSidecarTask);
    job.task_groups[0].services[0].connect.as_mut().unwrap().sidecar_task.as_mut().unwrap().user = "envoy".into();
    let msg = mutated(job).unwrap_err();
    assert!(msg.starts_with("group \"cache\" task \"connect-proxy-redis\": user with driver = \"raw_exec\""), "{msg}");
}

#[test]
fn every_use_is_reported_once_with_its_count() {
    let mut job = sample_job_using(Feature::Vault);
    job.task_groups[0].tasks[0].artifacts = sample_job_using(Feature::ArtifactSource).task_groups[0].tasks[0].artifacts.clone();
    let mut second = job.task_groups[0].clone();
    second.name = "other".into();
    job.task_groups.push(second);
    let msg = admitted(job).unwrap_err();
    assert!(msg.starts_with("4 errors occurred:\n"), "{msg}");
    assert!(msg.contains("\t* group \"other\" task \"redis\" artifact: source = \"git::"), "{msg}");
}

#[test]
fn artifacts_are_fetched_only_over_http_and_https() {
    let with_source = |source: &str| {
        let mut job = sample_job_using(Feature::Artifact);
        job.task_groups[0].tasks[0].artifacts[0].getter_source = source.into();
        admitted(job)
    };
    for ok in [
        "https://example.com/x.tgz",
        "HTTP://example.com/x",
        "https::https://example.com/x",
        "${NOMAD_META_url}",
        "https://${NOMAD_META_host}/x",
        "http::${NOMAD_META_url}",
    ] {
        with_source(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    let msg = with_source("git::https://github.com/hashicorp/nomad").unwrap_err();
    assert_eq!(
        msg,
        "group \"cache\" task \"redis\" artifact: source = \"git::https://github.com/hashicorp/nomad\" is not supported by nomad-rs yet; nomad-rs fetches only http and https artifacts (no git, hg, s3, gcs or local files)"
    );
    for refused in [
        "s3::https://s3.amazonaws.com/bucket/x",
        "bucket.s3.amazonaws.com/x",
        "github.com/hashicorp/nomad",
        "git@github.com:hashicorp/nomad.git",
        "hg::http://example.com/repo",
        "gcs::https://www.googleapis.com/storage/v1/b/x",
        "s3://bucket/x",
        "file:///etc/passwd",
        "/etc/passwd",
        "ftp://example.com/x",
        "git::${NOMAD_META_url}",
    ] {
        let msg = with_source(refused).unwrap_err();
        assert!(msg.contains("artifact: source = ") && msg.contains("nomad-rs fetches only http and https artifacts"), "{refused}: {msg}");
    }
}

#[test]
fn every_update_attribute_passes_canaries_and_reverts_included() {
    let mut job = sample_job_using(Feature::Cpu);
    job.update = Some(UpdateStrategy::default_service());
    admitted(job).unwrap();
    for f in [
        Feature::UpdateHealthyDeadline,
        Feature::UpdateProgressDeadline,
        Feature::UpdateManualHealth,
        Feature::UpdateCanary,
        Feature::UpdateAutoRevert,
        Feature::UpdateAutoPromote,
    ] {
        admitted(sample_job_using(f)).unwrap();
    }
}

#[test]
fn names_in_messages_are_escaped() {
    let mut job = sample_job_using(Feature::Vault);
    job.task_groups[0].name = "ca\u{1b}[2Jche".into();
    let msg = admitted(job).unwrap_err();
    assert!(msg.contains("group \"ca\\u{1b}[2Jche\""), "{msg}");
    assert!(!msg.contains('\u{1b}'));
}

#[test]
fn the_markdown_table_lists_every_entry() {
    let md = markdown_table();
    assert_eq!(md.lines().count(), TABLE.len() + 2);
    assert!(md.contains("| `vault {}` | group, task | refused |"), "{md}");
    assert!(md.contains("constrained: placed only where it can run, else \"missing compatible host volumes\""), "{md}");
}

#[test]
fn the_readme_carries_the_table_as_the_code_has_it() {
    let readme = include_str!("../../../README.md");
    let md = markdown_table();
    assert!(readme.contains(&md), "README.md's \"Job specification support\" table differs from the code; it should read:\n{md}");
}
