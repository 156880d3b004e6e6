//! `nomad-rs acl bootstrap`, `acl policy apply|list|info|delete`,
//! `acl token create|list|info|self|update|delete`, `acl role create|list|info|update|delete`:
//! the ACL system, with Nomad's output.

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::api::{ApiFlags, Query, encode_path};
use super::format::{kv, table_with_header};
use super::{CmdResult, Ctx, Failure, exit};

/// `nomad-rs acl`.
#[derive(Debug, Args)]
pub struct AclArgs {
    /// General options.
    #[command(flatten)]
    pub api: ApiFlags,
    /// The ACL command.
    #[command(subcommand)]
    pub command: AclCommand,
}

/// ACL commands.
#[derive(Debug, Subcommand)]
pub enum AclCommand {
    /// Create the initial management token (once; again only with the reset file).
    Bootstrap(BootstrapArgs),
    /// Write, show and remove ACL policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Create, show, update and remove ACL tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Create, show, update and remove ACL roles.
    #[command(subcommand)]
    Role(RoleCommand),
}

/// Flags of `acl bootstrap`.
#[derive(Debug, Args)]
pub struct BootstrapArgs {
    /// Print the token as JSON.
    #[arg(long)]
    pub json: bool,
    /// A file holding the secret to use (a UUID), or `-` for stdin.
    pub secret_file: Option<String>,
}

/// `acl policy` commands.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Create or update a policy from a file (`-` for stdin).
    Apply {
        /// Description.
        #[arg(long)]
        description: Option<String>,
        /// Policy name.
        name: String,
        /// Rules file (HCL or JSON), `-` for stdin.
        path: String,
    },
    /// List policies.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one policy with its rules.
    Info {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Policy name.
        name: String,
    },
    /// Delete a policy.
    Delete {
        /// Policy name.
        name: String,
    },
}

/// Flags shared by `token create` and `token update`.
#[derive(Debug, Args, Default)]
pub struct TokenFlags {
    /// Token name.
    #[arg(long)]
    pub name: Option<String>,
    /// `client` or `management`.
    #[arg(long = "type")]
    pub token_type: Option<String>,
    /// A policy to link (repeatable).
    #[arg(long = "policy")]
    pub policies: Vec<String>,
    /// A role to link by ID (repeatable).
    #[arg(long = "role-id")]
    pub role_ids: Vec<String>,
    /// A role to link by name (repeatable).
    #[arg(long = "role-name")]
    pub role_names: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `acl token` commands.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token.
    Create {
        /// Name, type, policies, roles.
        #[command(flatten)]
        flags: TokenFlags,
        /// Replicate to every region.
        #[arg(long)]
        global: bool,
        /// Lifetime (Go duration, e.g. `1h`).
        #[arg(long)]
        ttl: Option<String>,
    },
    /// List tokens.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a token by AccessorID.
    Info {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// AccessorID.
        accessor_id: String,
    },
    /// Show the token in use.
    #[command(name = "self")]
    SelfToken {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Update a token's name, type, policies or roles.
    Update {
        /// Name, type, policies, roles.
        #[command(flatten)]
        flags: TokenFlags,
        /// AccessorID.
        accessor_id: String,
    },
    /// Delete a token by AccessorID.
    Delete {
        /// AccessorID.
        accessor_id: String,
    },
}

/// Name, description and policies of `role create` and `role update`.
#[derive(Debug, Args, Default)]
pub struct RoleFlags {
    /// Role name.
    #[arg(long)]
    pub name: Option<String>,
    /// Description.
    #[arg(long)]
    pub description: Option<String>,
    /// A policy to link (repeatable).
    #[arg(long = "policy")]
    pub policies: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `acl role` commands.
#[derive(Debug, Subcommand)]
pub enum RoleCommand {
    /// Create a role linking policies.
    Create {
        /// Name, description, policies.
        #[command(flatten)]
        flags: RoleFlags,
    },
    /// List roles.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one role.
    Info {
        /// The argument is the role's name, not its ID.
        #[arg(long = "by-name")]
        by_name: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Role ID (or name with `-by-name`).
        id: String,
    },
    /// Update a role: the flags given are merged into it, or replace it with `-no-merge`.
    Update {
        /// Name, description, policies.
        #[command(flatten)]
        flags: RoleFlags,
        /// Replace the role with exactly the flags given.
        #[arg(long = "no-merge")]
        no_merge: bool,
        /// Role ID.
        id: String,
    },
    /// Delete a role by ID.
    Delete {
        /// Role ID.
        id: String,
    },
}

/// Runs an ACL command.
pub async fn run(a: AclArgs) -> CmdResult {
    let ctx = Ctx::new(&a.api)?;
    match a.command {
        AclCommand::Bootstrap(b) => bootstrap(&ctx, b).await,
        AclCommand::Policy(p) => policy(&ctx, p).await,
        AclCommand::Token(t) => token(&ctx, t).await,
        AclCommand::Role(r) => role(&ctx, r).await,
    }
}

fn read_input(path: &str) -> Result<String, Failure> {
    if path == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|e| Failure::new(format!("Error reading stdin: {e}")))?;
        Ok(s)
    } else {
        std::fs::read_to_string(path).map_err(|e| Failure::new(format!("Error reading file {path:?}: {e}")))
    }
}

