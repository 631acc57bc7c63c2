//! Rewrites a validated handler into a call of the runtime.

use crate::item::HandlerFn;
use crate::validate::{success_type_mut, Handler};
use proc_macro2::{Ident, Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, ReturnType, Signature, Type};

// Input:
//     fn handle(conn: &mut PgConnection, msg: &Msg) -> Result<T, E> { body }
// Output:
//     fn handle(conn: &mut PgConnection, msg: &Msg) -> Result<Processed<T>, E> {
//         static __INBOX_HANDLER: RegisteredHandler = RegisteredHandler::new("handle", path, file, line, shared);
//         inventory::submit!(Registration(&__INBOX_HANDLER));
//         run(conn, &&__INBOX_HANDLER, &(msg.id), 3, |conn| -> Result<T, E> { body }, classify)
//     }
// The body stays verbatim in its own closure, so `?` and `return` leave the
// transaction, and the closure's parameter is the user's own `conn`. The
// registration lets the runtime refuse two handlers that share a consumer
// by accident, and lists every handler (`consumers()`).
pub(crate) fn expand(handler: Handler) -> TokenStream {
    let Handler {
        func,
        conn,
        key,
        consumer,
        retries,
        batch,
        krate,
        shared,
        fingerprint,
        store_result,
        max_attempts,
    } = handler;
    let HandlerFn {
        attrs,
        vis,
        mut sig,
        body,
    } = func;

    let outcome = Outcome::of(batch.is_some(), store_result.is_some());
    let original_output = rewrite_output(&mut sig, &krate, outcome)
        .expect("validate() requires a rewritable return type");

    let conn_ident = &conn.ident;
    // Bounds on the error type (`E: From<InboxError>`) are reported on the
    // whole call: put the call at the user's return type.
    let output_span = original_output.span();
    let krate = respan(quote!(#krate), output_span);
    let error = Ident::new("__inbox_error", Span::mixed_site());
    let classify = quote_spanned! {output_span=>
        |#error| {
            #[allow(unused_imports)]
            use #krate::__private::{ViaRetryableError as _, ViaStatements as _};
            (&&#krate::__private::Probe(#error)).__diesel_inbox_error_class()
        }
    };
    let site = Ident::new("__INBOX_HANDLER", Span::mixed_site());
    let function_name = sig.ident.to_string();
    let location = sig.ident.span();
    let shared = syn::LitBool::new(shared, location);
    let registration = quote_spanned! {location=>
        static #site: #krate::__private::RegisteredHandler = #krate::__private::RegisteredHandler::new(
            #consumer,
            ::core::concat!(::core::module_path!(), "::", #function_name),
            ::core::file!(),
            ::core::line!(),
            #shared,
        );
        #krate::__private::inventory::submit!(#krate::__private::Registration(&#site));
    };
    // Input:  async fn h(conn: &mut AsyncPgConnection, ..) -> Result<T, E> { body }
    // Output: the same calls to the `_async` twins, with `async` closures
    //         and `.await`.
    let asyncness = sig.asyncness.is_some();
    let (closure, awaited, suffix) = if asyncness {
        (
            quote!(async),
            quote_spanned!(output_span=> .await),
            "_async",
        )
    } else {
        (quote!(), quote!(), "")
    };
    // With a fingerprint or a stored result, the `_with` variants take the
    // options: `run_with(conn, site, key, &options, ..)`.
    let with = fingerprint.is_some() || store_result.is_some() || max_attempts.is_some();
    let runtime_fn = |name: &str| {
        let with = if with { "_with" } else { "" };
        Ident::new(&format!("{name}{with}{suffix}"), output_span)
    };
    let options_ident = Ident::new("__inbox_options", Span::mixed_site());
    // `&options, ` between the key and the rest of the arguments.
    let options_arg = if with {
        quote!(&#options_ident,)
    } else {
        quote!()
    };
    let call = if let (Some(batch), Expr::Closure(key_closure)) = (&batch, &key) {
        // Input:  fn h(conn: &mut C, msgs: &[M]) -> Result<T, E>, key = "|msg| msg.id"
        // Output: run_batch(conn, site, msgs, |m| { let msg = m; owned_key(&(msg.id)) }, 3,
        //                   |conn, msgs| -> Result<T, E> { body }, classify)
        // The key closure is unpacked into one whose parameter type run_batch
        // infers. The body's `msgs` is a `Vec<&M>` of the first deliveries.
        // With `fingerprint = "|msg| msg.body"`, a `BatchOptions` whose
        // closure is unpacked the same way comes before the retries.
        let batch_ident = &batch.ident;
        let message = Ident::new("__inbox_message", Span::mixed_site());
        let key_pattern = &key_closure.inputs[0];
        let key_body = &key_closure.body;
        let key_of = quote_spanned!(key_body.span()=> &(#key_body));
        let options = match &fingerprint {
            Some(Expr::Closure(closure)) => {
                let pattern = &closure.inputs[0];
                let probe = fingerprint_probe(&closure.body, &krate);
                quote_spanned! {output_span=>
                    let #options_ident = #krate::__private::batch_options(#batch_ident).fingerprint_or_error(
                        |#message| {
                            let #pattern = #message;
                            #probe
                        },
                    );
                }
            }
            _ => quote!(),
        };
        let run_batch = runtime_fn("run_batch");
        quote_spanned! {output_span=>
            #options
            #krate::__private::#run_batch(
                #conn_ident,
                &&#site,
                #batch_ident,
                |#message| {
                    let #key_pattern = #message;
                    #krate::__private::owned_key(#key_of)
                },
                #options_arg
                #retries,
                #closure |#conn, #batch| -> #original_output #body,
                #classify,
            ) #awaited
        }
    } else {
        // Input:  key = "msg.id", fingerprint = "msg.body", store_result, max_attempts = 5
        // Output: let options = Options::new().fingerprint_or_error(fingerprint(probe(&(msg.body)))).max_attempts(5);
        //         run_with(conn, site, &(msg.id), &options, 3, |conn| .., classify)
        // The fingerprint is taken before the body can move the message.
        // `store_result` is the rewritten return type, `Stored<T>`, which
        // `run_with` infers its outcome from.
        let options = if with {
            let fingerprint = fingerprint.as_ref().map(|expr| {
                let probe = fingerprint_probe(expr, &krate);
                quote_spanned!(expr.span()=> .fingerprint_or_error(#probe))
            });
            let max_attempts = max_attempts
                .as_ref()
                .map(|n| quote_spanned!(n.span()=> .max_attempts(#n)));
            quote_spanned! {output_span=>
                let #options_ident = #krate::__private::Options::new() #fingerprint #max_attempts;
            }
        } else {
            quote!()
        };
        if retries == 0 {
            // The key is type-checked against `InboxKey` where the user wrote it.
            let key_ref = quote_spanned!(key.span()=> &(#key));
            // The body may move a parameter the key borrows from: take the key first.
            let owned_key = Ident::new("__inbox_key", Span::mixed_site());
            let run_once = runtime_fn("run_once");
            quote_spanned! {output_span=>
                let #owned_key = #krate::__private::owned_key(#key_ref);
                #options
                #krate::__private::#run_once(#conn_ident, &&#site, &#owned_key, #options_arg #closure |#conn| -> #original_output #body) #awaited
            }
        } else {
            let key_ref = quote_spanned!(key.span()=> &(#key));
            let run = runtime_fn("run");
            quote_spanned! {output_span=>
                #options
                #krate::__private::#run(
                    #conn_ident,
                    &&#site,
                    #key_ref,
                    #options_arg
                    #retries,
                    #closure |#conn| -> #original_output #body,
                    #classify,
                ) #awaited
            }
        }
    };

    quote! {
        #(#attrs)*
        #vis #sig {
            #registration
            #call
        }
    }
}

/// The fingerprint of `expr`'s value, as a `Result<Fingerprint, String>`:
/// bytes (`AsRef<[u8]>`) first, else `Serialize` (autoref specialization).
/// Spanned to the expression, so that a value that is neither is an error
/// on the user's tokens.
fn fingerprint_probe(expr: &Expr, krate: &TokenStream) -> TokenStream {
    let span = expr.span();
    let krate = respan(krate.clone(), span);
    quote_spanned! {span=>
        {
            #[allow(unused_imports)]
            use #krate::__private::{ViaBytes as _, ViaSerialize as _};
            #krate::__private::fingerprint(
                (&&#krate::__private::FingerprintProbe(&(#expr))).__diesel_inbox_fingerprint(),
            )
        }
    }
}

/// What a handler returns in place of its success type `T`.
#[derive(Clone, Copy)]
pub(crate) enum Outcome {
    /// `Processed<T>`.
    Processed,
    /// `Stored<T>` (`store_result`).
    Stored,
    /// `Batch<T>` (`batch = ".."`).
    Batch,
}

impl Outcome {
    pub(crate) fn of(batch: bool, store_result: bool) -> Self {
        match (batch, store_result) {
            (true, _) => Outcome::Batch,
            (false, true) => Outcome::Stored,
            (false, false) => Outcome::Processed,
        }
    }
}

/// Turns the success type `T` of the signature's `Result<T, E>` into
/// `Processed<T>` (`Stored<T>`, `Batch<T>`); returns the original return
/// type, or `None` when it is not a `Result`.
fn rewrite_output(sig: &mut Signature, krate: &syn::Path, outcome: Outcome) -> Option<Type> {
    let ReturnType::Type(_, output) = &mut sig.output else {
        return None;
    };
    let original = (**output).clone();
    let success = success_type_mut(output)?;
    let inner = success.clone();
    *success = match outcome {
        Outcome::Batch => syn::parse_quote_spanned!(inner.span()=> #krate::Batch<#inner>),
        Outcome::Stored => syn::parse_quote_spanned!(inner.span()=> #krate::Stored<#inner>),
        Outcome::Processed => {
            syn::parse_quote_spanned!(inner.span()=> #krate::Processed<#inner>)
        }
    };
    Some(original)
}

/// What stands in for a handler the attribute refused: the rewritten
/// signature, so that callers type-check against `Processed<T>` and the
/// attribute's error is the only one, and no body. A return type that
/// cannot be rewritten keeps the function as written.
pub(crate) fn placeholder(func: HandlerFn, krate: &syn::Path, outcome: Outcome) -> TokenStream {
    let HandlerFn {
        attrs,
        vis,
        mut sig,
        body,
    } = func;
    let rewritable = matches!(&sig.output, ReturnType::Type(_, ty)
        if !quote::ToTokens::to_token_stream(ty).to_string().contains("impl "));
    if !rewritable || rewrite_output(&mut sig, krate, outcome).is_none() {
        return quote!(#(#attrs)* #vis #sig #body);
    }
    // A `const fn` cannot panic with a message at run time; the attribute
    // has reported it already.
    sig.constness = None;
    quote! {
        #(#attrs)*
        #[allow(unused_variables, clippy::diverging_sub_expression)]
        #vis #sig {
            ::core::unreachable!("`#[idempotent]` refused this handler at compile time")
        }
    }
}

/// The same tokens, every one at `span`.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            token.set_span(span);
            token
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::idempotent_inner;
    use quote::quote;

    fn pretty(tokens: proc_macro2::TokenStream) -> String {
        prettyplease::unparse(&syn::parse2(tokens).expect("expansion is a valid file"))
    }

    /// Expansion snapshots: `tests/expand/*.rs` hold the expected output; set
    /// `INBOX_BLESS=1` to rewrite them after reviewing a change.
    fn check(name: &str, args: proc_macro2::TokenStream, item: proc_macro2::TokenStream) {
        let actual = pretty(idempotent_inner(args, item));
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/expand")
            .join(format!("{name}.rs"));
        if std::env::var_os("INBOX_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().expect("has a parent")).expect("mkdir");
            std::fs::write(&path, &actual).expect("write snapshot");
        }
        let expected = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; run with INBOX_BLESS=1", path.display()));
        assert_eq!(
            actual, expected,
            "expansion of {name} changed; review and bless"
        );
    }

    #[test]
    fn free_function() {
        check(
            "free_function",
            quote!(key = "msg.id"),
            quote! {
                /// Docs stay.
                pub fn on_order_placed(conn: &mut PgConnection, msg: &OrderPlaced) -> Result<i64, AppError> {
                    diesel::insert_into(orders::table).values(&msg.row).execute(conn)?;
                    Ok(msg.total)
                }
            },
        );
    }

    #[test]
    fn batch_handler() {
        check(
            "batch",
            quote!(batch = "orders", key = "|order| order.id.as_str()"),
            quote! {
                fn on_orders(conn: &mut PgConnection, orders: &[Order]) -> QueryResult<usize> {
                    diesel::insert_into(orders::table).values(rows(&orders)).execute(conn)
                }
            },
        );
    }

    #[test]
    fn method_with_alias_and_no_retries() {
        check(
            "method_no_retries",
            quote!(
                key = "event.id",
                consumer = "audit",
                conn = "db",
                retries = 0,
                crate = "::inbox"
            ),
            quote! {
                fn record<C>(&self, db: &mut C, event: Event) -> QueryResult<()> where C: Connection {
                    self.sink.push(event);
                    Ok(())
                }
            },
        );
    }
}
