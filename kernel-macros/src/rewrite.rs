//! Rewrites a kernel body: `for` -> `for_range`, `if` -> `branch`, comparisons and
//! `&&`/`||` -> trait calls; reports constructs that cannot be traced.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{BinOp, Expr, ExprForLoop, ExprIf, Ident, Pat, RangeLimits, Stmt};

use crate::carried::{assigned_in_block, assigned_in_expr, Assigned};
use crate::checks::{error, unsupported_expr, unsupported_macro};

/// The body rewriter; collects every error instead of stopping at the first.
pub struct Rewriter {
    /// Problems found, each at the user's span.
    pub errors: Vec<syn::Error>,
    /// For each enclosing loop: true when it is traced (an IR loop).
    loops: Vec<bool>,
    /// The path of the DSL runtime from the user's crate.
    dsl: TokenStream,
}

impl Rewriter {
    /// A rewriter emitting calls into the DSL runtime at `dsl`.
    pub fn new(dsl: TokenStream) -> Self {
        Rewriter {
            errors: Vec::new(),
            loops: Vec::new(),
            dsl,
        }
    }

    /// Rewrites a function body in place.
    pub fn rewrite_body(&mut self, block: &mut syn::Block) {
        self.visit_block_mut(block);
    }

    fn check_places(&mut self, assigned: &Assigned, what: &str) {
        for place in &assigned.places {
            self.errors.push(error(
                place,
                format!(
                    "only whole variables can be assigned inside a traced {what}: assign a \
                     local `let mut` variable and use it after the {what}"
                ),
            ));
        }
    }

    fn rewrite_for(&mut self, f: &mut ExprForLoop) -> Option<Expr> {
        let unroll = f.attrs.iter().position(|a| a.path().is_ident("unroll"));
        if let Some(i) = unroll {
            f.attrs.remove(i);
            self.loops.push(false);
            visit_mut::visit_expr_for_loop_mut(self, f);
            self.loops.pop();
            return None;
        }
        if let Some(label) = &f.label {
            self.errors
                .push(error(label, "loop labels are not supported in kernels"));
        }
        let var = match &*f.pat {
            Pat::Ident(p) if p.subpat.is_none() => {
                let id = &p.ident;
                quote!(#id)
            }
            Pat::Wild(_) => quote!(_),
            other => {
                self.errors.push(error(
                    other,
                    "a kernel `for` binds one induction variable: write `for i in lo..hi`",
                ));
                return None;
            }
        };
        let (lo, hi, step) = match range_parts(&f.expr) {
            Ok(parts) => parts,
            Err(e) => {
                self.errors.push(e);
                return None;
            }
        };
        let assigned = assigned_in_block(&f.body);
        self.check_places(&assigned, "loop");
        let (mut lo, mut hi, mut step) = (lo, hi, step);
        self.visit_expr_mut(&mut lo);
        self.visit_expr_mut(&mut hi);
        self.visit_expr_mut(&mut step);
        self.loops.push(true);
        self.visit_block_mut(&mut f.body);
        self.loops.pop();
        let vars = &assigned.vars;
        let body = &f.body;
        let span = f.for_token.span;
        let assign_back = assign_back(vars);
        let dsl = crate::paths::at_span(&self.dsl, span);
        Some(syn::parse_quote_spanned! {span=> {
            #[allow(unused_mut)]
            let __tessera_carried = #dsl::for_range(
                #lo, #hi, #step, (#(#vars,)*),
                |#var, (#(mut #vars,)*)| { #body; (#(#vars,)*) },
            );
            #assign_back
        }})
    }

