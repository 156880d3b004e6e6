use std::sync::Mutex;

use serde_json::json;

use super::*;

/// Answers from a map the test changes; a fetch from index N blocks until the map's version
/// passes N, as a blocking query does.
#[derive(Default)]
struct FakeSource {
    data: watch::Sender<(u64, BTreeMap<Dependency, Answer>)>,
}

impl FakeSource {
    fn set(&self, dep: Dependency, answer: Answer) {
        self.data.send_modify(|(v, m)| {
            *v += 1;
            m.insert(dep, answer);
        });
    }
}

impl TemplateSource for FakeSource {
    fn fetch<'a>(&'a self, dep: &'a Dependency, index: u64) -> BoxFuture<'a, Result<(Answer, u64), String>> {
        Box::pin(async move {
            let mut rx = self.data.subscribe();
            let (v, m) = rx.wait_for(|(v, m)| *v > index && m.contains_key(dep)).await.map_err(|e| e.to_string())?.clone();
            Ok((m[dep].clone(), v))
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Action {
    Event(String, String),
    Killed(String),
    Restart(String),
    Signal(String),
    Exec(String, Vec<String>),
}

#[derive(Default)]
struct FakeControl {
    log: watch::Sender<Vec<Action>>,
    exec_code: Mutex<i32>,
}

impl FakeControl {
    fn push(&self, a: Action) {
        self.log.send_modify(|l| l.push(a));
    }

    async fn wait_for(&self, what: &str, pred: impl Fn(&[Action]) -> bool) -> Vec<Action> {
        let mut rx = self.log.subscribe();
        match tokio::time::timeout(Duration::from_secs(20), rx.wait_for(|l| pred(l))).await {
            Ok(Ok(l)) => l.clone(),
            _ => panic!("timed out waiting for {what}: {:?}", self.log.borrow()),
        }
    }
}

impl TemplateControl for FakeControl {
    fn emit_event(&self, e: TaskEvent) {
        self.push(Action::Event(e.event_type, e.display_message));
    }
    fn kill_failed(&self, e: TaskEvent) {
        self.push(Action::Killed(e.display_message));
    }
    fn restart(&self, e: TaskEvent) {
        self.push(Action::Restart(e.display_message));
    }
    fn signal(&self, signal: nix::sys::signal::Signal) -> BoxFuture<'_, Result<(), String>> {
        self.push(Action::Signal(signal.as_str().to_string()));
        Box::pin(async { Ok(()) })
    }
    fn exec(&self, command: String, args: Vec<String>, _timeout: Duration) -> BoxFuture<'_, Result<i32, String>> {
        self.push(Action::Exec(command, args));
        let code = *self.exec_code.lock().unwrap();
        Box::pin(async move { Ok(code) })
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    alloc_dir: PathBuf,
    source: Arc<FakeSource>,
    control: Arc<FakeControl>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let alloc_dir = dir.path().to_path_buf();
    std::fs::create_dir_all(alloc_dir.join("web/local")).unwrap();
    std::fs::create_dir_all(alloc_dir.join("alloc")).unwrap();
    Fixture { _dir: dir, alloc_dir, source: Arc::default(), control: Arc::default() }
}

/// A template that reacts at once (no splay, no quiescence).
fn template(data: &str, dest: &str, mode: &str) -> Template {
    Template {
        embedded_tmpl: data.into(),
        dest_path: dest.into(),
        change_mode: mode.into(),
        change_signal: if mode == "signal" { "SIGUSR1".into() } else { String::new() },
        splay: 0,
        ..Template::default()
    }
}

fn start(f: &Fixture, templates: Vec<Template>) -> TemplateManager {
    let client = TemplateConfig { wait: Wait { min: Duration::ZERO, max: Duration::ZERO }, ..TemplateConfig::default() };
    let config = ManagerConfig {
        templates,
        alloc_dir: f.alloc_dir.clone(),
        task: "web".into(),
        namespace: "default".into(),
        env: Arc::new(BTreeMap::from([("NOMAD_TASK_DIR".to_string(), "/local".to_string())])),
        client,
        source: f.source.clone(),
        running: false,
    };
    TemplateManager::start(config, f.control.clone())
}

fn var() -> Dependency {
    Dependency::NomadVar { path: "nomad/jobs/web".into(), namespace: "default".into() }
}

fn items(v: serde_json::Value) -> Answer {
    Some(json!({"Path": "nomad/jobs/web", "Items": v}))
}

const CONFIG: &str = r#"{{ with nomadVar "nomad/jobs/web" }}port={{ .port }}{{ end }}"#;

async fn first(m: &TemplateManager) -> Result<BTreeMap<String, String>, String> {
    tokio::time::timeout(Duration::from_secs(20), m.first_render()).await.expect("first render in time")
}

#[tokio::test]
async fn the_first_render_waits_for_missing_data_and_says_what_is_missing() {
    let f = fixture();
    let m = start(&f, vec![template(CONFIG, "${NOMAD_TASK_DIR}/app.conf", "restart")]);
    let log = f.control.wait_for("the Missing event", |l| !l.is_empty()).await;
    assert_eq!(log[0], Action::Event("Template".into(), "Missing: nomad.var.block(nomad/jobs/web@default)".into()));
    assert_eq!(*m.first.borrow(), FirstRender::Pending, "blocked while missing");
    assert!(!f.alloc_dir.join("web/local/app.conf").exists(), "nothing written while missing");
    f.source.set(var(), items(json!({"port": "8080"})));
    first(&m).await.unwrap();
    assert_eq!(std::fs::read_to_string(f.alloc_dir.join("web/local/app.conf")).unwrap(), "port=8080");
    let mode = std::fs::metadata(f.alloc_dir.join("web/local/app.conf")).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o644, "Nomad's default perms");
    assert!(f.control.log.borrow().iter().all(|a| matches!(a, Action::Event(..))), "no change mode on the first render");
}

#[tokio::test]
async fn a_change_restarts_the_task_and_unchanged_data_writes_nothing() {
    let f = fixture();
    f.source.set(var(), items(json!({"port": "8080"})));
    let m = start(&f, vec![template(CONFIG, "local/app.conf", "restart")]);
    first(&m).await.unwrap();
    let path = f.alloc_dir.join("web/local/app.conf");
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
    // Another item changes, not the one rendered: the file stays, and the task is left alone.
    f.source.set(var(), items(json!({"port": "8080", "other": "x"})));
    f.source.set(var(), items(json!({"port": "9090", "other": "x"})));
    let log = f.control.wait_for("a restart", |l| l.iter().any(|a| matches!(a, Action::Restart(_)))).await;
    assert_eq!(log.iter().filter(|a| matches!(a, Action::Restart(_))).count(), 1);
    assert!(log.contains(&Action::Restart("Template with change_mode restart re-rendered".into())), "{log:?}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "port=9090");
    assert_ne!(std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap()), inode, "replaced by rename");
}

#[tokio::test]
async fn signal_noop_and_script_change_modes() {
    let f = fixture();
    f.source.set(var(), items(json!({"port": "1"})));
    let mut script = template(&CONFIG.replace("port=", "s="), "local/s.conf", "script");
    script.change_script =
        Some(nomad_proto::job::ChangeScript { command: "/bin/reload".into(), args: vec!["-q".into()], ..Default::default() });
    let m = start(
        &f,
        vec![template(CONFIG, "local/a.conf", "signal"), template(&CONFIG.replace("port=", "n="), "local/n.conf", "noop"), script],
    );
    first(&m).await.unwrap();
    f.source.set(var(), items(json!({"port": "2"})));
    let log = f.control.wait_for("signal and script", |l| l.iter().any(|a| matches!(a, Action::Exec(..)))).await;
    assert!(log.contains(&Action::Signal("SIGUSR1".into())), "{log:?}");
    assert!(log.contains(&Action::Event("Signaling".into(), "Template re-rendered".into())), "{log:?}");
    assert!(log.contains(&Action::Exec("/bin/reload".into(), vec!["-q".into()])), "{log:?}");
    let log =
        f.control.wait_for("the script's event", |l| l.iter().any(|a| matches!(a, Action::Event(t, _) if t == "Task hook message"))).await;
    assert!(!log.iter().any(|a| matches!(a, Action::Restart(_) | Action::Killed(_))), "{log:?}");
    assert_eq!(std::fs::read_to_string(f.alloc_dir.join("web/local/n.conf")).unwrap(), "n=2", "noop still rewrites the file");
}

#[tokio::test]
async fn a_failing_script_with_fail_on_error_kills_the_task() {
    let f = fixture();
    f.source.set(var(), items(json!({"port": "1"})));
    *f.control.exec_code.lock().unwrap() = 3;
    let mut t = template(CONFIG, "local/a.conf", "script");
    t.change_script = Some(nomad_proto::job::ChangeScript { command: "/bin/reload".into(), fail_on_error: true, ..Default::default() });
    let m = start(&f, vec![t]);
    first(&m).await.unwrap();
    f.source.set(var(), items(json!({"port": "2"})));
    let log = f.control.wait_for("the kill", |l| l.iter().any(|a| matches!(a, Action::Killed(_)))).await;
    assert!(log.contains(&Action::Killed("Template failed: Template script failed, task is being killed".into())), "{log:?}");
    assert!(
        log.iter().any(|a| matches!(a, Action::Event(t, m) if t == "Task hook failed" && m.contains("exited with code code: 3"))),
        "{log:?}"
    );
}

#[tokio::test]
async fn env_templates_give_their_variables_to_the_first_render() {
    let f = fixture();
    f.source.set(var(), items(json!({"port": "8080"})));
    let mut t = template(
        &CONFIG.replace("port=", "# comment\nexport PORT=\"").replace("{{ end }}", "\"\nEMPTY=\n{{ end }}"),
        "secrets/app.env",
        "restart",
    );
    t.envvars = true;
    let m = start(&f, vec![t]);
    let env = first(&m).await.unwrap();
    assert_eq!(env, BTreeMap::from([("PORT".to_string(), "8080".to_string()), ("EMPTY".to_string(), String::new())]));
}

#[tokio::test]
async fn a_destination_that_escapes_the_alloc_dir_fails_the_first_render() {
    let f = fixture();
    let m = start(&f, vec![template("x", "../../etc/x", "restart")]);
    let err = first(&m).await.unwrap_err();
    assert_eq!(err, "template destination path escapes alloc directory");
    // Absolute destinations are re-rooted under the task dir; `../alloc` reaches the shared dir.
    let m = start(&f, vec![template("a", "/etc/a.conf", "noop"), template("b", "../alloc/b.conf", "noop")]);
    first(&m).await.unwrap();
    assert_eq!(std::fs::read_to_string(f.alloc_dir.join("web/etc/a.conf")).unwrap(), "a");
    assert_eq!(std::fs::read_to_string(f.alloc_dir.join("alloc/b.conf")).unwrap(), "b");
}

#[tokio::test]
async fn a_symlinked_destination_dir_is_not_followed_out() {
    let f = fixture();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), f.alloc_dir.join("web/local/out")).unwrap();
    let m = start(&f, vec![template("pwned", "local/out/x", "noop")]);
    let err = first(&m).await.unwrap_err();
    assert!(err.contains("failed to open template directory"), "{err}");
    assert!(!outside.path().join("x").exists(), "nothing written through the symlink");
}

