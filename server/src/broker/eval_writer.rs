//! Batched eval status writes (canceled, unblocked, failed + follow-up).
//!
//! Many small eval updates arrive together (a job's superseded evals, every
//! eval a node unblocks); one `EvalUpsert` per burst keeps them from costing
//! one Raft entry each.

use std::collections::HashMap;
use std::sync::Arc;

use nomad_proto::Evaluation;
use tokio::sync::{mpsc, oneshot};

use crate::consensus::{ApplyError, Consensus};
use crate::fsm::Command;

/// Most evals in one write (Nomad pages its cancel writes at 728).
pub const MAX_EVALS_PER_WRITE: usize = 728;

struct Request {
    evals: Vec<Evaluation>,
    done: Option<oneshot::Sender<Result<u64, ApplyError>>>,
}

/// A handle to the writer task. Cheap to clone.
#[derive(Clone)]
pub struct EvalWriter {
    tx: mpsc::UnboundedSender<Request>,
}

impl EvalWriter {
    /// Starts the writer; it runs until every handle is dropped.
    pub fn spawn(consensus: Arc<dyn Consensus>) -> (EvalWriter, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (EvalWriter { tx }, tokio::spawn(run(consensus, rx)))
    }

    /// Queues evals to write, without waiting.
    pub fn submit(&self, evals: Vec<Evaluation>) {
        if !evals.is_empty() {
            let _ = self.tx.send(Request { evals, done: None });
        }
    }

    /// Writes evals (in one command with whatever else is queued) and returns the Raft index.
    pub async fn write(&self, evals: Vec<Evaluation>) -> Result<u64, ApplyError> {
        let (done, rx) = oneshot::channel();
        self.tx.send(Request { evals, done: Some(done) }).map_err(|_| ApplyError::Raft("eval writer stopped".into()))?;
        rx.await.map_err(|_| ApplyError::Raft("eval writer stopped".into()))?
    }
}

async fn run(consensus: Arc<dyn Consensus>, mut rx: mpsc::UnboundedReceiver<Request>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let mut count = batch[0].evals.len();
        while count < MAX_EVALS_PER_WRITE {
            match rx.try_recv() {
                Ok(r) => {
                    count += r.evals.len();
                    batch.push(r);
                }
                Err(_) => break,
            }
        }
        // The last update of an eval in the burst wins.
        let mut order = Vec::new();
        let mut latest: HashMap<String, Evaluation> = HashMap::new();
        for e in batch.iter_mut().flat_map(|r| r.evals.drain(..)) {
            if latest.insert(e.id.clone(), e.clone()).is_none() {
                order.push(e.id);
            }
        }
        let evals: Vec<Evaluation> = order.into_iter().filter_map(|id| latest.remove(&id)).collect();
        let result = consensus.apply(Command::EvalUpsert { evals }).await;
        if let Err(e) = &result {
            tracing::warn!(error = %e, "writing eval updates failed");
        }
        for r in batch {
            if let Some(done) = r.done {
                let _ = done.send(result.clone());
            }
        }
    }
}
