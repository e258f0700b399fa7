//! Component statuses: what running processes report about themselves in
//! the store (`Tasks::report_status`), so that any other process can show
//! it. Every key is made and read here, so that the process that writes a
//! status and the commands that read it cannot disagree on where it is.
//!
//! - `instance/<id>`: a process's heartbeat ([`instance_key`]).
//! - `breaker/<endpoint>`: an `http` agent's circuit breaker, as the
//!   process that runs it saw it last ([`breaker_key`], [`breakers`],
//!   [`breaker_endpoint`]).
//! - `webhooks/cursor`: how far the webhook follower has read the event
//!   log ([`WEBHOOK_CURSOR_KEY`]).
//!
//! Deliberately left out: the shape of the documents' views for clients
//! (the API's wire types).

use rota_model::InstanceId;
use rota_store::{ComponentStatus, SharedStore};

/// The key prefix of the processes' heartbeats.
pub const INSTANCE_PREFIX: &str = "instance/";

/// The key prefix of the circuit breakers.
pub const BREAKER_PREFIX: &str = "breaker/";

/// The key of the webhook follower's cursor (`{"seq": N}`).
pub const WEBHOOK_CURSOR_KEY: &str = "webhooks/cursor";

/// The key of `instance`'s heartbeat.
pub fn instance_key(instance: &InstanceId) -> String {
    format!("{INSTANCE_PREFIX}{instance}")
}

/// The key of the circuit breaker that guards `endpoint`.
pub fn breaker_key(endpoint: &str) -> String {
    format!("{BREAKER_PREFIX}{endpoint}")
}

/// The endpoint a breaker's key names (the key itself if it is not a
/// breaker's).
pub fn breaker_endpoint(key: &str) -> &str {
    key.strip_prefix(BREAKER_PREFIX).unwrap_or(key)
}

/// Every reported circuit breaker, sorted by key.
pub async fn breakers(store: &SharedStore) -> rota_store::Result<Vec<ComponentStatus>> {
    store.statuses(BREAKER_PREFIX).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_keys_give_back_their_endpoint() {
        let key = breaker_key("http://127.0.0.1:9100");
        assert_eq!(key, "breaker/http://127.0.0.1:9100");
        assert_eq!(breaker_endpoint(&key), "http://127.0.0.1:9100");
        assert_eq!(instance_key(&InstanceId::new("serve-1").unwrap()), "instance/serve-1");
    }
}
