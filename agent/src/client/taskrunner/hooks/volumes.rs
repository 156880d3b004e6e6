//! `volumes`: the task's `volume_mount`s of CSI volumes (Nomad's `volume_hook.go`, CSI part).
//!
//! The `csi` alloc hook mounted the group's CSI volumes before any task starts; each
//! `volume_mount` of one becomes a bind of its host publish target at `destination`
//! ([`volume_mounts`], read-only when the group's volume or the mount says so), which the exec
//! driver makes inside the task's mount namespace and the oci driver puts in the bundle.
//! Prestart refuses, with Nomad's words, a mount of a CSI volume that is not mounted and a
//! driver without mounts (raw_exec: no file system of its own to bind into).

use std::path::PathBuf;

use nomad_proto::{Allocation, Task};

use super::{HookError, HookRequest, PrestartHook, PrestartResponse, TaskHook};
use crate::client::allocrunner::hooks::CsiMounts;
use crate::client::allocrunner::hooks::csi::{MOUNT_DRIVERS, mount_source};
use crate::client::driver::{MountConfig, Propagation};

/// See the module docs.
pub struct VolumesHook {
    mounts: CsiMounts,
}

impl VolumesHook {
    /// A hook reading the alloc's CSI mounts.
    pub fn new(mounts: CsiMounts) -> VolumesHook {
        VolumesHook { mounts }
    }
}

impl TaskHook for VolumesHook {
    fn name(&self) -> &'static str {
        "volumes"
    }
    fn prestart(&self) -> Option<&dyn PrestartHook> {
        Some(self)
    }
}

/// The group's CSI volume of each `volume_mount`, with the mount.
fn csi_mounts_of<'a>(alloc: &'a Allocation, task: &'a Task) -> impl Iterator<Item = (&'a nomad_proto::volume::VolumeMount, bool)> + 'a {
    let group = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group));
    task.volume_mounts.iter().filter_map(move |m| {
        let v = group?.volumes.get(&m.volume).filter(|v| v.volume_type == "csi")?;
        Some((m, v.read_only || m.read_only))
    })
}

/// The binds of the task's CSI `volume_mount`s that are mounted, with their
/// `propagation_mode` (validation refused any other than Nomad's three).
pub fn volume_mounts(alloc: &Allocation, task: &Task, mounts: &CsiMounts) -> Vec<MountConfig> {
    csi_mounts_of(alloc, task)
        .filter_map(|(m, read_only)| {
            let host_path: PathBuf = mount_source(mounts, &m.volume)?;
            let propagation = Propagation::parse(&m.propagation_mode).unwrap_or_default();
            Some(MountConfig { host_path, task_path: m.destination.clone(), read_only, propagation })
        })
        .collect()
}

impl PrestartHook for VolumesHook {
    fn prestart(&self, req: &HookRequest<'_>) -> Result<PrestartResponse, HookError> {
        let mut any = false;
        for (m, _) in csi_mounts_of(req.alloc, req.task) {
            any = true;
            if mount_source(&self.mounts, &m.volume).is_none() {
                return Err(HookError::fatal(format!("No CSI Mount Point found for volume: {}", m.volume)));
            }
        }
        if any && !MOUNT_DRIVERS.contains(&req.task.driver.as_str()) {
            return Err(HookError::fatal(format!("task driver {:?} for {:?} does not support CSI", req.task.driver, req.task.name)));
        }
        Ok(PrestartResponse::default())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use nomad_proto::volume::{VolumeMount, VolumeRequest};
    use nomad_proto::{Job, TaskGroup};

    use super::*;
    use crate::client::csi::MountInfo;
    use crate::client::taskrunner::lock;

    fn fixture(driver: &str, group_read_only: bool, mount_read_only: bool) -> (Allocation, Task) {
        let task = Task {
            name: "t".into(),
            driver: driver.into(),
            volume_mounts: vec![
                VolumeMount {
                    volume: "data".into(),
                    destination: "/srv/data".into(),
                    read_only: mount_read_only,
                    propagation_mode: "host-to-task".into(),
                },
                VolumeMount { volume: "cfg".into(), destination: "/etc/cfg".into(), ..VolumeMount::default() },
            ],
            ..Task::default()
        };
        let volumes = BTreeMap::from([
            ("data".to_string(), VolumeRequest { volume_type: "csi".into(), read_only: group_read_only, ..VolumeRequest::default() }),
            ("cfg".to_string(), VolumeRequest { volume_type: "host".into(), ..VolumeRequest::default() }),
        ]);
        let group = TaskGroup { name: "g".into(), tasks: vec![task.clone()], volumes, ..TaskGroup::default() };
        let job = Job { task_groups: vec![group], ..Job::default() };
        (Allocation { task_group: "g".into(), job: Some(Arc::new(job)), ..Allocation::default() }, task)
    }

    fn request<'a>(alloc: &'a Allocation, task: &'a Task, config: &'a crate::client::driver::TaskConfig) -> HookRequest<'a> {
        HookRequest { alloc, task, config, driver: None, secrets_tmpfs: false, previous: None }
    }

    #[test]
    fn csi_mounts_become_binds_read_only_when_either_side_says_so_with_their_propagation() {
        let mounts = CsiMounts::default();
        lock(&mounts).insert("data".into(), MountInfo::new("/state/csi/node/p/per-alloc/a/v/rw".into()));
        for (group_ro, mount_ro) in [(false, false), (true, false), (false, true)] {
            let (alloc, task) = fixture("exec", group_ro, mount_ro);
            let binds = volume_mounts(&alloc, &task, &mounts);
            assert_eq!(
                binds,
                [MountConfig {
                    host_path: "/state/csi/node/p/per-alloc/a/v/rw".into(),
                    task_path: "/srv/data".into(),
                    read_only: group_ro || mount_ro,
                    propagation: Propagation::HostToTask,
                }],
                "host volumes are not mounted here"
            );
        }
        let (alloc, task) = fixture("exec", false, false);
        let config = crate::client::taskrunner::hooks::tests_support::config();
        assert!(PrestartHook::prestart(&VolumesHook::new(mounts.clone()), &request(&alloc, &task, &config)).is_ok());
    }

    #[test]
    fn an_unmounted_volume_and_a_driver_without_mounts_are_refused_in_nomads_words() {
        let config = crate::client::taskrunner::hooks::tests_support::config();
        let (alloc, task) = fixture("exec", false, false);
        let err = PrestartHook::prestart(&VolumesHook::new(CsiMounts::default()), &request(&alloc, &task, &config)).unwrap_err();
        assert_eq!(err.message, "No CSI Mount Point found for volume: data");
        let mounts = CsiMounts::default();
        lock(&mounts).insert("data".into(), MountInfo::new("/x".into()));
        let (alloc, task) = fixture("raw_exec", false, false);
        let err = PrestartHook::prestart(&VolumesHook::new(mounts), &request(&alloc, &task, &config)).unwrap_err();
        assert_eq!(err.message, "task driver \"raw_exec\" for \"t\" does not support CSI");
        assert!(!err.recoverable);
    }
}
