//! The three CSI services of csi-hostpath. Each RPC is a synchronous function of [`Plugin`] (run
//! on tokio's blocking pool: it takes file locks and mounts), behind the injected faults.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::mount::MsFlags;
use nomad_csi::v1;
use nomad_csi::v1::volume_capability::{AccessType, access_mode::Mode};
use tonic::{Request, Response, Status};

use crate::faults::Faults;
use crate::mounts;
use crate::state::{MAX_VOLUMES, Publication, StateDir, Volume};

/// CSI's size limit for strings (names and IDs here; paths may be longer).
const MAX_STRING: usize = 128;
/// CSI's size limit for a map, keys and values together.
const MAX_MAP_BYTES: usize = 4096;
/// The longest path the kernel takes.
const MAX_PATH: usize = 4096;

/// What the flags say.
#[derive(Debug, Clone)]
pub struct Config {
    /// GetPluginInfo's name.
    pub driver_name: String,
    /// NodeGetInfo's node ID.
    pub node_id: String,
    /// NodeGetInfo's limit, also enforced by ControllerPublishVolume per node; 0 is none.
    pub max_volumes_per_node: i64,
    /// The largest capacity CreateVolume accepts.
    pub max_volume_size: i64,
    /// Serve the Controller service.
    pub controller: bool,
    /// Advertise STAGE_UNSTAGE_VOLUME and stage before publishing.
    pub staging: bool,
}

/// The plugin: its configuration, state dir and faults.
pub struct Plugin {
    config: Config,
    state: StateDir,
    faults: Faults,
}

impl Plugin {
    /// A plugin over an opened state dir.
    pub fn new(config: Config, state: StateDir, faults: Faults) -> Plugin {
        Plugin { config, state, faults }
    }
}

fn internal(what: &str, e: impl std::fmt::Display) -> Status {
    Status::internal(format!("{what}: {e}"))
}

fn required(field: &str, present: bool) -> Result<(), Status> {
    if present { Ok(()) } else { Err(Status::invalid_argument(format!("{field} is required"))) }
}

fn check_string(field: &str, value: &str) -> Result<(), Status> {
    required(field, !value.is_empty())?;
    if value.len() > MAX_STRING {
        return Err(Status::invalid_argument(format!("{field} is {} bytes, more than CSI's {MAX_STRING}", value.len())));
    }
    Ok(())
}

fn check_map(field: &str, map: &HashMap<String, String>) -> Result<(), Status> {
    let bytes: usize = map.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_MAP_BYTES {
        return Err(Status::invalid_argument(format!("{field} is {bytes} bytes, more than CSI's {MAX_MAP_BYTES}")));
    }
    Ok(())
}

/// A path from a request: absolute, no NUL, at most PATH_MAX.
fn check_path(field: &str, value: &str) -> Result<PathBuf, Status> {
    required(field, !value.is_empty())?;
    if value.len() > MAX_PATH || value.contains('\0') || !value.starts_with('/') {
        return Err(Status::invalid_argument(format!("{field} {value:?} is not an absolute path")));
    }
    Ok(PathBuf::from(value))
}

/// Whether `id` can name a volume of this plugin: a single path component, so that joining it
/// to the state dir never leaves `volumes/`.
fn is_volume_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_STRING
        && id != "."
        && id != ".."
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// How a volume capability asks the volume to be mounted.
struct Usage {
    /// A reader-only access mode.
    reader_only: bool,
    /// The capability's mount flags.
    flags: MsFlags,
}

fn usage(capability: Option<&v1::VolumeCapability>) -> Result<Usage, Status> {
    let capability = capability.ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
    let mode = capability.access_mode.as_ref().map_or(Mode::Unknown, |m| m.mode());
    if mode == Mode::Unknown {
        return Err(Status::invalid_argument("volume_capability.access_mode is required"));
    }
    let mount = match &capability.access_type {
        Some(AccessType::Mount(mount)) => mount,
        Some(AccessType::Block(_)) => {
            return Err(Status::invalid_argument("block volumes are not supported: hostpath volumes are directories (use file-system)"));
        }
        None => return Err(Status::invalid_argument("volume_capability.access_type is required (mount or block)")),
    };
    if !mount.volume_mount_group.is_empty() {
        return Err(Status::invalid_argument("volume_mount_group is not supported (no VOLUME_MOUNT_GROUP capability)"));
    }
    // fs_type is not checked: bind mounts of a directory have no file system type of their own.
    let mut flags = MsFlags::empty();
    for name in &mount.mount_flags {
        flags |=
            mounts::flag(name).ok_or_else(|| Status::invalid_argument(format!("mount flag {name:?} is not supported by bind mounts")))?;
    }
    Ok(Usage { reader_only: matches!(mode, Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly), flags })
}

