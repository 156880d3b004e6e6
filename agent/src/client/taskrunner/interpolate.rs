//! Runtime interpolation of `${...}` in driver config and `env` values, as Nomad does on the
//! client: the task's environment (`${NOMAD_ALLOC_ID}`, `${env.X}`, `${env["X"]}`), node
//! attributes (`${attr.kernel.name}`), node fields (`${node.unique.id}`, `${node.unique.name}`,
//! `${node.datacenter}`, `${node.region}`, `${node.class}`, `${node.pool}`) and node meta
//! (`${meta.rack}`, also `${node.meta.rack}`). A reference that resolves to nothing is left as
//! written, so the task sees what it was given.

use std::collections::BTreeMap;

use nomad_proto::Node;
use serde_json::Value;

/// Resolves `${...}` references.
pub struct Interpolator<'a> {
    /// The task's environment.
    pub env: &'a BTreeMap<String, String>,
    /// This node.
    pub node: &'a Node,
    /// Region.
    pub region: &'a str,
}

impl Interpolator<'_> {
    fn lookup(&self, key: &str) -> Option<String> {
        let key = key.trim();
        if let Some(name) = key.strip_prefix("env.") {
            return self.env.get(name).cloned();
        }
        if let Some(name) = key.strip_prefix("env[").and_then(|r| r.strip_suffix(']')) {
            return self.env.get(name.trim_matches('"')).cloned();
        }
        if let Some(attr) = key.strip_prefix("attr.") {
            return self.node.attributes.get(attr).cloned();
        }
        if let Some(meta) = key.strip_prefix("meta.").or_else(|| key.strip_prefix("node.meta.")) {
            return self.node.meta.get(meta).cloned();
        }
        match key {
            "node.unique.id" => return Some(self.node.id.clone()),
            "node.unique.name" => return Some(self.node.name.clone()),
            "node.datacenter" => return Some(self.node.datacenter.clone()),
            "node.region" => return Some(self.region.to_string()),
            "node.class" => return Some(self.node.node_class.clone()),
            "node.pool" => return Some(self.node.node_pool.clone()),
            _ => {}
        }
        self.env.get(key).cloned()
    }

    /// Replaces every resolvable `${...}` in `s`.
    pub fn replace(&self, s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                out.push_str(&rest[start..]);
                return out;
            };
            match self.lookup(&after[..end]) {
                Some(v) => out.push_str(&v),
                None => out.push_str(&rest[start..start + 2 + end + 1]),
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        out
    }

    /// Interpolates every string in a JSON value, map keys included, recursively.
    pub fn value(&self, v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.replace(s)),
            Value::Array(items) => Value::Array(items.iter().map(|i| self.value(i)).collect()),
            Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (self.replace(k), self.value(v))).collect()),
            other => other.clone(),
        }
    }

    /// Interpolates a task's driver config.
    pub fn config(&self, config: &BTreeMap<String, Value>) -> serde_json::Map<String, Value> {
        config.iter().map(|(k, v)| (self.replace(k), self.value(v))).collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node() -> Node {
        let mut n = Node {
            id: "nid".into(),
            name: "web-1".into(),
            datacenter: "dc1".into(),
            node_class: "large".into(),
            node_pool: "prod".into(),
            ..Node::default()
        };
        n.attributes.insert("kernel.name".into(), "linux".into());
        n.meta.insert("rack".into(), "r7".into());
        n
    }

    #[test]
    fn every_namespace_resolves_and_unknown_references_stay() {
        let env = BTreeMap::from([("NOMAD_ALLOC_ID".to_string(), "a1".to_string()), ("HOME".to_string(), "/h".to_string())]);
        let node = node();
        let i = Interpolator { env: &env, node: &node, region: "global" };
        assert_eq!(
            i.replace("${NOMAD_ALLOC_ID}/${env.HOME}/${env[\"HOME\"]}/${attr.kernel.name}/${meta.rack}/${node.meta.rack}"),
            "a1//h//h/linux/r7/r7"
        );
        assert_eq!(
            i.replace("${node.unique.id} ${node.unique.name} ${node.datacenter} ${node.region} ${node.class} ${node.pool}"),
            "nid web-1 dc1 global large prod"
        );
        assert_eq!(i.replace("${nope} ${attr.missing} $HOME ${unterminated"), "${nope} ${attr.missing} $HOME ${unterminated");
        assert_eq!(i.replace("${ NOMAD_ALLOC_ID }"), "a1");
    }

    #[test]
    fn config_is_interpolated_recursively_with_keys() {
        let env = BTreeMap::from([("NOMAD_TASK_DIR".to_string(), "/local".to_string())]);
        let node = node();
        let i = Interpolator { env: &env, node: &node, region: "global" };
        let config = BTreeMap::from([
            ("command".to_string(), json!("${NOMAD_TASK_DIR}/run.sh")),
            ("args".to_string(), json!(["--dc", "${node.datacenter}", 3, true])),
            ("labels".to_string(), json!({"${attr.kernel.name}": {"rack": "${meta.rack}"}})),
        ]);
        let out = Value::Object(i.config(&config));
        assert_eq!(out, json!({"command": "/local/run.sh", "args": ["--dc", "dc1", 3, true], "labels": {"linux": {"rack": "r7"}}}));
    }
}
