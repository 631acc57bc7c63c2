//! The console's actions: retry and discard dead messages (one, every
//! one a filter selects, or a failure group), forget an inbox row. Each is a POST that must
//! carry the page's CSRF token, from a console that is not read-only, by
//! a request `authorize` admits (without it, from loopback); each is
//! logged and counted, then answered by a redirect to the page it came
//! from, with what it did.

use super::basic::{basic_credentials, same_secret};
use super::html::{self, esc, url, View};
use super::pages::{checked_text, with_db, DeadQuery};
use super::{Authorize, Console, Context, Operator, ReadOnly};
use crate::outbox::{self, RelayPool};
use axum::extract::rejection::FormRejection;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Form;
use serde::Deserialize;
use std::net::SocketAddr;
use std::sync::Arc;

/// An action's form: the token, what it acts on, and the filter of the
/// page it came from.
#[derive(Deserialize)]
pub(super) struct ActionForm {
    #[serde(default)]
    csrf: String,
    id: Option<String>,
    key: Option<String>,
    /// A failure group's destination and failure (`retry-group`,
    /// `discard-group`).
    group_destination: Option<String>,
    failure: Option<String>,
    /// The page to return to: `dead` (the default) or `lookup`.
    back: Option<String>,
    #[serde(flatten)]
    query: DeadQuery,
}

/// Why an action was refused (`403`, or `400` for a form that names
/// nothing).
fn refused(context: &Context, status: StatusCode, why: &str) -> Response {
    html::page(
        status,
        context,
        View::Dead,
        None,
        &format!(
            "<p class=\"error\" id=\"refused\">Refused: {}</p><p>Nothing was changed.</p>",
            esc(why)
        ),
    )
}

/// Who acts, for the log: the [`Operator`] your layer named, else the
/// Basic user, else the peer's address.
fn who(parts: &Parts, peer: Option<SocketAddr>) -> String {
    if let Some(operator) = parts.extensions.get::<Operator>() {
        return operator.0.clone();
    }
    match (basic_credentials(&parts.headers), peer) {
        (Some((user, _)), _) if !user.is_empty() => user,
        (_, Some(peer)) => peer.to_string(),
        _ => "unknown".to_owned(),
    }
}

/// Whether this request may act: who it is, or why not.
fn permitted(parts: &Parts, context: &Context) -> Result<String, (StatusCode, String)> {
    let forbidden = |why: String| Err((StatusCode::FORBIDDEN, why));
    if parts.extensions.get::<ReadOnly>().is_some_and(|r| r.0) || context.read_only {
        return forbidden("this console is read-only".into());
    }
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0);
    if parts
        .headers
        .get("sec-fetch-site")
        .is_some_and(|site| site == "cross-site")
    {
        return forbidden("a request from another site".into());
    }
    if let Some(why) = super::host::foreign_origin(&parts.headers) {
        return forbidden(why);
    }
    match (parts.extensions.get::<Authorize>(), peer) {
        (Some(authorize), _) if (authorize.0)(parts) => Ok(who(parts, peer)),
        (Some(_), _) => forbidden("not authorized (the console's authorize said no)".into()),
        (None, Some(peer)) if peer.ip().is_loopback() => Ok(who(parts, Some(peer))),
        (None, Some(peer)) => forbidden(format!(
            "an action from {} (not loopback) on a console without authorize",
            peer.ip()
        )),
        (None, None) => forbidden(
            "the peer's address is unknown and no authorize is set: serve the console with \
             into_make_service_with_connect_info::<SocketAddr>(), or set authorize"
                .into(),
        ),
    }
}