fn is_multi_node(capability: Option<&v1::VolumeCapability>) -> bool {
    let mode = capability.and_then(|c| c.access_mode.as_ref()).map_or(Mode::Unknown, |m| m.mode());
    matches!(mode, Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter)
}

/// The capacity a range asks for: required, else the limit, else unknown (0).
fn capacity_of(range: Option<&v1::CapacityRange>, max: i64) -> Result<(i64, i64, i64), Status> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    if required < 0 || limit < 0 {
        return Err(Status::invalid_argument("capacity_range bytes cannot be negative"));
    }
    if limit != 0 && limit < required {
        return Err(Status::invalid_argument(format!("capacity_range limit_bytes {limit} is less than required_bytes {required}")));
    }
    let capacity = if required > 0 { required } else { limit };
    if capacity > max {
        return Err(Status::out_of_range(format!("capacity {capacity} is more than the largest volume, {max} bytes (--max-volume-size)")));
    }
    Ok((capacity, required, limit))
}

impl Plugin {
    /// The volume directory for a node call: NOT_FOUND unless it exists.
    fn existing_volume_dir(&self, id: &str) -> Result<PathBuf, Status> {
        check_string("volume_id", id)?;
        let dir = if is_volume_id(id) { Some(self.state.volume_dir(id)) } else { None };
        match dir {
            Some(dir) if dir.is_dir() => Ok(dir),
            _ => Err(Status::not_found(format!("volume {id:?} does not exist"))),
        }
    }

    // ---- Identity ------------------------------------------------------------------------

    fn get_plugin_info(&self, _: v1::GetPluginInfoRequest) -> Result<v1::GetPluginInfoResponse, Status> {
        Ok(v1::GetPluginInfoResponse {
            name: self.config.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: HashMap::new(),
        })
    }

