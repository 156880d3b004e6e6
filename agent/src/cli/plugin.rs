//! `nomad-rs plugin status [-type csi] [-short] [-verbose] [-json] [<id>]`
//! (`command/plugin_status.go`, `plugin_status_csi.go`).

use clap::{Args, Subcommand};
use nomad_proto::csi::{CsiInfo, CsiPlugin, CsiPluginListStub};

use super::api::{ApiFlags, Query, encode_path};
use super::format::{json_text, kv, limit, now_nanos, safe_json, table_with_header};
use super::volume::status::check_type_and_template;
use super::{CmdResult, Ctx, Failure, exit, tables};

/// `nomad-rs plugin`.
#[derive(Debug, Args)]
pub struct PluginArgs {
    /// General options.
    #[command(flatten)]
    pub api: ApiFlags,
    /// The plugin command.
    #[command(subcommand)]
    pub command: PluginCommand,
}

/// Plugin commands.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// List CSI plugins, or show one plugin's controllers, nodes and allocations.
    #[command(long_about = LONG_ABOUT)]
    Status(StatusArgs),
}

/// The long help.
pub const LONG_ABOUT: &str = "Display status information about a plugin. If no plugin id is given, a list of all plugins will be \
                        displayed. The ID may be a prefix.";

/// Flags of `plugin status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// List only plugins of this type (only "csi" exists).
    #[arg(long = "type", value_name = "TYPE")]
    pub plugin_type: Option<String>,
    /// Display short output: with a plugin ID, drop the allocations.
    #[arg(long)]
    pub short: bool,
    /// Full IDs, and the plugin's capabilities and topologies.
    #[arg(long)]
    pub verbose: bool,
    /// Output the plugins in JSON format.
    #[arg(long)]
    pub json: bool,
    /// Format with a Go template (not supported by nomad-rs: use -json).
    #[arg(short = 't', value_name = "TEMPLATE")]
    pub template: Option<String>,
    /// Plugin ID or prefix; none lists all plugins.
    #[arg(value_name = "PLUGIN")]
    pub id: Option<String>,
}

/// Runs a plugin command.
pub async fn run(a: PluginArgs) -> CmdResult {
    let PluginCommand::Status(args) = a.command;
    check_type_and_template("plugin", args.plugin_type.as_deref(), args.template.as_deref())?;
    let ctx = Ctx::new(&a.api)?;
    let prefix = args.id.clone().unwrap_or_default();
    if !args.json && prefix.is_empty() {
        println!("{}", ctx.style.bold("Container Storage Interface"));
    }
    let q = Query::new().param("type", "csi");
    let q = if prefix.is_empty() { q } else { q.prefix(&prefix) };
    let mut plugins = ctx
        .client
        .get::<Option<Vec<CsiPluginListStub>>>("/v1/plugins", &q)
        .await
        .map_err(|e| Failure::new(format!("Error querying CSI plugins: {e}")))?
        .value
        .unwrap_or_default();
    plugins.retain(|p| p.id.starts_with(&prefix));
    plugins.sort_by(|a, b| a.id.cmp(&b.id));
    if prefix.is_empty() {
        if args.json {
            println!("{}", json_text(&plugins));
        } else if plugins.is_empty() {
            eprintln!("No CSI plugins");
        } else {
            println!("{}", plugins_table(&plugins, ctx.id_len(args.verbose)));
        }
        return Ok(exit::OK);
    }
    let id = match plugins.iter().position(|p| p.id == prefix) {
        _ if plugins.is_empty() => return Err(Failure::new(format!("No plugins(s) with prefix or ID {prefix:?} found"))),
        Some(i) => plugins[i].id.clone(),
        None if plugins.len() == 1 => plugins[0].id.clone(),
        None => {
            let table = if args.json { json_text(&plugins) } else { plugins_table(&plugins, ctx.id_len(args.verbose)) };
            return Err(Failure::new(format!("Prefix matched multiple plugins\n\n{table}")));
        }
    };
    let path = format!("/v1/plugin/csi/{}", encode_path(&id));
    let answer = ctx.client.get_json(&path, &Query::new()).await.map_err(|e| Failure::new(format!("Error querying plugin: {e}")))?;
    if args.json {
        println!("{}", safe_json(&serde_json::to_string_pretty(&answer.value).unwrap_or_default()));
        return Ok(exit::OK);
    }
    let plugin: CsiPlugin =
        nomad_proto::lenient::from_value(answer.value).map_err(|e| Failure::new(format!("Error querying plugin: {e}")))?;
    println!("{}", details(&plugin));
    if args.short {
        return Ok(exit::OK);
    }
    if args.verbose {
        let sections = [
            ("Controller Capabilities", controller_caps(&plugin)),
            ("Node Capabilities", node_caps(&plugin)),
            ("Accessible Topologies", topologies(&plugin)),
        ];
        for (title, text) in sections {
            if let Some(text) = text {
                println!("{}", ctx.style.section(title));
                println!("{text}");
            }
        }
    }
    println!("{}", ctx.style.section("Allocations"));
    println!("{}", tables::allocs(&plugin.allocations, ctx.id_len(args.verbose), args.verbose, now_nanos()));
    Ok(exit::OK)
}

