//! `nomad-rs tls ca create` and `nomad-rs tls cert create -server|-client|-cli`: a CA and
//! agent certificates in the current directory, under Nomad's file names. Existing files are
//! never overwritten (they are created with O_EXCL).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use super::{CmdResult, Failure, exit};
use crate::tls::generate::{self, CaRequest, CertRequest, Role};
use crate::tls::write_new;

/// `nomad-rs tls`.
#[derive(Debug, Args)]
pub struct TlsArgs {
    /// The TLS command.
    #[command(subcommand)]
    pub command: TlsCommand,
}

/// `tls` commands.
#[derive(Debug, Subcommand)]
pub enum TlsCommand {
    /// The certificate authority.
    #[command(subcommand)]
    Ca(CaCommand),
    /// Agent and CLI certificates.
    #[command(subcommand)]
    Cert(CertCommand),
}

/// `tls ca` commands.
#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Create a CA: `<domain>-agent-ca.pem` and `<domain>-agent-ca-key.pem`.
    Create(CaCreateArgs),
}

/// `tls cert` commands.
#[derive(Debug, Subcommand)]
pub enum CertCommand {
    /// Create a certificate for a server, a client or the CLI, signed by the CA.
    Create(CertCreateArgs),
}

/// Flags of `tls ca create`.
#[derive(Debug, Args)]
pub struct CaCreateArgs {
    /// More domains the name constraint permits (repeatable; with -name-constraint).
    #[arg(long = "additional-domain", value_name = "DOMAIN")]
    pub additional_domain: Vec<String>,
    /// The CA's common name (default: `Nomad Agent CA <serial>`).
    #[arg(long = "common-name", default_value = "")]
    pub common_name: String,
    /// Days the CA is valid.
    #[arg(long, default_value_t = 1825)]
    pub days: u32,
    /// Domain of the cluster's certificates.
    #[arg(long, default_value = "nomad")]
    pub domain: String,
    /// Restrict the CA to the domain, `localhost` and -additional-domain (a critical name constraint).
    #[arg(long = "name-constraint")]
    pub name_constraint: bool,
}

/// Flags of `tls cert create`.
#[derive(Debug, Args)]
pub struct CertCreateArgs {
    /// More DNS names (repeatable).
    #[arg(long = "additional-dnsname", value_name = "NAME")]
    pub additional_dnsname: Vec<String>,
    /// More IP addresses (repeatable).
    #[arg(long = "additional-ipaddress", value_name = "IP")]
    pub additional_ipaddress: Vec<String>,
    /// The CA certificate (default: `<domain>-agent-ca.pem`).
    #[arg(long = "ca", value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// The CA key (default: `<domain>-agent-ca-key.pem`).
    #[arg(long = "key", value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// A certificate for the CLI.
    #[arg(long)]
    pub cli: bool,
    /// A certificate for a client agent.
    #[arg(long)]
    pub client: bool,
    /// A certificate for a server agent.
    #[arg(long)]
    pub server: bool,
    /// Days the certificate is valid.
    #[arg(long, default_value_t = 365)]
    pub days: u32,
    /// Domain of the cluster's certificates.
    #[arg(long, default_value = "nomad")]
    pub domain: String,
    /// Region of the certificate [env: NOMAD_REGION; default: global].
    #[arg(long, value_name = "REGION")]
    pub region: Option<String>,
    /// Deprecated spelling of -region.
    #[arg(long = "cluster-region", value_name = "REGION", hide = true)]
    pub cluster_region: Option<String>,
}

/// Runs a `tls` command in the current directory.
pub fn run(args: TlsArgs) -> CmdResult {
    let dir = std::env::current_dir().map_err(|e| Failure::new(format!("Error reading the current directory: {e}")))?;
    match args.command {
        TlsCommand::Ca(CaCommand::Create(a)) => ca_create(&dir, &a),
        TlsCommand::Cert(CertCommand::Create(a)) => cert_create(&dir, &a, std::env::var("NOMAD_REGION").ok().filter(|r| !r.is_empty())),
    }
}

/// Fails when `path` exists, with `what` in the message (`CA certificate`).
fn refuse_existing(path: &Path, name: &str, what: &str) -> Result<(), Failure> {
    if path.symlink_metadata().is_ok() { Err(Failure::new(format!("{what} file '{name}' already exists"))) } else { Ok(()) }
}

fn write(dir: &Path, name: &str, what: &str, contents: &str, mode: u32) -> Result<(), Failure> {
    write_new(&dir.join(name), contents.as_bytes(), mode).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            Failure::new(format!("{what} file '{name}' already exists"))
        } else {
            Failure::new(format!("Error writing {what} file '{name}': {e}"))
        }
    })
}