    fn get_plugin_capabilities(&self, _: v1::GetPluginCapabilitiesRequest) -> Result<v1::GetPluginCapabilitiesResponse, Status> {
        use v1::plugin_capability::{Service, Type, VolumeExpansion, service, volume_expansion};
        let mut capabilities = vec![v1::PluginCapability {
            r#type: Some(Type::VolumeExpansion(VolumeExpansion { r#type: volume_expansion::Type::Online as i32 })),
        }];
        if self.config.controller {
            capabilities
                .push(v1::PluginCapability { r#type: Some(Type::Service(Service { r#type: service::Type::ControllerService as i32 })) });
        }
        Ok(v1::GetPluginCapabilitiesResponse { capabilities })
    }

    fn probe(&self, _: v1::ProbeRequest) -> Result<v1::ProbeResponse, Status> {
        // Ready once the state dir can be read.
        self.state.snapshot().map_err(|e| Status::failed_precondition(format!("state dir: {e}")))?;
        Ok(v1::ProbeResponse { ready: Some(true) })
    }

    // ---- Controller ----------------------------------------------------------------------

    fn create_volume(&self, req: v1::CreateVolumeRequest) -> Result<v1::CreateVolumeResponse, Status> {
        check_string("name", &req.name)?;
        required("volume_capabilities", !req.volume_capabilities.is_empty())?;
        for capability in &req.volume_capabilities {
            usage(Some(capability))?;
        }
        check_map("parameters", &req.parameters)?;
        check_map("secrets", &req.secrets)?;
        if req.volume_content_source.is_some() {
            return Err(Status::invalid_argument("volume_content_source is not supported (no snapshots or clones)"));
        }
        if req.accessibility_requirements.as_ref().is_some_and(|t| !t.requisite.is_empty() || !t.preferred.is_empty()) {
            return Err(Status::invalid_argument("accessibility_requirements are not supported (no VOLUME_ACCESSIBILITY_CONSTRAINTS)"));
        }
        let (capacity, required, limit) = capacity_of(req.capacity_range.as_ref(), self.config.max_volume_size)?;
        let parameters: BTreeMap<String, String> = req.parameters.into_iter().collect();
        let volume = self.state.update(|state| {
            if let Some(existing) = state.volumes.values().find(|v| v.name == req.name) {
                let fits = existing.capacity_bytes >= required && (limit == 0 || existing.capacity_bytes <= limit);
                if !fits {
                    return Err(Status::already_exists(format!(
                        "volume {:?} exists with capacity {} bytes, outside the range asked for",
                        req.name, existing.capacity_bytes
                    )));
                }
                if existing.parameters != parameters {
                    return Err(Status::already_exists(format!("volume {:?} exists with other parameters", req.name)));
                }
                return Ok(existing.clone());
            }
            if state.volumes.len() >= MAX_VOLUMES {
                return Err(Status::resource_exhausted(format!("the state dir holds {MAX_VOLUMES} volumes, the most it may")));
            }
            let id = uuid::Uuid::new_v4().to_string();
            std::fs::create_dir(self.state.volume_dir(&id)).map_err(|e| internal("creating the volume directory", e))?;
            let volume = Volume { id: id.clone(), name: req.name.clone(), capacity_bytes: capacity, parameters: parameters.clone() };
            state.volumes.insert(id, volume.clone());
            Ok(volume)
        })?;
        Ok(v1::CreateVolumeResponse { volume: Some(to_csi_volume(&volume)) })
    }

    fn delete_volume(&self, req: v1::DeleteVolumeRequest) -> Result<v1::DeleteVolumeResponse, Status> {
        check_string("volume_id", &req.volume_id)?;
        let id = req.volume_id;
        if !is_volume_id(&id) {
            // No such volume can exist: deleted already, as far as anyone can tell.
            return Ok(v1::DeleteVolumeResponse {});
        }
        self.state.update(|state| {
            if let Some(p) = state.published.iter().find(|p| p.volume_id == id) {
                return Err(Status::failed_precondition(format!("volume {id:?} is published to node {:?}", p.node_id)));
            }
            let mounted = mounts::mounts_of(&id).map_err(|e| internal("reading the mount table", e))?;
            if let Some(m) = mounted.first() {
                return Err(Status::failed_precondition(format!("volume {id:?} is mounted at {}", m.mount_point.display())));
            }
            match std::fs::remove_dir_all(self.state.volume_dir(&id)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(internal("removing the volume directory", e)),
            }
            state.volumes.remove(&id);
            Ok(())
        })?;
        Ok(v1::DeleteVolumeResponse {})
    }

    fn controller_publish_volume(&self, req: v1::ControllerPublishVolumeRequest) -> Result<v1::ControllerPublishVolumeResponse, Status> {
        check_string("volume_id", &req.volume_id)?;
        check_string("node_id", &req.node_id)?;
        usage(req.volume_capability.as_ref())?;
        let multi_node = is_multi_node(req.volume_capability.as_ref());
        let max = self.config.max_volumes_per_node;
        self.state.update(|state| {
            if !state.volumes.contains_key(&req.volume_id) {
                return Err(Status::not_found(format!("volume {:?} does not exist", req.volume_id)));
            }
            // Any node ID is accepted: the volumes are directories every node plugin sharing
            // this state dir can reach.
            let mine = |p: &&Publication| p.volume_id == req.volume_id;
            if let Some(p) = state.published.iter().filter(mine).find(|p| p.node_id == req.node_id) {
                if p.readonly != req.readonly {
                    return Err(Status::already_exists(format!(
                        "volume {:?} is published to node {:?} with readonly={}",
                        req.volume_id, req.node_id, p.readonly
                    )));
                }
                return Ok(());
            }
            if let Some(p) = state.published.iter().filter(mine).find(|_| !multi_node) {
                return Err(Status::failed_precondition(format!(
                    "volume {:?} is published to node {:?} and its access mode allows one node",
                    req.volume_id, p.node_id
                )));
            }
            let on_node = state.published.iter().filter(|p| p.node_id == req.node_id).count();
            if max > 0 && on_node as i64 >= max {
                return Err(Status::resource_exhausted(format!(
                    "node {:?} has {on_node} volumes published, the most it takes",
                    req.node_id
                )));
            }
            state.published.push(Publication { volume_id: req.volume_id.clone(), node_id: req.node_id.clone(), readonly: req.readonly });
            Ok(())
        })?;
        Ok(v1::ControllerPublishVolumeResponse { publish_context: HashMap::new() })
    }

    fn controller_unpublish_volume(
        &self,
        req: v1::ControllerUnpublishVolumeRequest,
    ) -> Result<v1::ControllerUnpublishVolumeResponse, Status> {
        check_string("volume_id", &req.volume_id)?;
        // A volume or node that does not exist is unpublished already.
        self.state.update(|state| {
            state.published.retain(|p| p.volume_id != req.volume_id || (!req.node_id.is_empty() && p.node_id != req.node_id));
            Ok::<_, Status>(())
        })?;
        Ok(v1::ControllerUnpublishVolumeResponse {})
    }

    fn validate_volume_capabilities(
        &self,
        req: v1::ValidateVolumeCapabilitiesRequest,
    ) -> Result<v1::ValidateVolumeCapabilitiesResponse, Status> {
        check_string("volume_id", &req.volume_id)?;
        required("volume_capabilities", !req.volume_capabilities.is_empty())?;
        let state = self.state.snapshot().map_err(|e| internal("reading the state", e))?;
        if !state.volumes.contains_key(&req.volume_id) {
            return Err(Status::not_found(format!("volume {:?} does not exist", req.volume_id)));
        }
        if let Some(unsupported) = req.volume_capabilities.iter().find_map(|c| usage(Some(c)).err()) {
            return Ok(v1::ValidateVolumeCapabilitiesResponse { confirmed: None, message: unsupported.message().to_string() });
        }
        Ok(v1::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(v1::validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: req.volume_capabilities,
                parameters: req.parameters,
            }),
            message: String::new(),
        })
    }