fn print_json(v: &Value) {
    println!("{}", super::format::safe_json(&serde_json::to_string_pretty(v).unwrap_or_default()));
}

async fn bootstrap(ctx: &Ctx, b: BootstrapArgs) -> CmdResult {
    let body = match &b.secret_file {
        Some(f) => json!({ "BootstrapSecret": read_input(f)?.trim() }),
        None => json!({}),
    };
    let t: Value = ctx
        .client
        .post("/v1/acl/bootstrap", &Query::new(), &body)
        .await
        .map_err(|e| Failure::new(format!("Error bootstrapping: {e}")))?
        .value;
    show_token(&t, b.json);
    Ok(exit::OK)
}

async fn policy(ctx: &Ctx, p: PolicyCommand) -> CmdResult {
    match p {
        PolicyCommand::Apply { description, name, path } => {
            let rules = read_input(&path)?;
            let body = json!({ "Name": name, "Description": description.unwrap_or_default(), "Rules": rules });
            ctx.client
                .post::<Value>(&format!("/v1/acl/policy/{}", encode_path(&name)), &Query::new(), &body)
                .await
                .map_err(|e| Failure::new(format!("Error writing ACL policy: {e}")))?;
            println!("Successfully wrote {name:?} ACL policy!");
        }
        PolicyCommand::List { json } => {
            let list = ctx
                .client
                .get_json("/v1/acl/policies", &Query::new())
                .await
                .map_err(|e| Failure::new(format!("Error listing ACL policies: {e}")))?
                .value;
            if json {
                print_json(&list);
                return Ok(exit::OK);
            }
            let items = list.as_array().cloned().unwrap_or_default();
            if items.is_empty() {
                println!("No policies found");
            } else {
                let rows = items.iter().map(|p| vec![s(p, "Name"), s(p, "Description")]).collect();
                println!("{}", table_with_header(&["Name", "Description"], rows));
            }
        }
        PolicyCommand::Info { json, name } => {
            let p = ctx
                .client
                .get_json(&format!("/v1/acl/policy/{}", encode_path(&name)), &Query::new())
                .await
                .map_err(|e| Failure::new(format!("Error reading ACL policy: {e}")))?
                .value;
            if json {
                print_json(&p);
                return Ok(exit::OK);
            }
            println!(
                "{}",
                kv(&[
                    ("Name", s(&p, "Name")),
                    ("Description", s(&p, "Description")),
                    ("CreateIndex", n(&p, "CreateIndex")),
                    ("ModifyIndex", n(&p, "ModifyIndex"))
                ])
            );
            println!("\nRules\n\n{}", super::format::safe_lines(&s(&p, "Rules")));
        }
        PolicyCommand::Delete { name } => {
            ctx.client
                .delete::<Value>(&format!("/v1/acl/policy/{}", encode_path(&name)), &Query::new())
                .await
                .map_err(|e| Failure::new(format!("Error deleting ACL policy: {e}")))?;
            println!("Successfully deleted {name:?} ACL policy!");
        }
    }
    Ok(exit::OK)
}

fn token_body(flags: &TokenFlags) -> Value {
    let mut roles: Vec<Value> = flags.role_ids.iter().map(|id| json!({ "ID": id })).collect();
    roles.extend(flags.role_names.iter().map(|name| json!({ "Name": name })));
    json!({
        "Name": flags.name.clone().unwrap_or_default(),
        "Type": flags.token_type.clone().unwrap_or_else(|| "client".into()),
        "Policies": flags.policies,
        "Roles": roles,
    })
}

