//! Parsing `#[idempotent(key = "...", consumer = "...", shared, conn = "...", retries = N, batch = "...", fingerprint = "...", store_result, max_attempts = N, crate = "...")]`.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::{LitInt, LitStr, Token};

mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(consumer);
    syn::custom_keyword!(conn);
    syn::custom_keyword!(retries);
    syn::custom_keyword!(batch);
    syn::custom_keyword!(shared);
    syn::custom_keyword!(fingerprint);
    syn::custom_keyword!(store_result);
    syn::custom_keyword!(max_attempts);
}

const VALID: &str = "`key`, `consumer`, `shared`, `conn`, `retries`, `batch`, `fingerprint`, `store_result`, `max_attempts`, `crate`";

/// The attribute's arguments, as written; [`crate::validate`] checks them
/// against the function.
#[derive(Default)]
pub(crate) struct IdempotentArgs {
    pub(crate) key: Option<LitStr>,
    pub(crate) consumer: Option<LitStr>,
    pub(crate) conn: Option<LitStr>,
    pub(crate) retries: Option<LitInt>,
    pub(crate) batch: Option<LitStr>,
    pub(crate) krate: Option<LitStr>,
    /// `shared`: the consumer scope is deliberately shared with other handlers.
    pub(crate) shared: Option<kw::shared>,
    /// `fingerprint = "..."`: the content whose fingerprint is stored.
    pub(crate) fingerprint: Option<LitStr>,
    /// `store_result`: the body's value is stored for duplicates.
    pub(crate) store_result: Option<kw::store_result>,
    /// `max_attempts = N`: failures after which the body no longer runs.
    pub(crate) max_attempts: Option<LitInt>,
}

impl Parse for IdempotentArgs {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = IdempotentArgs::default();
        while !input.is_empty() {
            let lookahead = input.lookahead1();
            if lookahead.peek(kw::key) {
                let name = input.parse::<kw::key>()?;
                set(&mut args.key, "key", name.span, parse_value(input)?)?;
            } else if lookahead.peek(kw::consumer) {
                let name = input.parse::<kw::consumer>()?;
                set(
                    &mut args.consumer,
                    "consumer",
                    name.span,
                    parse_value(input)?,
                )?;
            } else if lookahead.peek(kw::conn) {
                let name = input.parse::<kw::conn>()?;
                set(&mut args.conn, "conn", name.span, parse_value(input)?)?;
            } else if lookahead.peek(kw::retries) {
                let name = input.parse::<kw::retries>()?;
                set(&mut args.retries, "retries", name.span, parse_value(input)?)?;
            } else if lookahead.peek(kw::batch) {
                let name = input.parse::<kw::batch>()?;
                set(&mut args.batch, "batch", name.span, parse_value(input)?)?;
            } else if lookahead.peek(kw::max_attempts) {
                let name = input.parse::<kw::max_attempts>()?;
                set(
                    &mut args.max_attempts,
                    "max_attempts",
                    name.span,
                    parse_value(input)?,
                )?;
            } else if lookahead.peek(kw::fingerprint) {
                let name = input.parse::<kw::fingerprint>()?;
                set(
                    &mut args.fingerprint,
                    "fingerprint",
                    name.span,
                    parse_value(input)?,
                )?;
            } else if lookahead.peek(kw::shared) {
                let flag = input.parse::<kw::shared>()?;
                no_value(input, "shared", flag.span)?;
                set(&mut args.shared, "shared", flag.span, flag)?;
            } else if lookahead.peek(kw::store_result) {
                let flag = input.parse::<kw::store_result>()?;
                no_value(input, "store_result", flag.span)?;
                set(&mut args.store_result, "store_result", flag.span, flag)?;
            } else if lookahead.peek(Token![crate]) {
                let name = input.parse::<Token![crate]>()?;
                set(&mut args.krate, "crate", name.span, parse_value(input)?)?;
            } else if input.peek(syn::Ident) {
                let unknown: syn::Ident = input.parse()?;
                return Err(syn::Error::new(
                    unknown.span(),
                    format!("unknown argument `{unknown}`; expected one of {VALID}"),
                ));
            } else {
                return Err(lookahead.error());
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

/// A flag followed by `= ...` is refused.
fn no_value(input: ParseStream<'_>, name: &str, span: Span) -> syn::Result<()> {
    if input.peek(Token![=]) {
        return Err(syn::Error::new(
            span,
            format!("`{name}` is a flag and takes no value: write `{name}`"),
        ));
    }
    Ok(())
}

fn parse_value<T: Parse>(input: ParseStream<'_>) -> syn::Result<T> {
    input.parse::<Token![=]>()?;
    input.parse()
}

fn set<T>(slot: &mut Option<T>, name: &str, span: Span, value: T) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            span,
            format!("duplicate `{name}` argument"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_argument() {
        let args: IdempotentArgs = syn::parse_quote!(
            key = "msg.id",
            consumer = "billing",
            conn = "db",
            retries = 5,
            crate = "inbox",
            shared,
            fingerprint = "msg.body",
            store_result,
            max_attempts = 5,
        );
        assert_eq!(args.key.map(|k| k.value()).as_deref(), Some("msg.id"));
        assert_eq!(args.consumer.map(|k| k.value()).as_deref(), Some("billing"));
        assert_eq!(args.conn.map(|k| k.value()).as_deref(), Some("db"));
        assert_eq!(args.retries.map(|r| r.to_string()).as_deref(), Some("5"));
        assert_eq!(args.krate.map(|k| k.value()).as_deref(), Some("inbox"));
        assert!(args.shared.is_some());
        assert_eq!(
            args.fingerprint.map(|f| f.value()).as_deref(),
            Some("msg.body")
        );
        assert!(args.store_result.is_some());
        assert_eq!(
            args.max_attempts.map(|n| n.to_string()).as_deref(),
            Some("5")
        );
    }

    #[test]
    fn rejects_duplicates_and_unknown_names() {
        let dup = syn::parse_str::<IdempotentArgs>(r#"key = "a", key = "b""#);
        assert_eq!(
            dup.err().map(|e| e.to_string()).as_deref(),
            Some("duplicate `key` argument")
        );
        let unknown = syn::parse_str::<IdempotentArgs>(r#"kee = "a""#);
        assert_eq!(
            unknown.err().map(|e| e.to_string()).as_deref(),
            Some("unknown argument `kee`; expected one of `key`, `consumer`, `shared`, `conn`, `retries`, `batch`, `fingerprint`, `store_result`, `max_attempts`, `crate`")
        );
    }
}