    fn list_volumes(&self, req: v1::ListVolumesRequest) -> Result<v1::ListVolumesResponse, Status> {
        if req.max_entries < 0 {
            return Err(Status::invalid_argument("max_entries cannot be negative"));
        }
        let state = self.state.snapshot().map_err(|e| internal("reading the state", e))?;
        let start =
            match req.starting_token.as_str() {
                "" => 0,
                token => token.parse::<usize>().ok().filter(|start| *start <= state.volumes.len()).ok_or_else(|| {
                    Status::aborted(format!("starting_token {token:?} is not one this plugin gave (or the volumes changed)"))
                })?,
            };
        let take = if req.max_entries == 0 { usize::MAX } else { req.max_entries as usize };
        let entries: Vec<_> = state
            .volumes
            .values()
            .skip(start)
            .take(take)
            .map(|volume| v1::list_volumes_response::Entry {
                volume: Some(to_csi_volume(volume)),
                status: Some(v1::list_volumes_response::VolumeStatus {
                    published_node_ids: state.published.iter().filter(|p| p.volume_id == volume.id).map(|p| p.node_id.clone()).collect(),
                    volume_condition: None,
                }),
            })
            .collect();
        let end = start + entries.len();
        let next_token = if end < state.volumes.len() { end.to_string() } else { String::new() };
        Ok(v1::ListVolumesResponse { entries, next_token })
    }