async fn token(ctx: &Ctx, t: TokenCommand) -> CmdResult {
    match t {
        TokenCommand::Create { flags, global, ttl } => {
            let mut body = token_body(&flags);
            body["Global"] = json!(global);
            if let Some(ttl) = ttl {
                body["ExpirationTTL"] = json!(ttl);
            }
            let tok: Value = ctx
                .client
                .post("/v1/acl/token", &Query::new(), &body)
                .await
                .map_err(|e| Failure::new(format!("Error creating token: {e}")))?
                .value;
            show_token(&tok, flags.json);
        }
        TokenCommand::List { json } => {
            let list = ctx
                .client
                .get_json("/v1/acl/tokens", &Query::new())
                .await
                .map_err(|e| Failure::new(format!("Error listing tokens: {e}")))?
                .value;
            if json {
                print_json(&list);
                return Ok(exit::OK);
            }
            let now = super::format::now_nanos();
            let rows = list
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|t| vec![s(t, "Name"), s(t, "Type"), b(t, "Global"), s(t, "AccessorID"), expired(t, now).to_string()])
                .collect();
            println!("{}", table_with_header(&["Name", "Type", "Global", "Accessor ID", "Expired"], rows));
        }
        TokenCommand::Info { json, accessor_id } => {
            let tok = ctx
                .client
                .get_json(&format!("/v1/acl/token/{}", encode_path(&accessor_id)), &Query::new())
                .await
                .map_err(|e| Failure::new(format!("Error fetching token: {e}")))?
                .value;
            show_token(&tok, json);
        }
        TokenCommand::SelfToken { json } => {
            let tok = ctx
                .client
                .get_json("/v1/acl/token/self", &Query::new())
                .await
                .map_err(|e| Failure::new(format!("Error fetching self token: {e}")))?
                .value;
            show_token(&tok, json);
        }
        TokenCommand::Update { flags, accessor_id } => {
            let path = format!("/v1/acl/token/{}", encode_path(&accessor_id));
            let old =
                ctx.client.get_json(&path, &Query::new()).await.map_err(|e| Failure::new(format!("Error fetching token: {e}")))?.value;
            let mut body = old.clone();
            if let Some(name) = &flags.name {
                body["Name"] = json!(name);
            }
            if let Some(ty) = &flags.token_type {
                body["Type"] = json!(ty);
            }
            if !flags.policies.is_empty() {
                body["Policies"] = json!(flags.policies);
            }
            if !flags.role_ids.is_empty() || !flags.role_names.is_empty() {
                body["Roles"] = token_body(&flags)["Roles"].clone();
            }
            if let Some(m) = body.as_object_mut() {
                m.remove("ExpirationTTL");
            }
            let tok: Value =
                ctx.client.post(&path, &Query::new(), &body).await.map_err(|e| Failure::new(format!("Error updating token: {e}")))?.value;
            show_token(&tok, flags.json);
        }
        TokenCommand::Delete { accessor_id } => {
            ctx.client
                .delete::<Value>(&format!("/v1/acl/token/{}", encode_path(&accessor_id)), &Query::new())
                .await
                .map_err(|e| Failure::new(format!("Error deleting token: {e}")))?;
            println!("Token {accessor_id} successfully deleted");
        }
    }
    Ok(exit::OK)
}

/// A role's policy links from names.
fn policy_links(names: &[String]) -> Value {
    Value::Array(names.iter().map(|name| json!({ "Name": name })).collect())
}

/// What `role create` and `role update -no-merge` need before anything is sent (Nomad's texts).
fn check_role_flags(flags: &RoleFlags) -> Result<(), Failure> {
    if flags.name.as_deref().unwrap_or("").is_empty() {
        return Err(Failure::new("ACL role name must be specified using the -name flag"));
    }
    if flags.policies.is_empty() {
        return Err(Failure::new("At least one policy name must be specified using the -policy flag"));
    }
    Ok(())
}

