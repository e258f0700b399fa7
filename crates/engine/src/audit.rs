//! The audit log's engine side: the operator actions that have no task
//! (on queues, dead letters, schedules, batches; a prune), each done and
//! then recorded with who asked and why, and the listing of every
//! operator action (`Client::audit`). The actions on tasks and workflows
//! record themselves where they are made (`ops`, `pause`, `signal`).
//!
//! An action is recorded after it succeeded, with its outcome (how many
//! dead letters moved, how many tasks were pruned), in a transaction of
//! its own: operator actions are rare, and none of them is on a hot path
//! that should carry the extra write. A process that dies between the two
//! leaves an action done and unrecorded, never a record of an action that
//! did not happen. The task actions do not have that gap: they are read
//! from the very history row their commit appends (see
//! `rota_store::audit`).
//!
//! Deliberately left out: recording refused requests (a cancel of a
//! finished task changes nothing; it is in the log of the process that
//! refused it) and reads.

use rota_model::QueueName;
use rota_store::{AuditAction, AuditEntry, AuditFilter, NewAudit, Redrive};
use serde_json::{Value, json};

use crate::client::Client;
use crate::ops::{Operator, Result};

impl Client {
    /// Operator actions, newest first (see `rota_store::audit`).
    pub async fn audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>> {
        Ok(self.store.audit(filter).await?)
    }

    /// Records an action done outside this client (a prune run with
    /// `retention::prune`, a batch resumed by hand), after it succeeded.
    pub async fn record_action(&self, action: AuditAction, operator: Operator<'_>, target: &str, detail: Value) -> Result<()> {
        operator.check()?;
        let entry =
            NewAudit { action, by: operator.by.to_owned(), reason: operator.reason.map(str::to_owned), target: target.to_owned(), detail };
        if let Err(err) = self.store.record_audit(&entry).await {
            // The action happened: say so next to why it is not listed.
            tracing::error!(action = %action, target, by = operator.by, "{action} on {target} was done but not recorded in the audit log: {err}");
            return Err(err.into());
        }
        Ok(())
    }

    /// Stops deliveries from `queue` (sends still succeed).
    pub async fn pause_queue(&self, queue: &QueueName, operator: Operator<'_>) -> Result<()> {
        operator.check()?;
        self.store.pause(queue).await?;
        self.record_action(AuditAction::QueuePause, operator, queue.as_str(), json!({})).await
    }

    /// Resumes deliveries from a paused `queue`.
    pub async fn resume_queue(&self, queue: &QueueName, operator: Operator<'_>) -> Result<()> {
        operator.check()?;
        self.store.resume(queue).await?;
        self.record_action(AuditAction::QueueResume, operator, queue.as_str(), json!({})).await
    }

    /// Sends dead letters of `queue` back with a fresh delivery count;
    /// returns how many moved.
    pub async fn redrive_dead_letters(&self, queue: &QueueName, which: Redrive, operator: Operator<'_>) -> Result<u64> {
        operator.check()?;
        let detail = |moved: u64| match &which {
            Redrive::One(id) => json!({ "message": id.as_str(), "moved": moved }),
            Redrive::All => json!({ "all": true, "moved": moved }),
        };
        let moved = self.store.redrive(queue, which.clone()).await?;
        self.record_action(AuditAction::DlqRedrive, operator, queue.as_str(), detail(moved)).await?;
        Ok(moved)
    }

    /// Deletes every dead letter of `queue`; returns how many.
    pub async fn purge_dead_letters(&self, queue: &QueueName, operator: Operator<'_>) -> Result<u64> {
        operator.check()?;
        let purged = self.store.purge_dead_letters(queue).await?;
        self.record_action(AuditAction::DlqPurge, operator, queue.as_str(), json!({ "purged": purged })).await?;
        Ok(purged)
    }
}
