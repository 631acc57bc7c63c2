//! Lets the server test suites report themselves as ignored, not passed,
//! when their server is not configured: `cfg(inbox_test_postgres)` and
//! `cfg(inbox_test_mysql)` (and `cfg(inbox_test_galera)`, `cfg(inbox_test_pgbouncer)`) are set when
//! `INBOX_TEST_POSTGRES_URL` / `INBOX_TEST_MYSQL_URL` (`INBOX_TEST_GALERA_URLS`, `INBOX_TEST_PGBOUNCER_URL`)
//! is set at build time. Nothing in the library reads
//! them.
//!
//! It also embeds the console's screenshot (`docs/guide/console-overview.png`,
//! which the browser test writes as `target/console/overview.png`) in the
//! guide's console page, as a data URL: the page shows it wherever it is
//! read (docs.rs, `cargo doc`), with no file beside it.
fn main() {
    screenshot();
    for (var, cfg) in [
        ("INBOX_TEST_POSTGRES_URL", "inbox_test_postgres"),
        ("INBOX_TEST_MYSQL_URL", "inbox_test_mysql"),
        ("INBOX_TEST_GALERA_URLS", "inbox_test_galera"),
        ("INBOX_TEST_PGBOUNCER_URL", "inbox_test_pgbouncer"),
    ] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        println!("cargo::rerun-if-env-changed={var}");
        if std::env::var_os(var).is_some_and(|url| !url.is_empty()) {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}

/// `$OUT_DIR/console-overview.md`: the screenshot as a Markdown image.
fn screenshot() {
    let png = "docs/guide/console-overview.png";
    println!("cargo::rerun-if-changed={png}");
    let out = std::path::Path::new(&std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("console-overview.md");
    let markdown = match std::fs::read(png) {
        Ok(bytes) => format!(
            "![The console's overview: consumers, HTTP endpoints, the outbox and stream positions](data:image/png;base64,{})\n\n\
             *The overview, as the browser test sees it (`target/console/overview.png`).*\n",
            base64(&bytes)
        ),
        Err(_) => String::new(),
    };
    std::fs::write(out, markdown).expect("write the screenshot's page part");
}

/// Standard base64, with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
