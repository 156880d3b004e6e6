//! `nomad-rs status [<prefix>]`: without an argument, the job list; with one,
//! a prefix search across jobs, nodes, allocations and evaluations that shows
//! the single kind of object it matched, or lists the matches when the prefix
//! is ambiguous across kinds.

use clap::Args;
use nomad_proto::{AllocListStub, Evaluation, JobListStub, NodeListStub};

use super::api::{ApiFlags, Query};
use super::format::limit;
use super::{CmdResult, Ctx, Failure, alloc, eval, job, node, prefix};

/// Flags of `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// General options.
    #[command(flatten)]
    pub api: ApiFlags,
    /// Full IDs and details.
    #[arg(long)]
    pub verbose: bool,
    /// Print the API's JSON.
    #[arg(long)]
    pub json: bool,
    /// An ID or ID prefix of a job, node, allocation or evaluation.
    #[arg(value_name = "PREFIX")]
    pub prefix: Option<String>,
}

/// What a prefix matched, per kind of object.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Matches {
    /// Job IDs.
    pub jobs: Vec<String>,
    /// Node IDs (with names).
    pub nodes: Vec<(String, String)>,
    /// Allocation IDs (with names).
    pub allocs: Vec<(String, String)>,
    /// Evaluation IDs (with job IDs).
    pub evals: Vec<(String, String)>,
}

/// The one kind a search landed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A job.
    Job,
    /// A node.
    Node,
    /// An allocation.
    Alloc,
    /// An evaluation.
    Eval,
}

impl Matches {
    /// The single kind that matched; an exact job ID wins over UUID prefixes.
    pub fn kind(&self, prefix: &str) -> Option<Kind> {
        if self.jobs.iter().any(|j| j == prefix) {
            return Some(Kind::Job);
        }
        let kinds: Vec<Kind> = [
            (!self.jobs.is_empty()).then_some(Kind::Job),
            (!self.nodes.is_empty()).then_some(Kind::Node),
            (!self.allocs.is_empty()).then_some(Kind::Alloc),
            (!self.evals.is_empty()).then_some(Kind::Eval),
        ]
        .into_iter()
        .flatten()
        .collect();
        if kinds.len() == 1 { Some(kinds[0]) } else { None }
    }

    /// Nothing matched.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.nodes.is_empty() && self.allocs.is_empty() && self.evals.is_empty()
    }

    /// The matches listed by kind.
    pub fn listing(&self, len: usize) -> String {
        let mut out = Vec::new();
        let mut section = |title: &str, lines: Vec<String>| {
            if !lines.is_empty() {
                out.push(title.to_string());
                out.extend(lines.into_iter().map(|l| format!("  {l}")));
            }
        };
        section("Jobs", self.jobs.clone());
        section("Nodes", self.nodes.iter().map(|(id, name)| format!("{}  ({name})", limit(id, len))).collect());
        section("Allocations", self.allocs.iter().map(|(id, name)| format!("{}  ({name})", limit(id, len))).collect());
        section("Evaluations", self.evals.iter().map(|(id, job)| format!("{}  (job {job})", limit(id, len))).collect());
        out.join("\n")
    }
}

/// Runs `status`.
pub async fn run(args: StatusArgs) -> CmdResult {
    let ctx = Ctx::new(&args.api)?;
    let Some(p) = args.prefix.as_deref() else {
        return job::status::list(&ctx, args.json).await;
    };
    let matches = search(&ctx, p).await?;
    match matches.kind(p) {
        Some(Kind::Job) => {
            let a = job::status::StatusArgs {
                json: args.json,
                verbose: args.verbose,
                evals: false,
                all_allocs: false,
                short: false,
                job: Some(p.to_string()),
            };
            job::status::show(&ctx, &a, p).await
        }
        Some(Kind::Node) => {
            let id = prefix::node(&ctx, p).await?.id;
            node::status::show(&ctx, &id, args.verbose, args.json).await
        }
        Some(Kind::Alloc) => alloc::status::show(&ctx, p, args.verbose, args.json, false).await,
        Some(Kind::Eval) => eval::show(&ctx, p, args.verbose, args.json).await,
        None if matches.is_empty() => Err(Failure::new(format!("No job, node, allocation or evaluation with prefix or id \"{p}\" found"))),
        None => Err(Failure::new(format!(
            "Prefix \"{p}\" matched objects of several kinds:\n\n{}\n\nUse a longer prefix, or name the kind: `nomad-rs job status`, `node status`, `alloc status`, `eval status`",
            matches.listing(ctx.id_len(args.verbose))
        ))),
    }
}

/// Looks the prefix up in every list endpoint at once.
pub async fn search(ctx: &Ctx, p: &str) -> Result<Matches, Failure> {
    let err = |e: super::api::ApiError| Failure::new(format!("Error searching for \"{p}\": {e}"));
    let q = Query::new().prefix(p);
    let all_ns = if ctx.client.config().namespace.is_some() { q.clone() } else { q.clone().param("namespace", "*") };
    let uuid_ok = p.chars().count() >= 2;
    let (jobs, nodes, allocs, evals) = tokio::join!(
        ctx.client.get::<Vec<JobListStub>>("/v1/jobs", &q),
        async { if uuid_ok { ctx.client.get::<Vec<NodeListStub>>("/v1/nodes", &q).await.map(|a| a.value) } else { Ok(Vec::new()) } },
        async {
            if uuid_ok {
                ctx.client
                    .get::<Vec<AllocListStub>>("/v1/allocations", &all_ns.clone().param("task_states", "false"))
                    .await
                    .map(|a| a.value)
            } else {
                Ok(Vec::new())
            }
        },
        async {
            if uuid_ok { ctx.client.get::<Vec<Evaluation>>("/v1/evaluations", &all_ns).await.map(|a| a.value) } else { Ok(Vec::new()) }
        },
    );
    Ok(Matches {
        jobs: jobs.map_err(err)?.value.into_iter().filter(|j| j.id.starts_with(p)).map(|j| j.id).collect(),
        nodes: nodes.map_err(err)?.into_iter().filter(|n| n.id.starts_with(p)).map(|n| (n.id, n.name)).collect(),
        allocs: allocs.map_err(err)?.into_iter().filter(|a| a.id.starts_with(p)).map(|a| (a.id, a.name)).collect(),
        evals: evals.map_err(err)?.into_iter().filter(|e| e.id.starts_with(p)).map(|e| (e.id, e.job_id)).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_kind_is_shown_and_several_are_listed() {
        let m = Matches { jobs: vec!["ab-web".into()], ..Matches::default() };
        assert_eq!(m.kind("ab"), Some(Kind::Job));
        let m = Matches { allocs: vec![("ab12".into(), "web.g[0]".into()), ("ab34".into(), "web.g[1]".into())], ..Matches::default() };
        assert_eq!(m.kind("ab"), Some(Kind::Alloc), "several of one kind go to that kind's command, which lists them");
        let both = Matches { jobs: vec!["ab-web".into()], evals: vec![("ab99ffff".into(), "web".into())], ..Matches::default() };
        assert_eq!(both.kind("ab"), None);
        assert_eq!(both.listing(8), "Jobs\n  ab-web\nEvaluations\n  ab99ffff  (job web)");
        let exact = Matches { jobs: vec!["ab".into()], evals: vec![("ab99ffff".into(), "web".into())], ..Matches::default() };
        assert_eq!(exact.kind("ab"), Some(Kind::Job), "an exact job ID wins");
        assert!(Matches::default().is_empty());
    }
}
