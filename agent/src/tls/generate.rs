//! The CA and certificates of `nomad-rs tls ca create` and `tls cert create`: ECDSA P-256 keys,
//! Nomad's names, SANs and validity (CA 1825 days, certificates 365 days by default).

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, NameConstraints, PKCS_ECDSA_P256_SHA256, SanType, SerialNumber,
};
use time::{Duration, OffsetDateTime};

/// A certificate and its key, both PEM.
#[derive(Debug, Clone)]
pub struct Generated {
    /// Certificate.
    pub cert_pem: String,
    /// Private key (PKCS#8).
    pub key_pem: String,
}

/// What `tls ca create` is asked for.
#[derive(Debug, Clone)]
pub struct CaRequest {
    /// Days of validity (Nomad: 1825).
    pub days: u32,
    /// Domain (Nomad: `nomad`).
    pub domain: String,
    /// Common name; empty: `Nomad Agent CA <serial>`.
    pub common_name: String,
    /// Add a critical name constraint permitting only the domain, `localhost` and these.
    pub name_constraint: bool,
    /// More permitted domains with `name_constraint`.
    pub additional_domains: Vec<String>,
}

/// The role of a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `-server`.
    Server,
    /// `-client`.
    Client,
    /// `-cli`.
    Cli,
}

impl Role {
    /// `server`, `client` or `cli`, as in names and file names.
    pub fn word(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Client => "client",
            Role::Cli => "cli",
        }
    }
}

/// What `tls cert create` is asked for.
#[derive(Debug, Clone)]
pub struct CertRequest {
    /// Role.
    pub role: Role,
    /// Region (Nomad: `global`).
    pub region: String,
    /// Domain (Nomad: `nomad`).
    pub domain: String,
    /// Days of validity (Nomad: 365).
    pub days: u32,
    /// More DNS SANs.
    pub additional_dns: Vec<String>,
    /// More IP SANs.
    pub additional_ips: Vec<IpAddr>,
}

impl CertRequest {
    /// `<role>.<region>.<domain>`, the common name.
    pub fn name(&self) -> String {
        format!("{}.{}.{}", self.role.word(), self.region, self.domain)
    }

    /// `<region>-<role>-<domain>`, the stem of the file names.
    pub fn file_stem(&self) -> String {
        format!("{}-{}-{}", self.region, self.role.word(), self.domain)
    }

    /// The DNS SANs: the name, `<role>.global.<domain>` in another region, `localhost`, then the
    /// additional ones.
    pub fn dns_names(&self) -> Vec<String> {
        let mut names = vec![self.name()];
        if self.region != "global" {
            names.push(format!("{}.global.{}", self.role.word(), self.domain));
        }
        names.push("localhost".to_string());
        for n in &self.additional_dns {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
        names
    }

    /// The IP SANs: 127.0.0.1 (not for `-cli`), then the additional ones.
    pub fn ips(&self) -> Vec<IpAddr> {
        let mut ips = Vec::new();
        if self.role != Role::Cli {
            ips.push(IpAddr::from([127, 0, 0, 1]));
        }
        for ip in &self.additional_ips {
            if !ips.contains(ip) {
                ips.push(*ip);
            }
        }
        ips
    }
}

fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    // Positive and without a leading zero byte.
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    SerialNumber::from_slice(&bytes)
}

fn serial_text(s: &SerialNumber) -> String {
    // Nomad prints the serial as a decimal big integer; its first 8 bytes are plenty to tell CAs apart.
    let b = s.to_bytes();
    let mut n: u64 = 0;
    for byte in b.iter().take(8) {
        n = (n << 8) | u64::from(*byte);
    }
    n.to_string()
}

fn ia5(s: &str) -> anyhow::Result<rcgen::string::Ia5String> {
    rcgen::string::Ia5String::try_from(s.to_string()).map_err(|e| anyhow::anyhow!("invalid name {s:?}: {e}"))
}

/// A new CA.
pub fn ca(req: &CaRequest) -> anyhow::Result<Generated> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut p = CertificateParams::default();
    let serial = random_serial();
    let cn = if req.common_name.is_empty() { format!("Nomad Agent CA {}", serial_text(&serial)) } else { req.common_name.clone() };
    p.serial_number = Some(serial);
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let now = OffsetDateTime::now_utc();
    p.not_before = now;
    p.not_after = now + Duration::days(i64::from(req.days));
    if req.name_constraint {
        let mut permitted = vec![req.domain.clone(), "localhost".to_string()];
        if req.domain != "nomad" {
            permitted.push("nomad".to_string());
        }
        permitted.extend(req.additional_domains.iter().cloned());
        p.name_constraints = Some(NameConstraints {
            permitted_subtrees: permitted.into_iter().map(GeneralSubtree::DnsName).collect(),
            excluded_subtrees: Vec::new(),
        });
    }
    let cert = p.self_signed(&key)?;
    Ok(Generated { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// A certificate for `req`, signed by the CA in `ca_cert_pem` with `ca_key_pem`.
pub fn cert(req: &CertRequest, ca_cert_pem: &str, ca_key_pem: &str) -> anyhow::Result<Generated> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(|e| anyhow::anyhow!("reading the CA key: {e}"))?;
    let issuer = Issuer::from_ca_cert_pem(ca_cert_pem, ca_key).map_err(|e| anyhow::anyhow!("reading the CA certificate: {e}"))?;
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut p = CertificateParams::default();
    p.serial_number = Some(random_serial());
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, req.name());
    p.distinguished_name = dn;
    let mut sans = Vec::new();
    for n in req.dns_names() {
        sans.push(SanType::DnsName(ia5(&n)?));
    }
    sans.extend(req.ips().into_iter().map(SanType::IpAddress));
    p.subject_alt_names = sans;
    p.is_ca = IsCa::NoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    p.extended_key_usages = match req.role {
        Role::Server | Role::Client => vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
        Role::Cli => vec![ExtendedKeyUsagePurpose::ClientAuth],
    };
    p.use_authority_key_identifier_extension = true;
    let now = OffsetDateTime::now_utc();
    p.not_before = now;
    p.not_after = now + Duration::days(i64::from(req.days));
    let cert = p.signed_by(&key, &issuer)?;
    Ok(Generated { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}
