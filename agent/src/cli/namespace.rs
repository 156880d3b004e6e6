//! `nomad-rs namespace list|status|apply|delete`, as Nomad's.

use std::collections::BTreeMap;
use std::io::Read;

use clap::{Args, Subcommand};
use nomad_proto::Namespace;
use serde::Deserialize;

use super::api::{ApiFlags, Query, encode_path};
use super::format::{json_text, kv, safe, table_with_header};
use super::{CmdResult, Ctx, Failure, exit};

/// `nomad-rs namespace`.
#[derive(Debug, Args)]
pub struct NamespaceArgs {
    /// General options.
    #[command(flatten)]
    pub api: ApiFlags,
    /// The namespace command.
    #[command(subcommand)]
    pub command: NamespaceCommand,
}

/// Namespace commands.
#[derive(Debug, Subcommand)]
pub enum NamespaceCommand {
    /// List namespaces.
    List {
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one namespace (by name or unique prefix).
    Status {
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
        /// Namespace name or prefix.
        #[arg(value_name = "NAMESPACE")]
        name: String,
    },
    /// Create or update a namespace from a name and flags, or from a specification file
    /// (HCL, or JSON with -json; `-` reads stdin).
    Apply {
        /// The namespace's description.
        #[arg(long)]
        description: Option<String>,
        /// A quota to attach (Nomad Enterprise: refused).
        #[arg(long)]
        quota: Option<String>,
        /// Read the file as a JSON specification.
        #[arg(long)]
        json: bool,
        /// A namespace name, or a specification file.
        #[arg(value_name = "INPUT")]
        input: String,
    },
    /// Delete a namespace that holds no jobs.
    Delete {
        /// Namespace name.
        #[arg(value_name = "NAMESPACE")]
        name: String,
    },
}

/// The specification file's keys (Nomad's `namespace apply` HCL; capabilities and node pool
/// configuration are Nomad features nomad-rs does not have, so the file may not name them).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Spec {
    name: String,
    description: String,
    quota: String,
    meta: BTreeMap<String, String>,
}

/// Runs a namespace command.
pub async fn run(a: NamespaceArgs) -> CmdResult {
    let ctx = Ctx::new(&a.api)?;
    match a.command {
        NamespaceCommand::List { json } => {
            let list = list(&ctx, "").await?;
            if json {
                println!("{}", json_text(&list));
            } else if list.is_empty() {
                println!("No namespaces found");
            } else {
                println!("{}", table(&list));
            }
            Ok(exit::OK)
        }
        NamespaceCommand::Status { json, name } => {
            let ns = find(&ctx, name.trim()).await?;
            if json {
                println!("{}", json_text(&ns));
                return Ok(exit::OK);
            }
            // nomad-rs has no driver capabilities per namespace: every driver is enabled.
            println!(
                "{}",
                kv(&[
                    ("Name", ns.name.clone()),
                    ("Description", ns.description.clone()),
                    ("Quota", ns.quota.clone()),
                    ("EnabledDrivers", "*".into()),
                    ("DisabledDrivers", String::new()),
                ])
            );
            if !ns.meta.is_empty() {
                println!("\n{}", ctx.style.bold("Metadata"));
                let pairs: Vec<(&str, String)> = ns.meta.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
                println!("{}", kv(&pairs));
            }
            Ok(exit::OK)
        }
        NamespaceCommand::Apply { description, quota, json, input } => {
            let is_file = input == "-" || std::path::Path::new(&input).is_file();
            let ns = if is_file {
                if description.is_some() || quota.is_some() {
                    eprintln!("Flags are ignored when a file is specified!");
                }
                read_spec(&input, json)?
            } else {
                if quota.as_deref().is_some_and(|q| !q.is_empty()) {
                    return Err(Failure::new("Error applying namespace: quotas are a Nomad Enterprise feature nomad-rs does not have"));
                }
                // An existing namespace keeps what the flags do not change.
                let q = Query::new();
                let mut ns = match ctx.client.get::<Namespace>(&format!("/v1/namespace/{}", encode_path(&input)), &q).await {
                    Ok(answer) => answer.value,
                    Err(e) if e.is_not_found() => Namespace { name: input.clone(), ..Namespace::default() },
                    Err(e) => return Err(Failure::new(format!("Error looking up namespace: {e}"))),
                };
                if let Some(d) = description {
                    ns.description = d;
                }
                ns
            };
            if ns.name.is_empty() {
                return Err(Failure::new("Namespace name required"));
            }
            ctx.client
                .put::<serde_json::Value>(&format!("/v1/namespace/{}", encode_path(&ns.name)), &Query::new(), &ns)
                .await
                .map_err(|e| Failure::new(format!("Error applying namespace: {e}")))?;
            println!("Successfully applied namespace \"{}\"!", safe(&ns.name));
            Ok(exit::OK)
        }
        NamespaceCommand::Delete { name } => {
            ctx.client
                .delete::<serde_json::Value>(&format!("/v1/namespace/{}", encode_path(&name)), &Query::new())
                .await
                .map_err(|e| Failure::new(format!("Error deleting namespace: {e}")))?;
            println!("Successfully deleted namespace \"{}\"!", safe(&name));
            Ok(exit::OK)
        }
    }
}

async fn list(ctx: &Ctx, prefix: &str) -> Result<Vec<Namespace>, Failure> {
    Ok(ctx
        .client
        .get::<Vec<Namespace>>("/v1/namespaces", &Query::new().prefix(prefix))
        .await
        .map_err(|e| Failure::new(format!("Error retrieving namespaces: {e}")))?
        .value)
}

/// The namespace named `name`, or the only one it is a prefix of.
async fn find(ctx: &Ctx, name: &str) -> Result<Namespace, Failure> {
    let list = list(ctx, name).await?;
    if let Some(exact) = list.iter().find(|n| n.name == name) {
        return Ok(exact.clone());
    }
    match list.len() {
        0 => Err(Failure::new(format!("Namespace {:?} matched no namespaces", safe(name)))),
        1 => Ok(list.into_iter().next().expect("one")),
        _ => Err(Failure::new(format!("Prefix matched multiple namespaces\n\n{}", table(&list)))),
    }
}

fn table(list: &[Namespace]) -> String {
    table_with_header(&["Name", "Description"], list.iter().map(|n| vec![n.name.clone(), n.description.clone()]).collect())
}

/// A specification from `path` (`-`: stdin), HCL or (`json`) JSON.
fn read_spec(path: &str, json: bool) -> Result<Namespace, Failure> {
    let mut raw = String::new();
    if path == "-" {
        std::io::stdin().read_to_string(&mut raw).map_err(|e| Failure::new(format!("Failed to read stdin: {e}")))?;
    } else {
        raw = std::fs::read_to_string(path).map_err(|e| Failure::new(format!("Failed to read file: {e}")))?;
    }
    if json {
        return serde_json::from_str::<Namespace>(&raw).map_err(|e| Failure::new(format!("Failed to parse namespace: {e}")));
    }
    let spec: Spec =
        hcl::from_str(&raw).map_err(|e| Failure::new(format!("Error parsing namespace specification: {}", e.to_string().trim())))?;
    if !spec.quota.is_empty() {
        return Err(Failure::new("Error parsing namespace specification: quotas are a Nomad Enterprise feature nomad-rs does not have"));
    }
    Ok(Namespace { name: spec.name, description: spec.description, quota: spec.quota, meta: spec.meta, ..Namespace::default() })
}
