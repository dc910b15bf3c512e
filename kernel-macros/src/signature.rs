//! The kernel signature: refs by value, `#[comptime]` parameters, no return value.

use syn::{FnArg, Ident, ItemFn, Pat, ReturnType, Type};

use crate::expand::Kind;

/// What the signature check found.
pub struct Signature {
    /// The ref parameters, in order (named after them in the IR).
    pub refs: Vec<Ident>,
    /// Problems, each at its span.
    pub errors: Vec<syn::Error>,
}

fn is_ref_type(ty: &Type) -> bool {
    matches!(ty, Type::Path(p) if p.qself.is_none()
        && p.path.segments.last().is_some_and(|s| s.ident == "Ref" && s.arguments.is_empty()))
}

fn is_tensor_like(ty: &Type) -> bool {
    matches!(ty, Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Ref" || s.ident == "Tensor"))
}

/// Checks the signature and strips the `#[comptime]` markers.
pub fn analyze(func: &mut ItemFn, kind: Kind) -> Signature {
    let mut refs = Vec::new();
    let mut errors = Vec::new();
    let sig = &mut func.sig;
    if let Some(a) = &sig.asyncness {
        errors.push(syn::Error::new_spanned(
            a,
            "kernels cannot be `async`: remove `async`",
        ));
    }
    if let Some(u) = &sig.unsafety {
        errors.push(syn::Error::new_spanned(
            u,
            "kernels cannot be `unsafe`: remove `unsafe`",
        ));
    }
    if kind == Kind::Kernel {
        if let ReturnType::Type(_, ty) = &sig.output {
            errors.push(syn::Error::new_spanned(
                ty,
                "a kernel returns nothing: store results into an output ref (`o.write(value)`)",
            ));
        }
    }
    for arg in sig.inputs.iter_mut() {
        let FnArg::Typed(pt) = arg else {
            errors.push(syn::Error::new_spanned(
                arg,
                "kernels cannot take `self`: write a free function",
            ));
            continue;
        };
        let before = pt.attrs.len();
        pt.attrs.retain(|a| !a.path().is_ident("comptime"));
        let comptime = pt.attrs.len() != before;
        let name = match &*pt.pat {
            Pat::Ident(id) => Some(id.ident.clone()),
            _ => None,
        };
        if let Type::Reference(r) = &*pt.ty {
            if is_tensor_like(&r.elem) {
                errors.push(syn::Error::new_spanned(
                    &pt.ty,
                    "refs and kernel values are passed by value, not borrowed: write `Ref` \
                     instead of `&Ref` (they are Copy handles)",
                ));
                continue;
            }
        }
        if comptime || kind == Kind::Helper {
            continue;
        }
        match (is_ref_type(&pt.ty), name) {
            (true, Some(name)) => refs.push(name),
            (true, None) => errors.push(syn::Error::new_spanned(
                &pt.pat,
                "a ref parameter needs a plain name (it names the ref in the IR)",
            )),
            (false, name) => {
                let ty = &pt.ty;
                let name = name.map_or("this parameter".to_string(), |n| format!("`{n}`"));
                errors.push(syn::Error::new_spanned(
                    ty,
                    format!(
                        "kernel parameter {name} has type `{}`, but kernel parameters are refs \
                         (`Ref`) or compile-time values: mark it `#[comptime]` to specialise \
                         the kernel on it",
                        quote::quote!(#ty).to_string().replace(' ', "")
                    ),
                ));
            }
        }
    }
    Signature { refs, errors }
}
