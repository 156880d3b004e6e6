use std::collections::BTreeMap;
use std::sync::Arc;

use gotmpl::{FuncMap, MissingKey, Value};

use super::*;

const METHODS: &[&str] = &["Keys", "Values", "Tuples", "Metadata", "Parent", "ItemsMap"];

fn s(v: &str) -> Value {
    Value::String(Arc::from(v))
}

fn entries(pairs: &[(&str, Value)]) -> Value {
    Value::Map(Arc::new(pairs.iter().map(|(k, v)| (Arc::from(*k), v.clone())).collect()))
}

/// A map `{a: "1", b: "2"}` registered with `Keys` and `Metadata` methods,
/// returned by the function `nomadVar`.
fn registered_fixture() -> (Arc<MethodTable>, FuncMap, Value) {
    let table = Arc::new(MethodTable::new());
    let items = entries(&[("a", s("1")), ("b", s("2"))]);
    let mut methods = BTreeMap::new();
    methods.insert("Keys".to_string(), Value::List(vec![s("a"), s("b")].into()));
    methods.insert("Metadata".to_string(), entries(&[("ModifyIndex", Value::Int(42))]));
    assert!(table.register(&items, methods));
    let mut funcs = FuncMap::new();
    let returned = items.clone();
    funcs.insert("nomadVar".to_string(), Arc::new(move |_: &[Value]| Ok(returned.clone())));
    (table, funcs, items)
}

fn render_with(source: &str, left: &str, right: &str, missing_key: MissingKey, data: &Value) -> Result<String, String> {
    let (table, funcs, _) = registered_fixture();
    let template = compile("main", source, left, right, missing_key, funcs, METHODS, table)?;
    template.execute_to_string(data).map_err(|e| e.to_string())
}

fn render(source: &str) -> String {
    match render_with(source, "{{", "}}", MissingKey::Invalid, &Value::Nil) {
        Ok(out) => out,
        Err(e) => panic!("render of {source:?} failed: {e}"),
    }
}

