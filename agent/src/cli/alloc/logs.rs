//! `nomad-rs alloc logs [-stderr] [-f] [-tail] [-n lines] [-c bytes] <alloc> [task]`:
//! `GET /v1/client/fs/logs/<alloc>?task=&type=&plain=true&follow=&origin=&offset=`.

use std::io::Write;
use std::time::Duration;

use clap::Args;
use http_body_util::BodyExt;

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::{CmdResult, Ctx, Failure, exit, prefix};

/// Lines `-tail` shows when `-n` is not given.
const DEFAULT_TAIL_LINES: usize = 10;
/// Bytes asked for per wanted line when tailing; surplus lines are cut locally.
const BYTES_PER_LINE: u64 = 256;
/// When following a tail, output is held until the stream is quiet this long, then cut to `-n` lines.
const TAIL_QUIET: Duration = Duration::from_millis(200);
/// ... or until this much is buffered.
const TAIL_BUFFER_MAX: usize = 1 << 20;

/// Flags of `alloc logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Show stderr instead of stdout.
    #[arg(long)]
    pub stderr: bool,
    /// Keep streaming new output.
    #[arg(short = 'f', long = "follow")]
    pub follow: bool,
    /// Start from the end (the last 10 lines unless -n or -c says otherwise).
    #[arg(long)]
    pub tail: bool,
    /// With -tail: how many lines.
    #[arg(short = 'n', value_name = "LINES")]
    pub lines: Option<usize>,
    /// With -tail: how many bytes.
    #[arg(short = 'c', value_name = "BYTES")]
    pub bytes: Option<u64>,
    /// The task (same as the second argument).
    #[arg(long, value_name = "TASK")]
    pub task: Option<String>,
    /// Allocation ID or prefix.
    #[arg(value_name = "ALLOC")]
    pub alloc: String,
    /// Task name; optional when the allocation runs one task.
    #[arg(value_name = "TASK")]
    pub task_arg: Option<String>,
}

/// The last `n` lines of `buf` (a final line without a newline counts).
pub fn last_lines(buf: &[u8], n: usize) -> &[u8] {
    if n == 0 {
        return &buf[buf.len()..];
    }
    let body = buf.strip_suffix(b"\n").unwrap_or(buf);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return &buf[i + 1..];
            }
        }
    }
    buf
}

/// The logs query for these flags.
pub fn logs_query(args: &LogsArgs, task: &str) -> Query {
    let kind = if args.stderr { "stderr" } else { "stdout" };
    let mut q = Query::new().param("task", task).param("type", kind).param("plain", "true").param("follow", args.follow.to_string());
    if args.tail {
        let offset = match args.bytes {
            Some(b) => b,
            None => args.lines.unwrap_or(DEFAULT_TAIL_LINES) as u64 * BYTES_PER_LINE,
        };
        q = q.param("origin", "end").param("offset", offset.to_string());
    } else {
        q = q.param("origin", "start").param("offset", "0");
    }
    q
}

