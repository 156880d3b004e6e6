//! A simple field-level job diff in Nomad's `JobDiff` shape, for `job plan`.
//!
//! Fields are compared on their JSON form: scalars become `FieldDiff`s
//! (values as strings, like Nomad), nested objects become `ObjectDiff`s,
//! lists of scalars diff element by element and lists of objects by whole
//! element. Task groups and tasks are matched by name. Unchanged fields are
//! left out (Nomad's contextual diff would list them as `None`).

use std::collections::BTreeMap;

use nomad_proto::Job;
use nomad_proto::plan::PlanAnnotations;
use serde::Serialize;
use serde_json::{Map, Value};

/// `Added`, `Deleted`, `Edited` or `None`.
pub type DiffType = &'static str;

/// One changed scalar.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct FieldDiff {
    /// Change kind.
    #[serde(rename = "Type")]
    pub diff_type: DiffType,
    /// Field name.
    pub name: String,
    /// Old value.
    pub old: String,
    /// New value.
    pub new: String,
    /// Annotations.
    pub annotations: Option<Vec<String>>,
}

/// A changed nested object.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ObjectDiff {
    /// Change kind.
    #[serde(rename = "Type")]
    pub diff_type: DiffType,
    /// Object name.
    pub name: String,
    /// Changed fields.
    pub fields: Vec<FieldDiff>,
    /// Changed nested objects.
    pub objects: Vec<ObjectDiff>,
}

/// A task's diff.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct TaskDiff {
    /// Change kind.
    #[serde(rename = "Type")]
    pub diff_type: DiffType,
    /// Task name.
    pub name: String,
    /// Changed fields.
    pub fields: Vec<FieldDiff>,
    /// Changed nested objects.
    pub objects: Vec<ObjectDiff>,
    /// Annotations.
    pub annotations: Option<Vec<String>>,
}

/// A task group's diff, with what the scheduler would do to it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct TaskGroupDiff {
    /// Change kind.
    #[serde(rename = "Type")]
    pub diff_type: DiffType,
    /// Group name.
    pub name: String,
    /// Changed fields.
    pub fields: Vec<FieldDiff>,
    /// Changed nested objects.
    pub objects: Vec<ObjectDiff>,
    /// Task diffs.
    pub tasks: Vec<TaskDiff>,
    /// Counts per update kind (`create`, `destroy`, `ignore`, ...).
    pub updates: BTreeMap<String, u64>,
}

/// A job's diff.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct JobDiff {
    /// Change kind.
    #[serde(rename = "Type")]
    pub diff_type: DiffType,
    /// Job ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// Changed fields.
    pub fields: Vec<FieldDiff>,
    /// Changed nested objects.
    pub objects: Vec<ObjectDiff>,
    /// Group diffs.
    pub task_groups: Vec<TaskGroupDiff>,
}

/// Fields that are bookkeeping, not spec.
const IGNORED: &[&str] = &[
    "Status",
    "StatusDescription",
    "Stable",
    "Version",
    "SubmitTime",
    "CreateIndex",
    "ModifyIndex",
    "JobModifyIndex",
    "TaskGroups",
    "Tasks",
];