#[test]
fn registered_map_exposes_methods_but_ranges_over_real_entries_only() {
    assert_eq!(render(r#"{{ with nomadVar "x" }}{{ .Keys }} {{ .Metadata.ModifyIndex }}{{ end }}"#), "[a b] 42");
    assert_eq!(render(r#"{{ range $k, $v := nomadVar "x" }}{{ $k }}={{ $v }};{{ end }}"#), "a=1;b=2;");
    assert_eq!(render(r#"{{ len (nomadVar "x") }}"#), "2");
}

#[test]
fn unregistered_map_field_named_like_a_method_is_a_plain_lookup() {
    let data = entries(&[("Keys", s("own-entry")), ("Other", entries(&[("Metadata", s("meta-entry"))]))]);
    let out = render_with("{{ .Keys }} {{ .Other.Metadata }} [{{ .Other.Values }}]", "{{", "}}", MissingKey::Invalid, &data);
    assert_eq!(out.as_deref(), Ok("own-entry meta-entry [<no value>]"));
}

#[test]
fn missing_method_field_follows_missing_key_option() {
    let data = entries(&[("a", s("1"))]);
    let out = render_with("{{ .Keys }}", "{{", "}}", MissingKey::Error, &data);
    assert!(out.is_err_and(|e| e.contains("Keys")));
}

#[test]
fn method_on_a_non_map_is_an_error_not_a_panic() {
    let data = entries(&[("n", Value::Int(3))]);
    let out = render_with("{{ .n.Keys }}", "{{", "}}", MissingKey::Invalid, &data);
    assert!(out.is_err_and(|e| e.contains("can't evaluate field Keys in type int")));
    let nil_receiver = render_with("{{ .missing.Keys }}", "{{", "}}", MissingKey::Invalid, &data);
    assert_eq!(nil_receiver.as_deref(), Ok("<no value>"));
}

#[test]
fn methods_work_through_variables_chains_and_pipelines() {
    assert_eq!(render(r#"{{ $v := nomadVar "x" }}{{ $v.Keys }} {{ $v.Metadata.ModifyIndex }}"#), "[a b] 42");
    assert_eq!(render(r#"{{ (nomadVar "x").Keys }}"#), "[a b]");
    assert_eq!(render(r#"{{ (nomadVar "x").Metadata.ModifyIndex }}"#), "42");
    // A function name followed directly by fields: the call comes first.
    assert_eq!(render("{{ nomadVar.Metadata.ModifyIndex }}"), "42");
    assert_eq!(render(r#"{{ "x" | nomadVar.Keys }}"#), "[a b]");
    // As an argument, inside a sub-pipeline, and in if/range pipes.
    assert_eq!(render(r#"{{ printf "%v-%v" (nomadVar "x").Keys (index (nomadVar "x").Keys 1) }}"#), "[a b]-b");
    assert_eq!(render(r#"{{ with $v := nomadVar "x" }}{{ range $v.Keys }}<{{ . }}>{{ end }}{{ end }}"#), "<a><b>");
    assert_eq!(render(r#"{{ if gt (nomadVar "x").Metadata.ModifyIndex 40 }}new{{ else }}old{{ end }}"#), "new");
    assert_eq!(render(r#"{{ range $i, $k := (nomadVar "x").Keys }}{{ $i }}{{ $k }}{{ else }}none{{ end }}"#), "0a1b");
}

#[test]
fn methods_work_inside_define_and_template() {
    let source = r#"{{ define "meta" }}{{ .Metadata.ModifyIndex }}/{{ len . }}{{ end -}}
{{ template "meta" (nomadVar "x") }}|{{ block "keys" nomadVar "x" }}{{ .Keys }}{{ end }}"#;
    assert_eq!(render(source), "42/2|[a b]");
}

#[test]
fn main_template_can_still_call_itself_by_name_and_defines_survive() {
    let (table, funcs, _) = registered_fixture();
    let source = r#"{{ define "inner" }}{{ .Keys }}{{ end }}{{ if . }}{{ template "main" false }}{{ else }}{{ template "inner" (nomadVar "x") }}{{ end }}"#;
    let template = compile("main", source, "{{", "}}", MissingKey::Invalid, funcs, METHODS, table);
    let out = template.map(|t| t.execute_to_string(&Value::Bool(true)).map_err(|e| e.to_string()));
    assert_eq!(out, Ok(Ok("[a b]".to_string())));
}

#[test]
fn methods_work_with_custom_delimiters() {
    let out = render_with(r#"[[ with nomadVar "x" ]][[ .Keys ]] {{ .Keys }}[[ end ]]"#, "[[", "]]", MissingKey::Invalid, &Value::Nil);
    assert_eq!(out.as_deref(), Ok("[a b] {{ .Keys }}"));
}

#[test]
fn whitespace_only_main_body_renders_as_is() {
    let out = render_with("  \n", "{{", "}}", MissingKey::Invalid, &Value::Nil);
    assert_eq!(out.as_deref(), Ok("  \n"));
}

#[test]
fn parse_errors_are_reported() {
    let out = render_with("{{ .Keys ", "{{", "}}", MissingKey::Invalid, &Value::Nil);
    assert!(out.is_err_and(|e| e.contains("unclosed action")));
}

#[test]
fn table_registers_only_maps_and_lists_and_clears() {
    let table = MethodTable::new();
    assert!(!table.register(&s("text"), BTreeMap::new()));
    let listing = Value::List(vec![s("p")].into());
    let mut methods = BTreeMap::new();
    methods.insert("Parent".to_string(), s("root"));
    assert!(table.register(&listing, methods));
    assert_eq!(table.method(&listing.clone(), "Parent"), Some(s("root")));
    // An equal list in another allocation is a different value.
    assert_eq!(table.method(&Value::List(vec![s("p")].into()), "Parent"), None);
    table.clear();
    assert!(table.is_empty());
    assert_eq!(table.method(&listing, "Parent"), None);
}

#[test]
fn registered_list_methods_work_in_templates() {
    let table = Arc::new(MethodTable::new());
    let listing = Value::List(vec![s("p1"), s("p2")].into());
    let mut methods = BTreeMap::new();
    methods.insert("Parent".to_string(), s("root"));
    table.register(&listing, methods);
    let data = entries(&[("L", listing)]);
    let template = compile(
        "t",
        "{{ .L.Parent }}:{{ range .L }}{{ . }},{{ end }}{{ len .L }}",
        "{{",
        "}}",
        MissingKey::Invalid,
        FuncMap::new(),
        METHODS,
        table,
    );
    let out = template.map(|t| t.execute_to_string(&data).map_err(|e| e.to_string()));
    assert_eq!(out, Ok(Ok("root:p1,p2,2".to_string())));
}

#[test]
fn table_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<MethodTable>();
    let (table, _, items) = registered_fixture();
    let shared = Arc::clone(&table);
    let from_thread = std::thread::spawn(move || shared.method(&items, "Keys")).join();
    assert_eq!(from_thread.ok().flatten(), Some(Value::List(vec![s("a"), s("b")].into())));
}
