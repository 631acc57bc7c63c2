//! The `#[idempotent]` attribute of diesel-inbox. An implementation detail:
//! depend on `diesel-inbox`, which re-exports it and documents it.

#![forbid(unsafe_code)]

mod attr;
mod expand;
mod item;
mod validate;

use proc_macro2::TokenStream;
use quote::quote;

/// Makes a Diesel handler idempotent: its message key is recorded in the
/// inbox table in the same transaction as its body.
///
/// The arguments, what the attribute expands to and runnable examples are
/// documented once, on `diesel_inbox::idempotent`
/// (<https://docs.rs/diesel-inbox/latest/diesel_inbox/attr.idempotent.html>).
#[proc_macro_attribute]
pub fn idempotent(
    args: proc_macro::TokenStream,
    item: proc_macro::TokenStream,
) -> proc_macro::TokenStream {
    idempotent_inner(args.into(), item.into()).into()
}

/// Parse, validate, expand. On an error: the error, plus a stand-in with
/// the rewritten signature (so that callers see one error, not a cascade
/// of type mismatches), or the original item if it is not a function.
pub(crate) fn idempotent_inner(args: TokenStream, item: TokenStream) -> TokenStream {
    let func = match syn::parse2::<item::HandlerFn>(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            let mut error = syn::Error::new(
                proc_macro2::Span::call_site(),
                "`#[idempotent]` can only be applied to a function with a body",
            );
            if let Err(args_error) = syn::parse2::<attr::IdempotentArgs>(args) {
                error.combine(args_error);
            }
            let error = error.into_compile_error();
            return quote!(#item #error);
        }
    };
    let args = match syn::parse2::<attr::IdempotentArgs>(args) {
        Ok(args) => args,
        Err(error) => {
            let placeholder =
                expand::placeholder(func, &validate::runtime_path(), expand::Outcome::Processed);
            let error = error.into_compile_error();
            return quote!(#placeholder #error);
        }
    };
    let outcome = expand::Outcome::of(args.batch.is_some(), args.store_result.is_some());
    let krate = args
        .krate
        .as_ref()
        .and_then(|lit| lit.parse::<syn::Path>().ok())
        .unwrap_or_else(validate::runtime_path);
    match validate::validate(args, func.clone()) {
        Ok(handler) => expand::expand(handler),
        Err(error) => {
            let placeholder = expand::placeholder(func, &krate, outcome);
            let error = error.into_compile_error();
            quote!(#placeholder #error)
        }
    }
}
