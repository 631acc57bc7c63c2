//! The `#[idempotent]` attribute of diesel-inbox. An implementation detail:
//! depend on `diesel-inbox`, which re-exports it and documents it.

mod attr;
mod expand;
mod validate;

use proc_macro2::TokenStream;
use quote::quote;

/// Makes a Diesel handler idempotent: its message key is recorded in the
/// inbox table in the same transaction as its body.
///
/// The full documentation, with runnable examples, is on
/// `diesel_inbox::idempotent`. In short:
///
/// ```ignore
/// #[idempotent(key = "msg.id")]
/// fn on_order_placed(conn: &mut PgConnection, msg: &OrderPlaced) -> Result<i64, AppError> {
///     /* business writes on `conn` */
/// }
/// // is now `-> Result<Processed<i64>, AppError>`, and expands to
/// // run(conn, "on_order_placed", &(msg.id), 3, |conn| -> Result<i64, AppError> { /* body */ }, ..)
/// ```
///
/// Arguments: `key = "<expr>"` (required), `consumer = "<name>"` (default: the
/// function's name), `conn = "<param>"` (default: the only `&mut` parameter),
/// `retries = N` (default 3), `crate = "<path>"` (default: found from
/// Cargo.toml).
#[proc_macro_attribute]
pub fn idempotent(
    args: proc_macro::TokenStream,
    item: proc_macro::TokenStream,
) -> proc_macro::TokenStream {
    idempotent_inner(args.into(), item.into()).into()
}

/// Parse, validate, expand; on an error, the original item plus the error, so
/// that the rest of the crate still sees the function.
pub(crate) fn idempotent_inner(args: TokenStream, item: TokenStream) -> TokenStream {
    let expanded = syn::parse2::<attr::IdempotentArgs>(args).and_then(|args| {
        let func = syn::parse2::<syn::ItemFn>(item.clone()).map_err(|_| {
            syn::Error::new(
                proc_macro2::Span::call_site(),
                "`#[idempotent]` can only be applied to a function with a body",
            )
        })?;
        validate::validate(args, func).map(expand::expand)
    });
    match expanded {
        Ok(tokens) => tokens,
        Err(error) => {
            let error = error.into_compile_error();
            quote!(#item #error)
        }
    }
}
