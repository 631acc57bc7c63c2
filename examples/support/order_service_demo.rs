//! The demo around `examples/order_service.rs`: its queues, the orders it
//! publishes, and the check of what the consumer did.

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};

pub type Error = Box<dyn std::error::Error>;

/// A quorum queue (it counts deliveries, `x-delivery-count`) that
/// dead-letters through the default exchange into `<queue>.dlq`; both
/// durable.
pub async fn declare(channel: &Channel, queue: &str) -> Result<(), Error> {
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let dead_letters = format!("{queue}.dlq");
    channel
        .queue_declare(dead_letters.as_str().into(), durable, FieldTable::default())
        .await?;
    let mut arguments = FieldTable::default();
    for (name, value) in [
        ("x-queue-type", "quorum"),
        ("x-dead-letter-exchange", ""),
        ("x-dead-letter-routing-key", dead_letters.as_str()),
    ] {
        arguments.insert(name.into(), AMQPValue::LongString(value.into()));
    }
    channel
        .queue_declare(queue.into(), durable, arguments)
        .await?;
    Ok(())
}

/// 20 orders `order-<run>-<n>`, each body its total in cents: every fourth
/// published twice, order 7 unparsable. Waits for the broker's confirms.
pub async fn publish(channel: &Channel, queue: &str, run: u32) -> Result<(), Error> {
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    for n in 0..20u32 {
        let body = match n {
            7 => "seven".to_string(),
            _ => format!("{}", 100 + n),
        };
        for _ in 0..(1 + u32::from(n % 4 == 0)) {
            let properties = BasicProperties::default()
                .with_message_id(format!("order-{run}-{n}").into())
                .with_delivery_mode(2);
            channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    body.as_bytes(),
                    properties,
                )
                .await?
                .await?;
        }
    }
    Ok(())
}

/// Deletes the demo's queues.
pub async fn delete(channel: &Channel, queue: &str) -> Result<(), Error> {
    for name in [queue.to_string(), format!("{queue}.dlq")] {
        channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await?;
    }
    Ok(())
}

/// Each good order applied once, every repeat a duplicate, the bad one
/// dead-lettered; `rows` order rows written.
pub fn check(applied: u64, duplicates: u64, dead: u64, rows: i64) -> Result<(), Error> {
    println!("applied {applied}, duplicates {duplicates}, dead-lettered {dead}, order rows {rows}");
    if (applied, duplicates, dead, rows) != (19, 5, 1, 19) {
        return Err("expected 19 applied, 5 duplicates, 1 dead-lettered and 19 order rows".into());
    }
    Ok(())
}
