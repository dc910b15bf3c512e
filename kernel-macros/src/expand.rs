//! Puts the pieces together: signature checks, body rewrite, prologue, errors.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{parse2, ItemFn};

use crate::rewrite::Rewriter;
use crate::signature::{analyze, Signature};

/// Which attribute is being expanded.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `#[kernel]`: a body launched by `pallas_call`.
    Kernel,
    /// `#[kernel_fn]`: a helper called from kernels.
    Helper,
}

pub fn expand(attr: TokenStream, item: TokenStream, kind: Kind) -> TokenStream {
    let mut errors: Vec<syn::Error> = Vec::new();
    if !attr.is_empty() {
        errors.push(syn::Error::new_spanned(
            &attr,
            "`#[kernel]` takes no arguments: set the grid and BlockSpecs with `pallas_call`",
        ));
    }
    let mut func: ItemFn = match parse2(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error(),
    };
    let Signature {
        refs,
        errors: sig_errors,
    } = analyze(&mut func, kind);
    errors.extend(sig_errors);
    let dsl = crate::paths::dsl_path();
    let mut rewriter = Rewriter::new(dsl.clone());
    rewriter.rewrite_body(&mut func.block);
    errors.extend(rewriter.errors);
    if let Some(first) = errors.into_iter().reduce(|mut a, b| {
        a.combine(b);
        a
    }) {
        return first.to_compile_error();
    }
    if kind == Kind::Kernel {
        let name = func.sig.ident.to_string();
        let names: Vec<String> = refs.iter().map(|r| r.to_string()).collect();
        let stmts = std::mem::take(&mut func.block.stmts);
        func.block = syn::parse_quote!({
            #dsl::kernel_prologue(#name, &[#((#refs, #names)),*]);
            #(#stmts)*
        });
    }
    // Kernels take a ref per operand, and the rewritten control flow binds unit values.
    func.attrs
        .push(syn::parse_quote!(#[allow(clippy::too_many_arguments, clippy::let_unit_value)]));
    let out = quote!(#func);
    if std::env::var_os("TESSERA_EXPAND").is_some() {
        eprintln!(
            "// #[{}] {} expands to:\n{out}\n",
            if kind == Kind::Kernel {
                "kernel"
            } else {
                "kernel_fn"
            },
            func.sig.ident
        );
    }
    out
}
