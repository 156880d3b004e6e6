//! Structured logs on stderr.

use tracing_subscriber::EnvFilter;

/// Sets up logging at `level`; `NOMAD_RS_LOG` (an env-filter directive) overrides it.
pub fn init(level: &str) {
    let filter = std::env::var("NOMAD_RS_LOG")
        .ok()
        .and_then(|d| EnvFilter::try_new(d).ok())
        .unwrap_or_else(|| EnvFilter::new(format!("{},openraft=warn,h2=warn,tower=warn,hyper=warn", level.to_lowercase())));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).try_init();
}
