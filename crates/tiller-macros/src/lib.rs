//! Tiller's attribute macros; use them through the `tiller` crate
//! (`tiller::tool`), whose paths the generated code names.
//!
//! `#[tool]` on a Rust function (async or not) that returns a `Result` makes a
//! tool of it: a unit struct named after the function in `PascalCase` with a
//! `Tool` suffix (`fn add` → `AddTool`) implementing `tiller::AgentTool`. The
//! tool's name is the function's, its description the function's doc comment,
//! its parameter schema comes from the argument types through `schemars`, and
//! arguments are decoded with `serde` (a mismatch is an error result naming the
//! field). An argument of type `ToolContext` (or `&ToolContext`) receives the
//! call's context instead: its cancellation, progress updates and the agent's
//! `AgentContext`. The function stays as it was, callable as before.
//!
//! ```text
//! /// Add two numbers.
//! #[tiller::tool(params(a = "The first number", b = "The second number"))]
//! async fn add(a: f64, b: f64) -> Result<String, tiller::ToolError> {
//!     Ok((a + b).to_string())
//! }
//! let tools = tiller::ToolSet::new([std::sync::Arc::new(AddTool) as _])?;
//! ```
//!
//! On an impl block, each method taking `&self` becomes a tool (`Notes::add` →
//! `NotesAddTool`, holding the value in an `Arc`), a method's own `#[tool(...)]`
//! sets its options, and `Notes::tools(&Arc<Notes>)` gives every one of them.
//!
//! Options: `name = "..."` (the name the model calls), `params(arg = "...")`
//! (argument descriptions), `sequential` (the tool runs alone), `timeout_ms = N`
//! (each call bounded, see `AgentTool::timeout`).

use proc_macro::TokenStream;
use proc_macro2::Span;
use quote::{format_ident, quote};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{
    Attribute, Expr, ExprLit, FnArg, Ident, ImplItem, Item, ItemFn, ItemImpl, Lit, LitStr, Meta,
    Pat, ReturnType, Signature, Token, Type, Visibility, parse_macro_input,
};

/// Makes a tool of a function: see the crate documentation.
#[proc_macro_attribute]
pub fn tool(attr: TokenStream, item: TokenStream) -> TokenStream {
    let options = parse_macro_input!(attr as Options);
    let expanded = match parse_macro_input!(item as Item) {
        Item::Fn(function) => expand(options, function),
        Item::Impl(block) if options.is_empty() => expand_impl(block),
        Item::Impl(block) => Err(syn::Error::new(
            block.span(),
            "on an impl block, #[tool(...)] options go on each method",
        )),
        other => Err(syn::Error::new(
            other.span(),
            "#[tool] goes on a function or an impl block",
        )),
    };
    expanded
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// What `#[tool(...)]` was given.
#[derive(Default, Clone)]
struct Options {
    name: Option<LitStr>,
    params: Vec<(Ident, LitStr)>,
    sequential: bool,
    timeout_ms: Option<syn::LitInt>,
}

impl Options {
    fn is_empty(&self) -> bool {
        self.name.is_none()
            && self.params.is_empty()
            && !self.sequential
            && self.timeout_ms.is_none()
    }
}

impl Parse for Options {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut options = Options::default();
        for meta in Punctuated::<Meta, Token![,]>::parse_terminated(input)? {
            match &meta {
                Meta::Path(path) if path.is_ident("sequential") => options.sequential = true,
                Meta::NameValue(pair) if pair.path.is_ident("name") => {
                    options.name = Some(string(&pair.value)?);
                }
                Meta::NameValue(pair) if pair.path.is_ident("timeout_ms") => match &pair.value {
                    Expr::Lit(ExprLit {
                        lit: Lit::Int(millis),
                        ..
                    }) if millis.base10_parse::<u64>().is_ok_and(|ms| ms > 0) => {
                        options.timeout_ms = Some(millis.clone());
                    }
                    other => {
                        return Err(syn::Error::new(
                            other.span(),
                            "timeout_ms takes a whole number of milliseconds above 0",
                        ));
                    }
                },
                Meta::List(list) if list.path.is_ident("params") => {
                    let pairs = list.parse_args_with(
                        Punctuated::<syn::MetaNameValue, Token![,]>::parse_terminated,
                    )?;
                    for pair in pairs {
                        let ident = pair.path.require_ident()?.clone();
                        options.params.push((ident, string(&pair.value)?));
                    }
                }
                _ => {
                    return Err(syn::Error::new(
                        meta.span(),
                        "unknown #[tool] option; expected `name = \"...\"`, `params(arg = \"...\")`, `sequential` or `timeout_ms = N`",
                    ));
                }
            }
        }
        Ok(options)
    }
}

