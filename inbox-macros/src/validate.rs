//! Checks the arguments against the function and resolves what expansion
//! needs: the connection parameter, the key expression, the consumer name,
//! the retry bound and the runtime's path.

use crate::attr::IdempotentArgs;
use crate::item::HandlerFn;
use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{
    Expr, FnArg, GenericArgument, Ident, LitInt, LitStr, Pat, PatIdent, PathArguments, ReturnType,
    Type,
};

/// Longest consumer name the inbox stores, in bytes (the runtime's `MAX_KEY_BYTES`).
const MAX_CONSUMER_BYTES: usize = 255;
const DEFAULT_RETRIES: u32 = 3;

/// A function that passed every check, ready to expand.
pub(crate) struct Handler {
    pub(crate) func: HandlerFn,
    /// The connection parameter's pattern (`conn` or `mut conn`).
    pub(crate) conn: PatIdent,
    pub(crate) key: Expr,
    pub(crate) consumer: LitStr,
    pub(crate) retries: u32,
    /// Batch handlers: the parameter holding the messages (the key is then a
    /// closure over one message).
    pub(crate) batch: Option<PatIdent>,
    /// Path of the runtime: `::diesel_inbox`, `::inbox_runtime` or `crate = ".."`.
    pub(crate) krate: syn::Path,
    /// `shared`: the consumer scope is deliberately shared.
    pub(crate) shared: bool,
    /// `fingerprint = "..."`: an expression (a closure over one message for
    /// a batch) whose value is fingerprinted.
    pub(crate) fingerprint: Option<Expr>,
    /// `store_result`: where the flag was written.
    pub(crate) store_result: Option<Span>,
    /// `max_attempts = N` (at least 1).
    pub(crate) max_attempts: Option<LitInt>,
}

/// Accumulates errors so that one compile reports all of them.
#[derive(Default)]
struct Errors(Option<syn::Error>);

impl Errors {
    fn push(&mut self, span: Span, message: impl std::fmt::Display) {
        let error = syn::Error::new(span, message);
        match &mut self.0 {
            Some(first) => first.combine(error),
            None => self.0 = Some(error),
        }
    }
}

/// Generic std types that are not a `Result`, whatever their arguments.
const NOT_RESULTS: &[&str] = &[
    "Option",
    "Vec",
    "VecDeque",
    "Box",
    "Rc",
    "Arc",
    "Cow",
    "HashMap",
    "HashSet",
    "BTreeMap",
    "BTreeSet",
    "Poll",
    "ControlFlow",
    "Pin",
    "RefCell",
    "Cell",
    "Mutex",
];

