//! `nomad-rs service list [-json]` and `nomad-rs service info [-json] [-verbose] <name>`:
//! Nomad-native service registrations (`provider = "nomad"`).

use clap::{Args, Subcommand};
use nomad_proto::ServiceRegistration;
use nomad_proto::service_registration::ServiceRegistrationListStub;

use super::api::{ApiFlags, Query, encode_path};
use super::format::{kv, limit, table_with_header};
use super::{CmdResult, Ctx, Failure, exit};

/// `nomad-rs service`.
#[derive(Debug, Args)]
pub struct ServiceArgs {
    /// General options.
    #[command(flatten)]
    pub api: ApiFlags,
    /// The service command.
    #[command(subcommand)]
    pub command: ServiceCommand,
}

/// Service commands.
#[derive(Debug, Subcommand)]
pub enum ServiceCommand {
    /// List the registered services (names and tags) of a namespace (`-namespace '*'`: all).
    List(ListArgs),
    /// Show the registrations of one service.
    Info(InfoArgs),
}

/// Flags of `service list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print the API's JSON.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `service info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Print the API's JSON.
    #[arg(long)]
    pub json: bool,
    /// Every field, full IDs.
    #[arg(long)]
    pub verbose: bool,
    /// The service name.
    #[arg(value_name = "SERVICE_NAME")]
    pub name: String,
}

/// Runs a service command.
pub async fn run(a: ServiceArgs) -> CmdResult {
    let ctx = Ctx::new(&a.api)?;
    match a.command {
        ServiceCommand::List(l) => list(&ctx, l.json).await,
        ServiceCommand::Info(i) => info(&ctx, &i.name, i.verbose, i.json).await,
    }
}

async fn list(ctx: &Ctx, json: bool) -> CmdResult {
    let err = |e| Failure::new(format!("Error listing service registrations: {e}"));
    if json {
        return ctx.print_json("/v1/services", &Query::new(), "Error listing service registrations").await;
    }
    let list = ctx.client.get::<Vec<ServiceRegistrationListStub>>("/v1/services", &Query::new()).await.map_err(err)?.value;
    if list.iter().all(|ns| ns.services.is_empty()) {
        println!("No service registrations found");
        return Ok(exit::OK);
    }
    let all_namespaces = ctx.client.config().namespace.as_deref() == Some("*");
    println!("{}", render_list(&list, all_namespaces));
    Ok(exit::OK)
}

async fn info(ctx: &Ctx, name: &str, verbose: bool, json: bool) -> CmdResult {
    if name.is_empty() {
        return Err(Failure::new("This command takes one argument: <service_name>"));
    }
    let path = format!("/v1/service/{}", encode_path(name));
    let err = |e| Failure::new(format!("Error listing service registrations: {e}"));
    let regs = ctx.client.get::<Vec<ServiceRegistration>>(&path, &Query::new()).await.map_err(err)?.value;
    if regs.is_empty() {
        return Err(Failure::new(format!("No service registrations with name {name:?} found")));
    }
    if json {
        return ctx.print_json(&path, &Query::new(), "Error listing service registrations").await;
    }
    println!("{}", if verbose { render_info_verbose(&regs) } else { render_info(&regs) });
    Ok(exit::OK)
}

/// Tags as Nomad prints them: `[a,b]`.
pub fn tags(t: &[String]) -> String {
    format!("[{}]", t.join(","))
}

/// The `service list` table: service names and tags (with the namespace when listing all).
pub fn render_list(list: &[ServiceRegistrationListStub], all_namespaces: bool) -> String {
    let mut rows = Vec::new();
    for ns in list {
        for s in &ns.services {
            let mut row = vec![s.service_name.clone()];
            if all_namespaces {
                row.push(ns.namespace.clone());
            }
            row.push(tags(&s.tags));
            rows.push(row);
        }
    }
    let header: &[&str] = if all_namespaces { &["Service Name", "Namespace", "Tags"] } else { &["Service Name", "Tags"] };
    table_with_header(header, rows)
}

fn address(r: &ServiceRegistration) -> String {
    if r.address.contains(':') { format!("[{}]:{}", r.address, r.port) } else { format!("{}:{}", r.address, r.port) }
}

