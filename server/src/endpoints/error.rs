//! Endpoint errors, mapped to Nomad's HTTP codes and to gRPC statuses at the edges.

use nomad_proto::ValidationErrors;

use crate::consensus::ApplyError;

/// Why an endpoint refused or failed a request. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// Malformed or missing input (HTTP 400).
    #[error("{0}")]
    BadRequest(String),
    /// No such object (HTTP 404).
    #[error("{0}")]
    NotFound(String),
    /// Authentication failed (HTTP 403).
    #[error("{0}")]
    PermissionDenied(String),
    /// The object failed validation (HTTP 500, as Nomad does).
    #[error("{0}")]
    Invalid(String),
    /// No leader to write through (HTTP 500).
    #[error("No cluster leader")]
    NoLeader,
    /// Anything else (HTTP 500).
    #[error("{0}")]
    Internal(String),
    /// A Nomad feature nomad-rs does not have yet (HTTP 501): refused, never half done.
    #[error("{0}")]
    Unsupported(String),
}

impl From<ValidationErrors> for EndpointError {
    fn from(e: ValidationErrors) -> Self {
        EndpointError::Invalid(e.to_string())
    }
}

impl From<ApplyError> for EndpointError {
    fn from(e: ApplyError) -> Self {
        match e {
            ApplyError::NoLeader => EndpointError::NoLeader,
            ApplyError::Refused(m) => EndpointError::Invalid(m),
            ApplyError::Raft(m) => EndpointError::Internal(m),
        }
    }
}

impl From<EndpointError> for tonic::Status {
    fn from(e: EndpointError) -> Self {
        match e {
            EndpointError::BadRequest(m) => tonic::Status::invalid_argument(m),
            EndpointError::NotFound(m) => tonic::Status::not_found(m),
            EndpointError::PermissionDenied(m) => tonic::Status::permission_denied(m),
            EndpointError::Invalid(m) => tonic::Status::failed_precondition(m),
            EndpointError::NoLeader => tonic::Status::unavailable("No cluster leader"),
            EndpointError::Internal(m) => tonic::Status::internal(m),
            EndpointError::Unsupported(m) => tonic::Status::unimplemented(m),
        }
    }
}

impl From<tonic::Status> for EndpointError {
    fn from(s: tonic::Status) -> Self {
        let m = s.message().to_string();
        match s.code() {
            tonic::Code::InvalidArgument => EndpointError::BadRequest(m),
            tonic::Code::NotFound => EndpointError::NotFound(m),
            tonic::Code::PermissionDenied => EndpointError::PermissionDenied(m),
            tonic::Code::FailedPrecondition => EndpointError::Invalid(m),
            tonic::Code::Unimplemented => EndpointError::Unsupported(m),
            tonic::Code::Unavailable if m == "No cluster leader" => EndpointError::NoLeader,
            _ => EndpointError::Internal(m),
        }
    }
}
