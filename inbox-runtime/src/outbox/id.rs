//! Message ids: UUIDv7.

use std::time::{SystemTime, UNIX_EPOCH};

/// A new UUIDv7 (RFC 9562) in its text form: 48 bits of Unix milliseconds,
/// then 74 random bits (SipHash of a process-wide counter and the clock,
/// keyed at random per process), so ids sort by creation time.
pub(crate) fn uuid_v7() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let keys = KEYS.get_or_init(std::collections::hash_map::RandomState::new);
    let random = |salt: u64| {
        let mut hasher = keys.build_hasher();
        hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        hasher.write_u128(since.as_nanos());
        hasher.write_u64(salt);
        hasher.finish()
    };
    let (a, b) = (random(1), random(2));
    let ms = since.as_millis() as u64 & 0xFFFF_FFFF_FFFF;
    let hi = (ms << 16) | 0x7000 | (a & 0x0FFF);
    let lo = (b & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xFFFF,
        hi & 0xFFFF,
        lo >> 48,
        lo & 0xFFFF_FFFF_FFFF
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn uuid_v7_has_its_version_and_variant_and_sorts_by_time() {
        let first = uuid_v7();
        std::thread::sleep(Duration::from_millis(2));
        let second = uuid_v7();
        assert_eq!(first.len(), 36);
        assert_eq!(&first[14..15], "7");
        assert!(matches!(&first[19..20], "8" | "9" | "a" | "b"), "{first}");
        assert!(first < second, "{first} {second}");
        let many: std::collections::HashSet<String> = (0..10_000).map(|_| uuid_v7()).collect();
        assert_eq!(many.len(), 10_000);
    }
}
