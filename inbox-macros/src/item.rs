//! The annotated function, parsed down to its signature: the body stays
//! tokens, so that a syntax or type error inside it is reported by rustc
//! at its own place, not as a failure of the attribute.

use proc_macro2::{Delimiter, Group};
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Signature, Visibility};

#[derive(Clone)]
pub(crate) struct HandlerFn {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    /// The `{ .. }` body, verbatim.
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
        Ok(HandlerFn {
            attrs,
            vis,
            sig,
            body,
        })
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
    fn a_declaration_without_a_body_is_refused() {
        assert!(
            syn::parse_str::<HandlerFn>("fn handle(conn: &mut C) -> QueryResult<()>;").is_err()
        );
        assert!(syn::parse_str::<HandlerFn>("struct Handler;").is_err());
    }
}