/// The role `role update` sends: `current` with the flags merged in (new policies appended),
/// or the flags alone with `no_merge`.
fn updated_role(current: &Value, flags: &RoleFlags, no_merge: bool) -> Result<Value, Failure> {
    if no_merge {
        check_role_flags(flags)?;
        return Ok(json!({
            "ID": current.get("ID").cloned().unwrap_or(Value::Null),
            "Name": flags.name,
            "Description": flags.description.clone().unwrap_or_default(),
            "Policies": policy_links(&flags.policies),
        }));
    }
    let (name, description) = (flags.name.as_deref().unwrap_or(""), flags.description.as_deref().unwrap_or(""));
    if flags.policies.is_empty() && name.is_empty() && description.is_empty() {
        return Err(Failure::new("Please provide at least one flag to update the ACL role"));
    }
    let mut role = current.clone();
    if !name.is_empty() {
        role["Name"] = json!(name);
    }
    if !description.is_empty() {
        role["Description"] = json!(description);
    }
    let mut links = current.get("Policies").and_then(Value::as_array).cloned().unwrap_or_default();
    for policy in &flags.policies {
        if !links.iter().any(|l| l.get("Name").and_then(Value::as_str) == Some(policy)) {
            links.push(json!({ "Name": policy }));
        }
    }
    role["Policies"] = Value::Array(links);
    Ok(role)
}

async fn role(ctx: &Ctx, r: RoleCommand) -> CmdResult {
    match r {
        RoleCommand::Create { flags } => {
            check_role_flags(&flags)?;
            let body = json!({
                "Name": flags.name,
                "Description": flags.description.clone().unwrap_or_default(),
                "Policies": policy_links(&flags.policies),
            });
            let role: Value = ctx
                .client
                .post("/v1/acl/role", &Query::new(), &body)
                .await
                .map_err(|e| Failure::new(format!("Error creating ACL role: {e}")))?
                .value;
            show_role(&role, flags.json);
        }
        RoleCommand::List { json } => {
            let list = ctx
                .client
                .get_json("/v1/acl/roles", &Query::new())
                .await
                .map_err(|e| Failure::new(format!("Error listing ACL roles: {e}")))?
                .value;
            if json {
                print_json(&list);
                return Ok(exit::OK);
            }
            let items = list.as_array().cloned().unwrap_or_default();
            if items.is_empty() {
                println!("No ACL roles found");
            } else {
                let rows = items.iter().map(|r| vec![s(r, "ID"), s(r, "Name"), s(r, "Description"), role_policies(r)]).collect();
                println!("{}", table_with_header(&["ID", "Name", "Description", "Policies"], rows));
            }
        }
        RoleCommand::Info { by_name, json, id } => {
            let path =
                if by_name { format!("/v1/acl/role/name/{}", encode_path(&id)) } else { format!("/v1/acl/role/{}", encode_path(&id)) };
            let role =
                ctx.client.get_json(&path, &Query::new()).await.map_err(|e| Failure::new(format!("Error reading ACL role: {e}")))?.value;
            show_role(&role, json);
        }
        RoleCommand::Update { flags, no_merge, id } => {
            let path = format!("/v1/acl/role/{}", encode_path(&id));
            let current = ctx
                .client
                .get_json(&path, &Query::new())
                .await
                .map_err(|e| Failure::new(format!("Error when retrieving ACL role: {e}")))?
                .value;
            let body = updated_role(&current, &flags, no_merge)?;
            let role: Value = ctx
                .client
                .post(&path, &Query::new(), &body)
                .await
                .map_err(|e| Failure::new(format!("Error updating ACL role: {e}")))?
                .value;
            show_role(&role, flags.json);
        }
        RoleCommand::Delete { id } => {
            ctx.client
                .delete::<Value>(&format!("/v1/acl/role/{}", encode_path(&id)), &Query::new())
                .await
                .map_err(|e| Failure::new(format!("Error deleting ACL role: {e}")))?;
            println!("ACL role {id} successfully deleted");
        }
    }
    Ok(exit::OK)
}

/// A role's policy names, sorted, comma-separated (as Nomad prints them).
fn role_policies(r: &Value) -> String {
    let mut names: Vec<&str> =
        r.get("Policies").and_then(Value::as_array).into_iter().flatten().filter_map(|l| l.get("Name").and_then(Value::as_str)).collect();
    names.sort_unstable();
    names.join(",")
}

/// Nomad's role block (`formatACLRole`).
pub fn render_role(r: &Value) -> String {
    kv(&[
        ("ID", s(r, "ID")),
        ("Name", s(r, "Name")),
        ("Description", s(r, "Description")),
        ("Policies", role_policies(r)),
        ("Create Index", n(r, "CreateIndex")),
        ("Modify Index", n(r, "ModifyIndex")),
    ])
}

