//! `ServiceRegistration.*`: Nomad-native services, written by clients, read over HTTP.

use nomad_proto::rpc::{
    GenericResponse, ServiceRegistrationDeleteByIdRequest, ServiceRegistrationDeleteRequest, ServiceRegistrationUpsertRequest,
};

use super::{EndpointError, Endpoints};
use crate::fsm::Command;

impl Endpoints {
    /// A client registers services of its own allocs.
    pub async fn service_upsert(&self, req: ServiceRegistrationUpsertRequest) -> Result<GenericResponse, EndpointError> {
        if req.services.is_empty() {
            return Err(EndpointError::BadRequest("must specify at least one service registration".into()));
        }
        let snap = self.store.snapshot();
        let node = self.authenticate_node(&snap, &req.node_id, &req.secret_id)?;
        for s in &req.services {
            if s.id.is_empty() || s.service_name.is_empty() || s.alloc_id.is_empty() {
                return Err(EndpointError::BadRequest(format!(
                    "service registration {:?} needs an ID, a service name and an alloc ID",
                    s.id
                )));
            }
            if s.node_id != node.id {
                return Err(EndpointError::PermissionDenied(format!("service {} is not on node {}", s.id, node.id)));
            }
            let alloc = snap.alloc(&s.alloc_id).ok_or_else(|| EndpointError::NotFound(format!("alloc {} not found", s.alloc_id)))?;
            if alloc.node_id != node.id || alloc.namespace != s.namespace || alloc.job_id != s.job_id {
                return Err(EndpointError::PermissionDenied(format!("service {} does not match alloc {}", s.id, s.alloc_id)));
            }
        }
        let index = self.consensus.apply(Command::ServiceRegistrationUpsert { services: req.services }).await?;
        Ok(GenericResponse { index })
    }

    /// A client removes the services of its allocs.
    pub async fn service_delete_by_alloc(&self, req: ServiceRegistrationDeleteRequest) -> Result<GenericResponse, EndpointError> {
        let snap = self.store.snapshot();
        let node = self.authenticate_node(&snap, &req.node_id, &req.secret_id)?;
        if let Some(foreign) = req.alloc_ids.iter().filter_map(|id| snap.alloc(id)).find(|a| a.node_id != node.id) {
            return Err(EndpointError::PermissionDenied(format!("alloc {} is not on node {}", foreign.id, node.id)));
        }
        if !snap.service_registrations().any(|r| req.alloc_ids.contains(&r.alloc_id)) {
            return Ok(GenericResponse { index: snap.index });
        }
        let index = self.consensus.apply(Command::ServiceRegistrationDeleteByAlloc { alloc_ids: req.alloc_ids }).await?;
        Ok(GenericResponse { index })
    }

    /// A client removes one registration of its own (a task's service when the task stops).
    pub async fn service_delete_by_id(&self, req: ServiceRegistrationDeleteByIdRequest) -> Result<GenericResponse, EndpointError> {
        let snap = self.store.snapshot();
        let node = self.authenticate_node(&snap, &req.node_id, &req.secret_id)?;
        if req.id.is_empty() {
            return Err(EndpointError::BadRequest("missing service registration ID".into()));
        }
        let namespace = if req.namespace.is_empty() { "default" } else { req.namespace.as_str() };
        let reg = snap
            .service_registration(&req.id)
            .filter(|r| r.namespace == namespace)
            .ok_or_else(|| EndpointError::NotFound(format!("service registration {} not found", req.id)))?;
        if reg.node_id != node.id {
            return Err(EndpointError::PermissionDenied(format!("service registration {} is not on node {}", req.id, node.id)));
        }
        let index = self.consensus.apply(Command::ServiceRegistrationDeleteById { namespace: namespace.to_string(), id: req.id }).await?;
        Ok(GenericResponse { index })
    }
}