fn string(value: &Expr) -> syn::Result<LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(text),
            ..
        }) => Ok(text.clone()),
        _ => Err(syn::Error::new(value.span(), "expected a string literal")),
    }
}

/// The doc comment's lines, trimmed and joined.
fn doc_text(attrs: &[Attribute]) -> String {
    let lines: Vec<String> = attrs
        .iter()
        .filter(|attr| attr.path().is_ident("doc"))
        .filter_map(|attr| match &attr.meta {
            Meta::NameValue(pair) => string(&pair.value).ok().map(|text| text.value()),
            _ => None,
        })
        .map(|line| line.trim().to_owned())
        .collect();
    lines.join("\n").trim().to_owned()
}

/// How an argument reaches the function.
enum Argument {
    /// Decoded from the model's arguments.
    Field(Ident, Box<Type>),
    /// The call's `ToolContext`, by value or by reference.
    Context { by_ref: bool },
}

fn is_tool_context(ty: &Type) -> Option<bool> {
    let (ty, by_ref) = match ty {
        Type::Reference(reference) => (&*reference.elem, true),
        other => (other, false),
    };
    match ty {
        Type::Path(path) if path.path.segments.last()?.ident == "ToolContext" => Some(by_ref),
        _ => None,
    }
}

/// What a tool is made of: the function's signature and docs, and where it is.
struct ToolSource<'a> {
    signature: &'a Signature,
    attrs: &'a [Attribute],
    /// The struct's name and the fields it holds (none for a free function; the
    /// shared value for a method).
    struct_name: Ident,
    holder: Option<&'a Type>,
    visibility: &'a Visibility,
}

fn expand(options: Options, function: ItemFn) -> syn::Result<proc_macro2::TokenStream> {
    let struct_name = format_ident!("{}Tool", pascal_case(&function.sig.ident.to_string()));
    let tool = tool_tokens(
        options,
        ToolSource {
            signature: &function.sig,
            attrs: &function.attrs,
            struct_name,
            holder: None,
            visibility: &function.vis,
        },
    )?;
    Ok(quote! {
        #function
        #tool
    })
}

/// `#[tool]` on an impl block: each method taking `&self` becomes a tool holding
/// the value in an `Arc`, and `tools(&Arc<Self>)` gives them all. A method's own
/// `#[tool(...)]` sets its options.
fn expand_impl(mut block: ItemImpl) -> syn::Result<proc_macro2::TokenStream> {
    if !block.generics.params.is_empty() || block.trait_.is_some() {
        return Err(syn::Error::new(
            block.span(),
            "#[tool] goes on an inherent impl block without generics",
        ));
    }
    let Type::Path(self_path) = &*block.self_ty else {
        return Err(syn::Error::new(
            block.self_ty.span(),
            "#[tool] needs a named type",
        ));
    };
    let self_name = self_path
        .path
        .segments
        .last()
        .map(|segment| segment.ident.to_string())
        .unwrap_or_default();
    let mut methods = Vec::new();
    for item in &mut block.items {
        let ImplItem::Fn(method) = item else {
            continue;
        };
        if !matches!(method.sig.inputs.first(), Some(FnArg::Receiver(receiver)) if receiver.reference.is_some() && receiver.mutability.is_none())
        {
            continue;
        }
        let mut options = Options::default();
        let mut kept = Vec::new();
        for attr in method.attrs.drain(..) {
            if attr.path().is_ident("tool") {
                options = match &attr.meta {
                    Meta::Path(_) => Options::default(),
                    _ => attr.parse_args()?,
                };
            } else {
                kept.push(attr);
            }
        }
        method.attrs = kept;
        methods.push((options, method.clone()));
    }
    if methods.is_empty() {
        return Err(syn::Error::new(
            block.span(),
            "#[tool] on an impl block makes tools of its methods that take &self; it has none",
        ));
    }
    let self_ty = &*block.self_ty;
    let public: Visibility = syn::parse_quote!(pub);
    let mut tools = Vec::new();
    let mut names = Vec::new();
    for (options, method) in &methods {
        let struct_name = format_ident!(
            "{}{}Tool",
            self_name,
            pascal_case(&method.sig.ident.to_string())
        );
        names.push(struct_name.clone());
        tools.push(tool_tokens(
            options.clone(),
            ToolSource {
                signature: &method.sig,
                attrs: &method.attrs,
                struct_name,
                holder: Some(self_ty),
                visibility: &public,
            },
        )?);
    }
    Ok(quote! {
        #block
        #(#tools)*

        impl #self_ty {
            /// Every tool `#[tool]` made of this type's methods, sharing `self`.
            pub fn tools(self: &::std::sync::Arc<Self>) -> ::std::vec::Vec<::std::sync::Arc<dyn ::tiller::AgentTool>> {
                ::std::vec![#(
                    ::std::sync::Arc::new(#names(::std::sync::Arc::clone(self))) as ::std::sync::Arc<dyn ::tiller::AgentTool>
                ),*]
            }
        }
    })
}