/// The success type `T` inside `Result<T, E>`, `QueryResult<T>`, `anyhow::Result<T>`
/// or any other path whose first generic type argument it is (an alias of
/// `Result`), except the std types that are not results (`Option<T>`, `Vec<T>`, ..).
pub(crate) fn success_type_mut(ty: &mut Type) -> Option<&mut Type> {
    let Type::Path(path) = ty else { return None };
    if path.qself.is_some() {
        return None;
    }
    let last = path.path.segments.last_mut()?;
    if NOT_RESULTS.iter().any(|name| last.ident == name) {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &mut last.arguments else {
        return None;
    };
    args.args.iter_mut().find_map(|arg| match arg {
        GenericArgument::Type(ty) => Some(ty),
        _ => None,
    })
}

pub(crate) fn validate(args: IdempotentArgs, func: HandlerFn) -> syn::Result<Handler> {
    let mut errors = Errors::default();
    let sig = &func.sig;

    if let Some(constness) = &sig.constness {
        errors.push(
            constness.span(),
            "`#[idempotent]` cannot be applied to a `const fn`: a handler runs database queries",
        );
    }
    check_return_type(&func.sig.output, &func.sig.ident, &mut errors);

    let params = parameter_names(&func);
    let conn = connection_parameter(&func, args.conn.as_ref(), &mut errors);

    let key = match &args.key {
        None => {
            errors.push(
                Span::call_site(),
                "missing `key` argument\nhelp: name the message id, e.g. `#[idempotent(key = \"msg.id\")]`",
            );
            None
        }
        Some(lit) => match lit.parse::<Expr>() {
            Ok(Expr::Closure(closure)) if args.batch.is_some() => {
                if closure.inputs.len() != 1 {
                    errors.push(
                        lit.span(),
                        "a batch `key` is a closure over one message, e.g. `key = \"|msg| msg.id\"`",
                    );
                }
                Some(Expr::Closure(closure))
            }
            Ok(_) if args.batch.is_some() => {
                errors.push(
                    lit.span(),
                    "with `batch`, `key` is a closure over one message\nhelp: e.g. `key = \"|msg| msg.id\"`",
                );
                None
            }
            Ok(Expr::Closure(_)) => {
                errors.push(
                    lit.span(),
                    "`key` is a closure, which is for batch handlers\nhelp: name the batch parameter with `batch = \"msgs\"`, or write the key as an expression such as `msg.id`",
                );
                None
            }
            Ok(expr) => {
                check_root(
                    "key",
                    &expr,
                    lit,
                    &func.sig.ident,
                    &params,
                    conn.as_ref(),
                    &mut errors,
                );
                Some(expr)
            }
            Err(e) => {
                errors.push(
                    lit.span(),
                    format!("`key` is not a valid Rust expression: {e}"),
                );
                None
            }
        },
    };

    let fingerprint = args.fingerprint.as_ref().and_then(|lit| {
        let expr = match lit.parse::<Expr>() {
            Ok(expr) => expr,
            Err(e) => {
                errors.push(
                    lit.span(),
                    format!("`fingerprint` is not a valid Rust expression: {e}"),
                );
                return None;
            }
        };
        match (&expr, args.batch.is_some()) {
            (Expr::Closure(closure), true) if closure.inputs.len() == 1 => Some(expr),
            (_, true) => {
                errors.push(
                    lit.span(),
                    "with `batch`, `fingerprint` is a closure over one message\nhelp: e.g. `fingerprint = \"|msg| msg.body\"`",
                );
                None
            }
            (Expr::Closure(_), false) => {
                errors.push(
                    lit.span(),
                    "`fingerprint` is a closure, which is for batch handlers\nhelp: write the content as an expression such as `msg.body`",
                );
                None
            }
            (_, false) => {
                check_root(
                    "fingerprint",
                    &expr,
                    lit,
                    &func.sig.ident,
                    &params,
                    conn.as_ref(),
                    &mut errors,
                );
                Some(expr)
            }
        }
    });
    let store_result = args.store_result.as_ref().map(|flag| flag.span);
    if let (Some(span), Some(_)) = (store_result, &args.batch) {
        errors.push(
            span,
            "`store_result` is for single-message handlers: a batch's value belongs to no one message's row\nhelp: store what each message needs in your own table, or handle the messages one at a time",
        );
    }

    let max_attempts = args.max_attempts.clone().filter(|lit| {
        let valid = matches!(lit.base10_parse::<u32>(), Ok(n) if n >= 1);
        if !valid {
            errors.push(
                lit.span(),
                "`max_attempts` must be a whole number from 1 to 4294967295: the failures after which the body no longer runs",
            );
        }
        valid
    });
    if let (Some(lit), Some(_)) = (&args.max_attempts, &args.batch) {
        errors.push(
            lit.span(),
            "`max_attempts` is for single-message handlers: a batch's failure belongs to no one message, and counting it against every key would give up on the good ones too\nhelp: handle the messages one at a time to find the poison message",
        );
    }

    let consumer = args
        .consumer
        .unwrap_or_else(|| LitStr::new(&func.sig.ident.unraw().to_string(), func.sig.ident.span()));
    let name = consumer.value();
    let problem = if name.is_empty() {
        Some("it is empty".to_string())
    } else if name.len() > MAX_CONSUMER_BYTES {
        Some(format!(
            "it is {} bytes long; at most {MAX_CONSUMER_BYTES} are allowed",
            name.len()
        ))
    } else if name.contains('\0') {
        Some("it contains a NUL byte".to_string())
    } else {
        None
    };
    if let Some(problem) = problem {
        errors.push(
            consumer.span(),
            format!("invalid `consumer` name: {problem}"),
        );
    }

    let retries = match &args.retries {
        None => DEFAULT_RETRIES,
        Some(lit) => lit.base10_parse::<u32>().unwrap_or_else(|_| {
            errors.push(
                lit.span(),
                "`retries` must be a whole number from 0 to 4294967295",
            );
            DEFAULT_RETRIES
        }),
    };

    let batch = args
        .batch
        .as_ref()
        .and_then(|lit| batch_parameter(&func, lit, conn.as_ref(), &mut errors));

    let krate = match &args.krate {
        Some(lit) => lit.parse::<syn::Path>().unwrap_or_else(|e| {
            errors.push(lit.span(), format!("`crate` is not a path: {e}"));
            runtime_path()
        }),
        None => runtime_path(),
    };
    let shared = args.shared.is_some();

    if let Some(error) = errors.0 {
        return Err(error);
    }
    match (conn, key) {
        (Some(conn), Some(key)) => Ok(Handler {
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
        }),
        // Every `None` above pushed an error.
        _ => Err(syn::Error::new(
            Span::call_site(),
            "invalid `#[idempotent]` handler",
        )),
    }
}

/// The return type must be a `Result` (or an alias of one) whose types the
/// body's closure can name.
fn check_return_type(output: &ReturnType, name: &Ident, errors: &mut Errors) {
    let ty = match output {
        ReturnType::Type(_, ty) => ty,
        ReturnType::Default => {
            errors.push(
                name.span(),
                "`#[idempotent]` handlers must return `Result<T, E>` or an alias such as `QueryResult<T>`\n\
                 help: the macro changes the success type `T` to `Processed<T>`",
            );
            return;
        }
    };
    if success_type_mut(&mut (**ty).clone()).is_none() {
        let found = match &**ty {
            Type::Path(path) => path.path.segments.last().map(|last| {
                let generics = if last.arguments.is_empty() {
                    ""
                } else {
                    "<..>"
                };
                format!(", not `{}{generics}`", last.ident)
            }),
            _ => None,
        };
        errors.push(
            ty.span(),
            format!(
                "`#[idempotent]` handlers must return `Result<T, E>` or an alias such as `QueryResult<T>`{}\n\
                 help: the macro changes the success type `T` to `Processed<T>`",
                found.unwrap_or_default()
            ),
        );
        return;
    }
    if let Some(impl_trait) = find_impl_trait(ty) {
        errors.push(
            impl_trait.span(),
            "`impl Trait` cannot be used in an `#[idempotent]` handler's return type: the body runs \
             in a closure, whose return type must be named\n\
             help: name the type, or return a `Box<dyn Trait>`",
        );
    }
}

/// The first `impl Trait` inside `ty`.
fn find_impl_trait(ty: &Type) -> Option<&syn::TypeImplTrait> {
    struct Finder<'a>(Option<&'a syn::TypeImplTrait>);
    impl<'a> Visit<'a> for Finder<'a> {
        fn visit_type_impl_trait(&mut self, node: &'a syn::TypeImplTrait) {
            self.0.get_or_insert(node);
        }
    }
    let mut finder = Finder(None);
    finder.visit_type(ty);
    finder.0
}

