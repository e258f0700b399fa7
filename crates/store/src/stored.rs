//! What a backend read from its tables, turned back into domain types: one
//! implementation for every backend, so that a row no backend should have
//! written is refused with the same [`Error::Backend`] whichever database
//! holds it.
//!
//! Deliberately left out: reading the columns, which is each driver's own
//! business (rusqlite and sqlx name and convert them differently).

use rota_model::{LeaseToken, MessageId, QueueName, Timestamp};
use serde_json::value::RawValue;

use crate::{Body, Delivery, Error, Result};

/// A message row a receive has just leased, as its columns hold it.
#[derive(Debug, Clone)]
pub struct Leased {
    /// The message's sequence number, the first half of its lease token.
    pub seq: i64,
    /// The message id, as stored.
    pub id: String,
    /// The body's JSON text, as stored.
    pub body: String,
    /// The ordering key, if any.
    pub ordering_key: Option<String>,
    /// When it was sent, in epoch milliseconds.
    pub enqueued_at: i64,
    /// Its deliveries, this one included.
    pub delivery_count: u32,
    /// The lease epoch this receive gave it, the second half of the token.
    pub lease_epoch: i64,
    /// When this lease runs out, in epoch milliseconds.
    pub lease_until: i64,
    /// The reply address, as stored.
    pub reply_to: Option<String>,
    /// The correlation id, as stored.
    pub correlation_id: Option<String>,
}

impl Leased {
    /// The delivery of this row from `queue`.
    pub fn into_delivery(self, queue: QueueName) -> Result<Delivery> {
        Ok(Delivery {
            queue,
            id: id(self.id)?,
            body: body(self.body)?,
            lease_token: LeaseToken { message: self.seq, epoch: self.lease_epoch },
            delivery_count: self.delivery_count,
            enqueued_at: Timestamp::from_millis(self.enqueued_at),
            lease_until: Timestamp::from_millis(self.lease_until),
            ordering_key: self.ordering_key,
            reply_to: reply_to(self.reply_to)?,
            correlation_id: self.correlation_id,
        })
    }
}

/// A stored reply address. Queue names are validated when sent, so an
/// invalid one is a corrupt row.
pub fn reply_to(queue: Option<String>) -> Result<Option<QueueName>> {
    queue.map(QueueName::new).transpose().map_err(|e| Error::Backend(format!("stored reply_to is invalid: {e}")))
}

/// A stored message id. Ids are validated when sent, so an invalid one is
/// a corrupt row.
pub fn id(id: String) -> Result<MessageId> {
    MessageId::new(id).map_err(|e| Error::Backend(format!("stored message id is invalid: {e}")))
}

/// A stored message body. Bodies are JSON when sent, so anything else is a
/// corrupt row.
pub fn body(body: String) -> Result<Body> {
    RawValue::from_string(body).map_err(|e| Error::Backend(format!("stored message body is not JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_corrupt_row_is_a_backend_error_that_says_what_is_wrong() {
        assert!(matches!(id(String::new()), Err(Error::Backend(why)) if why.starts_with("stored message id is invalid")));
        assert!(matches!(body("{".into()), Err(Error::Backend(why)) if why.starts_with("stored message body is not JSON")));
        let leased = Leased {
            seq: 7,
            id: "m-1".into(),
            body: "{\"a\":1}".into(),
            ordering_key: None,
            enqueued_at: 1_000,
            delivery_count: 2,
            lease_epoch: 9,
            lease_until: 31_000,
            reply_to: Some("answers".into()),
            correlation_id: Some("c-1".into()),
        };
        let delivery = leased.into_delivery(QueueName::new("q").unwrap()).unwrap();
        assert_eq!(delivery.lease_token, LeaseToken { message: 7, epoch: 9 });
        assert_eq!((delivery.enqueued_at, delivery.lease_until), (Timestamp::from_millis(1_000), Timestamp::from_millis(31_000)));
        assert_eq!(delivery.body.get(), "{\"a\":1}");
        assert_eq!((delivery.reply_to.unwrap().as_str(), delivery.correlation_id.as_deref()), ("answers", Some("c-1")));
        assert!(matches!(reply_to(Some("a b".into())), Err(Error::Backend(why)) if why.starts_with("stored reply_to is invalid")));
    }
}