fn kind(old: bool, new: bool, changed: bool) -> DiffType {
    match (old, new) {
        (false, true) => "Added",
        (true, false) => "Deleted",
        _ if changed => "Edited",
        _ => "None",
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn object(v: Option<&Value>) -> Map<String, Value> {
    match v {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    }
}

/// Diffs two JSON objects' fields and nested objects.
fn diff_fields(old: &Map<String, Value>, new: &Map<String, Value>) -> (Vec<FieldDiff>, Vec<ObjectDiff>) {
    let mut fields = Vec::new();
    let mut objects = Vec::new();
    let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    for key in keys.into_iter().filter(|k| !IGNORED.contains(&k.as_str())) {
        let (o, n) = (old.get(key).filter(|v| !v.is_null()), new.get(key).filter(|v| !v.is_null()));
        if o == n {
            continue;
        }
        match (o, n) {
            (Some(Value::Object(_)), _) | (_, Some(Value::Object(_))) => {
                let (om, nm) = (object(o), object(n));
                let (f, ob) = diff_fields(&om, &nm);
                if !f.is_empty() || !ob.is_empty() {
                    let t = kind(!om.is_empty(), !nm.is_empty(), true);
                    objects.push(ObjectDiff { diff_type: t, name: key.clone(), fields: f, objects: ob });
                }
            }
            (Some(Value::Array(_)), _) | (_, Some(Value::Array(_))) => {
                let empty = Vec::new();
                let oa = o.and_then(Value::as_array).unwrap_or(&empty);
                let na = n.and_then(Value::as_array).unwrap_or(&empty);
                for (side, from, to) in [("Deleted", oa, na), ("Added", na, oa)] {
                    for item in from.iter().filter(|i| !to.contains(i)) {
                        match item {
                            Value::Object(m) => {
                                let (f, ob) = if side == "Added" { diff_fields(&Map::new(), m) } else { diff_fields(m, &Map::new()) };
                                objects.push(ObjectDiff { diff_type: side, name: key.clone(), fields: f, objects: ob });
                            }
                            v => {
                                let (old, new) = if side == "Added" { (String::new(), scalar(v)) } else { (scalar(v), String::new()) };
                                fields.push(FieldDiff { diff_type: side, name: key.clone(), old, new, annotations: None });
                            }
                        }
                    }
                }
            }
            _ => {
                let (old, new) = (o.map(scalar).unwrap_or_default(), n.map(scalar).unwrap_or_default());
                fields.push(FieldDiff { diff_type: kind(o.is_some(), n.is_some(), true), name: key.clone(), old, new, annotations: None });
            }
        }
    }
    (fields, objects)
}

/// Named children (`TaskGroups`, `Tasks`) of two JSON objects, paired by `Name`.
fn paired<'a>(old: &'a Value, new: &'a Value, list: &str) -> Vec<(String, Option<&'a Value>, Option<&'a Value>)> {
    let items = |v: &'a Value| -> Vec<&'a Value> { v.get(list).and_then(Value::as_array).map(|a| a.iter().collect()).unwrap_or_default() };
    let name = |v: &Value| v.get("Name").map(scalar).unwrap_or_default();
    let mut out: Vec<(String, Option<&Value>, Option<&Value>)> = Vec::new();
    for o in items(old) {
        out.push((name(o), Some(o), None));
    }
    for n in items(new) {
        match out.iter_mut().find(|(k, _, _)| *k == name(n)) {
            Some(slot) => slot.2 = Some(n),
            None => out.push((name(n), None, Some(n))),
        }
    }
    out
}

/// Diffs `old` (absent for a new job) with `new`, annotating groups with the
/// scheduler's planned updates.
pub fn job_diff(old: Option<&Job>, new: &Job, annotations: Option<&PlanAnnotations>) -> JobDiff {
    let null = Value::Null;
    let ov = old.map(|j| serde_json::to_value(j).unwrap_or(Value::Null)).unwrap_or(Value::Null);
    let nv = serde_json::to_value(new).unwrap_or(Value::Null);
    let (fields, objects) = diff_fields(&object(Some(&ov)), &object(Some(&nv)));
    let mut task_groups = Vec::new();
    for (name, o, n) in paired(&ov, &nv, "TaskGroups") {
        let (f, ob) = diff_fields(&object(o), &object(n));
        let mut tasks = Vec::new();
        for (tname, to, tn) in paired(o.unwrap_or(&null), n.unwrap_or(&null), "Tasks") {
            let (tf, tob) = diff_fields(&object(to), &object(tn));
            let changed = !tf.is_empty() || !tob.is_empty();
            tasks.push(TaskDiff {
                diff_type: kind(to.is_some(), tn.is_some(), changed),
                name: tname,
                fields: tf,
                objects: tob,
                annotations: None,
            });
        }
        // Nomad sorts them by name (`TaskDiffs`), so an injected Connect task is listed in order.
        tasks.sort_by(|a, b| a.name.cmp(&b.name));
        let changed = !f.is_empty() || !ob.is_empty() || tasks.iter().any(|t| t.diff_type != "None");
        let mut updates = BTreeMap::new();
        if let Some(u) = annotations.and_then(|a| a.desired_tg_updates.get(&name)) {
            for (k, v) in [
                ("ignore", u.ignore),
                ("create", u.place),
                ("migrate", u.migrate),
                ("destroy", u.stop),
                ("canary", u.canary),
                ("in-place update", u.in_place_update),
                ("create/destroy update", u.destructive_update),
            ] {
                if v != 0 {
                    updates.insert(k.to_string(), v);
                }
            }
        }
        task_groups.push(TaskGroupDiff {
            diff_type: kind(o.is_some(), n.is_some(), changed),
            name,
            fields: f,
            objects: ob,
            tasks,
            updates,
        });
    }
    let changed = !fields.is_empty() || !objects.is_empty() || task_groups.iter().any(|t| t.diff_type != "None");
    JobDiff { diff_type: kind(old.is_some(), true, changed), id: new.id.clone(), fields, objects, task_groups }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(count: i64, image: &str) -> Job {
        let mut j = crate::testing::job("web", count);
        j.task_groups[0].tasks[0].config.insert("command".into(), Value::String(image.into()));
        j.canonicalize();
        j
    }

    #[test]
    fn changed_fields_groups_and_tasks_are_reported() {
        let old = job(2, "/bin/a");
        let mut new = job(3, "/bin/b");
        new.meta.insert("team".into(), "core".into());
        let d = job_diff(Some(&old), &new, None);
        assert_eq!(d.diff_type, "Edited");
        assert!(d.objects.iter().any(|o| o.name == "Meta" && o.fields[0].new == "core"), "{d:?}");
        let tg = &d.task_groups[0];
        assert_eq!((tg.diff_type, tg.name.as_str()), ("Edited", "web"));
        assert!(tg.fields.iter().any(|f| f.name == "Count" && f.old == "2" && f.new == "3"));
        let task = &tg.tasks[0];
        assert_eq!(task.diff_type, "Edited");
        assert!(task.objects.iter().any(|o| o.name == "Config" && o.fields[0].old == "/bin/a" && o.fields[0].new == "/bin/b"));

        let same = job_diff(Some(&old), &old, None);
        assert_eq!(same.diff_type, "None");
        assert_eq!(same.task_groups[0].diff_type, "None");
        let added = job_diff(None, &new, None);
        assert_eq!((added.diff_type, added.task_groups[0].diff_type), ("Added", "Added"));
    }
}
