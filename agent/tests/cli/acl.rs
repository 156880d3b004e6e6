//! `acl bootstrap`, `acl policy ...` and `acl token ...` against an in-process server with ACLs on.

use nomad_server::acl::AclConfig;
use nomad_server::testing::TestServer;

use crate::support::{Api, Run, nomad_with};

async fn acl_api() -> Api {
    let mut ts = TestServer::new();
    ts.endpoints = ts.endpoints.clone().with_acl(AclConfig { enabled: true, ..AclConfig::default() });
    Api::serving(ts).await
}

async fn as_token(api: &Api, token: &str, args: &[&str]) -> Run {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["-address", &api.addr]);
    nomad_with(&all, &[("NOMAD_TOKEN", token)], "").await
}

fn field(out: &str, key: &str) -> String {
    out.lines()
        .find_map(|l| l.split_once(" = ").filter(|(k, _)| k.trim_end() == key).map(|(_, v)| v.trim().to_string()))
        .unwrap_or_else(|| panic!("no {key} in\n{out}"))
}

#[tokio::test]
async fn bootstrap_policies_and_tokens_from_the_cli() {
    let api = acl_api().await;
    let boot = api.nomad(&["acl", "bootstrap"]).await;
    boot.expect_code(0)
        .stdout_has("Name         = Bootstrap Token")
        .stdout_has("Type         = management")
        .stdout_has("Global       = true");
    let mgmt = field(&boot.stdout, "Secret ID");
    api.nomad(&["acl", "bootstrap"]).await.expect_code(1).stderr_has("ACL bootstrap already done");

    // Without a token the management routes refuse.
    api.nomad(&["acl", "token", "list"]).await.expect_code(1).stderr_has("403").stderr_has("Permission denied");

    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("read.hcl");
    std::fs::write(&rules, "namespace \"default\" { policy = \"read\" }\nnode { policy = \"read\" }\n").unwrap();
    as_token(&api, &mgmt, &["acl", "policy", "apply", "-description", "Read all", "readers", rules.to_str().unwrap()])
        .await
        .expect_code(0)
        .stdout_has("Successfully wrote \"readers\" ACL policy!");
    as_token(&api, &mgmt, &["acl", "policy", "list"]).await.expect_code(0).stdout_has("Name     Description\nreaders  Read all");
    as_token(&api, &mgmt, &["acl", "policy", "info", "readers"])
        .await
        .expect_code(0)
        .stdout_has("Name        = readers")
        .stdout_has("Rules\n\nnamespace \"default\" { policy = \"read\" }");

    let created = as_token(&api, &mgmt, &["acl", "token", "create", "-name", "reader", "-policy", "readers", "-ttl", "1h"]).await;
    created.expect_code(0).stdout_has("Policies     = readers").stdout_has("Type         = client");
    let secret = field(&created.stdout, "Secret ID");
    let accessor = field(&created.stdout, "Accessor ID");
    assert_ne!(field(&created.stdout, "Expiry Time"), "<none>");

    as_token(&api, &secret, &["acl", "token", "self"]).await.expect_code(0).stdout_has(&format!("Accessor ID  = {accessor}"));
    as_token(&api, &secret, &["node", "status"]).await.expect_code(0);
    as_token(&api, &secret, &["acl", "token", "list"]).await.expect_code(1).stderr_has("Permission denied");
    as_token(&api, &mgmt, &["acl", "token", "list"])
        .await
        .expect_code(0)
        .stdout_has("Name             Type        Global  Accessor ID")
        .stdout_has(&accessor);
    as_token(&api, &mgmt, &["acl", "token", "update", "-name", "renamed", &accessor])
        .await
        .expect_code(0)
        .stdout_has("Name         = renamed");
    as_token(&api, &mgmt, &["acl", "token", "info", &accessor]).await.expect_code(0).stdout_has(&format!("Secret ID    = {secret}"));
    as_token(&api, &mgmt, &["acl", "token", "delete", &accessor])
        .await
        .expect_code(0)
        .stdout_has(&format!("Token {accessor} successfully deleted"));
    as_token(&api, &secret, &["node", "status"]).await.expect_code(1).stderr_has("ACL token not found");
    as_token(&api, &mgmt, &["acl", "policy", "delete", "readers"])
        .await
        .expect_code(0)
        .stdout_has("Successfully deleted \"readers\" ACL policy!");
    as_token(&api, &mgmt, &["acl", "policy", "list"]).await.expect_code(0).stdout_has("No policies found");
}