fn show_role(r: &Value, json: bool) {
    if json {
        print_json(r);
    } else {
        println!("{}", render_role(r));
    }
}

fn s(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or("").to_string()
}

fn n(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_u64).unwrap_or(0).to_string()
}

fn b(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_bool).unwrap_or(false).to_string()
}

fn time_ns(v: &Value, k: &str) -> Option<i64> {
    let t = v.get(k)?.as_str()?;
    nomad_proto::Timestamp::parse_rfc3339(t).ok().map(|t| t.unix_nanos()).filter(|n| *n != 0)
}

fn expired(t: &Value, now: i64) -> bool {
    time_ns(t, "ExpirationTime").is_some_and(|e| e < now)
}

/// Nomad's token block (`formatToken`).
pub fn render_token(t: &Value) -> String {
    let list = |k: &str, field: Option<&str>| {
        let items: Vec<String> = t
            .get(k)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| {
                        match field {
                            Some(f) => x.get(f).and_then(Value::as_str),
                            None => x.as_str(),
                        }
                        .map(str::to_string)
                    })
                    .collect()
            })
            .unwrap_or_default();
        if items.is_empty() { "n/a".to_string() } else { items.join(", ") }
    };
    let time = |k: &str| time_ns(t, k).map_or_else(|| "<none>".to_string(), super::format::format_time);
    kv(&[
        ("Accessor ID", s(t, "AccessorID")),
        ("Secret ID", s(t, "SecretID")),
        ("Name", s(t, "Name")),
        ("Type", s(t, "Type")),
        ("Global", b(t, "Global")),
        ("Create Time", time("CreateTime")),
        ("Expiry Time", time("ExpirationTime")),
        ("Create Index", n(t, "CreateIndex")),
        ("Modify Index", n(t, "ModifyIndex")),
        ("Policies", list("Policies", None)),
        ("Roles", list("Roles", Some("Name"))),
    ])
}

fn show_token(t: &Value, json: bool) {
    if json {
        print_json(t);
    } else {
        println!("{}", render_token(t));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_merged_role_update_keeps_what_is_not_given_and_appends_new_policies_once() {
        let current =
            json!({"ID": "r1", "Name": "ops", "Description": "old", "Policies": [{"Name": "b"}, {"Name": "a"}], "CreateIndex": 3});
        let flags = RoleFlags { description: Some("new".into()), policies: vec!["a".into(), "c".into()], ..RoleFlags::default() };
        let merged = updated_role(&current, &flags, false).unwrap();
        assert_eq!(merged["Name"], "ops");
        assert_eq!(merged["Description"], "new");
        assert_eq!(merged["Policies"], json!([{"Name": "b"}, {"Name": "a"}, {"Name": "c"}]));
        assert_eq!(role_policies(&merged), "a,b,c");

        let none = updated_role(&current, &RoleFlags::default(), false).unwrap_err();
        assert!(none.message.contains("Please provide at least one flag to update the ACL role"), "{}", none.message);
        let unnamed = updated_role(&current, &flags, true).unwrap_err();
        assert!(unnamed.message.contains("ACL role name must be specified using the -name flag"), "{}", unnamed.message);
        let replaced =
            updated_role(&current, &RoleFlags { name: Some("dev".into()), policies: vec!["c".into()], ..RoleFlags::default() }, true)
                .unwrap();
        assert_eq!(replaced, json!({"ID": "r1", "Name": "dev", "Description": "", "Policies": [{"Name": "c"}]}));
    }

    #[test]
    fn token_block_has_nomads_keys() {
        let t = json!({"AccessorID": "a", "SecretID": "s", "Name": "Bootstrap Token", "Type": "management", "Global": true,
            "CreateTime": "2024-01-02T03:04:05Z", "ExpirationTime": null, "CreateIndex": 7, "ModifyIndex": 7, "Policies": [], "Roles": []});
        let out = render_token(&t);
        let keys: Vec<&str> = out.lines().map(|l| l.split(" = ").next().unwrap().trim_end()).collect();
        assert_eq!(
            keys,
            [
                "Accessor ID",
                "Secret ID",
                "Name",
                "Type",
                "Global",
                "Create Time",
                "Expiry Time",
                "Create Index",
                "Modify Index",
                "Policies",
                "Roles"
            ]
        );
        assert!(
            out.contains("Expiry Time  = <none>") && out.contains("Policies     = n/a") && out.contains("Global       = true"),
            "{out}"
        );
    }
}
