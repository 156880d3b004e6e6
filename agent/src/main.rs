use nomad_agent::cli::{Command, parse};

fn main() -> std::process::ExitCode {
    let cli = match parse(std::env::args_os()) {
        Ok(cli) => cli,
        Err(code) => return std::process::ExitCode::from(code),
    };
    if !matches!(cli.command, Command::Agent(_)) {
        quiet_on_broken_pipe();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            Command::Agent(args) => match nomad_agent::cli::agent::run(args).await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("Error: {e:#}");
                    1
                }
            },
            Command::Version => {
                println!("{}", nomad_agent::cli::version_line());
                0
            }
            // API commands print their own errors and choose their exit code.
            other => nomad_agent::cli::run(other).await,
        }
    });
    // Blocking reads still in flight (a Ctrl-C'd monitor) must not hold the process open.
    runtime.shutdown_background();
    std::process::ExitCode::from(code)
}

/// A CLI command whose reader has gone (`nomad-rs node status | head -1`) ends quietly, killed by
/// SIGPIPE as a Go program such as Nomad's CLI is, instead of panicking in `println!` on EPIPE.
///
/// Only a failed write to stdout or stderr does this: SIGPIPE stays ignored (Rust's default), so
/// a server closing the API connection mid-request is still an error the command reports
/// (socket writes do not all pass MSG_NOSIGNAL, so restoring SIGPIPE's default outright would
/// kill the command silently there).
fn quiet_on_broken_pipe() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message =
            payload.downcast_ref::<String>().map(String::as_str).or_else(|| payload.downcast_ref::<&str>().copied()).unwrap_or("");
        if message.starts_with("failed printing to std") && message.contains("(os error 32)") {
            use nix::sys::signal::{SigHandler, Signal, raise, signal};
            // SAFETY: restores the default disposition (no handler is installed), then dies of it.
            let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
            let _ = raise(Signal::SIGPIPE);
        }
        report(info)
    }));
}
