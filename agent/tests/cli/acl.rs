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