    fn rewrite_if(&mut self, i: &mut ExprIf) -> Expr {
        let mut assigned = assigned_in_block(&i.then_branch);
        if let Some((_, e)) = &i.else_branch {
            for v in assigned_in_expr(e).vars {
                if !assigned.vars.contains(&v) {
                    assigned.vars.push(v);
                }
            }
        }
        self.check_places(&assigned, "`if`");
        self.visit_expr_mut(&mut i.cond);
        self.visit_block_mut(&mut i.then_branch);
        if let Some((_, e)) = &mut i.else_branch {
            self.visit_expr_mut(e);
        }
        let vars = &assigned.vars;
        let cond = &i.cond;
        let then_branch = &i.then_branch;
        let else_branch: TokenStream = match &i.else_branch {
            Some((_, e)) => quote!(#e),
            None => quote!({}),
        };
        let span = i.if_token.span;
        let assign_back = assign_back(vars);
        let dsl = crate::paths::at_span(&self.dsl, span);
        syn::parse_quote_spanned! {span=> {
            #[allow(unused_mut)]
            let (__tessera_carried, __tessera_value) = #dsl::branch(
                #cond,
                (#(#vars,)*),
                |(#(mut #vars,)*)| { let __tessera_value = #then_branch; ((#(#vars,)*), __tessera_value) },
                |(#(mut #vars,)*)| { let __tessera_value = #else_branch; ((#(#vars,)*), __tessera_value) },
            );
            #assign_back
            __tessera_value
        }}
    }
}

/// Writes the carried values back to the outer variables.
fn assign_back(vars: &[Ident]) -> TokenStream {
    if vars.is_empty() {
        quote!(let () = __tessera_carried;)
    } else {
        quote!((#(#vars,)*) = __tessera_carried;)
    }
}

/// `lo..hi` or `(lo..hi).step_by(s)`.
fn range_parts(e: &Expr) -> Result<(Expr, Expr, Expr), syn::Error> {
    let unwrap_paren = |e: &Expr| match e {
        Expr::Paren(p) => (*p.expr).clone(),
        other => other.clone(),
    };
    let (range, step) = match e {
        Expr::MethodCall(m) if m.method == "step_by" && m.args.len() == 1 => {
            (unwrap_paren(&m.receiver), m.args[0].clone())
        }
        other => (unwrap_paren(other), syn::parse_quote!(1)),
    };
    match range {
        Expr::Range(r) if matches!(r.limits, RangeLimits::HalfOpen(_)) => match (r.start, r.end) {
            (Some(lo), Some(hi)) => Ok((*lo, *hi, step)),
            _ => Err(error(
                e,
                "a kernel `for` needs both bounds: write `for i in lo..hi`",
            )),
        },
        Expr::Range(_) => Err(error(
            e,
            "inclusive ranges are not supported in kernel loops: write `lo..hi + 1`",
        )),
        _ => Err(error(
            e,
            "a kernel `for` loops over a range: write `for i in lo..hi` or \
             `for i in (lo..hi).step_by(s)`, or mark a compile-time loop `#[unroll]`",
        )),
    }
}

impl VisitMut for Rewriter {
    fn visit_stmt_mut(&mut self, s: &mut Stmt) {
        match s {
            Stmt::Macro(m) => {
                if let Some(e) = unsupported_macro(&m.mac) {
                    self.errors.push(e);
                }
            }
            Stmt::Item(item) => self.errors.push(error(
                &*item,
                "items cannot be declared inside kernels: move them out of the function",
            )),
            Stmt::Local(l) if l.init.is_none() => self.errors.push(error(
                &*l,
                "a kernel `let` needs a value: write `let x = ...;` (use `let mut` to update it)",
            )),
            _ => {}
        }
        visit_mut::visit_stmt_mut(self, s);
    }

    fn visit_expr_mut(&mut self, e: &mut Expr) {
        if let Some(err) = unsupported_expr(e) {
            self.errors.push(err);
            // Keep looking inside for further problems.
            visit_mut::visit_expr_mut(self, e);
            return;
        }
        match e {
            Expr::ForLoop(f) => {
                if let Some(new) = self.rewrite_for(f) {
                    *e = new;
                }
            }
            Expr::If(i) => *e = self.rewrite_if(i),
            Expr::Break(_) | Expr::Continue(_) if self.loops.last() == Some(&true) => {
                self.errors.push(error(
                    &*e,
                    "`break` and `continue` cannot leave a traced loop: mask the remaining \
                     iterations with `if` or `select` instead",
                ));
            }
            Expr::Binary(b) => {
                visit_mut::visit_expr_binary_mut(self, b);
                let (l, r) = (&b.left, &b.right);
                let span = b.op.span();
                let dsl = crate::paths::at_span(&self.dsl, span);
                let call = |m: &str, t: &str| {
                    let method = Ident::new(m, span);
                    let tr = Ident::new(t, span);
                    quote_spanned!(span=> #dsl::#tr::#method(#l, #r))
                };
                let new: Option<TokenStream> = match b.op {
                    BinOp::Lt(_) => Some(call("k_lt", "KernelOrd")),
                    BinOp::Le(_) => Some(call("k_le", "KernelOrd")),
                    BinOp::Gt(_) => Some(call("k_gt", "KernelOrd")),
                    BinOp::Ge(_) => Some(call("k_ge", "KernelOrd")),
                    BinOp::Eq(_) => Some(call("k_eq", "KernelEq")),
                    BinOp::Ne(_) => Some(call("k_ne", "KernelEq")),
                    BinOp::And(_) => {
                        Some(quote_spanned!(span=> #dsl::KernelLogic::k_and(#l, || #r)))
                    }
                    BinOp::Or(_) => Some(quote_spanned!(span=> #dsl::KernelLogic::k_or(#l, || #r))),
                    _ => None,
                };
                if let Some(tokens) = new {
                    *e = syn::parse2(tokens).expect("generated call parses");
                }
            }
            _ => visit_mut::visit_expr_mut(self, e),
        }
    }
}