#[tokio::test]
async fn a_template_error_after_the_first_render_kills_the_task() {
    let f = fixture();
    f.source.set(var(), items(json!({"n": "1"})));
    let t = template(
        r#"{{ with nomadVar "nomad/jobs/web" }}{{ .n | parseInt }}{{ end }}"#.replace(" | parseInt", "").as_str(),
        "local/a",
        "restart",
    );
    let mut strict = template(r#"{{ with nomadVar "nomad/jobs/web" }}{{ .n }}{{ end }}"#, "local/b", "restart");
    strict.err_missing_key = true;
    let m = start(&f, vec![t, strict]);
    first(&m).await.unwrap();
    f.source.set(var(), items(json!({"other": "1"})));
    let log = f.control.wait_for("the kill", |l| l.iter().any(|a| matches!(a, Action::Killed(_)))).await;
    assert!(log.iter().any(|a| matches!(a, Action::Killed(m) if m.starts_with("Template failed: ") && m.contains('n'))), "{log:?}");
}

#[test]
fn env_files_parse_as_go_envparse_does() {
    let env = parse_env("# c\nA=1\nexport B = two \nC=\"x \\\"y\\\"\\n\"\nD='$lit'\n\n").unwrap();
    assert_eq!(env["A"], "1");
    assert_eq!(env["B"], "two");
    assert_eq!(env["C"], "x \"y\"\n");
    assert_eq!(env["D"], "$lit");
    assert!(parse_env("NOEQUALS").unwrap_err().contains("line 1"));
    assert!(parse_env("1A=x").unwrap_err().contains("invalid key"));
}