/// The arguments of a `#[tool]` function, checked: not generic, returning a
/// `Result`, each argument a plain name or the tool context, each documented
/// parameter one of them.
fn arguments_of(options: &Options, source: &ToolSource<'_>) -> syn::Result<Vec<Argument>> {
    let signature = source.signature;
    if !signature.generics.params.is_empty() {
        return Err(syn::Error::new(
            signature.generics.span(),
            "a #[tool] function cannot be generic",
        ));
    }
    if matches!(signature.output, ReturnType::Default) {
        return Err(syn::Error::new(
            signature.span(),
            "a #[tool] function returns a Result (Ok: a String, a serde_json::Value or a ToolOutput)",
        ));
    }
    let mut arguments = Vec::new();
    for input in &signature.inputs {
        let typed = match input {
            FnArg::Typed(typed) => typed,
            FnArg::Receiver(_) if source.holder.is_some() => continue,
            FnArg::Receiver(_) => {
                return Err(syn::Error::new(
                    input.span(),
                    "#[tool] goes on a free function, or on the impl block of methods",
                ));
            }
        };
        if let Some(by_ref) = is_tool_context(&typed.ty) {
            arguments.push(Argument::Context { by_ref });
            continue;
        }
        let Pat::Ident(pattern) = &*typed.pat else {
            return Err(syn::Error::new(
                typed.pat.span(),
                "a #[tool] argument needs a plain name: it is the parameter's name",
            ));
        };
        arguments.push(Argument::Field(pattern.ident.clone(), typed.ty.clone()));
    }
    for (ident, _) in &options.params {
        let known = arguments
            .iter()
            .any(|argument| matches!(argument, Argument::Field(field, _) if field == ident));
        if !known {
            return Err(syn::Error::new(
                ident.span(),
                format!("`{ident}` is not an argument of this function"),
            ));
        }
    }
    Ok(arguments)
}

