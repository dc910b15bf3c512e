//! What the kernel language does not support, and what to write instead.

use kernel_ir::dsl::{REF_METHODS, TENSOR_METHODS};
use syn::{Expr, ExprCall, ExprMethodCall, Macro};

/// Methods of the Rust values used for compile-time index math.
const COMPTIME_METHODS: &[&str] = &[
    "clone",
    "len",
    "is_empty",
    "div_ceil",
    "next_multiple_of",
    "saturating_sub",
    "is_power_of_two",
    "into",
    "step_by",
    "contains",
];

/// Macros that may appear in kernels.
const MACROS: &[&str] = &[
    "s",
    "debug_print",
    "check",
    "check_index",
    "vec",
    "assert",
    "assert_eq",
    "debug_assert",
];

/// Path roots whose functions are plain Rust, not kernel code.
const FOREIGN_ROOTS: &[&str] = &[
    "std", "core", "alloc", "f32", "f64", "i32", "i64", "u32", "u64", "usize", "isize",
];

/// A compile error at `tokens` with `message`.
pub fn error(tokens: impl quote::ToTokens, message: impl std::fmt::Display) -> syn::Error {
    syn::Error::new_spanned(tokens, message)
}

/// The error for an expression the kernel language cannot trace, if any.
pub fn unsupported_expr(e: &Expr) -> Option<syn::Error> {
    let msg = match e {
        Expr::While(w) => {
            return Some(error(
                w.while_token,
                "`while` loops cannot be traced into a kernel: write `for i in lo..hi` with \
                 an explicit bound (traced or compile-time)",
            ))
        }
        Expr::Loop(l) => {
            return Some(error(
                l.loop_token,
                "`loop` cannot be traced into a kernel: write `for i in lo..hi` with an \
                 explicit bound",
            ))
        }
        Expr::Closure(_) => {
            "closures are not supported inside kernels: move the code into a `#[kernel_fn]` \
             helper function and call it"
        }
        Expr::Return(_) => {
            "`return` is not supported in kernels: let the body run to its end and guard the \
             rest with `if`"
        }
        Expr::Match(m) => {
            return Some(error(
                m.match_token,
                "`match` is not supported in kernels: use `if`/`else if` on compile-time \
                 values, or `select(cond, a, b)` on traced ones",
            ))
        }
        Expr::Reference(_) => {
            "borrows are not supported in kernels: refs and kernel values are Copy handles, \
             pass them by value (drop the `&`)"
        }
        Expr::Async(_) | Expr::Await(_) => "`async` code cannot run inside a kernel",
        Expr::Try(_) => {
            "`?` is not supported in kernels: tracing errors are reported by \
             `pallas_call(...).build()`"
        }
        Expr::Unsafe(_) => "`unsafe` blocks are not allowed in kernels",
        Expr::Let(_) => "`if let` / `while let` are not supported in kernels: use `if` on a bool",
        Expr::Macro(m) => return unsupported_macro(&m.mac),
        Expr::MethodCall(m) => return unsupported_method(m),
        Expr::Call(c) => return unsupported_call(c),
        _ => return None,
    };
    Some(error(e, msg))
}

/// The error for a macro call inside a kernel, if it is not one of [`MACROS`].
pub fn unsupported_macro(mac: &Macro) -> Option<syn::Error> {
    let name = mac
        .path
        .segments
        .last()
        .map(|s| s.ident.to_string())
        .unwrap_or_default();
    if MACROS.contains(&name.as_str()) {
        return None;
    }
    Some(error(
        &mac.path,
        format!(
            "macro `{name}!` cannot run inside a kernel: the body is traced into IR, so only \
             `s![...]` (slices), `debug_print!`, `check!`, `check_index!` and compile-time \
             `vec!`/`assert!` are supported"
        ),
    ))
}

fn unsupported_method(m: &ExprMethodCall) -> Option<syn::Error> {
    let name = m.method.to_string();
    if [TENSOR_METHODS, REF_METHODS, COMPTIME_METHODS]
        .iter()
        .any(|list| list.contains(&name.as_str()))
    {
        return None;
    }
    Some(error(
        &m.method,
        format!(
            "`.{name}()` is not a kernel operation: kernel values support {}; refs support {}; \
             do other compile-time work outside the kernel and pass it as `#[comptime]`",
            TENSOR_METHODS.join(", "),
            REF_METHODS.join(", ")
        ),
    ))
}

fn unsupported_call(c: &ExprCall) -> Option<syn::Error> {
    let Expr::Path(p) = &*c.func else {
        return Some(error(
            &c.func,
            "only named functions can be called in kernels",
        ));
    };
    let segments: Vec<String> = p
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    if segments.len() > 1 && FOREIGN_ROOTS.contains(&segments[0].as_str()) {
        let path = segments.join("::");
        return Some(error(
            &c.func,
            format!(
                "`{path}` is not a kernel function: use a kernel operation (e.g. `.maximum()`, \
                 `.exp()`) or call a helper marked `#[kernel_fn]`"
            ),
        ));
    }
    None
}
