//! [`Message`]: a delivery as a batch handler reads it, the same type for
//! every broker.

/// A delivery as a handler reads it: its id, body and delivery count, its
/// headers, and, on Kafka, its key, topic, partition, offset and
/// timestamp. The same type for every broker; what a broker does not have
/// is `None` (or no headers).
///
/// Handlers of [`Consumer::run_batch`](super::Consumer::run_batch) get a
/// slice of them; key an `#[idempotent(batch = ..)]` handler on
/// [`id`](Self::id):
///
/// ```
/// use diesel_inbox::brokers::Message;
///
/// let message = Message::new("order-1", b"{}").with_header("tenant", b"acme");
/// assert_eq!(message.id(), "order-1");
/// assert_eq!(message.body(), b"{}");
/// assert_eq!(message.deliveries(), 1);
/// assert_eq!(message.header("tenant"), Some(&b"acme"[..]));
/// assert_eq!(message.partition(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<'a> {
    pub(crate) id: &'a str,
    pub(crate) body: &'a [u8],
    pub(crate) deliveries: u32,
    pub(crate) headers: Vec<(&'a str, &'a [u8])>,
    pub(crate) key: Option<&'a [u8]>,
    pub(crate) topic: Option<&'a str>,
    pub(crate) partition: Option<i32>,
    pub(crate) offset: Option<i64>,
    pub(crate) timestamp: Option<i64>,
}

impl<'a> Message<'a> {
    /// A message with `id` and `body`, delivered once, without headers
    /// (for a handler's own tests; the runners make theirs from the
    /// broker's delivery).
    pub fn new(id: &'a str, body: &'a [u8]) -> Self {
        Message {
            id,
            body,
            deliveries: 1,
            headers: Vec::new(),
            key: None,
            topic: None,
            partition: None,
            offset: None,
            timestamp: None,
        }
    }

    /// The same message with one more header.
    pub fn with_header(mut self, name: &'a str, value: &'a [u8]) -> Self {
        self.headers.push((name, value));
        self
    }

    /// The id the inbox deduplicates on (the broker module's message id:
    /// AMQP `message_id`, the `Nats-Msg-Id` header, Kafka's id header or
    /// `topic/partition/offset`).
    pub fn id(&self) -> &'a str {
        self.id
    }

    /// The payload.
    pub fn body(&self) -> &'a [u8] {
        self.body
    }

    /// How often the broker (and the runner, retrying a batch) has
    /// delivered it, this time included.
    pub fn deliveries(&self) -> u32 {
        self.deliveries
    }

    /// Its headers, in the order the broker gave them: AMQP's
    /// string-valued ones, every NATS header value, every Kafka header
    /// with a value.
    pub fn headers(&self) -> &[(&'a str, &'a [u8])] {
        &self.headers
    }

    /// The first value of the header `name` (case-sensitive, as the
    /// broker stores it).
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers
            .iter()
            .find(|(found, _)| *found == name)
            .map(|(_, value)| *value)
    }

    /// Kafka: the record's key.
    pub fn key(&self) -> Option<&'a [u8]> {
        self.key
    }

    /// Kafka: the topic.
    pub fn topic(&self) -> Option<&'a str> {
        self.topic
    }

    /// Kafka: the partition.
    pub fn partition(&self) -> Option<i32> {
        self.partition
    }

    /// Kafka: the offset.
    pub fn offset(&self) -> Option<i64> {
        self.offset
    }

    /// Kafka: the record's timestamp, milliseconds since 1970 (create or
    /// log-append time, as the topic keeps it).
    pub fn timestamp(&self) -> Option<i64> {
        self.timestamp
    }
}
