use clap::Parser;
use nomad_agent::cli::{Cli, Command, normalize_args};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse_from(normalize_args(std::env::args_os()));
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Agent(args) => nomad_agent::cli::agent::run(args).await,
            Command::Version => {
                println!("nomad-rs v{} (Nomad API {})", env!("CARGO_PKG_VERSION"), nomad_server::http::API_VERSION);
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
