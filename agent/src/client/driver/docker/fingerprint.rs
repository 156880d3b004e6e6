//! Whether an Engine answers, and the node attributes Nomad's docker driver sets.

use bollard::Docker;
use bollard::query_parameters::ListNetworksOptions;
use nomad_proto::{DriverInfo, Timestamp};

use super::config::DockerOptions;

/// The Engine gives the default bridge the first address of its subnet when its IPAM config
/// names no gateway (the Engine 20.10 here lists only the subnet).
fn first_host(subnet: &str) -> Option<String> {
    let (network, _) = subnet.split_once('/')?;
    let ip: std::net::Ipv4Addr = network.parse().ok()?;
    Some(std::net::Ipv4Addr::from(u32::from(ip).checked_add(1)?).to_string())
}

/// No Engine answered: undetected when none ever did, else detected and unhealthy.
pub fn failed(ever_detected: bool, why: &str) -> DriverInfo {
    let mut info = DriverInfo { update_time: Timestamp::now(), ..DriverInfo::default() };
    if ever_detected {
        info.detected = true;
        info.health_description = format!("Failed to connect to docker daemon: {why}");
    } else {
        info.health_description = format!("no Docker Engine answers: {why}");
    }
    info
}

/// The fingerprint from the Engine's answers; `ever_detected` decides between undetected (never
/// seen an Engine) and unhealthy (one went away).
pub async fn fingerprint(docker: Option<&Docker>, options: &DockerOptions, ever_detected: bool) -> DriverInfo {
    let mut info = DriverInfo { update_time: Timestamp::now(), ..DriverInfo::default() };
    let Some(docker) = docker else { return failed(ever_detected, &format!("no socket at {}", options.socket)) };
    let version = match docker.version().await {
        Ok(v) => v,
        Err(e) => return failed(ever_detected, &e.to_string()),
    };
    let a = &mut info.attributes;
    a.insert("driver.docker".to_string(), "1".to_string());
    a.insert("driver.docker.version".to_string(), version.version.unwrap_or_default());
    a.insert("driver.docker.os_type".to_string(), version.os.unwrap_or_else(|| "linux".to_string()));
    if let Ok(system) = docker.info().await {
        let mut runtimes: Vec<String> = system.runtimes.map(|r| r.into_keys().collect()).unwrap_or_default();
        runtimes.sort();
        a.insert("driver.docker.runtimes".to_string(), runtimes.join(","));
    }
    let bridge = ListNetworksOptions { filters: Some([("name".to_string(), vec!["bridge".to_string()])].into()) };
    if let Ok(networks) = docker.list_networks(Some(bridge)).await {
        let gateway = networks
            .iter()
            .filter(|n| n.name.as_deref() == Some("bridge"))
            .flat_map(|n| n.ipam.iter().flat_map(|i| i.config.iter().flatten()))
            .find_map(|c| c.gateway.clone().filter(|g| !g.is_empty()).or_else(|| c.subnet.as_deref().and_then(first_host)));
        if let Some(gateway) = gateway {
            a.insert("driver.docker.bridge_ip".to_string(), gateway);
        }
    }
    if options.allow_privileged {
        a.insert("driver.docker.privileged.enabled".to_string(), "true".to_string());
    }
    if options.volumes_enabled {
        a.insert("driver.docker.volumes.enabled".to_string(), "true".to_string());
    }
    if options.pids_limit > 0 {
        a.insert("driver.docker.pids.limit".to_string(), options.pids_limit.to_string());
    }
    info.detected = true;
    info.healthy = true;
    info.health_description = "Healthy".to_string();
    info
}
