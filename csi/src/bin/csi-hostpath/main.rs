//! csi-hostpath: a CSI plugin whose volumes are directories under its state dir, in the manner
//! of the Kubernetes reference hostpath driver, to run as a Nomad task and test against.
//!
//! - Controller: CreateVolume/DeleteVolume (idempotent by name), ControllerPublishVolume and
//!   ControllerUnpublishVolume recorded in `<statedir>/state.json`, ValidateVolumeCapabilities,
//!   ListVolumes, GetCapacity, ControllerExpandVolume. `--no-controller` leaves the service out.
//! - Node: NodeStageVolume bind-mounts the volume directory at the staging path,
//!   NodePublishVolume bind-mounts the staging path (the volume directory with `--no-staging`) at
//!   the target, read-only when asked; unpublish and unstage unmount and remove the path.
//! - Failure injection: `--slow MS` delays every call, `--slow-call METHOD=MS` the calls of one
//!   method (logging when each starts), `--fail-times METHOD=N` fails the first N calls of METHOD
//!   with UNAVAILABLE.
//!
//! Not done, as in the reference driver: snapshots, block volumes, topology. The single-node
//! publish rules are left to the orchestrator's claims (every node plugin on one machine sees
//! every mount, so the plugin cannot tell which node a mount belongs to). Secrets are accepted
//! and unused. Logs go to stderr; SIGTERM or SIGINT stops it and removes its socket.

mod faults;
mod mounts;
mod plugin;
mod state;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use nomad_csi::endpoint;
use nomad_csi::v1::controller_server::ControllerServer;
use nomad_csi::v1::identity_server::IdentityServer;
use nomad_csi::v1::node_server::NodeServer;
use tokio::signal::unix::{SignalKind, signal};
use tokio_stream::wrappers::UnixListenerStream;

use crate::faults::Faults;
use crate::plugin::{Config, Plugin, Service};
use crate::state::StateDir;

/// How long in-flight calls may finish after SIGTERM before the plugin exits anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Parser)]
#[command(name = "csi-hostpath", version, about = "A CSI plugin whose volumes are directories under its state dir")]
struct Args {
    /// The socket to serve on, as unix://PATH.
    #[arg(long, env = "CSI_ENDPOINT")]
    endpoint: String,
    /// The node ID NodeGetInfo reports.
    #[arg(long)]
    nodeid: String,
    /// Where volumes and state.json live (created if missing). Plugins sharing it share volumes.
    #[arg(long)]
    statedir: PathBuf,
    /// The plugin name GetPluginInfo reports.
    #[arg(long, default_value = "hostpath.csi.k8s.io")]
    drivername: String,
    /// The most volumes per node: reported by NodeGetInfo and enforced by
    /// ControllerPublishVolume. 0 is no limit.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i64).range(0..))]
    max_volumes: i64,
    /// The largest volume CreateVolume accepts, in bytes.
    #[arg(long, default_value_t = 1 << 40, value_parser = clap::value_parser!(i64).range(1..))]
    max_volume_size: i64,
    /// Do not serve the Controller service (a node-only plugin).
    #[arg(long)]
    no_controller: bool,
    /// Do not advertise STAGE_UNSTAGE_VOLUME: NodePublishVolume binds the volume directly.
    #[arg(long)]
    no_staging: bool,
    /// Delay every call by this many milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    slow: u64,
    /// Delay every call of METHOD (a gRPC method name) by MS milliseconds instead, logging when
    /// each starts. Repeatable.
    #[arg(long = "slow-call", value_name = "METHOD=MS")]
    slow_calls: Vec<String>,
    /// Fail the first N calls of METHOD (a gRPC method name, e.g. NodePublishVolume) with
    /// UNAVAILABLE. Repeatable.
    #[arg(long = "fail-times", value_name = "METHOD=N")]
    fail_times: Vec<String>,
}

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: task logs are files.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_ansi(ansi).with_env_filter(filter).init();
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!("starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let socket = endpoint::socket_path(&args.endpoint).map_err(|e| e.to_string())?;
    let faults = Faults::from_flags(args.slow, &args.slow_calls, &args.fail_times)?;
    if args.nodeid.is_empty() || args.nodeid.len() > 128 {
        return Err(format!("--nodeid {:?}: must be 1 to 128 bytes", args.nodeid));
    }
    let state = StateDir::open(&args.statedir).map_err(|e| format!("state dir {}: {e}", args.statedir.display()))?;
    let config = Config {
        driver_name: args.drivername,
        node_id: args.nodeid,
        max_volumes_per_node: args.max_volumes,
        max_volume_size: args.max_volume_size,
        controller: !args.no_controller,
        staging: !args.no_staging,
    };
    tracing::info!(socket = %socket.display(), statedir = %args.statedir.display(), ?config, "csi-hostpath starting");
    let service = Service(Arc::new(Plugin::new(config.clone(), state, faults)));

    let mut terminate = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM handler: {e}"))?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT handler: {e}"))?;
    let listener = endpoint::listen(&socket).map_err(|e| e.to_string())?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .add_service(IdentityServer::new(service.clone()))
        .add_service(NodeServer::new(service.clone()))
        .add_optional_service(config.controller.then(|| ControllerServer::new(service)))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
            let _ = stopped.await;
        });
    let mut server = tokio::spawn(server);
    tracing::info!("serving");

    let outcome = tokio::select! {
        _ = terminate.recv() => { tracing::info!("SIGTERM: stopping"); None }
        _ = interrupt.recv() => { tracing::info!("SIGINT: stopping"); None }
        result = &mut server => Some(result),
    };
    let result = match outcome {
        Some(result) => result,
        None => {
            let _ = stop.send(());
            match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
                Ok(result) => result,
                Err(_) => {
                    tracing::warn!("calls still running after {SHUTDOWN_GRACE:?}: exiting anyway");
                    server.abort();
                    Ok(Ok(()))
                }
            }
        }
    };
    if let Err(e) = std::fs::remove_file(&socket) {
        tracing::warn!(socket = %socket.display(), "removing the socket: {e}");
    }
    match result {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("serving: {e}")),
        Err(e) => Err(format!("server task: {e}")),
    }
}
