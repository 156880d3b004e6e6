//! `nomad-rs volume status [-type csi] [-short] [-verbose] [-json] [<id>]`
//! (`command/volume_status.go`, `volume_status_csi.go`).

use clap::Args;
use nomad_proto::AllocListStub;
use nomad_proto::csi::{CsiPluginListStub, CsiVolume};
use nomad_proto::volume::CsiMountOptions;
use serde::Deserialize;

use crate::cli::api::{ApiFlags, Query};
use crate::cli::format::{json_text, kv, limit, now_nanos, table_with_header};
use crate::cli::{CmdResult, Ctx, Failure, exit, tables};

/// The long help.
pub const LONG_ABOUT: &str = "Display status information about a CSI volume. If no volume id is given, a list of all volumes will \
                        be displayed. The ID may be a prefix; -namespace '*' looks in every namespace.";

/// Flags of `volume status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// List only volumes of this type (only "csi" exists).
    #[arg(long = "type", value_name = "TYPE")]
    pub volume_type: Option<String>,
    /// Display short output: with a volume ID, drop the allocations.
    #[arg(long)]
    pub short: bool,
    /// Full IDs, and with no volume ID the external volumes of each controller plugin.
    #[arg(long)]
    pub verbose: bool,
    /// Output the volumes in JSON format.
    #[arg(long)]
    pub json: bool,
    /// Format with a Go template (not supported by nomad-rs: use -json).
    #[arg(short = 't', value_name = "TEMPLATE")]
    pub template: Option<String>,
    /// Volume ID or prefix; none lists all volumes.
    #[arg(value_name = "ID")]
    pub id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct VolumeAllocations {
    allocations: Vec<AllocListStub>,
}

/// Refuses what `volume status` and `plugin status` share but nomad-rs cannot do.
pub fn check_type_and_template(kind: &str, t: Option<&str>, template: Option<&str>) -> Result<(), Failure> {
    if let Some(t) = t
        && !t.is_empty()
        && !t.eq_ignore_ascii_case("csi")
    {
        return Err(Failure::new(format!("Unsupported {kind} type: {}", t.to_lowercase())));
    }
    if template.is_some() {
        return Err(Failure::new("-t (Go templates) is not supported by nomad-rs; use -json and a JSON tool"));
    }
    Ok(())
}

/// Runs `volume status`.
pub async fn run(api: &ApiFlags, args: StatusArgs) -> CmdResult {
    check_type_and_template("volume", args.volume_type.as_deref(), args.template.as_deref())?;
    let ctx = Ctx::new(api)?;
    match &args.id {
        None => list(&ctx, &args).await,
        Some(id) => show(&ctx, &args, id).await,
    }
}

async fn list(ctx: &Ctx, args: &StatusArgs) -> CmdResult {
    if !args.json {
        println!("{}", ctx.style.bold("Container Storage Interface"));
    }
    let mut vols = super::list(ctx, "").await?;
    if args.json {
        vols.sort_by(|a, b| a.id.cmp(&b.id));
        println!("{}", json_text(&vols));
        return Ok(exit::OK);
    }
    if vols.is_empty() {
        eprintln!("No CSI volumes");
    } else {
        println!("{}", super::volumes_table(&mut vols));
    }
    if !args.verbose {
        return Ok(exit::OK);
    }
    let plugins = ctx
        .client
        .get::<Option<Vec<CsiPluginListStub>>>("/v1/plugins", &Query::new().param("type", "csi"))
        .await
        .map_err(|e| Failure::new(format!("Error querying CSI plugins: {e}")))?
        .value
        .unwrap_or_default();
    let mut code = exit::OK;
    for p in plugins.iter().filter(|p| p.controller_required && p.controllers_healthy > 0) {
        // The provider's own list of volumes (`ListExternal`), which needs a controller RPC.
        let q = Query::new().param("plugin_id", p.id.clone()).param("per_page", "30");
        match ctx.client.get_json("/v1/volumes/external", &q).await {
            Err(e) => {
                eprintln!("Error querying CSI external volumes for plugin {:?}: {e}", p.id);
                code = exit::ERROR;
            }
            Ok(a) => {
                let rows: Vec<Vec<String>> = a.value["Volumes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|v| {
                        let condition = if v["IsAbnormal"].as_bool().unwrap_or(false) {
                            format!("Abnormal ({})", v["Status"].as_str().unwrap_or_default())
                        } else {
                            "OK".to_string()
                        };
                        let nodes: Vec<&str> =
                            v["PublishedExternalNodeIDs"].as_array().into_iter().flatten().filter_map(|n| n.as_str()).collect();
                        vec![
                            limit(v["ExternalID"].as_str().unwrap_or_default(), ctx.id_len(args.verbose)).into_owned(),
                            limit(&condition, 20).into_owned(),
                            nodes.join(","),
                        ]
                    })
                    .collect();
                if !rows.is_empty() {
                    println!("{}", table_with_header(&["External ID", "Condition", "Nodes"], rows));
                }
            }
        }
    }
    Ok(code)
}