pub(super) async fn act<P: RelayPool>(
    State(console): State<Arc<Console<P>>>,
    Path(name): Path<String>,
    context: Context,
    parts: Parts,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    let who = match permitted(&parts, &context) {
        Ok(who) => who,
        Err((status, why)) => {
            inbox_runtime::__facade::console_action(&name, "refused", 0);
            tracing::warn!(target: crate::TRACING_TARGET, action = %name, reason = %why, "diesel-inbox console: action refused");
            return refused(&context, status, &why);
        }
    };
    let Ok(Form(form)) = form else {
        return refused(
            &context,
            StatusCode::BAD_REQUEST,
            "the form is not one of the console's",
        );
    };
    if !same_secret(&form.csrf, &console.csrf) {
        inbox_runtime::__facade::console_action(&name, "refused", 0);
        tracing::warn!(target: crate::TRACING_TARGET, action = %name, who = %who, "diesel-inbox console: action refused: no or a wrong CSRF token");
        return refused(
            &context,
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or not this console's (reload the page)",
        );
    }
    let query = &form.query;
    let id = form.id.as_deref().unwrap_or("");
    let key = form.key.as_deref().unwrap_or("");
    // A group's action keeps to the filter of the page it was shown on.
    let group = || outbox::RetryTarget::Group {
        destination: form.group_destination.clone().unwrap_or_default(),
        failure: form.failure.clone().unwrap_or_default(),
        within: query.filter().unwrap_or_default(),
    };
    // Every parameter checked before any statement: bad input is a `400`
    // that names it, never a database outage.
    let checked = match name.as_str() {
        "retry" | "discard" => checked_text("id", id),
        "retry-matching" | "discard-matching" => query.filter().map(drop),
        "retry-group" | "discard-group" => checked_text(
            "group_destination",
            form.group_destination.as_deref().unwrap_or(""),
        )
        .and(checked_failure(form.failure.as_deref()))
        .and(query.filter().map(drop)),
        "forget" => checked_text("consumer", &query.consumer).and(checked_text("key", key)),
        _ => Ok(()),
    };
    if let Err(why) = checked {
        inbox_runtime::__facade::console_action(&name, "refused", 0);
        tracing::warn!(target: crate::TRACING_TARGET, action = %name, who = %who, reason = %why, "diesel-inbox console: action refused: bad input");
        return refused(&context, StatusCode::BAD_REQUEST, &why);
    }
    let done = match name.as_str() {
        "retry" => with_db!(console, |conn| outbox::retry_async(conn, id)).await,
        "discard" => with_db!(console, |conn| outbox::discard_async(conn, id)).await,
        "retry-matching" | "discard-matching" => match query.filter() {
            Err(why) => Err(why),
            Ok(filter) if name == "retry-matching" => {
                with_db!(console, |conn| outbox::retry_async(conn, &filter)).await
            }
            Ok(filter) => with_db!(console, |conn| outbox::discard_async(conn, &filter)).await,
        },
        "retry-group" => with_db!(console, |conn| outbox::retry_async(conn, group())).await,
        "discard-group" => with_db!(console, |conn| outbox::discard_async(conn, group())).await,
        "forget" => with_db!(console, |conn| crate::forget_async(
            conn,
            &query.consumer,
            key
        ))
        .await
        .map(u64::from),
        _ => return refused(&context, StatusCode::NOT_FOUND, "no such action"),
    };
    let what = match name.as_str() {
        "retry" | "discard" => format!("message {id}"),
        "forget" => format!(
            "consumer {} key {}",
            query.consumer,
            form.key.as_deref().unwrap_or("")
        ),
        "retry-group" | "discard-group" => format!(
            "the failure group {:?} to {:?}",
            form.failure.as_deref().unwrap_or(""),
            form.group_destination.as_deref().unwrap_or("")
        ),
        _ => format!(
            "every dead message with destination {:?}, error containing {:?}, dead within {:?}, dead before {:?}",
            query.destination, query.error, query.since, query.until
        ),
    };
    let notice = match &done {
        Ok(count) => {
            inbox_runtime::__facade::console_action(&name, "done", *count);
            tracing::info!(target: crate::TRACING_TARGET, action = %name, who = %who, target = %what, count, "diesel-inbox console: action");
            match name.as_str() {
                "forget" if *count == 0 => {
                    "nothing to forget: no inbox row or failure count".to_owned()
                }
                "forget" => format!("forgotten: {what}; its next delivery will be applied"),
                "retry" | "retry-matching" | "retry-group" => {
                    format!("{count} dead message(s) pending again")
                }
                _ => format!("{count} dead message(s) discarded"),
            }
        }
        // A group too large for one action: refused before any change.
        Err(why) if name.ends_with("-group") && why.contains("nothing was changed") => {
            inbox_runtime::__facade::console_action(&name, "refused", 0);
            tracing::warn!(target: crate::TRACING_TARGET, action = %name, who = %who, target = %what, reason = %why, "diesel-inbox console: action refused");
            return refused(&context, StatusCode::BAD_REQUEST, why);
        }
        Err(why) => {
            inbox_runtime::__facade::console_action(&name, "failed", 0);
            tracing::warn!(target: crate::TRACING_TARGET, action = %name, who = %who, target = %what, error = %why, "diesel-inbox console: action failed");
            return html::unavailable(&context, View::Dead, why);
        }
    };
    let location = match form.back.as_deref() {
        Some("lookup") => format!(
            "{}/lookup?consumer={}&key={}&notice={}",
            context.base,
            url(&query.consumer),
            url(form.key.as_deref().unwrap_or("")),
            url(&notice)
        ),
        _ => {
            let mut location = format!("{}/dead?notice={}", context.base, url(&notice));
            for (field, value) in query.fields() {
                if !value.is_empty() {
                    location.push_str(&format!("&{field}={}", url(value)));
                }
            }
            location
        }
    };
    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()
}

/// A failure group's failure: present, without NUL, no longer than a
/// group keeps (240 characters).
fn checked_failure(failure: Option<&str>) -> Result<(), String> {
    match failure {
        None => Err("failure: needed".to_owned()),
        Some(f) if f.contains('\0') => Err("failure: contains NUL".to_owned()),
        Some(f) if f.chars().count() > 240 => Err(format!(
            "failure: {} characters, over the 240 a group keeps",
            f.chars().count()
        )),
        Some(_) => Ok(()),
    }
}
