//! Host: `unique.hostname`.

use super::{Fingerprint, FingerprintContext, Fingerprinter};

pub(super) struct Host;

impl Fingerprinter for Host {
    fn name(&self) -> &'static str {
        "host"
    }

    fn fingerprint(&self, _ctx: &FingerprintContext, out: &mut Fingerprint) -> Result<(), String> {
        out.attributes.insert("unique.hostname".into(), crate::config::hostname());
        Ok(())
    }
}