async fn show(ctx: &Ctx, args: &StatusArgs, prefix: &str) -> CmdResult {
    let stub = super::resolve(ctx, prefix).await?;
    let path = super::volume_path(&stub.id);
    let q = super::in_namespace(&stub.namespace);
    let answer = ctx.client.get_json(&path, &q).await.map_err(|e| Failure::new(format!("Error querying volume: {e}")))?;
    if args.json {
        println!("{}", crate::cli::format::safe_json(&serde_json::to_string_pretty(&answer.value).unwrap_or_default()));
        return Ok(exit::OK);
    }
    let decode_error = |e: nomad_proto::lenient::DecodeError| Failure::new(format!("Error querying volume: {e}"));
    let vol: CsiVolume = nomad_proto::lenient::from_value(answer.value.clone()).map_err(decode_error)?;
    let allocs: VolumeAllocations = nomad_proto::lenient::from_value(answer.value).map_err(decode_error)?;
    println!("{}", details(&vol));
    if args.short {
        return Ok(exit::OK);
    }
    if let Some(topologies) = topologies(&vol) {
        println!("{}", ctx.style.section("Topologies"));
        println!("{topologies}");
    }
    println!("{}", ctx.style.section("Allocations"));
    println!("{}", tables::allocs(&allocs.allocations, ctx.id_len(args.verbose), args.verbose, now_nanos()));
    Ok(exit::OK)
}

/// The volume's key/value block (`formatBasic`).
pub fn details(v: &CsiVolume) -> String {
    kv(&[
        ("ID", v.id.clone()),
        ("Name", v.name.clone()),
        ("Namespace", v.namespace.clone()),
        ("External ID", v.external_id.clone()),
        ("Plugin ID", v.plugin_id.clone()),
        ("Provider", v.provider.clone()),
        ("Version", v.provider_version.clone()),
        ("Schedulable", v.schedulable.to_string()),
        ("Controllers Healthy", v.controllers_healthy.to_string()),
        ("Controllers Expected", v.controllers_expected.to_string()),
        ("Nodes Healthy", v.nodes_healthy.to_string()),
        ("Nodes Expected", v.nodes_expected.to_string()),
        ("Access Mode", v.access_mode.as_str().to_string()),
        ("Attachment Mode", v.attachment_mode.as_str().to_string()),
        ("Mount Options", mount_options(v.mount_options.as_ref())),
    ])
}

/// Nomad's `csiVolMountOption` for a volume: `<none>`, or `fs_type: ext4 flags: a, b`.
pub fn mount_options(m: Option<&CsiMountOptions>) -> String {
    let Some(m) = m else { return "<none>".to_string() };
    let mut out = String::new();
    if !m.fs_type.is_empty() {
        out = format!("fs_type: {}", m.fs_type);
    }
    if !m.mount_flags.is_empty() {
        out = format!("{out} flags: {}", m.mount_flags.join(", "));
    }
    out
}

/// The `Topologies` table, `None` when the volume has none.
fn topologies(v: &CsiVolume) -> Option<String> {
    let rows: Vec<Vec<String>> = v
        .topologies
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let pairs: Vec<String> = t.segments.iter().map(|(k, v)| format!("{k}={v}")).collect();
            vec![format!("{i:02}"), pairs.join(", ")]
        })
        .collect();
    (!rows.is_empty()).then(|| table_with_header(&["Topology", "Segments"], rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_options_read_as_nomad_prints_them() {
        assert_eq!(mount_options(None), "<none>");
        let m = CsiMountOptions { fs_type: "ext4".into(), mount_flags: vec!["[REDACTED]".into()] };
        assert_eq!(mount_options(Some(&m)), "fs_type: ext4 flags: [REDACTED]");
        assert_eq!(mount_options(Some(&CsiMountOptions::default())), "");
    }

    #[test]
    fn only_the_csi_type_and_no_templates() {
        assert!(check_type_and_template("volume", Some("CSI"), None).is_ok());
        assert_eq!(check_type_and_template("plugin", Some("host"), None).unwrap_err().message, "Unsupported plugin type: host");
        assert!(check_type_and_template("volume", None, Some("{{.ID}}")).unwrap_err().message.contains("-t (Go templates)"));
    }
}
