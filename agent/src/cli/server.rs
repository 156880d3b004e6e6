//! `nomad-rs server members [-detailed] [-json]`.

use clap::{Args, Subcommand};
use serde_json::Value;

use super::api::{ApiFlags, Query};
use super::format::table_with_header;
use super::{CmdResult, Ctx, Failure, exit};

/// `nomad-rs server`.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// General options.
    #[command(flatten)]
    pub api: ApiFlags,
    /// The server command.
    #[command(subcommand)]
    pub command: ServerCommand,
}

/// Server commands.
#[derive(Debug, Subcommand)]
pub enum ServerCommand {
    /// List the servers of the region and which one leads.
    Members(MembersArgs),
}

/// Flags of `server members`.
#[derive(Debug, Args)]
pub struct MembersArgs {
    /// Show every tag of each member.
    #[arg(long, visible_alias = "verbose")]
    pub detailed: bool,
    /// Print the API's JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs a server command.
pub async fn run(a: ServerArgs) -> CmdResult {
    let ServerCommand::Members(m) = a.command;
    let ctx = Ctx::new(&a.api)?;
    let members = ctx
        .client
        .get_json("/v1/agent/members", &Query::new())
        .await
        .map_err(|e| Failure::new(format!("Error querying servers: {e}")))?
        .value;
    if m.json {
        println!("{}", crate::cli::format::safe_json(&serde_json::to_string_pretty(&members).unwrap_or_default()));
        return Ok(exit::OK);
    }
    // A leader read that fails (no leader yet) just marks nobody as leader.
    let leader = ctx.client.get::<String>("/v1/status/leader", &Query::new()).await.map(|a| a.value).unwrap_or_default();
    let list = members.get("Members").and_then(Value::as_array).cloned().unwrap_or_default();
    if list.is_empty() {
        println!("No servers found");
        return Ok(exit::OK);
    }
    println!("{}", render(&list, &leader, m.detailed));
    Ok(exit::OK)
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn tag<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get("Tags").and_then(|t| t.get(key)).and_then(Value::as_str).unwrap_or("")
}

/// Whether a member is the leader whose RPC address is `leader`.
pub fn is_leader(m: &Value, leader: &str) -> bool {
    if leader.is_empty() {
        return false;
    }
    let port = v_port(m);
    let by_tags = (!tag(m, "rpc_addr").is_empty()).then(|| format!("{}:{}", tag(m, "rpc_addr"), tag(m, "port")));
    by_tags.as_deref() == Some(leader) || format!("{}:{port}", s(m, "Addr")) == leader
}

fn v_port(m: &Value) -> String {
    m.get("Port").map(|p| p.as_u64().map(|n| n.to_string()).unwrap_or_else(|| p.as_str().unwrap_or("").to_string())).unwrap_or_default()
}

/// The members table.
pub fn render(members: &[Value], leader: &str, detailed: bool) -> String {
    let mut sorted: Vec<&Value> = members.iter().collect();
    sorted.sort_by(|a, b| s(a, "Name").cmp(s(b, "Name")));
    let rows = sorted
        .iter()
        .map(|m| {
            let mut r = vec![
                s(m, "Name").to_string(),
                s(m, "Addr").to_string(),
                v_port(m),
                s(m, "Status").to_string(),
                is_leader(m, leader).to_string(),
            ];
            if detailed {
                let mut tags: Vec<String> = m
                    .get("Tags")
                    .and_then(Value::as_object)
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect();
                tags.sort();
                r.push(tags.join(","));
            } else {
                let raft = tag(m, "raft_vsn");
                r.push(if raft.is_empty() { "-".into() } else { raft.into() });
                r.push(tag(m, "build").to_string());
                r.push(tag(m, "dc").to_string());
                r.push(tag(m, "region").to_string());
            }
            r
        })
        .collect();
    let header: &[&str] = if detailed {
        &["Name", "Address", "Port", "Status", "Leader", "Tags"]
    } else {
        &["Name", "Address", "Port", "Status", "Leader", "Raft Version", "Build", "Datacenter", "Region"]
    };
    table_with_header(header, rows)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_leader_is_found_by_its_rpc_address() {
        let a = json!({"Name": "a.global", "Addr": "10.0.0.1", "Port": 4647, "Status": "alive", "Tags": {"build": "1.6.1", "dc": "dc1", "region": "global"}});
        let b = json!({"Name": "b.global", "Addr": "10.0.0.2", "Port": 4647, "Status": "alive", "Tags": {"build": "1.6.1", "dc": "dc1", "region": "global"}});
        let out = render(&[b, a], "10.0.0.2:4647", false);
        assert_eq!(
            out,
            "Name      Address   Port  Status  Leader  Raft Version  Build  Datacenter  Region\n\
             a.global  10.0.0.1  4647  alive   false   -             1.6.1  dc1         global\n\
             b.global  10.0.0.2  4647  alive   true    -             1.6.1  dc1         global"
        );
    }
}
