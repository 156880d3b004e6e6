//! `Namespace.*` endpoints: upsert and delete.

use nomad_proto::Namespace;

use super::{EndpointError, Endpoints};
use crate::fsm::Command;

impl Endpoints {
    /// Creates or updates a namespace, validated as Nomad does (`Namespace.Validate`).
    pub async fn namespace_upsert(&self, ns: Namespace) -> Result<u64, EndpointError> {
        nomad_proto::limits::check_meta(|| format!("namespace {:?}", ns.name), "meta", &ns.meta, nomad_proto::limits::MAX_META_ENTRIES)
            .map_err(|e| EndpointError::BadRequest(e.to_string()))?;
        ns.validate().map_err(|e| EndpointError::BadRequest(format!("Invalid namespace {:?}: {}", ns.name, e.to_string().trim_end())))?;
        Ok(self.consensus.apply(Command::NamespaceUpsert { namespaces: vec![ns] }).await?)
    }

    /// Deletes a namespace that holds no jobs; `default` cannot be deleted.
    pub async fn namespace_delete(&self, name: &str) -> Result<u64, EndpointError> {
        let snap = self.store.snapshot();
        if name == nomad_proto::job::DEFAULT_NAMESPACE {
            return Err(EndpointError::BadRequest("default namespace can not be deleted".into()));
        }
        if snap.namespace(name).is_none() {
            return Err(EndpointError::NotFound(format!("namespace {name:?} not found")));
        }
        if snap.jobs().any(|j| j.namespace == name) {
            return Err(EndpointError::BadRequest(format!("namespace {name:?} has non-terminal jobs in regions: [global]")));
        }
        Ok(self.consensus.apply(Command::NamespaceDelete { names: vec![name.to_string()] }).await?)
    }
}
