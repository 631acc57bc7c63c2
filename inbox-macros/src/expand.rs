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
//         Inbox::consumer(&&__INBOX_HANDLER).retries(3).classify(..)
//             .run(conn, &(msg.id), |conn| -> Result<T, E> { body })
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
    // The classifier names its parameter's type, the error of the user's
    // `Result` however it is spelled, so that the autoref probe resolves
    // before the terminal call fixes `E`.
    let classify = quote_spanned! {output_span=>
        .classify(|#error: &<#original_output as #krate::__private::ResultParts>::Error| {
            #[allow(unused_imports)]
            use #krate::__private::{ViaRetryableError as _, ViaStatements as _};
            (&&#krate::__private::Probe(#error)).__diesel_inbox_error_class()
        })
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
    // Output: the same builder, its `_async` terminal, an `async` closure
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
    let terminal = |name: &str| Ident::new(&format!("{name}{suffix}"), output_span);
    // `.max_attempts(5)` and `.store_result()`, as the arguments say.
    let max_attempts = max_attempts
        .as_ref()
        .map(|n| quote_spanned!(n.span()=> .max_attempts(#n)));
    let store_result = store_result.map(|span| quote_spanned!(span=> .store_result()));
    let inbox = quote_spanned! {output_span=>
        #krate::__private::Inbox::consumer(&&#site)
    };
    let call = if let (Some(batch), Expr::Closure(key_closure)) = (&batch, &key) {
        // Input:  fn h(conn: &mut C, msgs: &[M]) -> Result<T, E>, key = "|msg| msg.id"
        // Output: Inbox::consumer(site).retries(3).classify(..)
        //             .run_batch(conn, msgs, |m| { let msg = m; owned_key(&(msg.id)) },
        //                        |conn, msgs| -> Result<T, E> { body })
        // The key closure is unpacked into one whose parameter type
        // run_batch infers. The body's `msgs` is a `Vec<&M>` of the first
        // deliveries. With `fingerprint = "|msg| msg.body"`, a fingerprint
        // closure unpacked the same way, its messages named so that its
        // parameter's type is known.
        let batch_ident = &batch.ident;
        let message = Ident::new("__inbox_message", Span::mixed_site());
        let key_pattern = &key_closure.inputs[0];
        let key_body = &key_closure.body;
        let key_of = quote_spanned!(key_body.span()=> &(#key_body));
        let fingerprint = match &fingerprint {
            Some(Expr::Closure(closure)) => {
                let pattern = &closure.inputs[0];
                let probe = fingerprint_probe(&closure.body, &krate);
                quote_spanned! {output_span=>
                    .batch_fingerprint_or_error(#batch_ident, |#message| {
                        let #pattern = #message;
                        #probe
                    })
                }
            }
            _ => quote!(),
        };
        let run_batch = terminal("run_batch");
        quote_spanned! {output_span=>
            #inbox
                .retries(#retries)
                #classify
                #fingerprint
                .#run_batch(
                    #conn_ident,
                    #batch_ident,
                    |#message| {
                        let #key_pattern = #message;
                        #krate::__private::owned_key(#key_of)
                    },
                    #closure |#conn, #batch| -> #original_output #body,
                ) #awaited
        }
    } else {
        // Input:  key = "msg.id", fingerprint = "msg.body", store_result, max_attempts = 5
        // Output: Inbox::consumer(site).retries(3).classify(..)
        //             .fingerprint_or_error(fingerprint(probe(&(msg.body)))).max_attempts(5).store_result()
        //             .run(conn, &(msg.id), |conn| -> Result<T, E> { body })
        // The fingerprint is taken before the body can move the message.
        let fingerprint = fingerprint.as_ref().map(|expr| {
            let probe = fingerprint_probe(expr, &krate);
            quote_spanned!(expr.span()=> .fingerprint_or_error(#probe))
        });
        // The key is type-checked against `InboxKey` where the user wrote it.
        let key_ref = quote_spanned!(key.span()=> &(#key));
        if retries == 0 {
            // The body may move a parameter the key borrows from: take the
            // key first. A body that runs once is never retried, so it
            // needs no classifier.
            let owned_key = Ident::new("__inbox_key", Span::mixed_site());
            let run_once = terminal("run_once");
            quote_spanned! {output_span=>
                let #owned_key = #krate::__private::owned_key(#key_ref);
                #inbox
                    #fingerprint
                    #max_attempts
                    #store_result
                    .#run_once(#conn_ident, &#owned_key, #closure |#conn| -> #original_output #body) #awaited
            }
        } else {
            let run = terminal("run");
            quote_spanned! {output_span=>
                #inbox
                    .retries(#retries)
                    #classify
                    #fingerprint
                    #max_attempts
                    #store_result
                    .#run(#conn_ident, #key_ref, #closure |#conn| -> #original_output #body) #awaited
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
    fn async_handler() {
        check(
            "async_handler",
            quote!(key = "msg.id"),
            quote! {
                async fn on_order_placed(conn: &mut AsyncPgConnection, msg: &OrderPlaced) -> QueryResult<i64> {
                    diesel::insert_into(orders::table).values(&msg.row).execute(conn).await?;
                    Ok(msg.total)
                }
            },
        );
    }

    #[test]
    fn fingerprint_option() {
        check(
            "fingerprint",
            quote!(key = "msg.id", fingerprint = "msg.body"),
            quote! {
                fn on_payment(conn: &mut PgConnection, msg: &Payment) -> QueryResult<()> {
                    Ok(())
                }
            },
        );
    }

    #[test]
    fn store_result_option() {
        check(
            "store_result",
            quote!(key = "msg.id", store_result),
            quote! {
                fn charge(conn: &mut PgConnection, msg: &Payment) -> QueryResult<i64> {
                    Ok(msg.amount)
                }
            },
        );
    }

    #[test]
    fn max_attempts_option() {
        check(
            "max_attempts",
            quote!(key = "msg.id", max_attempts = 5),
            quote! {
                fn import(conn: &mut PgConnection, msg: &File) -> QueryResult<()> {
                    Ok(())
                }
            },
        );
    }

    #[test]
    fn batch_with_fingerprints() {
        check(
            "batch_fingerprint",
            quote!(
                batch = "orders",
                key = "|o| o.id.as_str()",
                fingerprint = "|o| o.body.as_slice()"
            ),
            quote! {
                async fn on_orders(conn: &mut AsyncPgConnection, orders: &[Order]) -> QueryResult<usize> {
                    Ok(orders.len())
                }
            },
        );
    }

    #[test]
    fn inner_attributes_stay_at_function_level() {
        check(
            "inner_attributes",
            quote!(key = "msg.id"),
            quote! {
                fn handle(conn: &mut PgConnection, msg: &Msg) -> QueryResult<()> {
                    #![allow(unused_variables)]
                    #![deny(unsafe_code)]
                    let unused = 1;
                    Ok(())
                }
            },
        );
    }

    #[test]
    fn error_stand_in() {
        // A key that names no parameter: the error, and a stand-in with the
        // rewritten signature so that callers see no second error.
        check(
            "error_stand_in",
            quote!(key = "message.id"),
            quote! {
                /// Docs stay.
                pub fn handle(conn: &mut PgConnection, msg: &Msg) -> QueryResult<u32> {
                    Ok(1)
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
