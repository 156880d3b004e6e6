//! `nomad-rs operator raft list-peers [-json]` and
//! `nomad-rs operator raft remove-peer (-peer-id ID | -peer-address IP:PORT)`: the servers of the
//! Raft configuration, and taking out one that is gone for good. `nomad-rs operator keygen`: a
//! new cluster key for `server { encrypt }`. `nomad-rs operator root keyring ...`: see
//! [`super::root_keyring`]. `nomad-rs operator snapshot save|restore|inspect`: see
//! [`super::snapshot`]. `nomad-rs operator scheduler get-config|set-config`: see
//! [`super::scheduler_config`].

use clap::{Args, Subcommand};
use serde_json::Value;

use super::api::{ApiFlags, Query};
use super::format::table_with_header;
use super::{CmdResult, Ctx, Failure, exit};

/// `nomad-rs operator`.
#[derive(Debug, Args)]
pub struct OperatorArgs {
    /// General options.
    #[command(flatten)]
    pub api: ApiFlags,
    /// The operator command.
    #[command(subcommand)]
    pub command: OperatorCommand,
}

/// Operator commands.
#[derive(Debug, Subcommand)]
pub enum OperatorCommand {
    /// The Raft configuration of the servers.
    #[command(subcommand)]
    Raft(RaftCommand),
    /// Print a new cluster key for `server { encrypt = "..." }` (base64, 32 bytes).
    Keygen,
    /// The root keys that encrypt variables: list, rotate, remove.
    #[command(subcommand)]
    Root(super::root_keyring::RootCommand),
    /// The scheduler configuration: get-config, set-config.
    #[command(subcommand)]
    Scheduler(super::scheduler_config::SchedulerCommand),
    /// Snapshots of the servers' state: save, restore, inspect.
    #[command(subcommand)]
    Snapshot(super::snapshot::SnapshotCommand),
}

/// `operator raft` commands.
#[derive(Debug, Subcommand)]
pub enum RaftCommand {
    /// List the servers of the Raft configuration: address, state and whether they vote.
    ListPeers(ListPeersArgs),
    /// Remove a server that is gone for good from the Raft configuration.
    RemovePeer(RemovePeerArgs),
}

/// Flags of `operator raft list-peers`.
#[derive(Debug, Args)]
pub struct ListPeersArgs {
    /// Print the API's JSON.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `operator raft remove-peer`.
#[derive(Debug, Args)]
pub struct RemovePeerArgs {
    /// The server's Raft ID (as `list-peers` shows it).
    #[arg(long = "peer-id", conflicts_with = "peer_address")]
    pub peer_id: Option<String>,
    /// The server's RPC address (IP:port).
    #[arg(long = "peer-address")]
    pub peer_address: Option<String>,
}

/// Runs an operator command.
pub async fn run(a: OperatorArgs) -> CmdResult {
    let command = match a.command {
        OperatorCommand::Keygen => {
            println!("{}", nomad_server::rpc_auth::ClusterKey::generate().encode());
            return Ok(exit::OK);
        }
        OperatorCommand::Raft(command) => command,
        OperatorCommand::Root(command) => return super::root_keyring::run(&Ctx::new(&a.api)?, command).await,
        OperatorCommand::Snapshot(command) => return super::snapshot::run(|| Ctx::new(&a.api), command).await,
        OperatorCommand::Scheduler(command) => return super::scheduler_config::run(&Ctx::new(&a.api)?, command).await,
    };
    let ctx = Ctx::new(&a.api)?;
    match command {
        RaftCommand::ListPeers(l) => list_peers(&ctx, l.json).await,
        RaftCommand::RemovePeer(r) => remove_peer(&ctx, r).await,
    }
}

async fn list_peers(ctx: &Ctx, json: bool) -> CmdResult {
    let conf = ctx
        .client
        .get_json("/v1/operator/raft/configuration", &Query::new())
        .await
        .map_err(|e| Failure::new(format!("Failed to retrieve raft configuration: {e}")))?
        .value;
    if json {
        println!("{}", crate::cli::format::safe_json(&serde_json::to_string_pretty(&conf).unwrap_or_default()));
        return Ok(exit::OK);
    }
    let servers = conf.get("Servers").and_then(Value::as_array).cloned().unwrap_or_default();
    if servers.is_empty() {
        println!("No Raft servers (this agent runs no Raft)");
        return Ok(exit::OK);
    }
    println!("{}", render_peers(&servers));
    Ok(exit::OK)
}

/// Nomad's `list-peers` table.
pub fn render_peers(servers: &[Value]) -> String {
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let b = |v: &Value, k: &str| v.get(k).and_then(Value::as_bool).unwrap_or(false);
    let rows = servers
        .iter()
        .map(|v| {
            let state = if b(v, "Leader") { "leader" } else { "follower" };
            vec![s(v, "Node"), s(v, "ID"), s(v, "Address"), state.to_string(), b(v, "Voter").to_string(), s(v, "RaftProtocol")]
        })
        .collect();
    table_with_header(&["Node", "ID", "Address", "State", "Voter", "RaftProtocol"], rows)
}

async fn remove_peer(ctx: &Ctx, r: RemovePeerArgs) -> CmdResult {
    let (query, which) = match (r.peer_id, r.peer_address) {
        (Some(id), _) => (Query::new().param("id", id.clone()), format!("ID {id:?}")),
        (None, Some(address)) => (Query::new().param("address", address.clone()), format!("address {address:?}")),
        (None, None) => return Err(Failure::new("Missing peer: give -peer-id or -peer-address (see `operator raft list-peers`)")),
    };
    ctx.client
        .delete::<Value>("/v1/operator/raft/peer", &query)
        .await
        .map_err(|e| Failure::new(format!("Failed to remove raft peer: {e}")))?;
    println!("Removed peer with {which}");
    Ok(exit::OK)
}