/// `self` (for methods) and every name a parameter's pattern binds
/// (`msg`, and `id` and `n` in `(id, n): (String, i64)`).
fn parameter_names(func: &HandlerFn) -> Vec<Ident> {
    struct Bindings(Vec<Ident>);
    impl<'a> Visit<'a> for Bindings {
        fn visit_pat_ident(&mut self, node: &'a PatIdent) {
            self.0.push(node.ident.clone());
            syn::visit::visit_pat_ident(self, node);
        }
        // A binding's type or a const in a pattern binds nothing.
        fn visit_type(&mut self, _: &'a Type) {}
        fn visit_expr(&mut self, _: &'a Expr) {}
    }
    let mut names = Bindings(Vec::new());
    for arg in &func.sig.inputs {
        match arg {
            FnArg::Receiver(receiver) => names.0.push(Ident::new("self", receiver.self_token.span)),
            FnArg::Typed(typed) => names.visit_pat(&typed.pat),
        }
    }
    names.0
}

/// The parameter `batch = ".."` names: a reference to the messages.
fn batch_parameter(
    func: &HandlerFn,
    lit: &LitStr,
    conn: Option<&PatIdent>,
    errors: &mut Errors,
) -> Option<PatIdent> {
    let wanted = lit.value();
    let found = func.sig.inputs.iter().find_map(|arg| match arg {
        FnArg::Typed(typed) => match &*typed.pat {
            Pat::Ident(pat) if pat.ident.unraw() == wanted => Some((pat, &typed.ty)),
            _ => None,
        },
        FnArg::Receiver(_) => None,
    });
    match found {
        None => {
            errors.push(
                lit.span(),
                format!(
                    "`batch = \"{wanted}\"` names no parameter of `{}`; its parameters are {}",
                    func.sig.ident,
                    list(&parameter_names(func)),
                ),
            );
            None
        }
        Some((pat, _)) if conn.is_some_and(|c| c.ident == pat.ident) => {
            errors.push(lit.span(), "the batch parameter cannot be the connection");
            None
        }
        Some((_, ty)) if !matches!(**ty, Type::Reference(_)) => {
            errors.push(
                ty.span(),
                "the batch parameter must be a reference to the messages, such as `&[Msg]` or `&Vec<Msg>`",
            );
            None
        }
        Some((pat, _)) => Some(pat.clone()),
    }
}

fn is_mut_reference(ty: &Type) -> bool {
    matches!(ty, Type::Reference(reference) if reference.mutability.is_some())
}

fn connection_parameter(
    func: &HandlerFn,
    named: Option<&LitStr>,
    errors: &mut Errors,
) -> Option<PatIdent> {
    let typed = func.sig.inputs.iter().filter_map(|arg| match arg {
        FnArg::Typed(typed) => Some(typed),
        FnArg::Receiver(_) => None,
    });
    let chosen = match named {
        Some(lit) => {
            let wanted = lit.value();
            let found = typed.clone().find(
                |param| matches!(&*param.pat, Pat::Ident(pat) if pat.ident.unraw() == wanted),
            );
            match found {
                Some(param) if is_mut_reference(&param.ty) => param,
                Some(param) => {
                    errors.push(
                        param.ty.span(),
                        format!("the connection parameter `{wanted}` must be a `&mut` reference to a diesel connection"),
                    );
                    return None;
                }
                None => {
                    errors.push(
                        lit.span(),
                        format!(
                            "`conn = \"{wanted}\"` names no parameter of `{}`; its parameters are {}",
                            func.sig.ident,
                            list(&parameter_names(func)),
                        ),
                    );
                    return None;
                }
            }
        }
        None => {
            let candidates: Vec<_> = typed.filter(|param| is_mut_reference(&param.ty)).collect();
            match candidates.as_slice() {
                [only] => *only,
                [] => {
                    let span = if func.sig.inputs.is_empty() {
                        func.sig.ident.span()
                    } else {
                        func.sig.inputs.span()
                    };
                    errors.push(
                        span,
                        "`#[idempotent]` needs a connection parameter: a `&mut` reference to a diesel connection\n\
                         help: add one, e.g. `conn: &mut PgConnection`",
                    );
                    return None;
                }
                [_, second, ..] => {
                    let names: Vec<_> = candidates
                        .iter()
                        .filter_map(|param| match &*param.pat {
                            Pat::Ident(pat) => Some(pat.ident.clone()),
                            _ => None,
                        })
                        .collect();
                    let example = names
                        .first()
                        .map_or_else(|| "conn".to_string(), |n| n.to_string());
                    errors.push(
                        second.span(),
                        format!(
                            "several `&mut` parameters could be the connection: {}\n\
                             help: name it with `conn = \"{example}\"`",
                            list(&names)
                        ),
                    );
                    return None;
                }
            }
        }
    };
    check_connection_type(&chosen.ty, errors);
    match &*chosen.pat {
        Pat::Ident(pat) if pat.by_ref.is_none() && pat.subpat.is_none() => Some(pat.clone()),
        other => {
            errors.push(
                other.span(),
                "the connection parameter must be a plain identifier such as `conn`",
            );
            None
        }
    }
}

/// A pool's handle (r2d2's and bb8's `PooledConnection`, deadpool's
/// `Object`) has a transaction manager of its own; the runtime needs the
/// connection inside it, which `&mut pooled` reaches by deref coercion.
fn check_connection_type(ty: &Type, errors: &mut Errors) {
    let Type::Reference(reference) = ty else {
        return;
    };
    let Type::Path(path) = &*reference.elem else {
        return;
    };
    let Some(last) = path.path.segments.last() else {
        return;
    };
    if last.ident != "PooledConnection" && last.ident != "Object" {
        return;
    }
    // `PooledConnection<ConnectionManager<PgConnection>>`: name `PgConnection`.
    let inner = quote::ToTokens::to_token_stream(ty)
        .to_string()
        .replace(' ', "");
    let connection = inner
        .split("ConnectionManager<")
        .nth(1)
        .and_then(|rest| rest.split(['>', ',']).next())
        .filter(|name| !name.is_empty())
        .unwrap_or("PgConnection");
    errors.push(
        reference.elem.span(),
        format!(
            "`#[idempotent]` needs the diesel connection itself, not a pool's `{}`\n\
             help: take `&mut {connection}` and call the handler with `&mut pooled` \
             (deref coercion) or `&mut *pooled`",
            last.ident
        ),
    );
}

/// The expression the key is read from: `msg` in `msg.header.id.as_str()`.
fn key_root(expr: &Expr) -> &Expr {
    match expr {
        Expr::Field(e) => key_root(&e.base),
        Expr::MethodCall(e) => key_root(&e.receiver),
        Expr::Index(e) => key_root(&e.expr),
        Expr::Paren(e) => key_root(&e.expr),
        Expr::Group(e) => key_root(&e.expr),
        Expr::Reference(e) => key_root(&e.expr),
        Expr::Unary(e) => key_root(&e.expr),
        Expr::Cast(e) => key_root(&e.expr),
        Expr::Try(e) => key_root(&e.expr),
        other => other,
    }
}

fn check_root(
    what: &str,
    expr: &Expr,
    lit: &LitStr,
    handler: &Ident,
    params: &[Ident],
    conn: Option<&PatIdent>,
    errors: &mut Errors,
) {
    let others: Vec<Ident> = params
        .iter()
        .filter(|p| conn.is_none_or(|c| c.ident != **p))
        .cloned()
        .collect();
    match key_root(expr) {
        Expr::Lit(_) => errors.push(
            lit.span(),
            if what == "key" {
                "`key` is a constant: every message would share one key\n\
                 help: read the key from the message, e.g. `key = \"msg.id\"`"
                    .to_string()
            } else {
                format!(
                    "`{what}` is a constant: every message would have one fingerprint\n\
                     help: read the content from the message, e.g. `{what} = \"msg.body\"`"
                )
            },
        ),
        Expr::Path(path) if path.qself.is_none() => {
            let Some(root) = path.path.get_ident() else {
                // `Type::CONST`, `module::value`: not read from a parameter.
                errors.push(
                    lit.span(),
                    format!(
                        "`{what}` must be read from a parameter; `{}` is not one (parameters: {})",
                        quote::ToTokens::to_token_stream(&path.path)
                            .to_string()
                            .replace(' ', ""),
                        list(&others)
                    ),
                );
                return;
            };
            if conn.is_some_and(|c| c.ident == *root) {
                errors.push(
                    lit.span(),
                    format!(
                        "`{what}` cannot be read from the connection parameter `{root}`\n\
                     help: read it from the message, one of {}",
                        list(&others)
                    ),
                );
            } else if !params.iter().any(|p| p == root) {
                errors.push(
                    lit.span(),
                    format!(
                    "`{root}` in `{what}` is not a parameter of `{handler}`; its parameters are {}",
                    list(&others)
                ),
                );
            }
        }
        // Calls, macros, blocks: type-checked like any key expression.
        _ => {}
    }
}

fn list(names: &[Ident]) -> String {
    if names.is_empty() {
        return "none".to_string();
    }
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `::diesel_inbox` when the user depends on `diesel-inbox` (under any name),
/// else `::inbox_runtime` when they depend on the runtime directly.
pub(crate) fn runtime_path() -> syn::Path {
    use proc_macro_crate::{crate_name, FoundCrate};
    for (package, own_name) in [
        ("diesel-inbox", "diesel_inbox"),
        ("inbox-runtime", "inbox_runtime"),
    ] {
        match crate_name(package) {
            // `Itself` is the package's own tests and examples, which name
            // the library as an external crate (and the library declares
            // `extern crate self as ..` for its unit tests).
            Ok(FoundCrate::Itself) => return ident_path(own_name),
            Ok(FoundCrate::Name(name)) => return ident_path(&name),
            Err(_) => {}
        }
    }
    ident_path("diesel_inbox")
}

fn ident_path(name: &str) -> syn::Path {
    let ident = Ident::new(name, Span::call_site());
    syn::parse_quote!(::#ident)
}
