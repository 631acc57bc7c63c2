//! The annotated function, parsed down to its signature: the body stays
//! tokens, so that a syntax or type error inside it is reported by rustc
//! at its own place, not as a failure of the attribute.

use proc_macro2::{Delimiter, Group, TokenStream};
use syn::parse::{Parse, ParseStream, Parser};
use syn::{AttrStyle, Attribute, Signature, Visibility};

#[derive(Clone)]
pub(crate) struct HandlerFn {
    /// The outer attributes, then the body's inner ones (`#![allow(..)]`)
    /// turned outer: they apply to the function, never to the closure the
    /// body moves into.
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    /// The `{ .. }` body, verbatim but for its inner attributes.
    pub(crate) body: Group,
}

impl Parse for HandlerFn {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        let sig = input.parse()?;
        let body: Group = input.parse()?;
        if body.delimiter() != Delimiter::Brace || !input.is_empty() {
            return Err(input.error("expected the function's body"));
        }
        let (inner, body) = split_inner_attributes(body);
        let mut attrs = attrs;
        attrs.extend(inner);
        Ok(HandlerFn {
            attrs,
            vis,
            sig,
            body,
        })
    }
}

/// The body's leading inner attributes, as outer ones, and the body
/// without them (tracing-attributes' `MaybeItemFn` does the same). A body
/// whose attributes do not parse is left as it is, for rustc to report.
fn split_inner_attributes(body: Group) -> (Vec<Attribute>, Group) {
    let parser = |input: ParseStream<'_>| {
        let inner = input.call(Attribute::parse_inner)?;
        let rest: TokenStream = input.parse()?;
        Ok((inner, rest))
    };
    match parser.parse2(body.stream()) {
        Ok((inner, rest)) if !inner.is_empty() => {
            let mut stripped = Group::new(Delimiter::Brace, rest);
            stripped.set_span(body.span());
            let outer = inner
                .into_iter()
                .map(|mut attr| {
                    attr.style = AttrStyle::Outer;
                    attr
                })
                .collect();
            (outer, stripped)
        }
        _ => (Vec::new(), body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_with_a_syntax_error_still_parses() {
        let func: HandlerFn = syn::parse_quote! {
            /// Docs.
            pub fn handle(conn: &mut C, msg: &M) -> QueryResult<()> { let x = ; }
        };
        assert_eq!(func.sig.ident, "handle");
        assert_eq!(func.attrs.len(), 1);
        assert!(func.body.stream().to_string().contains("let x ="));
    }

    #[test]
    fn inner_attributes_move_to_the_function() {
        let func: HandlerFn = syn::parse_quote! {
            #[doc = "outer"]
            fn handle(conn: &mut C, msg: &M) -> QueryResult<()> {
                #![allow(unused_variables)]
                #![deny(unsafe_code)]
                let x = 1;
                Ok(())
            }
        };
        let attrs: Vec<String> = func
            .attrs
            .iter()
            .map(|a| quote::ToTokens::to_token_stream(a).to_string())
            .collect();
        assert_eq!(
            attrs,
            [
                "# [doc = \"outer\"]",
                "# [allow (unused_variables)]",
                "# [deny (unsafe_code)]"
            ]
        );
        let body = func.body.stream().to_string();
        assert!(!body.contains('!'), "{body}");
        assert!(body.starts_with("let x = 1"), "{body}");
    }

    #[test]
    fn a_declaration_without_a_body_is_refused() {
        assert!(
            syn::parse_str::<HandlerFn>("fn handle(conn: &mut C) -> QueryResult<()>;").is_err()
        );
        assert!(syn::parse_str::<HandlerFn>("struct Handler;").is_err());
    }
}