/// `tls ca create` in `dir`.
pub fn ca_create(dir: &Path, a: &CaCreateArgs) -> CmdResult {
    if a.domain.is_empty() {
        return Err(Failure::new("Please provide the -domain flag"));
    }
    if a.days == 0 {
        return Err(Failure::new("-days must be at least 1"));
    }
    let cert_name = format!("{}-agent-ca.pem", a.domain);
    let key_name = format!("{}-agent-ca-key.pem", a.domain);
    refuse_existing(&dir.join(&cert_name), &cert_name, "CA certificate")?;
    refuse_existing(&dir.join(&key_name), &key_name, "CA key")?;
    let req = CaRequest {
        days: a.days,
        domain: a.domain.clone(),
        common_name: a.common_name.clone(),
        name_constraint: a.name_constraint,
        additional_domains: a.additional_domain.clone(),
    };
    let g = generate::ca(&req).map_err(|e| Failure::new(format!("Error generating the CA: {e}")))?;
    write(dir, &key_name, "CA key", &g.key_pem, 0o600)?;
    write(dir, &cert_name, "CA certificate", &g.cert_pem, 0o644)?;
    println!("==> CA certificate saved to: {cert_name}");
    println!("==> CA certificate key saved to: {key_name}");
    Ok(exit::OK)
}

/// `tls cert create` in `dir`; `env_region` is `NOMAD_REGION`.
pub fn cert_create(dir: &Path, a: &CertCreateArgs, env_region: Option<String>) -> CmdResult {
    let role = match (a.server, a.client, a.cli) {
        (true, false, false) => Role::Server,
        (false, true, false) => Role::Client,
        (false, false, true) => Role::Cli,
        _ => return Err(Failure::new("Please provide either -server, -client, or -cli")),
    };
    if a.domain.is_empty() {
        return Err(Failure::new("Please provide the -domain flag"));
    }
    if a.days == 0 {
        return Err(Failure::new("-days must be at least 1"));
    }
    let region = a.region.clone().or_else(|| a.cluster_region.clone()).or(env_region).unwrap_or_else(|| "global".to_string());
    let mut ips = Vec::new();
    for ip in &a.additional_ipaddress {
        let parsed: IpAddr = ip.parse().map_err(|_| Failure::new(format!("Invalid IP address for -additional-ipaddress: {ip:?}")))?;
        ips.push(parsed);
    }
    let req = CertRequest {
        role,
        region,
        domain: a.domain.clone(),
        days: a.days,
        additional_dns: a.additional_dnsname.clone(),
        additional_ips: ips,
    };
    let ca_file = a.ca.clone().unwrap_or_else(|| PathBuf::from(format!("{}-agent-ca.pem", a.domain)));
    let key_file = a.key.clone().unwrap_or_else(|| PathBuf::from(format!("{}-agent-ca-key.pem", a.domain)));
    let ca_pem = std::fs::read_to_string(dir.join(&ca_file))
        .map_err(|e| Failure::new(format!("Error reading CA file {}: {e}", ca_file.display())))?;
    let ca_key_pem = std::fs::read_to_string(dir.join(&key_file))
        .map_err(|e| Failure::new(format!("Error reading CA key file {}: {e}", key_file.display())))?;
    let stem = req.file_stem();
    let cert_name = format!("{stem}.pem");
    let key_name = format!("{stem}-key.pem");
    let title = match role {
        Role::Server => "Server",
        Role::Client => "Client",
        Role::Cli => "Cli",
    };
    refuse_existing(&dir.join(&cert_name), &cert_name, &format!("{title} certificate"))?;
    refuse_existing(&dir.join(&key_name), &key_name, &format!("{title} certificate key"))?;
    let g = generate::cert(&req, &ca_pem, &ca_key_pem).map_err(|e| Failure::new(format!("Error generating the certificate: {e}")))?;
    if role == Role::Server {
        println!(
            "==> WARNING: Server certificates grant the authority to become a\n    server and to read all of the cluster's state, its keys and\n    its ACL tokens. Give them only to hosts that are server nodes,\n    and keep them as safe as the CA key."
        );
    }
    println!("==> Using CA file {} and CA key {}", ca_file.display(), key_file.display());
    write(dir, &key_name, &format!("{title} certificate key"), &g.key_pem, 0o600)?;
    write(dir, &cert_name, &format!("{title} certificate"), &g.cert_pem, 0o644)?;
    println!("==> {title} Certificate saved to {cert_name}");
    println!("==> {title} Certificate key saved to {key_name}");
    Ok(exit::OK)
}
