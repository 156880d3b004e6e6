//! `nomad-rs job dispatch [-meta k=v]... [-detach] [-verbose] [-idempotency-token t]
//! [-id-prefix-template p] <job> [file|-]`: a child of a parameterized job, then follow its eval.

use std::collections::BTreeMap;
use std::io::Read;

use base64::Engine;
use clap::Args;
use serde::Deserialize;

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::format::{id_len, kv, limit};
use crate::cli::monitor::follow_eval;
use crate::cli::{CmdResult, Ctx, Failure, exit, prefix};

/// The servers refuse larger payloads (Nomad's `DispatchPayloadSizeLimit`); reading stops past it.
const PAYLOAD_LIMIT: u64 = 16 * 1024;

/// Flags of `job dispatch`.
#[derive(Debug, Args)]
pub struct DispatchArgs {
    /// Meta for the child, `key=value` (repeatable).
    #[arg(long = "meta", value_name = "KEY=VALUE")]
    pub meta: Vec<String>,
    /// Return right after the dispatch.
    #[arg(long)]
    pub detach: bool,
    /// Show full IDs.
    #[arg(long)]
    pub verbose: bool,
    /// A retried dispatch with the same token returns the child the first one made.
    #[arg(long = "idempotency-token")]
    pub idempotency_token: Option<String>,
    /// Put into the child's ID: `<job>/dispatch-<template>-<unix>-<8 hex>`.
    #[arg(long = "id-prefix-template")]
    pub id_prefix_template: Option<String>,
    /// The parameterized job, by ID or prefix.
    #[arg(value_name = "JOB")]
    pub job: String,
    /// The payload: a file, or `-` for stdin.
    #[arg(value_name = "INPUT")]
    pub input: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct DispatchResponse {
    #[serde(rename = "DispatchedJobID")]
    dispatched_job_id: String,
    #[serde(rename = "EvalID")]
    eval_id: String,
}

fn read_payload(input: &str) -> Result<Vec<u8>, Failure> {
    let mut source: Box<dyn Read> = match input {
        "-" => Box::new(std::io::stdin()),
        path => Box::new(std::fs::File::open(path).map_err(|e| Failure::new(format!("Error reading input data: {e}")))?),
    };
    let mut payload = Vec::new();
    source
        .by_ref()
        .take(PAYLOAD_LIMIT + 1)
        .read_to_end(&mut payload)
        .map_err(|e| Failure::new(format!("Error reading input data: {e}")))?;
    if payload.len() as u64 > PAYLOAD_LIMIT {
        return Err(Failure::new(format!(
            "Error reading input data: the payload is larger than the {PAYLOAD_LIMIT} bytes a dispatch may carry"
        )));
    }
    Ok(payload)
}

/// Runs `job dispatch`.
pub async fn run(api: &ApiFlags, args: DispatchArgs) -> CmdResult {
    let payload = match args.input.as_deref() {
        Some(input) => read_payload(input)?,
        None => Vec::new(),
    };
    let mut meta = BTreeMap::new();
    for m in &args.meta {
        let Some((k, v)) = m.split_once('=') else {
            return Err(Failure::new(format!("Error parsing meta value: {m}")));
        };
        meta.insert(k.to_string(), v.to_string());
    }
    let ctx = Ctx::new(api)?;
    let job = prefix::job(&ctx, args.job.trim()).await?;
    let body = serde_json::json!({
        "JobID": job.id,
        "Meta": meta,
        "Payload": base64::engine::general_purpose::STANDARD.encode(&payload),
        "IdPrefixTemplate": args.id_prefix_template.clone().unwrap_or_default(),
    });
    let mut q = Query::new().param("namespace", job.namespace.clone());
    if let Some(t) = args.idempotency_token.as_deref().filter(|t| !t.is_empty()) {
        q = q.param("idempotency_token", t);
    }
    let resp: DispatchResponse = ctx
        .client
        .put(&format!("/v1/job/{}/dispatch", encode_path(&job.id)), &q, &body)
        .await
        .map_err(|e| Failure::new(format!("Failed to dispatch job: {e}")))?
        .value;
    let len = id_len(args.verbose);
    let mut pairs = vec![("Dispatched Job ID", resp.dispatched_job_id.clone())];
    if !resp.eval_id.is_empty() {
        pairs.push(("Evaluation ID", limit(&resp.eval_id, len).into_owned()));
    }
    println!("{}", kv(&pairs));
    if args.detach || resp.eval_id.is_empty() {
        return Ok(exit::OK);
    }
    println!();
    follow_eval(&ctx.client, &resp.eval_id, args.verbose, "the evaluation").await
}
