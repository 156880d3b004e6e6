use std::sync::atomic::Ordering;

use super::fake::FakePlugin;
use super::*;

fn registration(side: PluginSide, alloc_id: &str) -> PluginRegistration {
    PluginRegistration {
        side,
        plugin_id: "hostpath".into(),
        alloc_id: alloc_id.into(),
        socket: "/state/csi/plugins/a1/csi.sock".into(),
        provider: "hostpath.csi.k8s.io".into(),
        version: "1.0.0".into(),
        mount_point: "/state/csi/monolith/hostpath".into(),
        container_mount_point: "/local/csi".into(),
    }
}

fn manager(plugin: Arc<FakePlugin>) -> Arc<CsiManager> {
    let connect: Connector = Arc::new(move |_: &Path| Ok(plugin.clone() as Arc<dyn CsiPluginClient>));
    // Every instance is due at every call.
    CsiManager::new(Duration::ZERO, connect, PathBuf::from("/state/csi"))
}

#[tokio::test]
async fn a_node_plugin_fingerprints_into_nomads_csi_info() {
    let plugin = Arc::new(FakePlugin::default());
    let (basic, info) = fingerprint(plugin.as_ref(), &registration(PluginSide::Node, "a1"), None).await;
    assert!(basic.is_some(), "the basic part is kept once it succeeded");
    assert_eq!(info.plugin_id, "hostpath");
    assert_eq!(info.alloc_id, "a1");
    assert_eq!((info.provider.as_str(), info.provider_version.as_str()), ("hostpath.csi.k8s.io", "1.0.0"));
    assert!(info.healthy);
    assert_eq!(info.health_description, "healthy");
    assert!(info.requires_controller_plugin && info.requires_topologies);
    assert!(info.controller_info.is_none());
    let node = info.node_info.unwrap();
    assert_eq!(node.id, "host-1");
    assert_eq!(node.max_volumes, 7);
    assert_eq!(node.accessible_topology.unwrap().segments, BTreeMap::from([("rack".to_string(), "r1".to_string())]));
    assert!(node.requires_node_stage_volume && node.supports_expand && !node.supports_stats && !node.supports_condition);
}

#[tokio::test]
async fn a_controller_plugin_reports_its_capability_flags() {
    let plugin = Arc::new(FakePlugin::default());
    let (_, info) = fingerprint(plugin.as_ref(), &registration(PluginSide::Controller, "a1"), None).await;
    assert!(info.healthy);
    assert!(info.node_info.is_none());
    let c = info.controller_info.unwrap();
    assert!(c.supports_create_delete && c.supports_attach_detach && c.supports_list_volumes);
    assert!(!c.supports_get_capacity && !c.supports_clone && !c.supports_read_only_attach);
}

#[tokio::test]
async fn failures_make_the_instance_unhealthy_with_nomads_descriptions() {
    let plugin = Arc::new(FakePlugin::default());
    plugin.caps_fail.store(true, Ordering::SeqCst);
    let reg = registration(PluginSide::Node, "a1");
    let (basic, info) = fingerprint(plugin.as_ref(), &reg, None).await;
    assert!(basic.is_none(), "the basic part is tried again next time");
    assert!(!info.healthy);
    assert!(info.health_description.starts_with("failed initial fingerprint with err: "), "{}", info.health_description);

    plugin.caps_fail.store(false, Ordering::SeqCst);
    let (basic, _) = fingerprint(plugin.as_ref(), &reg, None).await;
    plugin.probe_fails.store(true, Ordering::SeqCst);
    let (kept, info) = fingerprint(plugin.as_ref(), &reg, basic.clone()).await;
    assert_eq!(kept, basic);
    assert!(!info.healthy);
    assert!(info.health_description.starts_with("failed fingerprinting with error: "), "{}", info.health_description);
    assert_eq!(info.node_info.unwrap().id, "host-1", "the basic part stays");
}

#[tokio::test]
async fn the_maps_follow_registrations_health_and_deregistrations() {
    let plugin = Arc::new(FakePlugin::default());
    let mgr = manager(plugin.clone());
    let mut maps = mgr.subscribe();
    mgr.register(registration(PluginSide::Controller, "a1"));
    mgr.register(registration(PluginSide::Node, "a1"));
    mgr.fingerprint_due().await;
    assert!(maps.has_changed().unwrap());
    let m = maps.borrow_and_update().clone();
    assert!(m.controllers["hostpath"].healthy && m.nodes["hostpath"].healthy);
    assert!(!m.nodes["hostpath"].update_time.is_zero());

    // Fingerprinted again, nothing changed: nothing is published (no register every 30 s).
    let first = m.nodes["hostpath"].update_time;
    mgr.fingerprint_due().await;
    assert!(!maps.has_changed().unwrap());

    plugin.probe_fails.store(true, Ordering::SeqCst);
    mgr.fingerprint_due().await;
    let m = maps.borrow_and_update().clone();
    assert!(!m.controllers["hostpath"].healthy && !m.nodes["hostpath"].healthy);
    assert!(m.nodes["hostpath"].update_time >= first);

    // An older alloc's deregistration leaves a newer alloc's instance alone.
    mgr.register(registration(PluginSide::Node, "a2"));
    mgr.deregister(PluginSide::Node, "hostpath", "a1");
    mgr.fingerprint_due().await;
    assert_eq!(maps.borrow_and_update().nodes["hostpath"].alloc_id, "a2");

    mgr.deregister(PluginSide::Controller, "hostpath", "a1");
    mgr.deregister(PluginSide::Node, "hostpath", "a2");
    assert_eq!(*maps.borrow_and_update(), CsiMaps::default(), "deregistered plugins leave the maps");
}
