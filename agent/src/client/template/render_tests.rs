use serde_json::json;

use super::*;

fn ctx(store: &Arc<Store>) -> RenderContext {
    RenderContext {
        store: store.clone(),
        namespace: "default".into(),
        env: Arc::new(BTreeMap::from([("NOMAD_TASK_NAME".to_string(), "web".to_string())])),
        denylist: vec!["plugin".into(), "writeToFile".into()],
        task_dir: PathBuf::from("/alloc/web"),
        sandbox_disabled: false,
        consul: false,
    }
}

fn compile(store: &Arc<Store>, src: &str) -> Compiled {
    Compiled::new("t", src, "{{", "}}", false, &ctx(store)).unwrap()
}

fn var(path: &str) -> Dependency {
    Dependency::NomadVar { path: path.into(), namespace: "default".into() }
}

fn variable(items: serde_json::Value) -> Answer {
    Some(json!({"Namespace": "default", "Path": "nomad/jobs/web", "CreateIndex": 7, "ModifyIndex": 9, "Items": items}))
}

#[test]
fn nomad_var_is_missing_until_the_variable_exists_then_renders_its_items() {
    let store = Arc::new(Store::default());
    let t = compile(&store, r#"{{ with nomadVar "nomad/jobs/web" }}user={{ .user }} pass={{ .pass }}{{ end }}"#);
    assert_eq!(t.render().unwrap(), Rendered::Missing([var("nomad/jobs/web")].into()), "not answered yet");
    assert_eq!(t.used(), [var("nomad/jobs/web")].into());
    store.set(var("nomad/jobs/web"), None);
    assert_eq!(t.render().unwrap(), Rendered::Missing([var("nomad/jobs/web")].into()), "a 404 keeps it missing");
    store.set(var("nomad/jobs/web"), variable(json!({"user": "admin", "pass": "s3cret"})));
    assert_eq!(t.render().unwrap(), Rendered::Complete("user=admin pass=s3cret".into()));
}

#[test]
fn nomad_var_ranges_over_items_in_key_order_and_takes_a_namespace() {
    let store = Arc::new(Store::default());
    let dep = Dependency::NomadVar { path: "shared/db".into(), namespace: "prod".into() };
    store.set(dep, variable(json!({"b": "2", "a": "1"})));
    let t = compile(&store, "{{ range $k, $v := nomadVar \"shared/db@prod.global\" }}{{ $k }}={{ $v }}\n{{ end }}");
    assert_eq!(t.render().unwrap(), Rendered::Complete("a=1\nb=2\n".into()));
}

#[test]
fn nomad_var_exists_waits_only_for_the_first_answer() {
    let store = Arc::new(Store::default());
    let t = compile(&store, r#"{{ if nomadVarExists "nomad/jobs/web" }}yes{{ else }}no{{ end }}"#);
    assert!(matches!(t.render().unwrap(), Rendered::Missing(_)));
    store.set(var("nomad/jobs/web"), None);
    assert_eq!(t.render().unwrap(), Rendered::Complete("no".into()));
    store.set(var("nomad/jobs/web"), variable(json!({})));
    assert_eq!(t.render().unwrap(), Rendered::Complete("yes".into()));
}

#[test]
fn nomad_var_list_prints_paths_and_the_safe_form_waits_for_a_non_empty_list() {
    let store = Arc::new(Store::default());
    let dep = Dependency::NomadVarList { prefix: "nomad/jobs".into(), namespace: "default".into() };
    let t = compile(&store, r#"{{ range nomadVarList "nomad/jobs" }}{{ .Path }};{{ end }}"#);
    let safe = compile(&store, r#"{{ range nomadVarListSafe "nomad/jobs" }}{{ .Path }};{{ end }}"#);
    store.set(dep.clone(), Some(json!([])));
    assert_eq!(t.render().unwrap(), Rendered::Complete(String::new()));
    assert!(matches!(safe.render().unwrap(), Rendered::Missing(_)), "empty is missing for the safe form");
    store.set(dep, Some(json!([{"Path": "nomad/jobs/a", "Namespace": "default"}, {"Path": "nomad/jobs/b"}])));
    assert_eq!(safe.render().unwrap(), Rendered::Complete("nomad/jobs/a;nomad/jobs/b;".into()));
}

fn registration(id: &str, addr: &str, port: i64, tags: &[&str]) -> serde_json::Value {
    json!({"ID": id, "ServiceName": "db", "Namespace": "default", "NodeID": "n1", "Datacenter": "dc1", "JobID": "j",
           "AllocID": "a", "Tags": tags, "Address": addr, "Port": port})
}

#[test]
fn nomad_service_lists_registrations_filters_by_tag_and_chooses_stably() {
    let store = Arc::new(Store::default());
    let all = json!([registration("1", "10.0.0.1", 5432, &["primary"]), registration("2", "10.0.0.2", 5433, &["replica"])]);
    store.set(Dependency::NomadService { name: "db".into(), tag: String::new(), namespace: "default".into() }, Some(all.clone()));
    store.set(Dependency::NomadService { name: "db".into(), tag: "primary".into(), namespace: "default".into() }, Some(all.clone()));
    let t = compile(&store, r#"{{ range nomadService "db" }}{{ .Address }}:{{ .Port }} {{ end }}"#);
    assert_eq!(t.render().unwrap(), Rendered::Complete("10.0.0.1:5432 10.0.0.2:5433 ".into()));
    let tagged = compile(&store, r#"{{ range nomadService "primary.db" }}{{ .Name }}@{{ .Address }}{{ end }}"#);
    assert_eq!(tagged.render().unwrap(), Rendered::Complete("db@10.0.0.1".into()));
    let one = compile(&store, r#"{{ range nomadService 1 "some-key" "db" }}{{ .ID }}{{ end }}"#);
    let first = one.render().unwrap();
    assert!(matches!(&first, Rendered::Complete(s) if s == "1" || s == "2"), "{first:?}");
    assert_eq!(one.render().unwrap(), first, "the same key chooses the same registration");
}

#[test]
fn a_missing_service_is_an_empty_list_once_answered() {
    let store = Arc::new(Store::default());
    let t = compile(&store, r#"{{ range nomadService "db" }}x{{ else }}none{{ end }}"#);
    assert!(matches!(t.render().unwrap(), Rendered::Missing(_)));
    store.set(Dependency::NomadService { name: "db".into(), tag: String::new(), namespace: "default".into() }, Some(json!([])));
    assert_eq!(t.render().unwrap(), Rendered::Complete("none".into()));
}

#[test]
fn file_is_sandboxed_to_the_task_dir() {
    let store = Arc::new(Store::default());
    store.set(Dependency::File { path: "local/in.txt".into() }, Some(json!("hello")));
    let t = compile(&store, r#"{{ file "local/in.txt" }}/{{ file "/alloc/web/local/in.txt" }}"#);
    assert_eq!(t.render().unwrap(), Rendered::Complete("hello/hello".into()), "relative and absolute under the task dir");
    for escape in [r#"{{ file "/etc/passwd" }}"#, r#"{{ file "../other/secrets/x" }}"#] {
        let err = compile(&store, escape).render().unwrap_err();
        assert!(err.contains("outside of the task's sandbox"), "{err}");
    }
}

#[test]
fn vault_consul_and_denied_functions_fail_with_a_message_naming_them() {
    let store = Arc::new(Store::default());
    let cases = [
        (r#"{{ with secret "kv/data/x" }}{{ end }}"#, "error calling secret: Vault is not supported by nomad-rs"),
        (r#"{{ key "a/b" }}"#, "error calling key: this client has no consul {} block to read Consul data from"),
        (r#"{{ plugin "x" }}"#, "error calling plugin: function is disabled"),
    ];
    for (src, want) in cases {
        let err = compile(&store, src).render().unwrap_err();
        assert!(err.contains(want), "{src}: {err}");
    }
}

#[test]
fn env_reads_the_task_env_and_a_parse_error_is_reported() {
    let store = Arc::new(Store::default());
    assert_eq!(compile(&store, r#"{{ env "NOMAD_TASK_NAME" }}"#).render().unwrap(), Rendered::Complete("web".into()));
    let err = Compiled::new("t", "{{ if }}", "{{", "}}", false, &ctx(&store)).err().unwrap();
    assert_eq!(err, "template: t:1:9: empty command");
}

#[test]
fn error_on_missing_key_fails_where_the_default_prints_no_value() {
    let store = Arc::new(Store::default());
    store.set(var("nomad/jobs/web"), variable(json!({"user": "admin"})));
    let src = r#"{{ with nomadVar "nomad/jobs/web" }}{{ .nope }}{{ end }}"#;
    assert_eq!(compile(&store, src).render().unwrap(), Rendered::Complete("<no value>".into()));
    let strict = Compiled::new("t", src, "{{", "}}", true, &ctx(&store)).unwrap();
    let err = strict.render().unwrap_err();
    assert!(err.contains("nope"), "{err}");
}

#[test]
fn custom_delimiters_leave_the_default_ones_as_text() {
    let store = Arc::new(Store::default());
    let t = Compiled::new("t", r#"[[ env "NOMAD_TASK_NAME" ]] {{ not an action }}"#, "[[", "]]", false, &ctx(&store)).unwrap();
    assert_eq!(t.render().unwrap(), Rendered::Complete("web {{ not an action }}".into()));
}

#[test]
fn sockaddr_evaluates_a_go_sockaddr_template_against_the_hosts_interfaces() {
    let store = Arc::new(Store::default());
    let t =
        compile(&store, r#"{{ sockaddr "GetAllInterfaces | include \"name\" \"^lo$\" | include \"type\" \"IPv4\" | attr \"address\"" }}"#);
    assert_eq!(t.render().unwrap(), Rendered::Complete("127.0.0.1".into()));
    let err = compile(&store, r#"{{ sockaddr "GetNothing" }}"#).render().unwrap_err();
    assert!(err.contains("error calling sockaddr") && err.contains("GetNothing"), "{err}");
}