#[tokio::test]
async fn roles_from_the_cli_link_policies_to_tokens() {
    let api = acl_api().await;
    let boot = api.nomad(&["acl", "bootstrap"]).await;
    let mgmt = field(&boot.stdout, "Secret ID");
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("read.hcl");
    std::fs::write(&rules, "namespace \"default\" { policy = \"read\" }\nnode { policy = \"read\" }\n").unwrap();
    for name in ["readers", "writers"] {
        as_token(&api, &mgmt, &["acl", "policy", "apply", name, rules.to_str().unwrap()]).await.expect_code(0);
    }

    // Checked before anything is sent, with Nomad's texts.
    as_token(&api, &mgmt, &["acl", "role", "create", "-policy", "readers"])
        .await
        .expect_code(1)
        .stderr_has("ACL role name must be specified using the -name flag");
    as_token(&api, &mgmt, &["acl", "role", "create", "-name", "ops"])
        .await
        .expect_code(1)
        .stderr_has("At least one policy name must be specified using the -policy flag");
    as_token(&api, &mgmt, &["acl", "role", "create", "-name", "ops", "-policy", "missing"])
        .await
        .expect_code(1)
        .stderr_has("Error creating ACL role")
        .stderr_has("cannot find policy missing");

    let created =
        as_token(&api, &mgmt, &["acl", "role", "create", "-name", "ops", "-description", "Operators", "-policy", "readers"]).await;
    created.expect_code(0).stdout_has("Name         = ops").stdout_has("Description  = Operators").stdout_has("Policies     = readers");
    let id = field(&created.stdout, "ID");
    as_token(&api, &mgmt, &["acl", "role", "list"])
        .await
        .expect_code(0)
        .stdout_has("ID")
        .stdout_has(&format!("{id}  ops   Operators    readers"));
    as_token(&api, &mgmt, &["acl", "role", "info", "-by-name", "ops"]).await.expect_code(0).stdout_has(&format!("ID           = {id}"));

    // Merged: the policy is added and the rest kept; -no-merge replaces.
    as_token(&api, &mgmt, &["acl", "role", "update", &id]).await.expect_code(1).stderr_has("Please provide at least one flag");
    as_token(&api, &mgmt, &["acl", "role", "update", "-policy", "writers", &id])
        .await
        .expect_code(0)
        .stdout_has("Description  = Operators")
        .stdout_has("Policies     = readers,writers");
    as_token(&api, &mgmt, &["acl", "role", "update", "-no-merge", "-name", "ops2", "-policy", "writers", &id])
        .await
        .expect_code(0)
        .stdout_has("Name         = ops2")
        .stdout_has("Description  =\n")
        .stdout_has("Policies     = writers");

    // A token linked to the role by name gets its policies.
    let created = as_token(&api, &mgmt, &["acl", "token", "create", "-name", "via-role", "-role-name", "ops2"]).await;
    created.expect_code(0).stdout_has("Roles        = ops2");
    let secret = field(&created.stdout, "Secret ID");
    as_token(&api, &secret, &["node", "status"]).await.expect_code(0);
    as_token(&api, &secret, &["acl", "role", "info", &id]).await.expect_code(0).stdout_has("Name         = ops2");

    as_token(&api, &mgmt, &["acl", "role", "delete", &id]).await.expect_code(0).stdout_has(&format!("ACL role {id} successfully deleted"));
    as_token(&api, &mgmt, &["acl", "role", "list"]).await.expect_code(0).stdout_has("No ACL roles found");
    as_token(&api, &mgmt, &["acl", "role", "info", &id]).await.expect_code(1).stderr_has("Error reading ACL role");
}
