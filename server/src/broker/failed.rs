//! Evals past their delivery limit: marked `failed`, with a follow-up eval
//! that retries the job after a long, jittered wait.

use std::sync::Arc;
use std::time::Duration;

use nomad_proto::eval::trigger;
use nomad_proto::{EvalStatus, Evaluation, JobType, Timestamp};
use rand::Rng;

use super::{EvalBroker, EvalWriter};

/// The failed eval and its follow-up, as they are written.
pub fn failed_eval_updates(eval: &Evaluation, delivery_limit: u32, followup_wait: Duration, now: Timestamp) -> Vec<Evaluation> {
    let mut failed = eval.clone();
    failed.status = EvalStatus::Failed;
    failed.status_description = format!("evaluation reached delivery limit ({delivery_limit})");
    failed.modify_time = now.unix_nanos().max(failed.create_time + 1);
    // Core evals are rescheduled by the leader instead.
    if eval.eval_type == JobType::Core {
        return vec![failed];
    }
    let followup = Evaluation {
        id: nomad_proto::new_id(),
        namespace: eval.namespace.clone(),
        priority: eval.priority,
        eval_type: eval.eval_type,
        triggered_by: trigger::FAILED_FOLLOW_UP.to_string(),
        job_id: eval.job_id.clone(),
        job_modify_index: eval.job_modify_index,
        status: EvalStatus::Pending,
        // Absolute, so a new leader keeps the remaining wait instead of starting over.
        wait_until: now.plus(followup_wait),
        previous_eval: eval.id.clone(),
        create_time: now.unix_nanos(),
        modify_time: now.unix_nanos(),
        ..Evaluation::default()
    };
    failed.next_eval = followup.id.clone();
    vec![failed, followup]
}

/// Marks evals from the broker's failed queue as failed and creates their
/// follow-ups; acks each once written. Runs until the broker is disabled.
pub async fn reap_failed_evals(broker: Arc<EvalBroker>, writer: EvalWriter) {
    let config = broker.config().clone();
    while let Ok(delivery) = broker.dequeue_failed().await {
        let jitter = if config.failed_followup_range.is_zero() {
            Duration::ZERO
        } else {
            config.failed_followup_range.mul_f64(rand::rng().random::<f64>())
        };
        let updates =
            failed_eval_updates(&delivery.eval, config.delivery_limit, config.failed_followup_baseline + jitter, Timestamp::now());
        tracing::warn!(eval_id = %delivery.eval.id, "eval reached its delivery limit, marking it failed");
        match writer.write(updates).await {
            // On failure the delivery times out and comes back through the failed queue.
            Err(e) => tracing::error!(eval_id = %delivery.eval.id, error = %e, "failed to mark eval failed"),
            Ok(_) => {
                let _ = broker.ack(&delivery.eval.id, &delivery.token);
            }
        }
    }
}
