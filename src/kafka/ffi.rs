//! The two reads of librdkafka's state that rdkafka does not wrap: a
//! setting of the client's configuration, and a partition's cached high
//! watermark. The crate's only `unsafe` code.

use rdkafka::consumer::{Consumer as _, ConsumerContext, StreamConsumer};

/// A setting of `consumer`'s configuration, as librdkafka holds it.
pub(super) fn config<C: ConsumerContext>(
    consumer: &StreamConsumer<C>,
    name: &str,
) -> Option<String> {
    let name = std::ffi::CString::new(name).ok()?;
    let mut value = vec![0u8; 64];
    let mut size = value.len();
    // SAFETY: the client pointer is live for `consumer`'s lifetime;
    // `rd_kafka_conf` returns its configuration (owned by the client, not
    // freed here), and `rd_kafka_conf_get` writes at most `size` bytes,
    // NUL-terminated, into `value`.
    let found = unsafe {
        let conf = rdkafka::bindings::rd_kafka_conf(consumer.client().native_ptr());
        rdkafka::bindings::rd_kafka_conf_get(
            conf,
            name.as_ptr(),
            value.as_mut_ptr().cast(),
            &mut size,
        )
    };
    if found != rdkafka::bindings::rd_kafka_conf_res_t::RD_KAFKA_CONF_OK {
        return None;
    }
    let text = std::ffi::CStr::from_bytes_until_nul(&value).ok()?;
    Some(text.to_string_lossy().into_owned())
}

/// The high watermark librdkafka cached for `topic`'s `partition` (no
/// request to the broker); `None` when it has none.
#[cfg(feature = "metrics")]
pub(super) fn high_watermark<C: ConsumerContext>(
    consumer: &StreamConsumer<C>,
    topic: &std::ffi::CStr,
    partition: i32,
) -> Option<i64> {
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client pointer is live for `consumer`'s lifetime, `topic`
    // is NUL-terminated, and the two outputs are written by librdkafka
    // under its own lock.
    let found = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (found == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0)
        .then_some(high)
}
