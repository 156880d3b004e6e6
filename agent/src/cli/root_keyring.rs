//! `nomad-rs operator root keyring list|rotate|remove`: the root keys that encrypt variables
//! and sign workload identities (Nomad's `command/operator_root_keyring_*.go`), over
//! `/v1/operator/keyring/*`. Key metadata only; key material never leaves the servers.

use clap::{Args, Subcommand};
use nomad_proto::variables::RootKeyMeta;
use serde::Deserialize;

use super::api::{Query, encode_path};
use super::format::{format_time, id_len, limit, safe, table_with_header};
use super::{CmdResult, Ctx, Failure, exit};

/// `operator root` commands.
#[derive(Debug, Subcommand)]
pub enum RootCommand {
    /// The root encryption keys.
    #[command(subcommand)]
    Keyring(KeyringCommand),
}

/// `operator root keyring` commands.
#[derive(Debug, Subcommand)]
pub enum KeyringCommand {
    /// List the root keys: ID, state and creation time.
    List(ListArgs),
    /// Make a new active key for new writes (-full: re-encrypt every variable with it).
    Rotate(RotateArgs),
    /// Remove a key that is not the active one.
    Remove(RemoveArgs),
}

/// Flags of `operator root keyring list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Full key IDs.
    #[arg(long)]
    pub verbose: bool,
    /// Print the API's JSON (a nomad-rs addition; Nomad 1.6 has no -json here).
    #[arg(long)]
    pub json: bool,
}

/// Flags of `operator root keyring rotate`.
#[derive(Debug, Args)]
pub struct RotateArgs {
    /// Also re-encrypt every existing variable with the new key (the leader does it in the
    /// background; the command returns at once).
    #[arg(long)]
    pub full: bool,
    /// Full key IDs.
    #[arg(long)]
    pub verbose: bool,
}

/// Flags and argument of `operator root keyring remove`.
#[derive(Debug, Args)]
pub struct RemoveArgs {
    /// Accepted as Nomad accepts it; it changes nothing here either.
    #[arg(long)]
    pub verbose: bool,
    /// The key's ID (in full).
    #[arg(value_name = "KEY_ID")]
    pub key_id: String,
}

/// What `PUT /v1/operator/keyring/rotate` answers.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct RotateResponse {
    key: RootKeyMeta,
}

/// Runs an `operator root` command.
pub async fn run(ctx: &Ctx, command: RootCommand) -> CmdResult {
    let RootCommand::Keyring(command) = command;
    match command {
        KeyringCommand::List(l) => list(ctx, l).await,
        KeyringCommand::Rotate(r) => rotate(ctx, r).await,
        KeyringCommand::Remove(r) => remove(ctx, &r.key_id).await,
    }
}

async fn list(ctx: &Ctx, a: ListArgs) -> CmdResult {
    if a.json {
        return ctx.print_json("/v1/operator/keyring/keys", &Query::new(), "error").await;
    }
    let keys = ctx
        .client
        .get::<Vec<RootKeyMeta>>("/v1/operator/keyring/keys", &Query::new())
        .await
        .map_err(|e| Failure::new(format!("error: {e}")))?
        .value;
    println!("{}", render_keys(&keys, a.verbose));
    Ok(exit::OK)
}

async fn rotate(ctx: &Ctx, a: RotateArgs) -> CmdResult {
    let q = if a.full { Query::new().param("full", "true") } else { Query::new() };
    let resp: RotateResponse = ctx
        .client
        .write(http::Method::PUT, "/v1/operator/keyring/rotate", &q, None::<&()>)
        .await
        .map_err(|e| Failure::new(format!("error: {e}")))?
        .value;
    println!("{}", render_keys(&[resp.key], a.verbose));
    Ok(exit::OK)
}

async fn remove(ctx: &Ctx, key_id: &str) -> CmdResult {
    ctx.client
        .delete::<serde_json::Value>(&format!("/v1/operator/keyring/key/{}", encode_path(key_id)), &Query::new())
        .await
        .map_err(|e| Failure::new(format!("error: {e}")))?;
    println!("Removed encryption key {}", safe(key_id));
    Ok(exit::OK)
}

/// Nomad's keyring table: key ID (8 characters unless verbose), state, creation time.
pub fn render_keys(keys: &[RootKeyMeta], verbose: bool) -> String {
    let rows =
        keys.iter().map(|k| vec![limit(&k.key_id, id_len(verbose)).into_owned(), k.state.clone(), format_time(k.create_time)]).collect();
    table_with_header(&["Key", "State", "Create Time"], rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_show_short_ids_unless_verbose() {
        let keys = [
            RootKeyMeta {
                key_id: "5d8c7a1e-7b7a-4f3e-9d0c-3b1a2f4e5d6c".into(),
                state: "active".into(),
                create_time: 1_700_000_000_000_000_000,
                ..RootKeyMeta::default()
            },
            RootKeyMeta { key_id: "0a1b2c3d-0000-0000-0000-000000000000".into(), state: "inactive".into(), ..RootKeyMeta::default() },
        ];
        let out = render_keys(&keys, false);
        let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().take(2).collect()).collect();
        assert_eq!(rows, [vec!["Key", "State"], vec!["5d8c7a1e", "active"], vec!["0a1b2c3d", "inactive"]]);
        assert!(out.lines().next().unwrap().ends_with("Create Time"));
        assert!(out.lines().nth(1).unwrap().contains("2023-11-1"), "{out}");
        assert!(render_keys(&keys, true).contains("5d8c7a1e-7b7a-4f3e-9d0c-3b1a2f4e5d6c  active"));
    }
}