/// The `service info` table.
pub fn render_info(regs: &[ServiceRegistration]) -> String {
    let rows = regs
        .iter()
        .map(|r| vec![r.job_id.clone(), address(r), tags(&r.tags), limit(&r.node_id, 8).to_string(), limit(&r.alloc_id, 8).to_string()])
        .collect();
    table_with_header(&["Job ID", "Address", "Tags", "Node ID", "Alloc ID"], rows)
}

/// `service info -verbose`: every registration as key/value pairs.
pub fn render_info_verbose(regs: &[ServiceRegistration]) -> String {
    regs.iter()
        .map(|r| {
            kv(&[
                ("ID", r.id.clone()),
                ("Service Name", r.service_name.clone()),
                ("Namespace", r.namespace.clone()),
                ("Job ID", r.job_id.clone()),
                ("Alloc ID", r.alloc_id.clone()),
                ("Node ID", r.node_id.clone()),
                ("Datacenter", r.datacenter.clone()),
                ("Address", address(r)),
                ("Tags", tags(&r.tags)),
            ])
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

#[cfg(test)]
mod tests {
    use nomad_proto::service_registration::ServiceRegistrationStub;

    use super::*;

    fn reg(alloc: &str, port: i64) -> ServiceRegistration {
        ServiceRegistration {
            id: format!("_nomad-task-{alloc}-group-cache-redis-db"),
            service_name: "redis".into(),
            namespace: "default".into(),
            node_id: "7406e90b-de16-d118-80fe-60d0f2730cb3".into(),
            datacenter: "dc1".into(),
            job_id: "example".into(),
            alloc_id: alloc.into(),
            tags: vec!["db".into(), "cache".into()],
            address: "127.0.0.1".into(),
            port,
            ..ServiceRegistration::default()
        }
    }

    #[test]
    fn info_is_nomads_aligned_table_and_verbose_lists_every_field() {
        let regs = [reg("5f0730ca-b055-52ac-f56e-358f3f7412f6", 22686), reg("a831f7f2-4c01-39dc-c742-f2b8ca178a49", 25854)];
        let out = render_info(&regs);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0].split_whitespace().collect::<Vec<_>>(), ["Job", "ID", "Address", "Tags", "Node", "ID", "Alloc", "ID"]);
        assert_eq!(lines[1].split_whitespace().collect::<Vec<_>>(), ["example", "127.0.0.1:22686", "[db,cache]", "7406e90b", "5f0730ca"]);
        let col = |l: &str, s: &str| l.find(s).unwrap();
        assert_eq!(col(lines[0], "Address"), col(lines[1], "127.0.0.1"), "aligned:\n{out}");
        assert_eq!(col(lines[0], "Alloc ID"), col(lines[2], "a831f7f2"), "aligned:\n{out}");

        let v = render_info_verbose(&regs[..1]);
        assert!(v.contains("ID           = _nomad-task-5f0730ca-b055-52ac-f56e-358f3f7412f6-group-cache-redis-db"), "{v}");
        assert!(v.contains("Node ID      = 7406e90b-de16-d118-80fe-60d0f2730cb3"), "{v}");
        assert!(v.contains("Address      = 127.0.0.1:22686") && v.contains("Tags         = [db,cache]"), "{v}");
        let mut six = reg("x", 80);
        six.address = "::1".into();
        assert!(render_info(&[six]).contains("[::1]:80"));
    }

    #[test]
    fn list_shows_names_and_tags_and_the_namespace_only_across_namespaces() {
        let list = vec![
            ServiceRegistrationListStub {
                namespace: "default".into(),
                services: vec![ServiceRegistrationStub { service_name: "redis".into(), tags: vec!["db".into(), "cache".into()] }],
            },
            ServiceRegistrationListStub {
                namespace: "prod".into(),
                services: vec![ServiceRegistrationStub { service_name: "web".into(), tags: vec![] }],
            },
        ];
        let out = render_list(&list, false);
        let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(rows, [vec!["Service", "Name", "Tags"], vec!["redis", "[db,cache]"], vec!["web", "[]"]]);
        let out = render_list(&list, true);
        let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(rows, [vec!["Service", "Name", "Namespace", "Tags"], vec!["redis", "default", "[db,cache]"], vec!["web", "prod", "[]"]]);
    }
}