    fn get_capacity(&self, req: v1::GetCapacityRequest) -> Result<v1::GetCapacityResponse, Status> {
        for capability in &req.volume_capabilities {
            usage(Some(capability))?;
        }
        let stats = nix::sys::statvfs::statvfs(&self.state.volumes_root()).map_err(|e| internal("statfs of the state dir", e))?;
        let available = (stats.blocks_available() as u128 * stats.fragment_size() as u128).min(i64::MAX as u128) as i64;
        Ok(v1::GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(self.config.max_volume_size),
            minimum_volume_size: None,
        })
    }

    fn controller_get_capabilities(
        &self,
        _: v1::ControllerGetCapabilitiesRequest,
    ) -> Result<v1::ControllerGetCapabilitiesResponse, Status> {
        use v1::controller_service_capability::{Rpc, Type, rpc::Type as R};
        let rpcs = [
            R::CreateDeleteVolume,
            R::PublishUnpublishVolume,
            R::ListVolumes,
            R::GetCapacity,
            R::PublishReadonly,
            R::ExpandVolume,
            R::ListVolumesPublishedNodes,
        ];
        let capabilities =
            rpcs.into_iter().map(|r| v1::ControllerServiceCapability { r#type: Some(Type::Rpc(Rpc { r#type: r as i32 })) }).collect();
        Ok(v1::ControllerGetCapabilitiesResponse { capabilities })
    }

    fn controller_expand_volume(&self, req: v1::ControllerExpandVolumeRequest) -> Result<v1::ControllerExpandVolumeResponse, Status> {
        check_string("volume_id", &req.volume_id)?;
        required("capacity_range", req.capacity_range.is_some())?;
        if req.volume_capability.is_some() {
            usage(req.volume_capability.as_ref())?;
        }
        let (capacity, _, _) = capacity_of(req.capacity_range.as_ref(), self.config.max_volume_size)?;
        let capacity_bytes = self.state.update(|state| {
            let volume = state
                .volumes
                .get_mut(&req.volume_id)
                .ok_or_else(|| Status::not_found(format!("volume {:?} does not exist", req.volume_id)))?;
            // Volumes never shrink.
            volume.capacity_bytes = volume.capacity_bytes.max(capacity);
            Ok::<_, Status>(volume.capacity_bytes)
        })?;
        Ok(v1::ControllerExpandVolumeResponse { capacity_bytes, node_expansion_required: false })
    }

    // ---- Node ----------------------------------------------------------------------------

    fn node_stage_volume(&self, req: v1::NodeStageVolumeRequest) -> Result<v1::NodeStageVolumeResponse, Status> {
        if !self.config.staging {
            return Err(Status::unimplemented("NodeStageVolume: this plugin does not stage volumes (--no-staging)"));
        }
        let volume_dir = self.existing_volume_dir(&req.volume_id)?;
        let staging = check_path("staging_target_path", &req.staging_target_path)?;
        let usage = usage(req.volume_capability.as_ref())?;
        check_map("publish_context", &req.publish_context)?;
        let read_only = usage.reader_only;
        if let Some(mounted) = mounts::mounted_at(&staging).map_err(|e| internal("reading the mount table", e))? {
            return if mounted.root.ends_with(&format!("/{}", req.volume_id)) && mounted.read_only == read_only {
                Ok(v1::NodeStageVolumeResponse {})
            } else {
                Err(Status::already_exists(format!(
                    "{} already holds another mount (or this volume with another access mode)",
                    staging.display()
                )))
            };
        }
        std::fs::create_dir_all(&staging).map_err(|e| internal(&format!("creating {}", staging.display()), e))?;
        let flags = usage.flags | if read_only { MsFlags::MS_RDONLY } else { MsFlags::empty() };
        mounts::bind(&volume_dir, &staging, flags)
            .map_err(|e| internal(&format!("bind-mounting the volume at {}", staging.display()), e))?;
        Ok(v1::NodeStageVolumeResponse {})
    }

    fn node_unstage_volume(&self, req: v1::NodeUnstageVolumeRequest) -> Result<v1::NodeUnstageVolumeResponse, Status> {
        if !self.config.staging {
            return Err(Status::unimplemented("NodeUnstageVolume: this plugin does not stage volumes (--no-staging)"));
        }
        self.existing_volume_dir(&req.volume_id)?;
        let staging = check_path("staging_target_path", &req.staging_target_path)?;
        unmount_and_remove(&staging)?;
        Ok(v1::NodeUnstageVolumeResponse {})
    }

    fn node_publish_volume(&self, req: v1::NodePublishVolumeRequest) -> Result<v1::NodePublishVolumeResponse, Status> {
        let volume_dir = self.existing_volume_dir(&req.volume_id)?;
        let target = check_path("target_path", &req.target_path)?;
        let usage = usage(req.volume_capability.as_ref())?;
        check_map("publish_context", &req.publish_context)?;
        let source = if self.config.staging {
            if req.staging_target_path.is_empty() {
                return Err(Status::failed_precondition(
                    "staging_target_path is required: this plugin stages volumes (NodeStageVolume first)",
                ));
            }
            let staging = check_path("staging_target_path", &req.staging_target_path)?;
            let staged = mounts::mounted_at(&staging).map_err(|e| internal("reading the mount table", e))?;
            if !staged.is_some_and(|m| m.root.ends_with(&format!("/{}", req.volume_id))) {
                return Err(Status::failed_precondition(format!("volume {:?} is not staged at {}", req.volume_id, staging.display())));
            }
            staging
        } else {
            if !req.staging_target_path.is_empty() {
                return Err(Status::invalid_argument("staging_target_path given, but this plugin does not stage volumes (--no-staging)"));
            }
            volume_dir
        };
        let read_only = req.readonly || usage.reader_only || usage.flags.contains(MsFlags::MS_RDONLY);
        if let Some(mounted) = mounts::mounted_at(&target).map_err(|e| internal("reading the mount table", e))? {
            return if mounted.root.ends_with(&format!("/{}", req.volume_id)) && mounted.read_only == read_only {
                Ok(v1::NodePublishVolumeResponse {})
            } else {
                Err(Status::already_exists(format!(
                    "{} is already published with readonly={} (or holds another mount)",
                    target.display(),
                    mounted.read_only
                )))
            };
        }
        std::fs::create_dir_all(&target).map_err(|e| internal(&format!("creating {}", target.display()), e))?;
        let flags = usage.flags | if read_only { MsFlags::MS_RDONLY } else { MsFlags::empty() };
        mounts::bind(&source, &target, flags).map_err(|e| internal(&format!("bind-mounting the volume at {}", target.display()), e))?;
        Ok(v1::NodePublishVolumeResponse {})
    }

    fn node_unpublish_volume(&self, req: v1::NodeUnpublishVolumeRequest) -> Result<v1::NodeUnpublishVolumeResponse, Status> {
        self.existing_volume_dir(&req.volume_id)?;
        let target = check_path("target_path", &req.target_path)?;
        unmount_and_remove(&target)?;
        Ok(v1::NodeUnpublishVolumeResponse {})
    }

    fn node_get_volume_stats(&self, req: v1::NodeGetVolumeStatsRequest) -> Result<v1::NodeGetVolumeStatsResponse, Status> {
        use v1::volume_usage::Unit;
        self.existing_volume_dir(&req.volume_id)?;
        let path = check_path("volume_path", &req.volume_path)?;
        if !path.exists() {
            return Err(Status::not_found(format!("volume path {} does not exist", path.display())));
        }
        let s = nix::sys::statvfs::statvfs(&path).map_err(|e| internal(&format!("statfs of {}", path.display()), e))?;
        let bytes = |blocks: u64| (blocks as u128 * s.fragment_size() as u128).min(i64::MAX as u128) as i64;
        let count = |n: u64| n.min(i64::MAX as u64) as i64;
        Ok(v1::NodeGetVolumeStatsResponse {
            usage: vec![
                v1::VolumeUsage {
                    available: bytes(s.blocks_available() as u64),
                    total: bytes(s.blocks() as u64),
                    used: bytes(s.blocks().saturating_sub(s.blocks_free()) as u64),
                    unit: Unit::Bytes as i32,
                },
                v1::VolumeUsage {
                    available: count(s.files_available() as u64),
                    total: count(s.files() as u64),
                    used: count(s.files().saturating_sub(s.files_free()) as u64),
                    unit: Unit::Inodes as i32,
                },
            ],
            volume_condition: None,
        })
    }

    fn node_expand_volume(&self, req: v1::NodeExpandVolumeRequest) -> Result<v1::NodeExpandVolumeResponse, Status> {
        self.existing_volume_dir(&req.volume_id)?;
        check_path("volume_path", &req.volume_path)?;
        let (capacity_bytes, _, _) = capacity_of(req.capacity_range.as_ref(), self.config.max_volume_size)?;
        // A directory grows with its file system: nothing to do on the node.
        Ok(v1::NodeExpandVolumeResponse { capacity_bytes })
    }

    fn node_get_capabilities(&self, _: v1::NodeGetCapabilitiesRequest) -> Result<v1::NodeGetCapabilitiesResponse, Status> {
        use v1::node_service_capability::{Rpc, Type, rpc::Type as R};
        let mut rpcs = vec![R::GetVolumeStats, R::ExpandVolume];
        if self.config.staging {
            rpcs.insert(0, R::StageUnstageVolume);
        }
        let capabilities =
            rpcs.into_iter().map(|r| v1::NodeServiceCapability { r#type: Some(Type::Rpc(Rpc { r#type: r as i32 })) }).collect();
        Ok(v1::NodeGetCapabilitiesResponse { capabilities })
    }

    fn node_get_info(&self, _: v1::NodeGetInfoRequest) -> Result<v1::NodeGetInfoResponse, Status> {
        Ok(v1::NodeGetInfoResponse {
            node_id: self.config.node_id.clone(),
            max_volumes_per_node: self.config.max_volumes_per_node,
            accessible_topology: None,
        })
    }
}

fn to_csi_volume(volume: &Volume) -> v1::Volume {
    v1::Volume {
        capacity_bytes: volume.capacity_bytes,
        volume_id: volume.id.clone(),
        volume_context: volume.parameters.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        content_source: None,
        accessible_topology: Vec::new(),
    }
}

/// Unmounts `path` and removes the directory; a path that is not there is done already.
fn unmount_and_remove(path: &Path) -> Result<(), Status> {
    mounts::unmount_all(path).map_err(|e| internal(&format!("unmounting {}", path.display()), e))?;
    match std::fs::remove_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(internal(&format!("removing {} after unmounting it", path.display()), e)),
    }
}

/// The gRPC face of the plugin: one handle serves all three services.
#[derive(Clone)]
pub struct Service(pub Arc<Plugin>);

impl Service {
    /// Injected faults first, then the RPC on the blocking pool; every failure is logged.
    async fn run<Req, Resp>(
        &self,
        method: &'static str,
        request: Request<Req>,
        rpc: fn(&Plugin, Req) -> Result<Resp, Status>,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Send + 'static,
        Resp: Send + 'static,
    {
        let result = match self.0.faults.enter(method).await {
            Ok(()) => {
                let plugin = self.0.clone();
                let message = request.into_inner();
                tokio::task::spawn_blocking(move || rpc(&plugin, message)).await.unwrap_or_else(|e| Err(internal(method, e)))
            }
            Err(injected) => Err(injected),
        };
        match &result {
            Ok(_) => tracing::info!(method, "ok"),
            Err(status) => tracing::warn!(method, code = ?status.code(), message = status.message(), "failed"),
        }
        result.map(Response::new)
    }
}

fn unimplemented<T>(method: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!("{method} is not implemented by csi-hostpath")))
}

#[tonic::async_trait]
impl v1::identity_server::Identity for Service {
    async fn get_plugin_info(&self, r: Request<v1::GetPluginInfoRequest>) -> Result<Response<v1::GetPluginInfoResponse>, Status> {
        self.run("GetPluginInfo", r, Plugin::get_plugin_info).await
    }
    async fn get_plugin_capabilities(
        &self,
        r: Request<v1::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<v1::GetPluginCapabilitiesResponse>, Status> {
        self.run("GetPluginCapabilities", r, Plugin::get_plugin_capabilities).await
    }
    async fn probe(&self, r: Request<v1::ProbeRequest>) -> Result<Response<v1::ProbeResponse>, Status> {
        self.run("Probe", r, Plugin::probe).await
    }
}

#[tonic::async_trait]
impl v1::controller_server::Controller for Service {
    async fn create_volume(&self, r: Request<v1::CreateVolumeRequest>) -> Result<Response<v1::CreateVolumeResponse>, Status> {
        self.run("CreateVolume", r, Plugin::create_volume).await
    }
    async fn delete_volume(&self, r: Request<v1::DeleteVolumeRequest>) -> Result<Response<v1::DeleteVolumeResponse>, Status> {
        self.run("DeleteVolume", r, Plugin::delete_volume).await
    }
    async fn controller_publish_volume(
        &self,
        r: Request<v1::ControllerPublishVolumeRequest>,
    ) -> Result<Response<v1::ControllerPublishVolumeResponse>, Status> {
        self.run("ControllerPublishVolume", r, Plugin::controller_publish_volume).await
    }
    async fn controller_unpublish_volume(
        &self,
        r: Request<v1::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<v1::ControllerUnpublishVolumeResponse>, Status> {
        self.run("ControllerUnpublishVolume", r, Plugin::controller_unpublish_volume).await
    }
    async fn validate_volume_capabilities(
        &self,
        r: Request<v1::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<v1::ValidateVolumeCapabilitiesResponse>, Status> {
        self.run("ValidateVolumeCapabilities", r, Plugin::validate_volume_capabilities).await
    }
    async fn list_volumes(&self, r: Request<v1::ListVolumesRequest>) -> Result<Response<v1::ListVolumesResponse>, Status> {
        self.run("ListVolumes", r, Plugin::list_volumes).await
    }
    async fn get_capacity(&self, r: Request<v1::GetCapacityRequest>) -> Result<Response<v1::GetCapacityResponse>, Status> {
        self.run("GetCapacity", r, Plugin::get_capacity).await
    }
    async fn controller_get_capabilities(
        &self,
        r: Request<v1::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<v1::ControllerGetCapabilitiesResponse>, Status> {
        self.run("ControllerGetCapabilities", r, Plugin::controller_get_capabilities).await
    }
    async fn create_snapshot(&self, _: Request<v1::CreateSnapshotRequest>) -> Result<Response<v1::CreateSnapshotResponse>, Status> {
        unimplemented("CreateSnapshot")
    }
    async fn delete_snapshot(&self, _: Request<v1::DeleteSnapshotRequest>) -> Result<Response<v1::DeleteSnapshotResponse>, Status> {
        unimplemented("DeleteSnapshot")
    }
    async fn list_snapshots(&self, _: Request<v1::ListSnapshotsRequest>) -> Result<Response<v1::ListSnapshotsResponse>, Status> {
        unimplemented("ListSnapshots")
    }
    async fn controller_expand_volume(
        &self,
        r: Request<v1::ControllerExpandVolumeRequest>,
    ) -> Result<Response<v1::ControllerExpandVolumeResponse>, Status> {
        self.run("ControllerExpandVolume", r, Plugin::controller_expand_volume).await
    }
    async fn controller_get_volume(
        &self,
        _: Request<v1::ControllerGetVolumeRequest>,
    ) -> Result<Response<v1::ControllerGetVolumeResponse>, Status> {
        unimplemented("ControllerGetVolume")
    }
}

#[tonic::async_trait]
impl v1::node_server::Node for Service {
    async fn node_stage_volume(&self, r: Request<v1::NodeStageVolumeRequest>) -> Result<Response<v1::NodeStageVolumeResponse>, Status> {
        self.run("NodeStageVolume", r, Plugin::node_stage_volume).await
    }
    async fn node_unstage_volume(
        &self,
        r: Request<v1::NodeUnstageVolumeRequest>,
    ) -> Result<Response<v1::NodeUnstageVolumeResponse>, Status> {
        self.run("NodeUnstageVolume", r, Plugin::node_unstage_volume).await
    }
    async fn node_publish_volume(
        &self,
        r: Request<v1::NodePublishVolumeRequest>,
    ) -> Result<Response<v1::NodePublishVolumeResponse>, Status> {
        self.run("NodePublishVolume", r, Plugin::node_publish_volume).await
    }
    async fn node_unpublish_volume(
        &self,
        r: Request<v1::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<v1::NodeUnpublishVolumeResponse>, Status> {
        self.run("NodeUnpublishVolume", r, Plugin::node_unpublish_volume).await
    }
    async fn node_get_volume_stats(
        &self,
        r: Request<v1::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<v1::NodeGetVolumeStatsResponse>, Status> {
        self.run("NodeGetVolumeStats", r, Plugin::node_get_volume_stats).await
    }
    async fn node_expand_volume(&self, r: Request<v1::NodeExpandVolumeRequest>) -> Result<Response<v1::NodeExpandVolumeResponse>, Status> {
        self.run("NodeExpandVolume", r, Plugin::node_expand_volume).await
    }
    async fn node_get_capabilities(
        &self,
        r: Request<v1::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<v1::NodeGetCapabilitiesResponse>, Status> {
        self.run("NodeGetCapabilities", r, Plugin::node_get_capabilities).await
    }
    async fn node_get_info(&self, r: Request<v1::NodeGetInfoRequest>) -> Result<Response<v1::NodeGetInfoResponse>, Status> {
        self.run("NodeGetInfo", r, Plugin::node_get_info).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_ids_stay_inside_the_state_dir() {
        assert!(is_volume_id("0b7c2f0e-2a39-4c1e-9d0f-6f4c2b1e8a11"));
        assert!(is_volume_id("my_vol.1"));
        for bad in ["", ".", "..", "../x", "a/b", "a\0b", &"x".repeat(MAX_STRING + 1)] {
            assert!(!is_volume_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn capacity_ranges() {
        let range = |required_bytes, limit_bytes| Some(v1::CapacityRange { required_bytes, limit_bytes });
        assert_eq!(capacity_of(None, 100).unwrap(), (0, 0, 0));
        assert_eq!(capacity_of(range(10, 0).as_ref(), 100).unwrap(), (10, 10, 0));
        assert_eq!(capacity_of(range(0, 50).as_ref(), 100).unwrap(), (50, 0, 50));
        assert_eq!(capacity_of(range(101, 0).as_ref(), 100).unwrap_err().code(), tonic::Code::OutOfRange);
        assert_eq!(capacity_of(range(20, 10).as_ref(), 100).unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(capacity_of(range(-1, 0).as_ref(), 100).unwrap_err().code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn capabilities_are_checked() {
        use v1::volume_capability::{AccessMode, BlockVolume, MountVolume};
        let cap = |access_type, mode: Mode| v1::VolumeCapability { access_type, access_mode: Some(AccessMode { mode: mode as i32 }) };
        let mount = |flags: &[&str]| {
            Some(AccessType::Mount(MountVolume {
                fs_type: "ext4".into(),
                mount_flags: flags.iter().map(|f| f.to_string()).collect(),
                volume_mount_group: String::new(),
            }))
        };
        let ok = usage(Some(&cap(mount(&["noexec"]), Mode::MultiNodeReaderOnly))).unwrap();
        assert!(ok.reader_only && ok.flags == MsFlags::MS_NOEXEC);
        assert!(!usage(Some(&cap(mount(&[]), Mode::SingleNodeWriter))).unwrap().reader_only);
        let err = |c: Option<&v1::VolumeCapability>| usage(c).err().map(|s| s.message().to_string()).unwrap_or_default();
        assert_eq!(err(None), "volume_capability is required");
        assert!(err(Some(&cap(mount(&[]), Mode::Unknown))).contains("access_mode is required"));
        assert!(
            err(Some(&cap(Some(AccessType::Block(BlockVolume {})), Mode::SingleNodeWriter))).contains("block volumes are not supported")
        );
        assert!(err(Some(&cap(None, Mode::SingleNodeWriter))).contains("access_type is required"));
        assert!(err(Some(&cap(mount(&["discard"]), Mode::SingleNodeWriter))).contains("\"discard\" is not supported"));
    }
}