/// Runs `alloc logs`.
pub async fn run(api: &ApiFlags, args: LogsArgs) -> CmdResult {
    if args.lines.is_some() && args.bytes.is_some() {
        return Err(Failure::new("Give -n or -c, not both"));
    }
    let given = match (&args.task, &args.task_arg) {
        (Some(a), Some(b)) if a != b => return Err(Failure::new("Give the task once: either -task or as an argument")),
        (a, b) => a.clone().or_else(|| b.clone()),
    };
    let ctx = Ctx::new(api)?;
    let alloc = prefix::full_alloc(&ctx, &args.alloc).await?;
    let task = super::pick_task(&alloc, given.as_deref())?;
    let path = format!("/v1/client/fs/logs/{}", encode_path(&alloc.id));
    let mut body = ctx.client.get_stream(&path, &logs_query(&args, &task)).await.map_err(|e| {
        if e.is_unsupported_route() {
            Failure::new(format!("Error reading logs: this agent does not serve task logs yet (GET {path}: {e}); point -address at a nomad-rs client agent that does"))
        } else {
            Failure::new(format!("Error reading logs: {e}"))
        }
    })?;
    // With -tail and lines, cut the first burst to the last N lines; after that, pass through.
    let cut_lines = if args.tail && args.bytes.is_none() { Some(args.lines.unwrap_or(DEFAULT_TAIL_LINES)) } else { None };
    let mut held: Option<Vec<u8>> = cut_lines.map(|_| Vec::new());
    let mut stdout = std::io::stdout();
    let stream = async {
        loop {
            let holding = held.is_some();
            let next = match (holding, args.follow) {
                (true, true) => match tokio::time::timeout(TAIL_QUIET, body.frame()).await {
                    Ok(f) => f,
                    Err(_) => {
                        flush_held(&mut held, cut_lines, &mut stdout);
                        continue;
                    }
                },
                _ => body.frame().await,
            };
            let Some(frame) = next else { break };
            let frame = frame.map_err(|e| Failure::new(format!("Error reading logs: {e}")))?;
            let Ok(data) = frame.into_data() else { continue };
            match &mut held {
                Some(buf) => {
                    buf.extend_from_slice(&data);
                    if buf.len() > TAIL_BUFFER_MAX {
                        flush_held(&mut held, cut_lines, &mut stdout);
                    }
                }
                None => {
                    if stdout.write_all(&data).and_then(|()| stdout.flush()).is_err() {
                        // The reader went away (a closed pipe): stop quietly.
                        return Ok(exit::OK);
                    }
                }
            }
        }
        flush_held(&mut held, cut_lines, &mut stdout);
        Ok(exit::OK)
    };
    let interrupt = crate::cli::interrupted();
    tokio::select! {
        r = stream => r,
        _ = interrupt => Ok(exit::OK),
    }
}

fn flush_held(held: &mut Option<Vec<u8>>, lines: Option<usize>, out: &mut impl Write) {
    if let Some(buf) = held.take() {
        let shown = match lines {
            Some(n) => last_lines(&buf, n),
            None => &buf[..],
        };
        let _ = out.write_all(shown).and_then(|()| out.flush());
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn last_lines_keeps_the_tail() {
        assert_eq!(last_lines(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(last_lines(b"a\nb\nc", 2), b"b\nc");
        assert_eq!(last_lines(b"a\nb\n", 5), b"a\nb\n");
        assert_eq!(last_lines(b"a\nb\n", 0), b"");
    }

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        l: LogsArgs,
    }

    fn parse(args: &[&str]) -> LogsArgs {
        let argv = std::iter::once("t").chain(args.iter().copied()).map(std::ffi::OsString::from);
        T::try_parse_from(crate::cli::normalize_args(argv)).unwrap().l
    }

    #[test]
    fn flags_in_either_spelling_build_the_query() {
        let c = crate::cli::api::Client::new(crate::cli::api::ApiConfig {
            address: "http://h:1".into(),
            token: None,
            namespace: None,
            region: None,
            tls: Default::default(),
        })
        .unwrap();
        let a = parse(&["-stderr", "-f", "-tail", "-n", "5", "abcd", "web"]);
        assert_eq!(c.url("/l", &logs_query(&a, "web")), "http://h:1/l?task=web&type=stderr&plain=true&follow=true&origin=end&offset=1280");
        let b = parse(&["--stderr", "--follow", "--tail", "-n=5", "abcd", "web"]);
        assert_eq!(logs_query(&a, "web"), logs_query(&b, "web"));
        let plain = parse(&["abcd"]);
        assert_eq!(c.url("/l", &logs_query(&plain, "t")), "http://h:1/l?task=t&type=stdout&plain=true&follow=false&origin=start&offset=0");
        let bytes = parse(&["-tail", "-c", "100", "abcd"]);
        assert!(c.url("/l", &logs_query(&bytes, "t")).ends_with("origin=end&offset=100"));
    }
}
