//! `Namespace.*` endpoints: upsert and delete.

use nomad_proto::Namespace;

use super::{EndpointError, Endpoints};
use crate::fsm::Command;

impl Endpoints {
    /// Creates or updates a namespace. Names are 1-128 characters of letters, digits, `-` and `_`.
    pub async fn namespace_upsert(&self, ns: Namespace) -> Result<u64, EndpointError> {
        if ns.name.is_empty() || ns.name.len() > 128 || !ns.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(EndpointError::BadRequest(format!(
                "invalid name {:?}: must be 1-128 characters of letters, digits, '-' and '_'",
                ns.name
            )));
        }
        if ns.description.len() > 256 {
            return Err(EndpointError::BadRequest("description longer than 256".into()));
        }
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