/// The plugin list (`csiFormatPlugins`).
pub fn plugins_table(plugins: &[CsiPluginListStub], len: usize) -> String {
    let rows = plugins
        .iter()
        .map(|p| {
            vec![
                limit(&p.id, len).into_owned(),
                p.provider.clone(),
                format!("{}/{}", p.controllers_healthy, p.controllers_expected),
                format!("{}/{}", p.nodes_healthy, p.nodes_expected),
            ]
        })
        .collect();
    table_with_header(&["ID", "Provider", "Controllers Healthy/Expected", "Nodes Healthy/Expected"], rows)
}

/// The plugin's key/value block.
pub fn details(p: &CsiPlugin) -> String {
    kv(&[
        ("ID", p.id.clone()),
        ("Provider", p.provider.clone()),
        ("Version", p.version.clone()),
        ("Controllers Healthy", p.controllers_healthy.to_string()),
        ("Controllers Expected", p.controllers_expected.to_string()),
        ("Nodes Healthy", p.nodes_healthy.to_string()),
        ("Nodes Expected", p.nodes_expected.to_string()),
    ])
}

/// Indented capability names, sorted; `None` when there are none.
fn caps_text(mut caps: Vec<&str>) -> Option<String> {
    caps.sort_unstable();
    caps.dedup();
    (!caps.is_empty()).then(|| format!("  {}", caps.join("\n  ")))
}

/// The first controller's capabilities (Nomad takes every instance of a plugin to be alike).
/// Each is listed only if the controller has it (Nomad 1.6's switch falls through and lists
/// every capability after the first one found).
fn controller_caps(p: &CsiPlugin) -> Option<String> {
    let info = p.controllers.values().find_map(|c: &CsiInfo| c.controller_info.as_ref())?;
    let all = [
        (info.supports_create_delete, "CREATE_DELETE_VOLUME"),
        (info.supports_attach_detach, "CONTROLLER_ATTACH_DETACH"),
        (info.supports_list_volumes, "LIST_VOLUMES"),
        (info.supports_get_capacity, "GET_CAPACITY"),
        (info.supports_create_delete_snapshot, "CREATE_DELETE_SNAPSHOT"),
        (info.supports_list_snapshots, "LIST_SNAPSHOTS"),
        (info.supports_clone, "CLONE_VOLUME"),
        (info.supports_read_only_attach, "ATTACH_READONLY"),
        (info.supports_expand, "EXPAND_VOLUME"),
        (info.supports_list_volumes_attached_nodes, "LIST_VOLUMES_PUBLISHED_NODES"),
        (info.supports_condition, "VOLUME_CONDITION"),
        (info.supports_get, "GET_VOLUME"),
    ];
    caps_text(all.iter().filter(|(has, _)| *has).map(|(_, name)| *name).collect())
}

/// The first node instance's capabilities.
fn node_caps(p: &CsiPlugin) -> Option<String> {
    let node = p.nodes.values().next()?;
    let mut caps = Vec::new();
    if node.requires_topologies {
        caps.push("VOLUME_ACCESSIBILITY_CONSTRAINTS");
    }
    if let Some(info) = &node.node_info {
        let all = [
            (info.requires_node_stage_volume, "STAGE_UNSTAGE_VOLUME"),
            (info.supports_stats, "GET_VOLUME_STATS"),
            (info.supports_expand, "EXPAND_VOLUME"),
            (info.supports_condition, "VOLUME_CONDITION"),
        ];
        caps.extend(all.iter().filter(|(has, _)| *has).map(|(_, name)| *name));
    }
    caps_text(caps)
}

/// Each node's accessible topology.
fn topologies(p: &CsiPlugin) -> Option<String> {
    let rows: Vec<Vec<String>> = p
        .nodes
        .iter()
        .filter_map(|(node_id, info)| {
            let topo = info.node_info.as_ref()?.accessible_topology.as_ref()?;
            let pairs: Vec<String> = topo.segments.iter().map(|(k, v)| format!("{k}={v}")).collect();
            Some(vec![limit(node_id, 8).into_owned(), pairs.join(",")])
        })
        .collect();
    (!rows.is_empty()).then(|| table_with_header(&["Node ID", "Accessible Topology"], rows))
}

#[cfg(test)]
mod tests {
    use nomad_proto::csi::{CsiControllerInfo, CsiNodeInfo, CsiTopology};

    use super::*;

    #[test]
    fn capabilities_list_only_what_the_plugin_has() {
        let mut p = CsiPlugin::default();
        assert_eq!(controller_caps(&p), None);
        p.controllers.insert(
            "n1".into(),
            CsiInfo {
                controller_info: Some(CsiControllerInfo { supports_create_delete: true, supports_get: true, ..Default::default() }),
                ..Default::default()
            },
        );
        assert_eq!(controller_caps(&p).as_deref(), Some("  CREATE_DELETE_VOLUME\n  GET_VOLUME"));
        p.nodes.insert(
            "4e0d0001-aaaa".into(),
            CsiInfo {
                requires_topologies: true,
                node_info: Some(CsiNodeInfo {
                    requires_node_stage_volume: true,
                    accessible_topology: Some(CsiTopology { segments: [("rack".to_string(), "r1".to_string())].into() }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        assert_eq!(node_caps(&p).as_deref(), Some("  STAGE_UNSTAGE_VOLUME\n  VOLUME_ACCESSIBILITY_CONSTRAINTS"));
        assert_eq!(topologies(&p).as_deref(), Some("Node ID   Accessible Topology\n4e0d0001  rack=r1"));
    }
}
