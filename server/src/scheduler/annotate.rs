//! What `job plan` shows: per group, how many allocs would be placed,
//! stopped, updated in place or destructively, migrated, ignored,
//! disconnected or reconnected (`DesiredTGUpdates`).

use std::collections::BTreeMap;

use nomad_proto::plan::DesiredUpdates;

use super::reconcile::ReconcileResults;

/// The reconciler's counts, plus the disconnect and reconnect updates it made.
pub(crate) fn desired_updates(r: &ReconcileResults<'_>) -> BTreeMap<String, DesiredUpdates> {
    let mut out = r.desired_tg_updates.clone();
    for a in r.disconnect_updates.values() {
        out.entry(a.task_group.clone()).or_default().disconnect_updates += 1;
    }
    for a in r.reconnect_updates.values() {
        out.entry(a.task_group.clone()).or_default().reconnect_updates += 1;
    }
    out
}
