//! Nomad's job defaults (`api.Job.Canonicalize` then `structs.Job.Canonicalize`).
//!
//! Static defaults (count 1, priority 50, 100 MHz / 300 MiB, 5 s kill
//! timeout, ...) live in the types' `Default` impls and serde field defaults,
//! so an absent or `null` key gets them while an explicit value is kept.
//! Defaults that depend on other fields are filled here.

use crate::job::{
    DEFAULT_NAMESPACE, DEFAULT_NODE_POOL, DEFAULT_REGION, Job, JobType, RESTART_MODE_FAIL, ReschedulePolicy, RestartPolicy, UPDATE_UNSET,
    UpdateStrategy,
};
use crate::service::{SERVICE_PROVIDER_CONSUL, Service};

impl Job {
    /// Fills every default Nomad fills before validation. Idempotent.
    pub fn canonicalize(&mut self) {
        if self.name.is_empty() {
            self.name = self.id.clone();
        }
        if self.namespace.is_empty() {
            self.namespace = DEFAULT_NAMESPACE.to_string();
        }
        if self.region.is_empty() {
            self.region = DEFAULT_REGION.to_string();
        }
        if self.node_pool.is_empty() {
            self.node_pool = DEFAULT_NODE_POOL.to_string();
        }
        if self.datacenters.is_empty() {
            self.datacenters = vec!["*".to_string()];
        }
        if let Some(p) = self.periodic.as_mut()
            && p.spec_type.is_empty()
        {
            p.spec_type = "cron".to_string();
        }
        if let Some(p) = self.parameterized_job.as_mut()
            && p.payload.is_empty()
        {
            p.payload = "optional".to_string();
        }
        for c in &mut self.constraints {
            default_operand(&mut c.operand);
        }
        for a in &mut self.affinities {
            default_operand(&mut a.operand);
        }
        let job_update = match self.job_type {
            JobType::Service => {
                let mut u = self.update.take().unwrap_or_else(UpdateStrategy::default_service);
                fill_update_defaults(&mut u, true);
                u
            }
            _ => match self.update.take() {
                Some(mut u) => {
                    // Only what JSON left out: the stored zeros of an absent block stay.
                    fill_update_defaults(&mut u, false);
                    u
                }
                None => UpdateStrategy::default(),
            },
        };
        let job_type = self.job_type;
        let job_id = self.id.clone();
        for g in &mut self.task_groups {
            if job_type == JobType::Service && g.update.is_none() {
                g.update = Some(job_update.clone());
            }
            if let Some(u) = g.update.as_mut() {
                fill_update_defaults(u, true);
            }
            let type_default = match job_type {
                JobType::Batch | JobType::Sysbatch => RestartPolicy::default_batch(),
                _ => RestartPolicy::default_service(),
            };
            let restart = g.restart_policy.get_or_insert_with(|| type_default.clone());
            restart.fill_unset_from(&type_default);
            if restart.mode.is_empty() {
                restart.mode = RESTART_MODE_FAIL.to_string();
            }
            let restart = restart.clone();
            if matches!(job_type, JobType::Service | JobType::Batch) {
                let resched = g.reschedule_policy.get_or_insert_with(|| match job_type {
                    JobType::Batch => ReschedulePolicy::default_batch(),
                    _ => ReschedulePolicy::default_service(),
                });
                if resched.delay_function.is_empty() {
                    resched.delay_function = if job_type == JobType::Batch { "constant" } else { "exponential" }.to_string();
                }
            }
            if job_type == JobType::Service && g.migrate.is_none() {
                g.migrate = Some(Default::default());
            }
            for c in &mut g.constraints {
                default_operand(&mut c.operand);
            }
            for a in &mut g.affinities {
                default_operand(&mut a.operand);
            }
            for n in &mut g.networks {
                if n.mode.is_empty() {
                    n.mode = "host".to_string();
                }
            }
            if let Some(p) = g.scaling.as_mut() {
                p.canonicalize(&self.namespace, &job_id, &g.name, g.count);
            }
            let group_name = g.name.clone();
            for s in &mut g.services {
                canonicalize_service(s, &format!("{job_id}-{group_name}"), None);
            }
            for v in g.volumes.values_mut() {
                if v.volume_type.is_empty() {
                    v.volume_type = "host".to_string();
                }
            }
            for t in &mut g.tasks {
                match t.restart_policy.as_mut() {
                    None => t.restart_policy = Some(restart.clone()),
                    Some(p) => p.fill_unset_from(&restart),
                }
                if t.resources.cores > 0 {
                    t.resources.cpu = 0;
                }
                for c in &mut t.constraints {
                    default_operand(&mut c.operand);
                }
                for a in &mut t.affinities {
                    default_operand(&mut a.operand);
                }
                for m in &mut t.volume_mounts {
                    if m.propagation_mode.is_empty() {
                        m.propagation_mode = "private".to_string();
                    }
                }
                for a in &mut t.artifacts {
                    // Nomad's API defaults, for jobs submitted as JSON without them.
                    if a.getter_mode.is_empty() {
                        a.getter_mode = crate::job::getter_mode::ANY.to_string();
                    }
                    if a.relative_dest.is_empty() {
                        a.relative_dest = crate::job::TaskArtifact::default_destination(&a.getter_mode, &a.getter_source);
                    }
                }
                for tmpl in &mut t.templates {
                    // Nomad's `Template.Canonicalize`: signals upper-cased, SIGHUP for `signal`.
                    tmpl.change_signal = tmpl.change_signal.to_uppercase();
                    if tmpl.change_mode == crate::job::template_change_mode::SIGNAL && tmpl.change_signal.is_empty() {
                        tmpl.change_signal = "SIGHUP".to_string();
                    }
                }
                let task_name = t.name.clone();
                for s in &mut t.services {
                    canonicalize_service(s, &format!("{job_id}-{group_name}-{task_name}"), Some(&task_name));
                }
            }
        }
        self.update = Some(job_update);
    }
}

