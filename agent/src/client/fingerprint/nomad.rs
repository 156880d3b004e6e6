//! The agent itself: `nomad.version` (the Nomad API version spoken), `nomad.revision`,
//! `nomad.advertise.address`, `nomad.service_discovery` (this client registers Nomad services:
//! Nomad's implied constraint on groups with `provider = "nomad"` services reads it).

use super::{Fingerprint, FingerprintContext, Fingerprinter};

pub(super) struct Nomad;

/// The build's revision: `NOMAD_RS_REVISION` at build time, else the crate version.
pub(super) fn revision() -> String {
    option_env!("NOMAD_RS_REVISION").map(str::to_string).unwrap_or_else(|| format!("nomad-rs-{}", env!("CARGO_PKG_VERSION")))
}

impl Fingerprinter for Nomad {
    fn name(&self) -> &'static str {
        "nomad"
    }

    fn fingerprint(&self, ctx: &FingerprintContext, out: &mut Fingerprint) -> Result<(), String> {
        out.attributes.insert("nomad.version".into(), nomad_server::http::API_VERSION.into());
        out.attributes.insert("nomad.revision".into(), revision());
        out.attributes.insert("nomad.service_discovery".into(), "true".into());
        if !ctx.http_addr.is_empty() {
            out.attributes.insert("nomad.advertise.address".into(), ctx.http_addr.clone());
        }
        Ok(())
    }
}
