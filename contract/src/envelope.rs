//! The CloudEvents 1.0 envelope (structured JSON mode) on `order-events`.
//!
//! The producer makes the `id` once (UUIDv7) when it writes the outbox row, so
//! a relay that publishes a row twice publishes the same id twice, and
//! consumers deduplicate on it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub const SPEC_VERSION: &str = "1.0";
pub const ORDER_CONFIRMED_V1: &str = "boxoffice.order.confirmed.v1";
pub const SOURCE_ORDER_SERVICE: &str = "/boxoffice/order-service";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CloudEvent<T> {
    pub specversion: String,
    pub id: Uuid,
    pub source: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// The order id; also the Kafka key.
    pub subject: String,
    pub time: DateTime<Utc>,
    pub datacontenttype: String,
    pub data: T,
}

impl<T> CloudEvent<T> {
    pub fn new(kind: &str, subject: String, data: T) -> Self {
        Self {
            specversion: SPEC_VERSION.to_owned(),
            id: Uuid::now_v7(),
            source: SOURCE_ORDER_SERVICE.to_owned(),
            kind: kind.to_owned(),
            subject,
            time: Utc::now(),
            datacontenttype: "application/json".to_owned(),
            data,
        }
    }
}

/// `data` of `boxoffice.order.confirmed.v1`: everything a ticket needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderConfirmed {
    pub order_id: Uuid,
    pub event_id: String,
    pub fan_id: String,
    pub quantity: i32,
    /// Seats `first_seat .. first_seat + quantity` are this order's.
    pub first_seat: i32,
    pub amount_cents: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_serializes_with_cloudevents_field_names() {
        let data = OrderConfirmed {
            order_id: Uuid::now_v7(),
            event_id: "ev".into(),
            fan_id: "fan".into(),
            quantity: 2,
            first_seat: 1,
            amount_cents: 100,
        };
        let event = CloudEvent::new(ORDER_CONFIRMED_V1, data.order_id.to_string(), data);
        let json = serde_json::to_value(&event).unwrap();
        for field in [
            "specversion",
            "id",
            "source",
            "type",
            "subject",
            "time",
            "datacontenttype",
            "data",
        ] {
            assert!(json.get(field).is_some(), "missing {field}");
        }
        assert_eq!(json["type"], ORDER_CONFIRMED_V1);
        let back: CloudEvent<OrderConfirmed> = serde_json::from_value(json).unwrap();
        assert_eq!(back, event);
    }
}
