use nomad_agent::cli::{Command, parse};

fn main() -> std::process::ExitCode {
    let cli = match parse(std::env::args_os()) {
        Ok(cli) => cli,
        Err(code) => return std::process::ExitCode::from(code),
    };
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
                println!("nomad-rs v{} (Nomad API {})", env!("CARGO_PKG_VERSION"), nomad_server::http::API_VERSION);
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
