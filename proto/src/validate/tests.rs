use super::*;
use crate::lenient;

fn job(json: &str) -> Job {
    let mut j: Job = lenient::from_slice(json.as_bytes()).unwrap();
    j.canonicalize();
    j
}

/// A valid one-group job with `patch` applied before canonicalization.
fn job_with(patch: impl FnOnce(&mut Job)) -> Job {
    let mut j: Job = lenient::from_slice(br#"{"ID":"ok","TaskGroups":[{"Name":"g","Tasks":[{"Name":"t","Driver":"raw_exec"}]}]}"#).unwrap();
    patch(&mut j);
    j.canonicalize();
    j
}

fn errors_of(j: &Job) -> String {
    j.validate().map(|_| String::new()).unwrap_or_else(|e| e.to_string())
}

fn assert_refused(j: &Job, needle: &str) {
    let text = errors_of(j);
    assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
}

#[test]
fn a_good_job_passes() {
    job_with(|_| {}).validate().unwrap();
}

#[test]
fn each_problem_is_named() {
    let j = job(r#"{"ID":"has space","Priority":0,"TaskGroups":[
            {"Name":"g","Count":-1,"MaxClientDisconnect":1,"StopAfterClientDisconnect":1,
             "Tasks":[{"Name":"t","Resources":{"MemoryMB":1}}]},
            {"Name":"g","Tasks":[]}]}"#);
    let err = j.validate().unwrap_err();
    let text = err.to_string();
    for needle in [
        "Job ID contains a space",
        "job priority must be between [1, 100]",
        "Task group count can't be negative",
        "both max_client_disconnect and stop_after_client_disconnect",
        "Missing task driver",
        "minimum MemoryMB value is 10; got 1",
        "Job task group 2 redefines 'g' from group 1",
        "Missing tasks for task group",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(text.starts_with(&format!("{} errors occurred:\n\t* ", err.0.len())));
}

#[test]
fn a_job_without_groups_is_refused() {
    let j = job(r#"{"ID":"empty"}"#);
    assert_eq!(j.validate().unwrap_err().0, vec!["Missing job task groups".to_string()]);
}

#[test]
fn unknown_constraint_operators_are_refused() {
    let j = job(r#"{"ID":"c","Constraints":[{"LTarget":"${attr.kernel.name}","RTarget":"linux","Operand":"~="}],
        "TaskGroups":[{"Name":"g","Tasks":[{"Name":"t","Driver":"raw_exec"}]}]}"#);
    assert_refused(&j, "Unknown constraint type \"~=\"");
}

#[test]
fn ids_with_control_characters_or_unaddressable_paths_are_refused() {
    for (id, needle) in [
        ("a\nb", "Job ID contains a control character"),
        ("red\u{1b}[31m", "Job ID contains a control character"),
        ("bell\u{7}", "Job ID contains a control character"),
        ("c1\u{9b}", "Job ID contains a control character"),
        ("spoof\u{202e}", "Job ID contains a control character"),
        ("nul\0", "Job ID contains a null character"),
        ("/lead", "Job ID cannot start or end with '/'"),
        ("trail/", "Job ID cannot start or end with '/'"),
        ("a//b", "empty, \".\" or \"..\" segment"),
        ("a/../b", "empty, \".\" or \"..\" segment"),
        ("..", "empty, \".\" or \"..\" segment"),
    ] {
        let j = job_with(|j| j.id = id.to_string());
        assert_refused(&j, needle);
        // The refusal never echoes an unsafe ID raw.
        assert!(!id.chars().any(is_unsafe_char) || !errors_of(&j).contains(id), "{id:?} echoed raw");
    }
    let long = job_with(|j| j.id = "x".repeat(MAX_JOB_ID_BYTES + 1));
    assert_refused(&long, "Job ID is longer than 512 bytes");
    // Periodic and dispatch children keep their slashes.
    job_with(|j| j.id = "batch/dispatch-1700000000-abcd1234".to_string()).validate().unwrap();
    let named = job_with(|j| j.name = "tab\there".to_string());
    assert_refused(&named, "Job Name contains a control character");
}

#[test]
fn group_and_task_names_cannot_reach_outside_their_dirs() {
    for (name, needle) in [
        ("..", "Task name cannot be \"..\""),
        (".", "Task name cannot be \".\""),
        ("a/b", "Task name cannot include slashes"),
        ("a\\b", "Task name cannot include slashes"),
        ("nul\0", "Task name cannot include null characters"),
        ("esc\u{1b}", "Task name contains a control character"),
        ("alloc", "Task name cannot be \"alloc\""),
    ] {
        let j = job_with(|j| j.task_groups[0].tasks[0].name = name.to_string());
        assert_refused(&j, needle);
        assert!(!errors_of(&j).contains(name) || !name.chars().any(is_unsafe_char), "{name:?} echoed raw");
    }
    for (name, needle) in [
        ("..", "Task group name cannot be \"..\""),
        ("a/b", "Task group name cannot include slashes"),
        ("nul\0", "Task group name contains null character"),
        ("line\nbreak", "Task group name contains a control character"),
    ] {
        let j = job_with(|j| j.task_groups[0].name = name.to_string());
        assert_refused(&j, needle);
    }
    let long = job_with(|j| j.task_groups[0].tasks[0].name = "t".repeat(MAX_NAME_BYTES + 1));
    assert_refused(&long, "Task name is longer than 255 bytes");
}

#[test]
fn meta_keys_and_values_are_checked() {
    let j = job_with(|j| {
        j.meta.insert("k\0".into(), "v".into());
        j.task_groups[0].meta.insert("ok".into(), "nul\0value".into());
        j.task_groups[0].tasks[0].meta.insert("esc\u{1b}".into(), "v".into());
        j.task_groups[0].tasks[0].meta.insert(String::new(), "v".into());
    });
    let text = errors_of(&j);
    for needle in [
        "Job meta key \"k\\0\" contains a null character",
        "Task group meta value of \"ok\" contains a null character",
        "Task meta key \"esc\\u{1b}\" contains a control character",
        "Task meta key must not be empty",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    // Newlines in values are data (certificates, scripts).
    job_with(|j| {
        j.meta.insert("pem".into(), "line one\nline two".into());
    })
    .validate()
    .unwrap();
}

#[test]
fn a_per_alloc_volume_is_refused_with_canaries_and_in_system_jobs() {
    let volume = crate::volume::VolumeRequest { volume_type: "csi".into(), source: "data".into(), per_alloc: true, ..Default::default() };
    let with_volume = |j: &mut Job| {
        j.task_groups[0].volumes.insert("data".into(), volume.clone());
    };
    assert!(errors_of(&job_with(with_volume)).is_empty(), "{}", errors_of(&job_with(with_volume)));
    let j = job_with(|j| {
        with_volume(j);
        j.task_groups[0].update = Some(UpdateStrategy { canary: 1, ..UpdateStrategy::default_service() });
    });
    assert_refused(&j, "Volume data cannot be per_alloc when canaries are in use");
    let j = job_with(|j| {
        with_volume(j);
        j.job_type = JobType::Sysbatch;
    });
    assert_refused(&j, "Volume data cannot be per_alloc for system or sysbatch jobs");
}

#[test]
fn update_migrate_restart_and_reschedule_follow_nomad() {
    let j = job_with(|j| {
        j.update = Some(UpdateStrategy { max_parallel: -1, ..UpdateStrategy::default_service() });
    });
    assert_refused(&j, "Max parallel can not be less than zero: -1 < 0");
    let j = job_with(|j| {
        j.task_groups[0].update =
            Some(UpdateStrategy { canary: -2, auto_promote: true, health_check: "bogus".into(), ..UpdateStrategy::default_service() });
    });
    for needle in ["Canary count can not be less than zero: -2 < 0", "Invalid health check given: \"bogus\""] {
        assert_refused(&j, needle);
    }
    let j = job_with(|j| {
        j.task_groups[0].update = Some(UpdateStrategy {
            min_healthy_time: 20 * SECOND,
            healthy_deadline: 10 * SECOND,
            progress_deadline: 5 * SECOND,
            ..UpdateStrategy::default_service()
        });
    });
    assert_refused(&j, "Minimum healthy time must be less than healthy deadline: 20s > 10s");
    assert_refused(&j, "Healthy deadline must be less than progress deadline: 10s > 5s");
    let j = job_with(|j| {
        j.task_groups[0].update = Some(UpdateStrategy { progress_deadline: 6 * 60 * SECOND, ..UpdateStrategy::default_service() });
        j.task_groups[0].tasks[0].kill_timeout = 7 * 60 * SECOND;
    });
    assert_refused(&j, "KillTimout (7m0s) longer than the group's ProgressDeadline (6m0s)");

    let j =
        job_with(|j| j.task_groups[0].migrate = Some(MigrateStrategy { max_parallel: -1, health_check: "x".into(), ..Default::default() }));
    assert_refused(&j, "MaxParallel must be >= 0 but found -1");
    assert_refused(&j, "Invalid HealthCheck: \"x\"");

    let j = job_with(|j| {
        j.job_type = JobType::Batch;
        j.task_groups[0].update = Some(UpdateStrategy::default_service());
        j.task_groups[0].migrate = Some(MigrateStrategy::default());
    });
    assert_refused(&j, "Job type \"batch\" does not allow update block");
    assert_refused(&j, "Job type \"batch\" does not allow migrate block");

    let j = job_with(|j| {
        j.task_groups[0].restart_policy =
            Some(RestartPolicy { attempts: 0, interval: SECOND, delay: 0, mode: "delay".into(), ..RestartPolicy::default() });
    });
    assert_refused(&j, "Restart policy \"delay\" with 0 attempts is ambiguous");
    assert_refused(&j, "Interval can not be less than 5s (got 1s)");
    let j = job_with(|j| {
        j.task_groups[0].restart_policy = Some(RestartPolicy {
            attempts: i64::MAX,
            interval: 60 * SECOND,
            delay: i64::MAX,
            mode: "fail".into(),
            ..RestartPolicy::default()
        });
    });
    assert_refused(&j, "Nomad can't restart the TaskGroup 9223372036854775807 times in an interval of 1m0s");

    let resched = |attempts, interval, delay, f: &str, max_delay| {
        job_with(|j| {
            j.task_groups[0].reschedule_policy =
                Some(ReschedulePolicy { attempts, interval, delay, delay_function: f.into(), max_delay, unlimited: false })
        })
    };
    assert_refused(&resched(3, 10 * SECOND, SECOND, "constant", 0), "Delay cannot be less than 5s (got 1s)");
    assert_refused(&resched(3, 10 * SECOND, 5 * SECOND, "constant", 0), "Interval cannot be less than 15s (got 10s)");
    let c = resched(10, 60 * SECOND, 10 * SECOND, "constant", 0);
    assert_refused(&c, "Nomad can only make 6 attempts in 1m0s with initial delay 10s and delay function \"constant\"");
    assert_refused(&c, "Set the interval to at least 1m40s to accommodate 10 attempts");
    // Exponential: 10s, 20s, 40s, then +60s each: 100s, 160s.
    let e = resched(5, 120 * SECOND, 10 * SECOND, "exponential", 60 * SECOND);
    assert_refused(
        &e,
        "Nomad can only make 4 attempts in 2m0s with initial delay 10s, delay function \"exponential\", and delay ceiling 1m0s",
    );
    assert_refused(&e, "Set the interval to at least 2m40s to accommodate 5 attempts");
    resched(4, 120 * SECOND, 10 * SECOND, "exponential", 60 * SECOND).validate().unwrap();
    // Fibonacci: 10s, 10s, 20s, 30s, 50s, then capped at 60s and +60s: 60s, 120s.
    let f = resched(7, 100 * SECOND, 10 * SECOND, "fibonacci", 60 * SECOND);
    assert_refused(
        &f,
        "Nomad can only make 6 attempts in 1m40s with initial delay 10s, delay function \"fibonacci\", and delay ceiling 1m0s",
    );
    resched(6, 100 * SECOND, 10 * SECOND, "fibonacci", 60 * SECOND).validate().unwrap();
    // A huge attempt count is judged without walking every attempt.
    let huge = resched(i64::MAX, 3600 * SECOND, 5 * SECOND, "exponential", 60 * SECOND);
    assert_refused(&huge, "Nomad can only make 63 attempts in 1h0m0s");
    assert_refused(&resched(1, 3600 * SECOND, 10 * SECOND, "exponential", SECOND), "Max Delay cannot be less than Delay 10s (got 1s)");
}

#[test]
fn periodic_specs_are_parsed() {
    let periodic = |spec: &str| {
        job_with(|j| {
            j.job_type = JobType::Batch;
            j.periodic = Some(PeriodicConfig { enabled: true, spec: spec.into(), ..PeriodicConfig::default() });
        })
    };
    periodic("*/5 * * * *").validate().unwrap();
    assert_refused(&periodic("61 * * * *"), "Invalid cron spec \"61 * * * *\": syntax error in minute field: '61'");
    assert_refused(&periodic("every day"), "Invalid cron spec \"every day\": missing field(s)");
    assert_refused(&periodic(""), "Must specify a spec");
    let service = job_with(|j| j.periodic = Some(PeriodicConfig { enabled: true, spec: "@daily".into(), ..PeriodicConfig::default() }));
    assert_refused(&service, "Periodic can only be used with \"batch\" or \"sysbatch\" scheduler");
    let tz = job_with(|j| {
        j.job_type = JobType::Batch;
        j.periodic =
            Some(PeriodicConfig { enabled: true, spec: "@daily".into(), time_zone: "../../etc/passwd".into(), ..Default::default() });
    });
    assert_refused(&tz, "Invalid time zone \"../../etc/passwd\"");
}

#[test]
fn constraint_patterns_and_versions_must_parse() {
    let with = |operand: &str, r: &str| {
        job_with(|j| {
            j.constraints = vec![crate::Constraint { l_target: "${attr.x}".into(), r_target: r.into(), operand: operand.into() }];
        })
    };
    with("regexp", "^web-[0-9]+$").validate().unwrap();
    let bad = with("regexp", "web-(");
    assert_refused(
        &bad,
        "Constraint 1 validation failed: Regular expression failed to compile: error parsing regexp: unclosed group: `web-(`",
    );
    with("version", ">= 1.2, < 2").validate().unwrap();
    assert_refused(
        &with("version", "=> 1.2"),
        "Constraint 1 validation failed: Version constraint is invalid: Malformed constraint: => 1.2",
    );
    assert_refused(&with("semver", "~> 1.2"), "Semver constraint is invalid: Malformed constraint: ~> 1.2");
    assert_refused(&with("is_set", "x"), "Operator \"is_set\" does not support an RTarget");
    assert_refused(&with("distinct_property", "zero"), "Failed to convert RTarget \"zero\" to uint64");
    let aff = job_with(|j| {
        j.affinities = vec![crate::Affinity { l_target: "${attr.x}".into(), r_target: "(".into(), operand: "regexp".into(), weight: 0 }];
    });
    assert_refused(&aff, "Affinity 1 validation failed: Regular expression failed to compile");
    assert_refused(&aff, "Affinity weight cannot be zero");
}

#[test]
fn spreads_follow_nomad_and_never_overflow() {
    let j = job_with(|j| {
        j.task_groups[0].spreads = vec![Spread {
            attribute: String::new(),
            weight: 0,
            spread_target: vec![
                crate::job::SpreadTarget { value: "a".into(), percent: i64::MAX },
                crate::job::SpreadTarget { value: "a".into(), percent: i64::MAX },
            ],
        }];
    });
    for needle in [
        "Missing spread attribute",
        "Spread block must have a positive weight from 0 to 100",
        "Spread target value \"a\" already defined",
        "Spread target percentage for value \"a\" must be between 0 and 100",
        "Sum of spread target percentages must not be greater than 100%; got 18446744073709551614%",
    ] {
        assert_refused(&j, needle);
    }
    // A JSON spread without a weight gets Nomad's default of 50.
    let j = job(r#"{"ID":"s","TaskGroups":[{"Name":"g","Spreads":[{"Attribute":"${node.datacenter}"}],
        "Tasks":[{"Name":"t","Driver":"raw_exec"}]}]}"#);
    assert_eq!(j.task_groups[0].spreads[0].weight, 50);
    j.validate().unwrap();
}

#[test]
fn resources_have_a_floor_and_a_ceiling() {
    let j = job_with(|j| {
        let t = &mut j.task_groups[0].tasks[0];
        t.resources.cpu = 5_000_000_000_000_000_000;
        t.resources.memory_mb = i64::MAX;
        t.resources.disk_mb = 1;
        j.task_groups[0].ephemeral_disk.size_mb = 5;
    });
    for needle in [
        "maximum CPU value is 4294967296; got 5000000000000000000",
        "maximum MemoryMB value is 4294967296; got 9223372036854775807",
        "Task can't ask for disk resources",
        "minimum DiskMB value is 10; got 5",
        "log storage (100 MB) must be less than requested disk capacity (5 MB)",
    ] {
        assert_refused(&j, needle);
    }
    let j = job_with(|j| {
        j.task_groups[0].tasks[0].log_config.max_files = i64::MAX;
        j.task_groups[0].tasks[0].log_config.max_file_size_mb = i64::MAX;
    });
    assert_refused(&j, "log storage (85070591730234615847396907784232501249 MB) must be less than");
}

#[test]
fn job_type_rules_of_nomad() {
    let j = job_with(|j| {
        j.job_type = JobType::System;
        j.task_groups[0].count = 3;
        j.affinities = vec![crate::Affinity { l_target: "${attr.x}".into(), r_target: "y".into(), operand: "=".into(), weight: 10 }];
    });
    assert_refused(&j, "Job task group g has count 3. Count cannot exceed 1 with system scheduler");
    assert_refused(&j, "System jobs may not have an affinity block");
    let j = job_with(|j| {
        j.parameterized_job = Some(crate::job::ParameterizedJobConfig {
            payload: "maybe".into(),
            meta_required: vec!["a".into()],
            meta_optional: vec!["a".into()],
        })
    });
    assert_refused(&j, "Parameterized job can only be used with \"batch\" or \"sysbatch\" scheduler");
    assert_refused(&j, "Unknown payload requirement: \"maybe\"");
    assert_refused(&j, "Following keys exist in both: [a]");
}

#[test]
fn destinations_stay_inside_the_alloc_dir() {
    assert!(!path_escapes_alloc(&["task"], "local/file"));
    assert!(!path_escapes_alloc(&["task"], "/local/file"), "absolute paths are relative to the task dir");
    assert!(!path_escapes_alloc(&["task"], "../alloc/data/x"), "the shared alloc dir is reachable");
    assert!(path_escapes_alloc(&["task"], "../../etc/passwd"));
    assert!(path_escapes_alloc(&["task"], "../../alloc-id/x"), "no way back in by the placeholder's name");
    assert!(path_escapes_alloc(&["task", "local"], "../../../x"));
    let j = job_with(|j| {
        let t = &mut j.task_groups[0].tasks[0];
        t.templates =
            vec![crate::job::Template { embedded_tmpl: "x".into(), dest_path: "../../../etc/cron.d/x".into(), ..Default::default() }];
        t.artifacts =
            vec![crate::job::TaskArtifact { getter_source: "https://x".into(), relative_dest: "../../..".into(), ..Default::default() }];
        t.dispatch_payload = Some(serde_json::json!({"File": "../../../../root"}));
    });
    assert_refused(&j, "Template 1 validation failed: destination escapes allocation directory");
    assert_refused(&j, "Artifact 1 validation failed: destination escapes allocation directory");
    assert_refused(&j, "Dispatch Payload validation failed: destination escapes allocation directory");
}

#[test]
fn artifact_checksums_take_nomads_format_unless_interpolated() {
    let with_checksum = |c: &str| {
        job_with(|j| {
            let mut a = crate::job::TaskArtifact { getter_source: "https://x/f".into(), ..Default::default() };
            a.getter_options.insert("checksum".into(), c.into());
            j.task_groups[0].tasks[0].artifacts = vec![a];
        })
    };
    let md5 = "d41d8cd98f00b204e9800998ecf8427e";
    let sha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    for ok in [
        format!("md5:{md5}"),
        format!("sha256:{sha256}"),
        " sha1:da39a3ee5e6b4b0d3255bfef95601890afd80709 ".into(),
        "${NOMAD_META_sum}".into(),
    ] {
        assert_eq!(errors_of(&with_checksum(&ok)), "", "{ok}");
    }
    for (bad, why) in [
        ("", "checksum value cannot be empty"),
        (md5, "checksum must be given as \"type:value\"; got \"d41d8cd98f00b204e9800998ecf8427e\""),
        ("file:https://x/SHA256SUMS", "checksum must be given as \"type:value\"; got \"file:https://x/SHA256SUMS\""),
        ("file:00ff", "unsupported checksum type: file"),
        ("md5:zz", "invalid checksum: encoding/hex: invalid byte: U+007A 'z'"),
        ("sha256:abc", "invalid checksum: encoding/hex: odd length hex string"),
        ("crc32:abcd", "unsupported checksum type: crc32"),
        (&format!("sha256:{md5}"), &format!("invalid sha256 checksum: {md5}")),
    ] {
        assert_refused(&with_checksum(bad), &format!("Artifact 1 validation failed: {why}"));
    }
    // A `${` that is no reference is checked.
    assert_refused(&with_checksum("md5:${}"), "Artifact 1 validation failed: invalid checksum");
    assert!(contains_env_reference("sha256:${NOMAD_META_sum}") && !contains_env_reference("${a b}"));
}

#[test]
fn json_artifacts_get_nomads_mode_and_destination_defaults() {
    let j = job_with(|j| {
        j.task_groups[0].tasks[0].artifacts = vec![
            crate::job::TaskArtifact { getter_source: "https://x/a.tgz".into(), ..Default::default() },
            crate::job::TaskArtifact { getter_source: "https://x/bin/run.sh?x=1".into(), getter_mode: "file".into(), ..Default::default() },
        ];
    });
    let a = &j.task_groups[0].tasks[0].artifacts;
    assert_eq!((a[0].getter_mode.as_str(), a[0].relative_dest.as_str()), ("any", "local/"));
    assert_eq!((a[1].getter_mode.as_str(), a[1].relative_dest.as_str()), ("file", "local/run.sh"));
}

#[test]
fn go_durations_print_like_go() {
    for (ns, want) in [
        (0i64, "0s"),
        (5 * SECOND, "5s"),
        (90 * SECOND, "1m30s"),
        (3600 * SECOND, "1h0m0s"),
        (1_500_000_000, "1.5s"),
        (300_000_000, "300ms"),
        (-SECOND, "-1s"),
    ] {
        assert_eq!(go_duration(ns), want);
    }
}

#[test]
fn unsafe_characters_are_escaped_for_display() {
    assert_eq!(escape_unsafe_chars("plain", &[]), "plain");
    assert_eq!(escape_unsafe_chars("a\u{1b}[2Jb\n", &[]), "a\\u{1b}[2Jb\\n");
    assert_eq!(escape_unsafe_chars("keep\nlines\u{9b}", &['\n']), "keep\nlines\\u{9b}");
    assert_eq!(escape_unsafe_chars("rtl\u{202e}", &[]), "rtl\\u{202e}");
}

fn node() -> Node {
    let mut n = Node {
        id: "2f1c4b7e-0000-4000-8000-000000000001".into(),
        secret_id: "s".into(),
        name: "n1".into(),
        datacenter: "dc1".into(),
        ..Node::default()
    };
    n.attributes.insert("kernel.name".into(), "linux".into());
    n
}

#[test]
fn node_registrations_are_checked() {
    node().validate_registration().unwrap();
    let refused = |patch: &dyn Fn(&mut Node), needle: &str| {
        let mut n = node();
        patch(&mut n);
        let e = n.validate_registration().unwrap_err();
        assert!(e.contains(needle), "missing {needle:?} in {e:?}");
    };
    refused(&|n| n.id = "a\nb".into(), "node ID \"a\\nb\" contains a control character");
    refused(&|n| n.id = "a/b".into(), "cannot contain spaces or slashes");
    refused(&|n| n.name = "\u{1b}]0;owned\u{7}".into(), "node name \"\\u{1b}]0;owned\\u{7}\" contains a control character");
    refused(&|n| n.node_pool = "bad pool".into(), "invalid node pool: invalid name \"bad pool\", must match regex ^[a-zA-Z0-9-_]{1,128}$");
    refused(
        &|n| {
            n.attributes.insert("x\u{1b}".into(), "y".into());
        },
        "node attribute key",
    );
    refused(
        &|n| {
            n.meta.insert("k".into(), "\0".into());
        },
        "node meta value of \"k\" contains a null character",
    );
    refused(
        &|n| {
            n.node_resources = Some(crate::NodeResources {
                cpu: crate::resources::NodeCpuResources { cpu_shares: 5_000_000_000_000_000_000, ..Default::default() },
                ..Default::default()
            })
        },
        "node CPU (MHz) must be between 0 and 4294967296; got 5000000000000000000",
    );
    refused(
        &|n| {
            let mut r = crate::resources::NodeReservedResources::default();
            r.memory.memory_mb = -1;
            n.reserved_resources = Some(r);
        },
        "node reserved memory (MB) must be between 0",
    );
    refused(
        &|n| {
            let mut r = crate::resources::NodeReservedResources::default();
            r.networks.reserved_host_ports = "22,80-70000".into();
            n.reserved_resources = Some(r);
        },
        "node reserved host ports: \"70000\" is not a port",
    );
    refused(
        &|n| {
            let mut r = crate::resources::NodeReservedResources::default();
            r.cpu.cpu_shares = i64::MAX;
            n.reserved_resources = Some(r);
        },
        "node reserved CPU (MHz) must be between 0 and 4294967296; got 9223372036854775807",
    );
    refused(
        &|n| {
            let mut r = crate::resources::NodeReservedResources::default();
            r.disk.disk_mb = 1 << 40;
            n.reserved_resources = Some(r);
        },
        "node reserved disk (MB) must be between 0",
    );
    refused(
        &|n| {
            let mut r = crate::NodeResources::default();
            r.cpu.reservable_cpu_cores = vec![0; (1 << 16) + 1];
            n.node_resources = Some(r);
        },
        "node reservable CPU cores lists 65537 cores, more than 65536",
    );
    refused(
        &|n| n.node_resources = Some(crate::NodeResources { min_dynamic_port: 30000, max_dynamic_port: 20000, ..Default::default() }),
        "node dynamic port range 30000-20000 is empty",
    );
    let mut n = node();
    n.secret_id = "secret\u{1b}".into();
    let e = n.validate_registration().unwrap_err();
    assert!(!e.contains("secret\u{1b}") && !e.contains("secret\\u"), "a secret is never echoed: {e}");
}

#[test]
fn namespace_names_follow_nomads_rule() {
    let ns = |name: &str| crate::Namespace { name: name.into(), ..Default::default() };
    ns("prod-eu-1").validate().unwrap();
    for bad in ["", "under_score", "a/b", "new\nline", &"x".repeat(129)] {
        let e = ns(bad).validate().unwrap_err().to_string();
        assert!(e.contains("Must match regex ^[a-zA-Z0-9-]{1,128}$"), "{bad:?}: {e}");
    }
    let long = crate::Namespace { name: "ok".into(), description: "d".repeat(257), ..Default::default() };
    assert!(long.validate().unwrap_err().to_string().contains("description longer than 256"));
}

#[test]
fn a_csi_plugin_needs_an_id_usable_as_a_directory_and_one_of_nomads_types() {
    let with_plugin = |id: &str, plugin_type: &str| {
        let (id, plugin_type) = (id.to_string(), plugin_type.to_string());
        job_with(move |j| {
            j.task_groups[0].tasks[0].csi_plugin_config =
                Some(crate::job::CsiPluginConfig { id, plugin_type, ..crate::job::CsiPluginConfig::default() })
        })
    };
    with_plugin("hostpath", "monolith").validate().unwrap();
    assert_refused(&with_plugin("", "node"), "CSIPluginConfig must have a non-empty PluginID");
    assert_refused(&with_plugin("../x", "node"), "CSIPluginConfig PluginID \"../x\" must be usable as a directory name");
    assert_refused(
        &with_plugin("p", "sidecar"),
        "CSIPluginConfig PluginType must be one of 'node', 'controller', or 'monolith', got: \"sidecar\"",
    );
}

#[test]
fn script_checks_need_a_command_intervals_of_a_second_and_in_group_services_a_task() {
    let with_checks = |group: bool, checks: &str| {
        let service = format!(r#"{{"Name":"s","Checks":[{checks}]}}"#);
        let body = if group {
            format!(r#"{{"ID":"j","TaskGroups":[{{"Name":"g","Services":[{service}],"Tasks":[{{"Name":"t","Driver":"raw_exec"}}]}}]}}"#)
        } else {
            format!(r#"{{"ID":"j","TaskGroups":[{{"Name":"g","Tasks":[{{"Name":"t","Driver":"raw_exec","Services":[{service}]}}]}}]}}"#)
        };
        job(&body)
    };
    let good = r#"{"Name":"c","Type":"script","Command":"/bin/true","Interval":1000000000,"Timeout":1000000000}"#;
    with_checks(false, good).validate().unwrap();
    let task_named = r#"{"Name":"c","Type":"script","Command":"/bin/true","Interval":1000000000,"Timeout":1000000000,"TaskName":"t"}"#;
    with_checks(true, task_named).validate().unwrap();
    assert_refused(&with_checks(true, good), "Service [g]->s or Check c must specify task parameter");
    let bad = r#"{"Name":"c","Type":"script","Interval":500000000}"#;
    let j = with_checks(false, bad);
    for needle in [
        "Check c invalid: script type must have a valid script path",
        "Check c invalid: interval (500ms) cannot be lower than 1s",
        "Check c invalid: missing required value timeout. Timeout cannot be less than 1s",
    ] {
        assert_refused(&j, needle);
    }
}

/// Nomad's `Service.Validate` and `ServiceCheck.validateCommon` on `on_update`.
#[test]
fn on_update_takes_nomads_three_values_and_agrees_with_check_restart() {
    let with = |service: &str, check: &str| {
        job(&format!(
            r#"{{"ID":"j","TaskGroups":[{{"Name":"g","Tasks":[{{"Name":"t","Driver":"raw_exec","Services":[{{"Name":"s","OnUpdate":"{service}",
                "Checks":[{{"Name":"c","Type":"tcp","PortLabel":"80","Interval":1000000000,"Timeout":1000000000,{check}}}]}}]}}]}}]}}"#
        ))
    };
    with("ignore_warnings", r#""OnUpdate":"ignore""#).validate().unwrap();
    with("require_healthy", r#""OnUpdate":"ignore_warnings","CheckRestart":{"Limit":3,"IgnoreWarnings":true}"#).validate().unwrap();
    assert_refused(
        &with("sometimes", r#""OnUpdate":"ignore""#),
        "Service on_update must be \"require_healthy\", \"ignore_warnings\", or \"ignore\"; not \"sometimes\"",
    );
    assert_refused(
        &with("ignore", r#""OnUpdate":"never""#),
        "Check c invalid: on_update must be \"require_healthy\", \"ignore_warnings\", or \"ignore\"; got \"never\"",
    );
    assert_refused(
        &with("ignore", r#""OnUpdate":"ignore","CheckRestart":{"Limit":3}"#),
        "Check c invalid: on_update value \"ignore\" is not compatible with check_restart",
    );
    assert_refused(
        &with("ignore", r#""OnUpdate":"ignore_warnings","CheckRestart":{"Limit":3}"#),
        "Check c invalid: on_update value \"ignore_warnings\" not supported with check_restart ignore_warnings value \"false\"",
    );
}

/// Nomad-provider checks (`validateNomad`): each field Nomad keeps for Consul checks, and each
/// common rule, refused with Nomad's own words; the rest admitted.
#[test]
fn nomad_checks_are_validated_as_nomads_validate_nomad() {
    let with = |check: &str| {
        job(&format!(
            r#"{{"ID":"j","TaskGroups":[{{"Name":"g","Tasks":[{{"Name":"t","Driver":"raw_exec","Services":[{{"Name":"s","Provider":"nomad",
                "PortLabel":"80","Checks":[{{"Name":"c","Interval":1000000000,"Timeout":1000000000,{check}}}]}}]}}]}}]}}"#
        ))
    };
    with(r#""Type":"tcp""#).validate().unwrap();
    with(r#""Type":"http","Path":"/health?x=1","Method":"post","Header":{"Host":["web"]},"Body":"b","Protocol":"https""#)
        .validate()
        .unwrap();
    // Accepted and ignored, as in Nomad.
    with(r#""Type":"tcp","TLSSkipVerify":true,"InitialStatus":"critical""#).validate().unwrap();
    with(r#""Type":"tcp","AddressMode":"alloc""#).validate().unwrap();
    for (check, message) in [
        (r#""Type":"script","Command":"/bin/true""#, "invalid check type (\"script\"), must be one of tcp, http"),
        (r#""Type":"grpc""#, "invalid check type (\"grpc\"), must be one of tcp, http"),
        (r#""Type":"http""#, "http type must have http path"),
        (r#""Type":"http","Path":"http://example.com/health""#, "http type must have relative http path"),
        (r#""Type":"http","Path":"/a%zz""#, "http type must have valid http path"),
        (r#""Type":"http","Path":"/h","Method":"BREW""#, "method type \"BREW\" not supported in Nomad http check"),
        (r#""Type":"tcp","Expose":true"#, "expose may only be set for Consul service checks"),
        (r#""Type":"tcp","OnUpdate":"ignore_warnings""#, "on_update may only be set to ignore_warnings for Consul service checks"),
        (
            r#""Type":"tcp","OnUpdate":"ignore_warnings","CheckRestart":{"Limit":2,"IgnoreWarnings":true}"#,
            "on_update may only be set to ignore_warnings for Consul service checks",
        ),
        (
            r#""Type":"tcp","CheckRestart":{"Limit":2,"IgnoreWarnings":true}"#,
            "ignore_warnings on check_restart only supported for Consul service checks",
        ),
        (r#""Type":"tcp","AddressMode":"driver""#, "address_mode = driver may only be set for Consul service checks"),
        (r#""Type":"tcp","SuccessBeforePassing":2"#, "success_before_passing may only be set for Consul service checks"),
        (r#""Type":"tcp","FailuresBeforeCritical":2"#, "failures_before_critical may only be set for Consul service checks"),
        (r#""Type":"tcp","TLSServerName":"web""#, "tls_server_name may only be set for Consul service checks"),
        (r#""Type":"tcp","Interval":500000000"#, "interval (500ms) cannot be lower than 1s"),
        (r#""Type":"tcp","Timeout":0"#, "missing required value timeout. Timeout cannot be less than 1s"),
    ] {
        assert_refused(&with(check), message);
    }
    // No port anywhere: the port rule first, as Nomad.
    let j =
        job(r#"{"ID":"j","TaskGroups":[{"Name":"g","Tasks":[{"Name":"t","Driver":"raw_exec","Services":[{"Name":"s","Provider":"nomad",
            "Checks":[{"Name":"c","Type":"tcp","Interval":1000000000,"Timeout":1000000000}]}]}]}]}"#);
    assert_refused(&j, "Check c invalid: check requires a port but neither check nor service \"s\" have a port");
    // Connect on a Nomad service (Nomad's message, unchanged).
    let j = job(r#"{"ID":"j","TaskGroups":[{"Name":"g","Services":[{"Name":"s","Provider":"nomad","Connect":{"Native":true}}],
            "Tasks":[{"Name":"t","Driver":"raw_exec"}]}]}"#);
    assert_refused(&j, "Service with provider nomad cannot include Connect blocks");
}

#[test]
fn nomad_check_ids_are_nomads_md5() {
    // As Nomad's `NomadCheckID` computes it for this check (allocID "a1", group "g"):
    // md5("a1" "g" "t" "c" "http" "web" "require_healthy" "" <1s le> <2s le> "http" "/h" "GET").
    let c = ServiceCheck {
        name: "c".into(),
        check_type: "http".into(),
        task_name: "t".into(),
        port_label: "web".into(),
        on_update: "require_healthy".into(),
        interval: 1_000_000_000,
        timeout: 2_000_000_000,
        protocol: "http".into(),
        path: "/h".into(),
        method: "GET".into(),
        ..ServiceCheck::default()
    };
    let mut bytes = b"a1gtchttpwebrequire_healthy".to_vec();
    bytes.extend(1_000_000_000i64.to_le_bytes());
    bytes.extend(2_000_000_000i64.to_le_bytes());
    bytes.extend(b"http/hGET");
    use md5::Digest;
    let want: String = md5::Md5::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(c.nomad_check_id("a1", "g"), want);
    assert_eq!(want.len(), 32);
    // Another alloc, another ID; a field outside Nomad's list (the body) changes nothing.
    assert_ne!(c.nomad_check_id("a2", "g"), want);
    assert_eq!(ServiceCheck { body: "x".into(), ..c.clone() }.nomad_check_id("a1", "g"), want);
    assert_eq!(c.nomad_check_mode(), "healthiness");
    assert_eq!(ServiceCheck { on_update: "ignore".into(), ..c }.nomad_check_mode(), "readiness");
}

#[test]
fn checks_get_nomads_default_name_and_their_services_task() {
    let j = job(
        r#"{"ID":"j","TaskGroups":[{"Name":"g","Services":[{"Name":"gs","Provider":"nomad","PortLabel":"80","Checks":[{"Type":"tcp"}]}],
            "Tasks":[{"Name":"t","Driver":"raw_exec","Services":[{"Name":"ts","Provider":"nomad","PortLabel":"80","Checks":[{"Type":"tcp"}]}]}]}]}"#,
    );
    let g = &j.task_groups[0];
    assert_eq!(g.services[0].checks[0].name, "service: \"gs\" check");
    assert_eq!(g.services[0].checks[0].task_name, "", "a group service without a task");
    assert_eq!(g.tasks[0].services[0].checks[0].name, "service: \"ts\" check");
    assert_eq!(g.tasks[0].services[0].checks[0].task_name, "t");
}