fn default_operand(op: &mut String) {
    if op.is_empty() {
        *op = "=".to_string();
    }
}

/// Fills what was left out. Zero is left alone where it means something (no rolling
/// updates, healthy at once, fail at the first unhealthy alloc); with `zero_unset`, where it is
/// not a valid value (stagger, healthy_deadline) it is taken as left out too.
fn fill_update_defaults(u: &mut UpdateStrategy, zero_unset: bool) {
    let d = UpdateStrategy::default_service();
    if zero_unset && u.health_check.is_empty() {
        u.health_check = d.health_check;
    }
    for (v, default, zero_invalid) in [
        (&mut u.stagger, d.stagger, true),
        (&mut u.max_parallel, d.max_parallel, false),
        (&mut u.min_healthy_time, d.min_healthy_time, false),
        (&mut u.healthy_deadline, d.healthy_deadline, true),
        (&mut u.progress_deadline, d.progress_deadline, false),
    ] {
        if *v == UPDATE_UNSET || (zero_unset && zero_invalid && *v == 0) {
            *v = default;
        }
    }
}

/// `task` is the task of a task service (`None` for a group service).
fn canonicalize_service(s: &mut Service, default_name: &str, task: Option<&str>) {
    if s.name.is_empty() {
        s.name = default_name.to_string();
    }
    if s.address_mode.is_empty() {
        s.address_mode = "auto".to_string();
    }
    if s.provider.is_empty() {
        s.provider = SERVICE_PROVIDER_CONSUL.to_string();
    }
    if s.on_update.is_empty() {
        s.on_update = "require_healthy".to_string();
    }
    if let Some(c) = s.connect.as_mut() {
        crate::connect::canonicalize_connect(c);
    }
    let service_restart = s.check_restart.take();
    for c in &mut s.checks {
        if c.on_update.is_empty() {
            c.on_update = s.on_update.clone();
        }
        // Nomad's `ServiceCheck.Canonicalize` on the servers: the default name, and the task of
        // the service (a task service's own task, or a group service's `task`).
        if c.name.is_empty() {
            c.name = format!("service: {:?} check", s.name);
        }
        if c.task_name.is_empty() {
            c.task_name = task.unwrap_or(&s.task_name).to_string();
        }
        c.check_restart = crate::service::CheckRestart::merge(service_restart.as_ref(), c.check_restart.as_ref());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lenient;

    #[test]
    fn a_minimal_json_job_gets_nomads_defaults() {
        let mut job: Job = lenient::from_slice(
            br#"{"ID":"web","TaskGroups":[{"Name":"g","Tasks":[{"Name":"t","Driver":"raw_exec",
                "Services":[{"PortLabel":"http"}]}]}]}"#,
        )
        .unwrap();
        job.canonicalize();
        assert_eq!(job.name, "web");
        assert_eq!(job.namespace, "default");
        assert_eq!(job.region, "global");
        assert_eq!(job.priority, 50);
        assert_eq!(job.job_type, JobType::Service);
        assert_eq!(job.datacenters, vec!["*"]);
        assert_eq!(job.node_pool, "default");
        let g = &job.task_groups[0];
        assert_eq!(g.count, 1);
        assert_eq!(g.ephemeral_disk.size_mb, 300);
        assert_eq!(g.restart_policy.as_ref().unwrap().attempts, 2);
        assert!(g.reschedule_policy.as_ref().unwrap().unlimited);
        assert_eq!(g.update.as_ref().unwrap().max_parallel, 1);
        let t = &g.tasks[0];
        assert_eq!(t.resources.cpu, 100);
        assert_eq!(t.resources.memory_mb, 300);
        assert_eq!(t.kill_timeout, 5_000_000_000);
        assert_eq!(t.log_config.max_files, 10);
        assert_eq!(t.restart_policy, g.restart_policy);
        assert_eq!(t.services[0].name, "web-g-t");
        assert_eq!(t.services[0].provider, "consul");
    }

    #[test]
    fn explicit_zero_count_and_batch_policies_are_kept() {
        let mut job: Job = lenient::from_slice(
            br#"{"ID":"b","Type":"batch","TaskGroups":[{"Name":"g","Count":0,"Tasks":[{"Name":"t","Driver":"raw_exec"}]}]}"#,
        )
        .unwrap();
        job.canonicalize();
        let g = &job.task_groups[0];
        assert_eq!(g.count, 0);
        assert_eq!(g.restart_policy.as_ref().unwrap().attempts, 3);
        assert_eq!(g.reschedule_policy.as_ref().unwrap().attempts, 1);
        assert!(g.update.is_none());
        let before = job.clone();
        job.canonicalize();
        assert_eq!(job, before, "canonicalize is idempotent");
    }

    #[test]
    fn partial_json_restart_policies_are_merged_onto_their_defaults() {
        // Nomad's `api.RestartPolicy.Merge`: a group's keys over the job type's default, a
        // task's over its group's; an explicit zero stays zero.
        let mut job: Job = lenient::from_slice(
            br#"{"ID":"b","Type":"batch","TaskGroups":[{"Name":"g","RestartPolicy":{"Attempts":0,"Mode":"fail"},
                 "Tasks":[{"Name":"t","Driver":"raw_exec","RestartPolicy":{"Delay":1000000000}},{"Name":"u","Driver":"raw_exec"}]}]}"#,
        )
        .unwrap();
        job.canonicalize();
        let g = &job.task_groups[0];
        let group = g.restart_policy.as_ref().unwrap();
        let batch = RestartPolicy::default_batch();
        assert_eq!((group.attempts, group.interval, group.delay, group.mode.as_str()), (0, batch.interval, batch.delay, "fail"));
        let t = g.tasks[0].restart_policy.as_ref().unwrap();
        assert_eq!((t.attempts, t.interval, t.delay), (0, batch.interval, 1_000_000_000));
        assert_eq!(g.tasks[1].restart_policy.as_ref(), Some(group));
        let before = job.clone();
        job.canonicalize();
        assert_eq!(job, before, "canonicalize is idempotent");
        assert_eq!(serde_json::to_value(&job).unwrap()["TaskGroups"][0]["RestartPolicy"]["Interval"], batch.interval);
    }

    #[test]
    fn json_update_blocks_get_defaults_for_what_they_leave_out_and_keep_explicit_zeros() {
        let mut job: Job = lenient::from_slice(
            br#"{"ID":"w","Type":"service","Update":{"Canary":1},"TaskGroups":[
                 {"Name":"a","Tasks":[{"Name":"t","Driver":"raw_exec"}]},
                 {"Name":"b","Update":{"MaxParallel":2,"MinHealthyTime":0,"ProgressDeadline":0},"Tasks":[{"Name":"t","Driver":"raw_exec"}]}]}"#,
        )
        .unwrap();
        job.canonicalize();
        let d = UpdateStrategy::default_service();
        let a = job.task_groups[0].update.clone().unwrap();
        assert_eq!((a.canary, a.max_parallel, a.min_healthy_time, a.progress_deadline), (1, 1, d.min_healthy_time, d.progress_deadline));
        let b = job.task_groups[1].update.clone().unwrap();
        assert_eq!((b.max_parallel, b.min_healthy_time, b.progress_deadline), (2, 0, 0), "explicit zeros stay");
        assert_eq!((b.healthy_deadline, b.stagger, b.health_check.as_str()), (d.healthy_deadline, d.stagger, "checks"));
        let before = job.clone();
        job.canonicalize();
        assert_eq!(job, before, "canonicalize is idempotent");
    }

    #[test]
    fn a_services_check_restart_is_merged_into_its_checks_as_nomads_api_does() {
        let mut job: Job = lenient::from_slice(
            br#"{"ID":"j","TaskGroups":[{"Name":"g","Tasks":[{"Name":"t","Driver":"raw_exec","Services":[{"Name":"s",
                "CheckRestart":{"Limit":3,"Grace":90000000000},
                "Checks":[{"Name":"a"},{"Name":"b","CheckRestart":{"Limit":0,"IgnoreWarnings":true}},
                          {"Name":"c","CheckRestart":{"Limit":5,"Grace":0}}]}]}]}]}"#,
        )
        .unwrap();
        job.canonicalize();
        let s = &job.task_groups[0].tasks[0].services[0];
        let of = |i: usize| s.checks[i].check_restart.clone().map(|r| (r.limit, r.grace, r.ignore_warnings));
        assert_eq!(of(0), Some((3, 90_000_000_000, false)), "the service's, as it is");
        assert_eq!(of(1), Some((3, 90_000_000_000, true)), "a zero limit keeps the service's; true ignore_warnings wins");
        assert_eq!(of(2), Some((5, 0, false)), "a given limit and grace win");
        assert!(s.check_restart.is_none(), "merged, then gone");
        assert!(serde_json::to_value(s).unwrap().get("CheckRestart").is_none(), "never sent");
        // Without a grace, Nomad's default of 1s.
        let lone: crate::service::CheckRestart = lenient::from_slice(br#"{"Limit":2}"#).unwrap();
        assert_eq!(lone.grace, 1_000_000_000);
    }
}
