//! Templates against a real agent with ACLs on: a task's templates read its job's Nomad variables
//! and services with the task's workload identity; the first render blocks the task (with a
//! `Missing:` event while a variable does not exist); a variable changed over the API re-renders
//! the files, signals the task (a shell trap records it) or restarts it with the new env.

use nomad_e2e::wait_for;
use serde_json::{Value, json};

use crate::SETTLE;

fn job(id: &str, script: &str, templates: Value) -> Value {
    json!({"Job": {
        "ID": id, "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "g", "Count": 1,
            "Networks": [{"DynamicPorts": [{"Label": "http"}]}],
            "Services": [{"Name": format!("{id}-web"), "PortLabel": "http", "Provider": "nomad"}],
            "Tasks": [{"Name": "t", "Driver": "raw_exec",
                "Config": {"command": "/bin/sh", "args": ["-c", script]},
                "Templates": templates,
                "Resources": {"CPU": 50, "MemoryMB": 64}}]}]}})
}

/// A template that reacts at once: no splay, no quiescence.
fn template(data: &str, dest: &str, extra: Value) -> Value {
    let mut t = json!({"EmbeddedTmpl": data, "DestPath": dest, "Splay": 0, "Wait": {"Min": 0, "Max": 0}});
    t.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    t
}

fn events(http: &nomad_e2e::HttpClient, alloc: &str) -> Vec<(String, String)> {
    let a = http.get_json(&format!("/v1/allocation/{alloc}")).unwrap_or_default();
    a["TaskStates"]["t"]["Events"]
        .as_array()
        .map(|e| {
            e.iter()
                .map(|e| (e["Type"].as_str().unwrap_or("").to_string(), e["DisplayMessage"].as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn first_alloc(http: &nomad_e2e::HttpClient, job: &str) -> Option<(String, String)> {
    let allocs = http.get_json(&format!("/v1/job/{job}/allocations")).ok()?;
    let a = allocs.as_array()?.first()?;
    Some((a["ID"].as_str()?.to_string(), a["ClientStatus"].as_str()?.to_string()))
}

#[test]
fn templates_render_variables_and_services_and_react_to_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, mgmt) = crate::workload_identity::acl_dev_agent(dir.path());
    let put_var = |path: &str, items: Value| {
        wait_for("the variable write", SETTLE, || mgmt.put_json(&format!("/v1/var/{path}"), &json!({"Items": items})).ok())
            .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    };
    put_var("nomad/jobs/tpl", json!({"port": "8080", "password": "s3cret"}));
    put_var("nomad/jobs/other", json!({"password": "not-yours"}));

    let script = "trap 'echo usr1 >> local/signals' USR1; \
                  echo \"$DB_PASSWORD\" > local/env_seen; echo start >> local/starts; \
                  while true; do sleep 0.1; done";
    let templates = json!([
        template(
            r#"{{ with nomadVar "nomad/jobs/tpl" }}port={{ .port }}{{ end }}"#,
            "local/app.conf",
            json!({"ChangeMode": "signal", "ChangeSignal": "SIGUSR1"})
        ),
        template(
            r#"{{ with nomadVar "nomad/jobs/tpl" }}DB_PASSWORD={{ .password }}{{ end }}"#,
            "secrets/app.env",
            json!({"Envvars": true, "ChangeMode": "restart"})
        ),
        template(
            "{{ range nomadService \"tpl-web\" }}{{ .Address }}:{{ .Port }}\n{{ end }}",
            "local/upstreams",
            json!({"ChangeMode": "noop"})
        ),
        template(r#"{{ with nomadVar "nomad/jobs/other" }}{{ .password }}{{ end }}"#, "local/other", json!({"ChangeMode": "noop"})),
    ]);
    // The last template asks for another job's variable: the identity may not read it.
    let mut spec = job("tpl", script, templates.clone());
    spec["Job"]["TaskGroups"][0]["Tasks"][0]["Templates"].as_array_mut().unwrap().pop();
    mgmt.put_json("/v1/jobs", &spec).unwrap();
    let alloc = wait_for("the alloc to run", SETTLE, || first_alloc(&mgmt, "tpl").filter(|(_, s)| s == "running").map(|(id, _)| id))
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let cat = |alloc: &str, file: &str| {
        let r = mgmt.request("GET", &format!("/v1/client/fs/cat/{alloc}?path=t/{file}"), None).ok()?;
        (r.status == 200).then(|| r.text())
    };
    let read = |file: &str, want: &str| {
        wait_for(&format!("{file} to read {want:?}"), SETTLE, || cat(&alloc, file).filter(|t| t.trim_end() == want).map(|_| ()))
            .unwrap_or_else(|e| panic!("{e}: {:?}\n{:?}\n{}", cat(&alloc, file), events(&mgmt, &alloc), agent.logs()));
    };
    read("local/app.conf", "port=8080");
    read("local/env_seen", "s3cret");
    read("local/starts", "start");
    // The service registers after the task starts: the noop template follows it.
    let upstream = wait_for("the service in the rendered file", SETTLE, || cat(&alloc, "local/upstreams").filter(|t| t.contains(':')))
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    assert!(upstream.trim_end().rsplit(':').next().unwrap().parse::<u16>().is_ok(), "{upstream:?}");

    // Only the signal template changes: the task is signalled, not restarted.
    put_var("nomad/jobs/tpl", json!({"port": "9090", "password": "s3cret"}));
    read("local/app.conf", "port=9090");
    read("local/signals", "usr1");
    assert_eq!(cat(&alloc, "local/starts").unwrap().lines().count(), 1, "a signal does not restart");
    let has_event = |want: (&str, &str)| {
        let want = (want.0.to_string(), want.1.to_string());
        wait_for(&format!("the event {want:?}"), SETTLE, || events(&mgmt, &alloc).contains(&want).then_some(()))
            .unwrap_or_else(|e| panic!("{e}: {:?}", events(&mgmt, &alloc)));
    };
    has_event(("Signaling", "Template re-rendered"));

    // The env template changes: the task restarts with the new value in its environment.
    put_var("nomad/jobs/tpl", json!({"port": "9090", "password": "rotated"}));
    read("local/env_seen", "rotated");
    read("local/starts", "start\nstart");
    has_event(("Restart Signaled", "Template with change_mode restart re-rendered"));

    // Another job's variable stays missing for this identity: the task waits and says why.
    mgmt.request("DELETE", "/v1/job/tpl?purge=true", None).unwrap();
    mgmt.put_json("/v1/jobs", &job("tpl2", "exec sleep 300", json!([templates[3].clone()]))).unwrap();
    let alloc2 = wait_for("the second alloc", SETTLE, || first_alloc(&mgmt, "tpl2").map(|(id, _)| id)).unwrap();
    let missing = ("Template".to_string(), "Missing: nomad.var.block(nomad/jobs/other@default)".to_string());
    wait_for("the Missing event", SETTLE, || events(&mgmt, &alloc2).contains(&missing).then_some(()))
        .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", events(&mgmt, &alloc2), agent.logs()));
    assert_eq!(first_alloc(&mgmt, "tpl2").unwrap().1, "pending", "blocked before the first render");
    assert_eq!(cat(&alloc2, "local/other"), None, "nothing rendered from a variable the task may not read");
}

/// Consul data through the agent's `consul {}` (the stand-in here): `key` and `ls` from the KV
/// store and `service` from the health API render, and a KV write or a new instance re-renders
/// by the blocking queries the template holds open.
#[test]
fn templates_render_consul_keys_and_services_and_follow_them() {
    let consul = nomad_e2e::consul::ConsulStandIn::start(nomad_e2e::consul::ConsulOptions::default()).unwrap();
    let c = nomad_e2e::HttpClient::new(&consul.addr().to_string());
    let kv = |key: &str, value: &str| assert_eq!(c.request("PUT", &format!("/v1/kv/{key}"), Some(value.as_bytes())).unwrap().status, 200);
    let register = |id: &str, port: u16| {
        let body = json!({"ID": id, "Name": "db", "Address": "10.1.0.7", "Port": port}).to_string();
        assert_eq!(c.request("PUT", "/v1/agent/service/register", Some(body.as_bytes())).unwrap().status, 200);
    };
    kv("app/greeting", "hello");
    kv("app/cfg/a", "1");
    kv("app/cfg/b", "2");
    register("db-1", 5432);

    let dir = tempfile::tempdir().unwrap();
    let config = format!("consul {{\n  address = \"{}\"\n}}\n", consul.addr());
    let opts = nomad_e2e::AgentOptions { args: vec!["-dev".into()], config: Some(config), ..Default::default() };
    let agent = nomad_e2e::Agent::start("dev", &dir.path().join("agent"), opts).expect("start dev agent");
    agent.wait_for_leader(SETTLE).unwrap();
    let http = agent.http();
    let data = "greeting={{ key \"app/greeting\" }}\n{{ range ls \"app/cfg\" }}{{ .Key }}={{ .Value }}\n{{ end }}\
                {{ range service \"db\" }}db={{ .Address }}:{{ .Port }}\n{{ end }}";
    let mut spec = job("ctpl", "exec sleep 300", json!([template(data, "local/app.conf", json!({"ChangeMode": "noop"}))]));
    spec["Job"]["TaskGroups"][0]["Services"] = json!([]);
    wait_for("the job to be accepted", SETTLE, || http.put_json("/v1/jobs", &spec).ok()).unwrap();
    let alloc = wait_for("the alloc to run", SETTLE, || first_alloc(&http, "ctpl").filter(|(_, s)| s == "running").map(|(id, _)| id))
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let cat = || {
        let r = http.request("GET", &format!("/v1/client/fs/cat/{alloc}?path=t/local/app.conf"), None).ok()?;
        (r.status == 200).then(|| r.text())
    };
    let read = |want: &str| {
        wait_for(&format!("app.conf to read {want:?}"), SETTLE, || cat().filter(|t| t == want).map(|_| ()))
            .unwrap_or_else(|e| panic!("{e}: {:?}\n{:?}\n{}", cat(), events(&http, &alloc), agent.logs()));
    };
    read("greeting=hello\na=1\nb=2\ndb=10.1.0.7:5432\n");
    kv("app/greeting", "bye");
    read("greeting=bye\na=1\nb=2\ndb=10.1.0.7:5432\n");
    register("db-2", 5433);
    read("greeting=bye\na=1\nb=2\ndb=10.1.0.7:5432\ndb=10.1.0.7:5433\n");
    let asked: Vec<String> = consul.calls_to("GET", "/v1/health/service/db").iter().map(|c| c.query.clone()).collect();
    assert!(asked.iter().any(|q| q.contains("passing=true") && q.contains("index=")), "blocking queries for passing instances: {asked:?}");
}
