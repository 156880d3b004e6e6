//! The stand-in's built-in Connect CA, shaped like Consul's `consul` provider (reference
//! connect-data-plane.md §4): one self-signed EC P-256 root per stand-in, trust domain
//! `<cluster-uuid>.consul`, and P-256 leaves whose only name is the service's SPIFFE URI.
//!
//! Leaves are cached per service (as the Consul agent's leaf cache does) so a proxy's xDS
//! resources keep their versions until the leaf is renewed at 60% of its lifetime.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType, SerialNumber,
};
use serde_json::{Value, json};
use sha1::{Digest, Sha1};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Consul's default root lifetime (`RootCertTTL` 87600h).
const ROOT_TTL: Duration = Duration::from_secs(87_600 * 3600);
/// Longest leaf lifetime a caller may ask for (Consul caps `LeafCertTTL` at one year).
const MAX_LEAF_TTL: Duration = Duration::from_secs(8_760 * 3600);

/// A signed leaf: what `/v1/agent/connect/ca/leaf/:service` returns and the sidecars present.
#[derive(Debug, Clone)]
pub struct Leaf {
    pub service: String,
    pub service_uri: String,
    /// Colon-separated hex, as Consul prints serials.
    pub serial: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub valid_after: OffsetDateTime,
    pub valid_before: OffsetDateTime,
    /// When the cache hands out a fresh one instead (60% of the lifetime).
    renew_at: OffsetDateTime,
}

impl Leaf {
    /// `api/agent.go` `LeafCert`.
    pub fn to_json(&self, index: u64) -> Value {
        json!({
            "SerialNumber": self.serial, "CertPEM": self.cert_pem, "PrivateKeyPEM": self.key_pem,
            "Service": self.service, "ServiceURI": self.service_uri, "Kind": "", "Agent": "", "AgentURI": "",
            "ValidAfter": rfc3339(self.valid_after), "ValidBefore": rfc3339(self.valid_before),
            "CreateIndex": index, "ModifyIndex": index,
        })
    }
}

/// The CA: its root, its signing key and the leaf cache.
pub struct ConnectCa {
    pub cluster_id: String,
    pub trust_domain: String,
    pub datacenter: String,
    pub root_pem: String,
    /// SHA-1 fingerprint of the root's DER, colon-separated hex (Consul's root ID).
    pub root_id: String,
    /// The root's subject key ID, colon-separated hex.
    pub signing_key_id: String,
    root_name: String,
    root_serial: u64,
    root_not_before: OffsetDateTime,
    root_not_after: OffsetDateTime,
    issuer: CertifiedIssuer<'static, KeyPair>,
    leaf_ttl: Duration,
    leaves: Mutex<LeafCache>,
}

#[derive(Default)]
struct LeafCache {
    next_serial: u64,
    by_service: BTreeMap<String, Leaf>,
}

fn colon_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

pub fn rfc3339(t: OffsetDateTime) -> String {
    t.replace_nanosecond(0).unwrap_or(t).format(&Rfc3339).unwrap_or_default()
}

fn base36(mut n: u64, width: usize) -> String {
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    for _ in 0..width {
        out.push(digits[(n % 36) as usize]);
        n /= 36;
    }
    String::from_utf8(out).unwrap_or_default()
}