/// The tool struct, its arguments type and its `AgentTool` implementation.
fn tool_tokens(options: Options, source: ToolSource<'_>) -> syn::Result<proc_macro2::TokenStream> {
    let signature = source.signature;
    let arguments = arguments_of(&options, &source)?;
    let function_name = &signature.ident;
    let tool_name = options
        .name
        .map(|name| name.value())
        .unwrap_or_else(|| function_name.to_string());
    let description = doc_text(source.attrs);
    if description.is_empty() {
        return Err(syn::Error::new(
            function_name.span(),
            "a #[tool] function needs a doc comment: it is the description the model reads",
        ));
    }
    let struct_name = &source.struct_name;
    let fields = arguments.iter().filter_map(|argument| match argument {
        Argument::Field(ident, ty) => {
            let doc = options
                .params
                .iter()
                .find(|(name, _)| name == ident)
                .map(|(_, text)| quote!(#[doc = #text]));
            Some(quote!(#doc #ident: #ty))
        }
        Argument::Context { .. } => None,
    });
    let names: Vec<&Ident> = arguments
        .iter()
        .filter_map(|argument| match argument {
            Argument::Field(ident, _) => Some(ident),
            Argument::Context { .. } => None,
        })
        .collect();
    let call = call_tokens(&arguments, &source);
    let execution = if options.sequential {
        quote!(::tiller::run::ToolExecution::Sequential)
    } else {
        quote!(::tiller::run::ToolExecution::Parallel)
    };
    let timeout = match &options.timeout_ms {
        Some(millis) => {
            quote!(::std::option::Option::Some(::std::time::Duration::from_millis(#millis)))
        }
        None => quote!(::std::option::Option::None),
    };
    let definition = tool_struct(&source, &tool_name);
    let args_name = Ident::new("Arguments", Span::call_site());

    Ok(quote! {
        #definition

        const _: () = {
            #[derive(::tiller::__private::serde::Deserialize, ::tiller::__private::schemars::JsonSchema)]
            #[serde(crate = "::tiller::__private::serde")]
            #[schemars(crate = "::tiller::__private::schemars")]
            struct #args_name {
                #(#fields,)*
            }

            impl ::tiller::AgentTool for #struct_name {
                fn name(&self) -> &str {
                    #tool_name
                }

                fn description(&self) -> &str {
                    #description
                }

                fn parameters(&self) -> &::tiller::__private::serde_json::Value {
                    static SCHEMA: ::std::sync::OnceLock<::tiller::__private::serde_json::Value> =
                        ::std::sync::OnceLock::new();
                    SCHEMA.get_or_init(::tiller::__private::parameters_schema::<#args_name>)
                }

                fn execution(&self) -> ::tiller::run::ToolExecution {
                    #execution
                }

                fn timeout(&self) -> ::std::option::Option<::std::time::Duration> {
                    #timeout
                }

                fn execute<'a>(
                    &'a self,
                    __tiller_args: ::tiller::__private::serde_json::Value,
                    __tiller_ctx: ::tiller::ToolContext,
                ) -> ::tiller::__private::BoxFuture<'a, ::std::result::Result<::tiller::ToolOutput, ::tiller::ToolError>> {
                    ::std::boxed::Box::pin(async move {
                        let #args_name { #(#names),* } =
                            ::tiller::__private::decode_arguments(#tool_name, __tiller_args)?;
                        let _ = &__tiller_ctx;
                        ::tiller::__private::tool_result(#call)
                    })
                }
            }
        };
    })
}

/// The call of a `#[tool]` function with its decoded arguments (and the tool
/// context where it takes one), awaited when it is async.
fn call_tokens(arguments: &[Argument], source: &ToolSource<'_>) -> proc_macro2::TokenStream {
    let function_name = &source.signature.ident;
    let call_arguments = arguments.iter().map(|argument| match argument {
        Argument::Field(ident, _) => quote!(#ident),
        Argument::Context { by_ref: true } => quote!(&__tiller_ctx),
        Argument::Context { by_ref: false } => quote!(__tiller_ctx.clone()),
    });
    let callee = match source.holder {
        Some(_) => quote!(self.0.#function_name),
        None => quote!(#function_name),
    };
    if source.signature.asyncness.is_some() {
        quote!(#callee(#(#call_arguments),*).await)
    } else {
        quote!(#callee(#(#call_arguments),*))
    }
}

/// The struct a `#[tool]` function's tool is: a unit struct, or one holding
/// the methods' `Arc`'d receiver.
fn tool_struct(source: &ToolSource<'_>, tool_name: &str) -> proc_macro2::TokenStream {
    let function_name = &source.signature.ident;
    let struct_name = &source.struct_name;
    let visibility = source.visibility;
    let struct_doc = format!("The `{tool_name}` tool, made by `#[tool]` from `{function_name}`.");
    match source.holder {
        Some(holder) => quote! {
            #[doc = #struct_doc]
            #[derive(Clone)]
            #visibility struct #struct_name(#visibility ::std::sync::Arc<#holder>);
        },
        None => quote! {
            #[doc = #struct_doc]
            #[derive(Debug, Clone, Copy, Default)]
            #visibility struct #struct_name;
        },
    }
}

fn pascal_case(snake: &str) -> String {
    snake
        .split('_')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|first| first.to_uppercase().chain(chars).collect::<String>())
                .unwrap_or_default()
        })
        .collect()
}
