//! Structured logs on stderr.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Sets up logging at `level`; `NOMAD_RS_LOG` (an env-filter directive) overrides it. Colors
/// only on a terminal: a log file or the journal gets plain text (and `NO_COLOR` turns them off).
pub fn init(level: &str) {
    let filter = std::env::var("NOMAD_RS_LOG")
        .ok()
        .and_then(|d| EnvFilter::try_new(d).ok())
        .unwrap_or_else(|| EnvFilter::new(format!("{},openraft=warn,h2=warn,tower=warn,hyper=warn", level.to_lowercase())));
    let _ =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colors()).with_target(false).try_init();
}

/// Whether log lines may carry ANSI colors: stderr is a terminal and `NO_COLOR` is not set.
fn colors() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}
