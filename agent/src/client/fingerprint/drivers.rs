//! Drivers: the node's `Drivers` map and each detected driver's attributes (`driver.raw_exec`).

use std::collections::BTreeMap;

use nomad_proto::{DriverInfo, Node};

/// Puts the drivers' fingerprints on the node: the `Drivers` map, and the attributes of every
/// detected driver (an undetected driver's attributes are removed).
pub fn apply_drivers(node: &mut Node, infos: &BTreeMap<String, DriverInfo>) {
    node.attributes.retain(|k, _| !k.starts_with("driver."));
    for info in infos.values().filter(|i| i.detected) {
        node.attributes.extend(info.attributes.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    node.drivers = infos.clone();
}

/// True when a driver appeared, vanished, or changed detection, health or attributes.
/// The fingerprint time alone is not a change (it would re-register every period).
pub fn drivers_changed(old: &BTreeMap<String, DriverInfo>, new: &BTreeMap<String, DriverInfo>) -> bool {
    old.len() != new.len()
        || old.iter().any(|(name, o)| {
            new.get(name).is_none_or(|n| {
                o.detected != n.detected
                    || o.healthy != n.healthy
                    || o.health_description != n.health_description
                    || o.attributes != n.attributes
            })
        })
}

#[cfg(test)]
mod tests {
    use nomad_proto::Timestamp;

    use super::*;

    fn info(detected: bool, healthy: bool) -> DriverInfo {
        let mut i = DriverInfo { detected, healthy, update_time: Timestamp::now(), ..DriverInfo::default() };
        if detected {
            i.attributes.insert("driver.raw_exec".into(), "1".into());
        }
        i
    }

    #[test]
    fn detected_drivers_add_their_attributes_and_lost_ones_remove_them() {
        let mut node = Node::default();
        node.attributes.insert("kernel.name".into(), "linux".into());
        apply_drivers(&mut node, &BTreeMap::from([("raw_exec".to_string(), info(true, true))]));
        assert_eq!(node.attributes.get("driver.raw_exec").map(String::as_str), Some("1"));
        apply_drivers(&mut node, &BTreeMap::from([("raw_exec".to_string(), info(false, false))]));
        assert!(!node.attributes.contains_key("driver.raw_exec"));
        assert!(node.attributes.contains_key("kernel.name"));
        assert!(!node.drivers["raw_exec"].detected);
    }

    #[test]
    fn only_real_changes_count() {
        let a = BTreeMap::from([("raw_exec".to_string(), info(true, true))]);
        let mut b = a.clone();
        b.get_mut("raw_exec").unwrap().update_time = Timestamp(1);
        assert!(!drivers_changed(&a, &b), "a new fingerprint time is not a change");
        b.get_mut("raw_exec").unwrap().healthy = false;
        assert!(drivers_changed(&a, &b));
        assert!(drivers_changed(&a, &BTreeMap::new()));
    }
}