impl ConnectCa {
    /// A fresh root for a new cluster ID.
    pub fn new(datacenter: &str, leaf_ttl: Duration) -> Result<ConnectCa> {
        let cluster_id = uuid::Uuid::new_v4().to_string();
        let trust_domain = format!("{cluster_id}.consul");
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("CA key")?;
        let mut params = CertificateParams::default();
        let root_serial = u64::from_be_bytes(uuid::Uuid::new_v4().as_bytes()[..8].try_into().unwrap_or_default()) >> 1;
        let root_name = format!("pri-{}.consul.ca.{}.consul", base36(root_serial, 8), &cluster_id[..8]);
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, root_name.clone());
        params.distinguished_name = dn;
        params.subject_alt_names = vec![SanType::URI(format!("spiffe://{trust_domain}").try_into().context("root SAN")?)];
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        params.serial_number = Some(SerialNumber::from_slice(&root_serial.to_be_bytes()));
        let now = OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::minutes(1);
        params.not_after = now + ROOT_TTL;
        // Fix the subject key ID so it can be reported as SigningKeyID.
        let skid = params.key_identifier(&key);
        params.key_identifier_method = KeyIdMethod::PreSpecified(skid.clone());
        let (not_before, not_after) = (params.not_before, params.not_after);
        let issuer = CertifiedIssuer::self_signed(params, key).context("self-sign the CA root")?;
        let root_id = colon_hex(&Sha1::digest(issuer.der().as_ref()));
        Ok(ConnectCa {
            trust_domain,
            datacenter: datacenter.to_string(),
            root_pem: issuer.pem(),
            root_id,
            signing_key_id: colon_hex(&skid),
            root_name,
            root_serial,
            root_not_before: not_before,
            root_not_after: not_after,
            cluster_id,
            issuer,
            leaf_ttl: leaf_ttl.min(MAX_LEAF_TTL),
            leaves: Mutex::new(LeafCache { next_serial: 2, ..Default::default() }),
        })
    }

    /// `spiffe://<td>/ns/default/dc/<dc>/svc/<service>`.
    pub fn spiffe_id(&self, service: &str) -> String {
        format!("spiffe://{}/ns/default/dc/{}/svc/{service}", self.trust_domain, self.datacenter)
    }

    /// The SNI and cluster name of a service in this datacenter: `<svc>.default.<dc>.internal.<td>`.
    pub fn sni(&self, service: &str) -> String {
        format!("{service}.default.{}.internal.{}", self.datacenter, self.trust_domain)
    }

    /// `GET /v1/connect/ca/roots` (`structs.IndexedCARoots`).
    pub fn roots_json(&self, index: u64) -> Value {
        json!({
            "ActiveRootID": self.root_id,
            "TrustDomain": self.trust_domain,
            "Roots": [{
                "ID": self.root_id, "Name": "Consul CA Primary Cert", "SerialNumber": self.root_serial,
                "SigningKeyID": self.signing_key_id, "ExternalTrustDomain": self.cluster_id,
                "NotBefore": rfc3339(self.root_not_before), "NotAfter": rfc3339(self.root_not_after),
                "RootCert": self.root_pem, "IntermediateCerts": null, "Active": true,
                "RotatedOutAt": "0001-01-01T00:00:00Z", "PrivateKeyType": "ec", "PrivateKeyBits": 256,
                "CreateIndex": 1, "ModifyIndex": 1,
            }],
            "QueryMeta": null,
            "Index": index,
            "CommonName": self.root_name,
        })
    }

    /// The cached leaf for `service`, or a freshly signed one when there is none or it is due
    /// for renewal.
    pub fn leaf(&self, service: &str) -> Result<Leaf> {
        let mut cache = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        let now = OffsetDateTime::now_utc();
        if let Some(l) = cache.by_service.get(service)
            && now < l.renew_at
        {
            return Ok(l.clone());
        }
        cache.next_serial += 1;
        let serial = cache.next_serial;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).context("leaf key")?;
        let mut params = CertificateParams::default();
        // Consul's leaves have an empty subject: the SPIFFE URI is the identity.
        params.distinguished_name = DistinguishedName::new();
        let uri = self.spiffe_id(service);
        params.subject_alt_names = vec![SanType::URI(uri.clone().try_into().context("leaf SAN")?)];
        params.serial_number = Some(SerialNumber::from_slice(&serial.to_be_bytes()));
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
            KeyUsagePurpose::KeyAgreement,
            KeyUsagePurpose::DataEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = now - time::Duration::minutes(1);
        params.not_after = now + self.leaf_ttl;
        let cert = params.signed_by(&key, &self.issuer).context("sign the leaf")?;
        let lifetime = params.not_after - params.not_before;
        let leaf = Leaf {
            service: service.to_string(),
            service_uri: uri,
            // Big-endian without leading zero bytes, as Go prints a big.Int serial.
            serial: colon_hex(&serial.to_be_bytes()[serial.leading_zeros() as usize / 8..]),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            valid_after: params.not_before,
            valid_before: params.not_after,
            renew_at: params.not_before + lifetime * 0.6,
        };
        cache.by_service.insert(service.to_string(), leaf.clone());
        Ok(leaf)
    }
}
