use proptest::prelude::*;

use std::sync::Arc;

use super::*;

fn acl(rules: &[&str]) -> Acl {
    let parsed: Vec<Policy> = rules.iter().map(|r| Policy::parse(r).unwrap()).collect();
    Acl::compile(&parsed)
}

#[test]
fn namespace_policies_expand_as_nomad_does() {
    let a = acl(&[r#"namespace "default" { policy = "read" }"#]);
    for c in [
        "list-jobs",
        "parse-job",
        "read-job",
        "csi-list-volume",
        "csi-read-volume",
        "read-job-scaling",
        "list-scaling-policies",
        "read-scaling-policy",
    ] {
        assert!(a.allow_namespace_op("default", c), "{c}");
    }
    assert!(!a.allow_namespace_op("default", "submit-job"));
    assert!(!a.allow_namespace_op("other", "read-job"));

    let w = acl(&[r#"namespace "default" { policy = "write" }"#]);
    for c in [
        "read-job",
        "submit-job",
        "dispatch-job",
        "read-logs",
        "read-fs",
        "alloc-exec",
        "alloc-lifecycle",
        "csi-mount-volume",
        "csi-write-volume",
        "scale-job",
        "submit-recommendation",
    ] {
        assert!(w.allow_namespace_op("default", c), "{c}");
    }
    for c in ["alloc-node-exec", "csi-register-plugin", "sentinel-override"] {
        assert!(!w.allow_namespace_op("default", c), "write never implies {c}");
    }
    let s = acl(&[r#"namespace "default" { policy = "scale" }"#]);
    assert!(s.allow_namespace_op("default", "scale-job"));
    assert!(!s.allow_namespace_op("default", "read-job"));

    let c = acl(&["namespace \"default\" {\n policy = \"read\"\n capabilities = [\"alloc-node-exec\"]\n}"]);
    assert!(c.allow_namespace_op("default", "alloc-node-exec") && c.allow_namespace_op("default", "read-job"));
}

#[test]
fn deny_wins_across_policies_in_any_order() {
    let write = r#"namespace "default" { policy = "write" }"#;
    let deny = r#"namespace "default" { capabilities = ["deny"] }"#;
    assert!(!acl(&[write, deny]).allow_namespace_op("default", "read-job"));
    assert!(!acl(&[deny, write]).allow_namespace_op("default", "read-job"));
    assert!(!acl(&[r#"node { policy = "write" }"#, r#"node { policy = "deny" }"#]).allow_node(false));
}

#[test]
fn exact_beats_glob_and_closest_glob_wins() {
    let a = acl(&[r#"
        namespace "prod-*" { policy = "deny" }
        namespace "prod-api" { policy = "read" }
        namespace "*-api-services" { policy = "write" }
        namespace "prod-api-*" { policy = "read" }
        namespace "*" { policy = "read" }
    "#]);
    assert!(a.allow_namespace_op("prod-api", "read-job"), "exact beats a glob deny");
    assert!(a.allow_namespace_op("prod-api-services", "submit-job"), "*-api-services beats prod-api-*");
    assert!(!a.allow_namespace_op("prod-web", "read-job"), "prod-* beats *");
    assert!(a.allow_namespace_op("dev", "read-job"));
    assert!(a.allow_namespace_op("*", "submit-job"), "`*` passes when any namespace allows");
    assert!(!a.allow_namespace_op("*", "alloc-node-exec"));
}

#[test]
fn variables_paths_host_volumes_node_pools_and_coarse_blocks() {
    let a = acl(&[r#"
        namespace "default" {
          variables {
            path "app/*" { capabilities = ["read"] }
            path "app/secret" { capabilities = ["deny"] }
            path "*" { capabilities = ["write", "list"] }
          }
        }
        host_volume "data-*" { policy = "read" }
        host_volume "data-rw" { policy = "write" }
        node_pool "gpu_a" { policy = "write" }
        agent { policy = "read" }
        node { policy = "write" }
        operator { policy = "read" }
        plugin { policy = "list" }
    "#]);
    assert!(a.allow_variable_op("default", "app/x", "read") && a.allow_variable_op("default", "app/x", "list"));
    assert!(!a.allow_variable_op("default", "app/x", "write"));
    assert!(!a.allow_variable_op("default", "app/secret", "read"));
    assert!(a.allow_variable_op("default", "other", "write"));
    assert!(!a.allow_variable_op("prod", "other", "write"));
    assert!(a.allow_host_volume_op("data-1", "mount-readonly") && !a.allow_host_volume_op("data-1", "mount-readwrite"));
    assert!(a.allow_host_volume_op("data-rw", "mount-readwrite"));
    assert!(a.allow_node_pool_op("gpu_a", "delete") && !a.allow_node_pool_op("cpu", "read"));
    assert!(a.allow_agent(false) && !a.allow_agent(true));
    assert!(a.allow_node(true));
    assert!(a.allow_operator(false) && !a.allow_operator(true));
    assert!(a.allow_plugin_list() && !a.allow_plugin_read());
    assert!(!a.allow_quota(false));
    assert!(Acl::management().allow_namespace_op("x", "alloc-node-exec") && Acl::management().allow_operator(true));
}

#[test]
fn json_policies_parse_like_hcl() {
    let hcl = Policy::parse("namespace \"default\" {\n policy = \"read\"\n capabilities = [\"alloc-exec\"]\n}\nnode { policy = \"read\" }")
        .unwrap();
    let json =
        Policy::parse(r#"{"namespace": {"default": {"policy": "read", "capabilities": ["alloc-exec"]}}, "node": {"policy": "read"}}"#)
            .unwrap();
    assert_eq!(hcl, json);
}

#[test]
fn bad_policies_get_nomads_errors() {
    let err = |r: &str| Policy::parse(r).unwrap_err().0;
    // Empty rules grant nothing; blank or meaningless ones are refused.
    assert_eq!(Policy::parse("").unwrap(), Policy::default());
    assert_eq!(err(" \n"), "Invalid policy");
    assert_eq!(err("foo = 1"), "Invalid policy");
    assert!(err("namespace \"x\" {").starts_with("Failed to parse ACL Policy: "), "{}", err("namespace \"x\" {"));
    assert!(err("namespace { policy = \"read\" }").starts_with("Failed to parse ACL Policy: "), "unlabelled namespace refused");
    assert!(err(r#"{"namespace": {"policy": "read"}}"#).starts_with("Failed to parse ACL Policy: "), "unlabelled JSON namespace refused");
    assert!(err(r#"host_volume { policy = "read" }"#).starts_with("Failed to parse ACL Policy: "));
    assert_eq!(err(r#"namespace "x" { policy = "admin" }"#), "Invalid namespace policy: \"admin\"");
    assert_eq!(err(r#"namespace "x" { capabilities = ["fly"] }"#), "Invalid namespace capability 'fly'");
    assert_eq!(err(r#"namespace "a b" { policy = "read" }"#), "Invalid namespace name: \"a b\"");
    assert!(err("namespace \"x\" {\n variables {\n }\n}").starts_with("Invalid variable policy"));
    assert!(
        err("namespace \"x\" {\n variables {\n  path { capabilities = [\"read\"] }\n }\n}").starts_with("Failed to parse ACL Policy: ")
    );
    assert_eq!(err(r#"plugin { policy = "write" }"#), "Invalid plugin policy: \"write\"");
    assert!(Policy::parse(r#"node_pool "a_b" { policy = "read" }"#).is_ok());
    assert!(Policy::parse(r#"host_volume "a_b" { policy = "read" }"#).is_err());
    assert!(valid_policy_name("ops-read") && !valid_policy_name("ops_read") && !valid_policy_name(""));
}

#[test]
fn token_hash_and_json_shape() {
    let mut t = AclToken {
        accessor_id: "a".into(),
        secret_id: "s".into(),
        name: "n".into(),
        token_type: CLIENT.into(),
        policies: vec!["p".into()],
        expiration_ttl: 3_600_000_000_000,
        ..AclToken::default()
    };
    t.set_hash();
    let h1 = t.hash.clone();
    assert_eq!(base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &h1).unwrap().len(), 32);
    t.global = true;
    t.set_hash();
    assert_ne!(t.hash, h1, "global is hashed");
    let v = serde_json::to_value(&t).unwrap();
    assert_eq!(v["ExpirationTTL"], "1h0m0s");
    assert_eq!(v["ExpirationTime"], serde_json::Value::Null);
    assert!(t.stub().get("SecretID").is_none() && t.stub().get("ExpirationTTL").is_none());
    let back: AclToken = serde_json::from_value(serde_json::json!({"ExpirationTTL": "10m", "Type": "client"})).unwrap();
    assert_eq!(back.expiration_ttl, 600_000_000_000);
    let back: AclToken = serde_json::from_value(serde_json::json!({"ExpirationTTL": 5_000_000_000i64})).unwrap();
    assert_eq!(back.expiration_ttl, 5_000_000_000);
    assert_eq!(go_duration::format(90_000_000_000), "1m30s");
}

#[test]
fn glob_matching() {
    assert!(glob_match("*", "") && glob_match("a*c", "abbc") && glob_match("*-api-*", "prod-api-x"));
    assert!(!glob_match("a*c", "abcd") && !glob_match("prod", "prod-x"));
}

fn label() -> impl Strategy<Value = String> {
    "[ab-]{1,6}"
}

fn glob() -> impl Strategy<Value = String> {
    "[ab*-]{1,6}"
}

fn level() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("deny"), Just("read"), Just("write"), Just("scale")]
}

fn rules(entries: &[(String, &str)]) -> String {
    entries.iter().map(|(l, p)| format!("namespace {l:?} {{ policy = {p:?} }}\n")).collect()
}

proptest! {
    /// An exact label decides, whatever globs (deny included) say; the order of policies never matters.
    #[test]
    fn exact_label_decides(ns in label(), globs in prop::collection::vec((glob(), level()), 0..6), exact in level()) {
        let globs: Vec<(String, &str)> = globs.into_iter().filter(|(g, _)| g.contains('*')).collect();
        let mut entries = globs.clone();
        entries.push((ns.clone(), exact));
        let a = Acl::compile(&[Policy::parse(&rules(&entries)).unwrap()]);
        let alone = Acl::compile(&[Policy::parse(&rules(&[(ns.clone(), exact)])).unwrap()]);
        for cap in ["read-job", "submit-job", "scale-job"] {
            prop_assert_eq!(a.allow_namespace_op(&ns, cap), alone.allow_namespace_op(&ns, cap));
        }
        // One policy per rule, forwards and backwards: same answers.
        let split: Vec<Policy> = entries.iter().map(|e| Policy::parse(&rules(std::slice::from_ref(e))).unwrap()).collect();
        let mut rev = split.clone();
        rev.reverse();
        let (f, b) = (Acl::compile(&split), Acl::compile(&rev));
        for probe in [ns.as_str(), "a", "b-a", "ab"] {
            for cap in ["read-job", "submit-job"] {
                prop_assert_eq!(f.allow_namespace_op(probe, cap), b.allow_namespace_op(probe, cap));
            }
        }
    }

    /// Among globs, one whose literal part covers more of the name beats the bare `*`, and a
    /// name no label matches gets nothing.
    #[test]
    fn closest_glob_wins(prefix in label(), rest in label(), closer in level(), wide in level()) {
        let ns = format!("{prefix}{rest}");
        let entries = vec![("*".to_string(), wide), (format!("{prefix}*"), closer)];
        let a = Acl::compile(&[Policy::parse(&rules(&entries)).unwrap()]);
        let only = Acl::compile(&[Policy::parse(&rules(&[(format!("{prefix}*"), closer)])).unwrap()]);
        for cap in ["read-job", "submit-job", "scale-job"] {
            prop_assert_eq!(a.allow_namespace_op(&ns, cap), only.allow_namespace_op(&ns, cap));
        }
        let none = Acl::compile(&[Policy::parse(&rules(&[(format!("{prefix}x*"), "write")])).unwrap()]);
        prop_assert!(!none.allow_namespace_op(&ns, "read-job"));
    }
}

#[test]
fn compiled_acls_are_reused_until_a_policy_changes() {
    use crate::state::StateStore;
    let store = StateStore::new();
    let policy = |rules: &str| AclPolicy { name: "p".into(), rules: rules.into(), ..AclPolicy::default() };
    let token = AclToken {
        accessor_id: "a".into(),
        secret_id: "s".into(),
        token_type: CLIENT.into(),
        policies: vec!["p".into()],
        ..AclToken::default()
    };
    store
        .write(1, |txn| {
            txn.upsert_acl_policies(&[policy(r#"namespace "default" { policy = "read" }"#)]);
            txn.upsert_acl_tokens(std::slice::from_ref(&token));
            Ok(())
        })
        .unwrap();
    let now = nomad_proto::Timestamp::now();
    let first = super::resolve(&store.snapshot(), &crate::keyring::Keyring::default(), "s", now).unwrap().acl;
    let again = super::resolve(&store.snapshot(), &crate::keyring::Keyring::default(), "s", now).unwrap().acl;
    assert!(Arc::ptr_eq(&first, &again), "the same policies were compiled twice");
    assert!(first.allow_namespace_op("default", "read-job"));
    store
        .write(2, |txn| {
            txn.upsert_acl_policies(&[policy(r#"namespace "default" { policy = "deny" }"#)]);
            Ok(())
        })
        .unwrap();
    let changed = super::resolve(&store.snapshot(), &crate::keyring::Keyring::default(), "s", now).unwrap().acl;
    assert!(!changed.allow_namespace_op("default", "read-job"), "a changed policy was served from the cache");
}
