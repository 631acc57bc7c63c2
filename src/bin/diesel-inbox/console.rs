//! `console`: the operations console (`diesel_inbox::console`) served on
//! an address of its own, on the URL's database, or over every tenant
//! (`--tenants`: `console::tenants`).

use crate::cli::ConsoleArgs;
use crate::Failure;
use std::process::ExitCode;

/// Refuses a listening address that would open the console to the
/// network without `--allow-remote` and `--token`.
pub(crate) fn check(args: &ConsoleArgs) -> Result<(), Failure> {
    let ip = args.listen.ip();
    if !ip.is_loopback() && !args.allow_remote {
        return Err(Failure(format!(
            "refusing to listen on {}: not a loopback address, so anyone who can reach it could act on the inbox; pass --allow-remote and --token (every request then needs the token as its HTTP Basic password)",
            args.listen
        )));
    }
    if args.kafka.is_some() && !cfg!(feature = "kafka") {
        return Err(Failure(
            "--kafka needs a diesel-inbox built with Kafka: cargo install diesel-inbox --features cli,console,kafka".into(),
        ));
    }
    if args.allow_remote && args.token.as_deref().is_none_or(str::is_empty) {
        return Err(Failure(
            "--allow-remote needs --token (or DIESEL_INBOX_CONSOLE_TOKEN): the password every request must carry".into(),
        ));
    }
    Ok(())
}

/// The console until SIGTERM or Ctrl-C.
#[cfg(feature = "console")]
pub(crate) fn run(url: &str, args: &ConsoleArgs) -> Result<ExitCode, Failure> {
    check(args)?;
    // SQLite creates a missing file on connect: the console never does.
    if let crate::database::Backend::Sqlite(path) = crate::database::Backend::of(url)? {
        let is_file = path.starts_with("file:") || path == ":memory:";
        if !is_file && !std::path::Path::new(path).exists() {
            return Err(Failure(format!(
                "no SQLite database at {path} (`diesel-inbox migrate` creates one)"
            )));
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure(format!("no async runtime: {e}")))?;
    runtime.block_on(crate::pool::with_pool(url, 4, serve::Serve { args }))
}

/// The console over every tenant `source` lists (`--tenants`), until
/// SIGTERM or Ctrl-C. The list is read again every minute and whenever a
/// page names a tenant the console does not know.
#[cfg(feature = "console")]
pub(crate) fn run_tenants(source: &str, args: &ConsoleArgs) -> Result<ExitCode, Failure> {
    check(args)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure(format!("no async runtime: {e}")))?;
    runtime.block_on(crate::pool::with_tenants(
        source,
        2,
        serve::ServeTenants { args },
    ))
}

#[cfg(not(feature = "console"))]
pub(crate) fn run_tenants(source: &str, args: &ConsoleArgs) -> Result<ExitCode, Failure> {
    run(source, args)
}

#[cfg(not(feature = "console"))]
pub(crate) fn run(_: &str, args: &ConsoleArgs) -> Result<ExitCode, Failure> {
    check(args)?;
    Err(Failure(
        "this diesel-inbox was built without the console: cargo install diesel-inbox --features cli,console".into(),
    ))
}

#[cfg(feature = "console")]
#[path = "../../console/basic.rs"]
mod basic;

#[cfg(feature = "console")]
mod serve {
    use crate::cli::ConsoleArgs;
    use crate::pool::{stop, OnPool, OnTenants};
    use crate::Failure;
    use axum::http::{header, Request, StatusCode};
    use axum::response::{IntoResponse, Response};
    use diesel_inbox::console::{self, ConsoleExt};
    use diesel_inbox::outbox::RelayPool;
    use diesel_inbox::tenants::{TenantPool, Tenants};
    use std::net::SocketAddr;
    use std::process::ExitCode;

    pub(super) struct Serve<'a> {
        pub(super) args: &'a ConsoleArgs,
    }

    impl OnPool for Serve<'_> {
        async fn run<D: RelayPool + 'static>(self, pool: D) -> Result<ExitCode, Failure> {
            serve(console::router(pool), self.args).await
        }
    }

    /// The console over every tenant.
    pub(super) struct ServeTenants<'a> {
        pub(super) args: &'a ConsoleArgs,
    }

    impl OnTenants for ServeTenants<'_> {
        async fn run<T>(self, tenants: Tenants<T>) -> Result<ExitCode, Failure>
        where
            T: TenantPool,
            T::Guard: 'static,
        {
            tenants
                .refresh()
                .await
                .map_err(|e| Failure(e.to_string()))?;
            // Tenants added to the list show on the overview within a
            // minute.
            let reading = tenants.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(std::time::Duration::from_secs(60)).await;
                    if let Err(e) = reading.refresh().await {
                        tracing::warn!(target: "diesel_inbox", error = %e, "diesel-inbox: console: the tenant list could not be read again; the last one stays");
                    }
                }
            });
            serve(console::tenants(tenants), self.args).await
        }
    }

    /// `app` with the command line's settings, served until SIGTERM or
    /// Ctrl-C.
    async fn serve(mut app: axum::Router, args: &ConsoleArgs) -> Result<ExitCode, Failure> {
        app = app
            .read_only(args.read_only)
            .allow_hosts(args.allow_hosts.iter().cloned());
        if let Some(max) = args.max_attempts {
            app = app.max_attempts(max);
        }
        #[cfg(feature = "kafka")]
        if let Some(brokers) = &args.kafka {
            app = app.kafka_lag(brokers.clone());
        }
        if let Some(token) = args.token.clone().filter(|t| !t.is_empty()) {
            // Every request carries the token; a request that did may act.
            app = app
                .authorize(|_| true)
                .layer(axum::middleware::from_fn(move |request, next| {
                    let token = token.clone();
                    async move { guard(&token, request, next).await }
                }));
        }
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| Failure(format!("cannot listen on {}: {e}", args.listen)))?;
        let address = listener.local_addr().unwrap_or(args.listen);
        tracing::info!(target: "diesel_inbox", %address, read_only = args.read_only, token = args.token.is_some(), "diesel-inbox: console: listening (stop with SIGTERM or Ctrl-C)");
        eprintln!("diesel-inbox console: http://{address}/");
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(stop())
        .await
        .map_err(|e| Failure(format!("the console stopped: {e}")))?;
        Ok(ExitCode::SUCCESS)
    }

    /// Lets a request through when its HTTP Basic password is the token.
    async fn guard(
        token: &str,
        request: Request<axum::body::Body>,
        next: axum::middleware::Next,
    ) -> Response {
        let matches = super::basic::basic_credentials(request.headers())
            .is_some_and(|(_, password)| super::basic::same_secret(&password, token));
        if matches {
            return next.run(request).await;
        }
        (
            StatusCode::UNAUTHORIZED,
            [(
                header::WWW_AUTHENTICATE,
                "Basic realm=\"diesel-inbox console\", charset=\"UTF-8\"",
            )],
            "the console needs its token as the HTTP Basic password",
        )
            .into_response()
    }
}
