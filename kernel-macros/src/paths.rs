//! Where the generated code finds the DSL runtime, seen from the crate being compiled.

use proc_macro2::{Ident, Span, TokenStream};
use proc_macro_crate::{crate_name, FoundCrate};
use quote::quote;

/// `::kernel_ir::dsl` when the crate depends on kernel-ir (under whatever name), else
/// `::<facade>::dsl` when it reaches the DSL through the `tessera` facade only.
pub fn dsl_path() -> TokenStream {
    let root = |name: &str| {
        let id = Ident::new(name, Span::call_site());
        quote!(::#id::dsl)
    };
    match crate_name("kernel-ir") {
        Ok(FoundCrate::Name(name)) => root(&name),
        // kernel-ir's own tests and examples name it as an external crate.
        Ok(FoundCrate::Itself) => root("kernel_ir"),
        Err(_) => match crate_name("tessera") {
            Ok(FoundCrate::Name(name)) => root(&name),
            Ok(FoundCrate::Itself) => quote!(crate::dsl),
            Err(_) => root("kernel_ir"),
        },
    }
}

/// `path` with every token at `span`, so errors in generated calls point at the user's
/// code (the `for`, the `if`, the operator) rather than at the attribute.
pub fn at_span(path: &TokenStream, span: Span) -> TokenStream {
    path.clone()
        .into_iter()
        .map(|mut t| {
            t.set_span(span);
            t
        })
        .collect()
}
