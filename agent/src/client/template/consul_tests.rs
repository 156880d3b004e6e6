use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::json;

use super::super::render::{Compiled, RenderContext, Rendered};
use super::super::{Answer, Dependency, Store};
use super::*;

fn compile(store: &Arc<Store>, src: &str) -> Compiled {
    let ctx = RenderContext {
        store: store.clone(),
        namespace: "default".into(),
        env: Arc::new(BTreeMap::new()),
        denylist: Vec::new(),
        task_dir: PathBuf::from("/alloc/web"),
        sandbox_disabled: false,
        consul: true,
    };
    Compiled::new("t", src, "{{", "}}", false, &ctx).unwrap()
}

fn key(k: &str, block: bool) -> Dependency {
    Dependency::ConsulKey { key: k.into(), dc: String::new(), block }
}

/// Consul's `/v1/kv` answer for one entry (values travel base64-encoded).
fn kv(entries: &[(&str, &str)]) -> Answer {
    Some(json!(
        entries
            .iter()
            .map(|(k, v)| json!({"Key": k, "Value": crate::client::base64::encode(v.as_bytes()), "Flags": 0, "LockIndex": 0, "CreateIndex": 5, "ModifyIndex": 6}))
            .collect::<Vec<_>>()
    ))
}

#[test]
fn key_blocks_until_the_key_exists_and_key_or_default_does_not() {
    let store = Arc::new(Store::default());
    let t = compile(&store, r#"{{ key "app/db/host" }}:{{ keyOrDefault "app/db/port" "5432" }}:{{ keyExists "app/db/host" }}"#);
    assert_eq!(
        t.render().unwrap(),
        Rendered::Missing([key("app/db/host", true), key("app/db/port", false), key("app/db/host", false)].into())
    );
    store.set(key("app/db/host", true), None);
    store.set(key("app/db/port", false), None);
    store.set(key("app/db/host", false), None);
    assert_eq!(t.render().unwrap(), Rendered::Missing([key("app/db/host", true)].into()), "`key` waits for the key");
    store.set(key("app/db/host", true), kv(&[("app/db/host", "db.internal")]));
    store.set(key("app/db/host", false), kv(&[("app/db/host", "db.internal")]));
    assert_eq!(t.render().unwrap(), Rendered::Complete("db.internal:5432:true".into()));
    store.set(key("app/db/port", false), kv(&[("app/db/port", "6543")]));
    assert_eq!(t.render().unwrap(), Rendered::Complete("db.internal:6543:true".into()));
}

#[test]
fn a_key_names_its_datacenter_and_a_bad_one_is_an_error() {
    let store = Arc::new(Store::default());
    let t = compile(&store, r#"{{ key "/app/x@east-1" }}"#);
    let want = Dependency::ConsulKey { key: "app/x".into(), dc: "east-1".into(), block: true };
    assert_eq!(t.render().unwrap(), Rendered::Missing([want.clone()].into()));
    assert_eq!(want.to_string(), "kv.block(app/x@east-1)");
    let err = compile(&store, r#"{{ key "app@bad dc" }}"#).render().unwrap_err();
    assert!(err.contains("error calling key: kv: invalid format"), "{err}");
}

#[test]
fn ls_lists_direct_children_and_tree_every_key_without_folders() {
    let store = Arc::new(Store::default());
    let list = Dependency::ConsulKeys { prefix: "app/".into(), dc: String::new() };
    store.set(list.clone(), kv(&[("app/", ""), ("app/a", "1"), ("app/b", "2"), ("app/sub/", ""), ("app/sub/c", "3")]));
    let ls = compile(&store, r#"{{ range ls "app/" }}{{ .Key }}={{ .Value }} {{ end }}"#);
    assert_eq!(ls.render().unwrap(), Rendered::Complete("a=1 b=2 ".into()));
    let tree = compile(&store, r#"{{ range tree "app/" }}{{ .Key }}={{ .Value }}({{ .Path }}) {{ end }}"#);
    assert_eq!(tree.render().unwrap(), Rendered::Complete("a=1(app/a) b=2(app/b) sub/c=3(app/sub/c) ".into()));
}

#[test]
fn safe_ls_and_safe_tree_wait_while_the_prefix_is_empty_and_ls_does_not() {
    let store = Arc::new(Store::default());
    let list = Dependency::ConsulKeys { prefix: "cfg".into(), dc: String::new() };
    store.set(list.clone(), Some(json!([])));
    assert_eq!(compile(&store, r#"[{{ range ls "cfg" }}{{ .Key }}{{ end }}]"#).render().unwrap(), Rendered::Complete("[]".into()));
    for f in ["safeLs", "safeTree"] {
        let t = compile(&store, &format!(r#"{{{{ range {f} "cfg" }}}}{{{{ .Key }}}}{{{{ end }}}}"#));
        assert_eq!(t.render().unwrap(), Rendered::Missing([list.clone()].into()), "{f}");
    }
    store.set(list, kv(&[("cfg/x", "1")]));
    assert_eq!(compile(&store, r#"{{ range safeTree "cfg" }}{{ .Key }}{{ end }}"#).render().unwrap(), Rendered::Complete("x".into()));
}

fn entry(node: &str, id: &str, addr: &str, port: u16, tags: &[&str], statuses: &[&str]) -> serde_json::Value {
    json!({
        "Node": {"ID": format!("{node}-id"), "Node": node, "Address": "10.0.0.9", "Datacenter": "dc1", "TaggedAddresses": {}, "Meta": {}},
        "Service": {"ID": id, "Service": "web", "Tags": tags, "Address": addr, "Port": port, "Meta": {"v": "1"}, "Weights": {"Passing": 1, "Warning": 1}},
        "Checks": statuses.iter().enumerate().map(|(i, s)| json!({"CheckID": format!("c{i}"), "Status": s})).collect::<Vec<_>>(),
    })
}

#[test]
fn service_keeps_passing_instances_sorted_by_node_then_id_with_the_node_address_as_fallback() {
    let store = Arc::new(Store::default());
    let dep = service_ref("web").unwrap();
    assert_eq!(dep.to_string(), "health.service(web|passing)");
    store.set(
        dep,
        Some(json!([
            entry("n2", "b", "", 81, &["z", "a"], &["passing"]),
            entry("n1", "c", "10.0.0.1", 80, &[], &["passing", "passing"]),
            entry("n2", "a", "10.0.0.2", 82, &[], &["warning"]),
        ])),
    );
    let t = compile(&store, r#"{{ range service "web" }}{{ .Node }}/{{ .ID }}@{{ .Address }}:{{ .Port }}{{ .Tags }} {{ end }}"#);
    assert_eq!(t.render().unwrap(), Rendered::Complete("n1/c@10.0.0.1:80[] n2/b@10.0.0.9:81[a z] ".into()), "the warning one is left out");
}

#[test]
fn service_filters_take_both_forms_and_name_tags_datacenters_and_near() {
    let any = service_ref("web|any").unwrap();
    assert_eq!(service_ref("web|any").unwrap(), any);
    let store = Arc::new(Store::default());
    store.set(any.clone(), Some(json!([entry("n1", "a", "", 1, &[], &["critical"]), entry("n1", "b", "", 2, &[], &["warning"])])));
    let t = compile(&store, r#"{{ range service "web" "any" }}{{ .ID }}={{ .Status }} {{ end }}"#);
    assert_eq!(t.render().unwrap(), Rendered::Complete("a=critical b=warning ".into()));
    let d = service_ref("v1.web@east~n1|warning,critical").unwrap();
    assert_eq!(
        d,
        Dependency::ConsulService {
            name: "web".into(),
            tag: "v1".into(),
            dc: "east".into(),
            near: "n1".into(),
            filters: vec!["critical".into(), "warning".into()]
        }
    );
    assert_eq!(d.to_string(), "health.service(v1.web@east~n1|critical,warning)");
    assert_eq!(service_ref("web|sick").unwrap_err(), "health.service: invalid filter: \"sick\" in \"web|sick\"");
    let err = compile(&store, r#"{{ service "bad name!" }}"#).render().unwrap_err();
    assert!(err.contains("error calling service: health.service: invalid format"), "{err}");
}

#[test]
fn services_lists_the_catalog_by_name_with_sorted_tags() {
    let store = Arc::new(Store::default());
    store.set(Dependency::ConsulServices { dc: "west".into() }, Some(json!({"web": ["v2", "v1"], "consul": [], "api": ["x"]})));
    let t = compile(&store, r#"{{ range services "@west" }}{{ .Name }}{{ .Tags }} {{ end }}"#);
    assert_eq!(t.render().unwrap(), Rendered::Complete("api[x] consul[] web[v1 v2] ".into()));
    assert_eq!(Dependency::ConsulServices { dc: String::new() }.to_string(), "catalog.services");
}
