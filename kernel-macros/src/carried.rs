//! Which outer variables a loop body or branch assigns: those become the values an IR
//! `for` carries or an IR `if` yields.

use syn::visit::{self, Visit};
use syn::{BinOp, Expr, Ident, Pat};

/// Outer variables assigned inside a loop body or branch, in order of first assignment,
/// and assignments to places other than whole variables (fields, indices).
#[derive(Default)]
pub struct Assigned {
    /// Whole variables declared outside and assigned inside.
    pub vars: Vec<Ident>,
    /// `a.b = ...` or `a[i] = ...`: cannot be carried.
    pub places: Vec<Expr>,
}

struct Finder {
    scopes: Vec<Vec<Ident>>,
    found: Assigned,
}

impl Finder {
    fn declared(&self, id: &Ident) -> bool {
        self.scopes.iter().any(|s| s.contains(id))
    }

    fn declare_pat(&mut self, pat: &Pat) {
        let mut ids = Vec::new();
        collect_pat_idents(pat, &mut ids);
        self.scopes.last_mut().expect("a scope is open").extend(ids);
    }

    fn target(&mut self, lhs: &Expr) {
        match lhs {
            Expr::Path(p) if p.qself.is_none() && p.path.get_ident().is_some() => {
                let id = p.path.get_ident().expect("checked").clone();
                if !self.declared(&id) && !self.found.vars.contains(&id) {
                    self.found.vars.push(id);
                }
            }
            Expr::Tuple(t) => t.elems.iter().for_each(|e| self.target(e)),
            Expr::Paren(p) => self.target(&p.expr),
            Expr::Infer(_) => {}
            other => self.found.places.push(other.clone()),
        }
    }
}

/// All identifiers a pattern binds.
pub fn collect_pat_idents(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(p) => out.push(p.ident.clone()),
        Pat::Tuple(t) => t.elems.iter().for_each(|p| collect_pat_idents(p, out)),
        Pat::TupleStruct(t) => t.elems.iter().for_each(|p| collect_pat_idents(p, out)),
        Pat::Slice(s) => s.elems.iter().for_each(|p| collect_pat_idents(p, out)),
        Pat::Struct(s) => s
            .fields
            .iter()
            .for_each(|f| collect_pat_idents(&f.pat, out)),
        Pat::Type(t) => collect_pat_idents(&t.pat, out),
        Pat::Reference(r) => collect_pat_idents(&r.pat, out),
        Pat::Paren(p) => collect_pat_idents(&p.pat, out),
        _ => {}
    }
}

impl<'ast> Visit<'ast> for Finder {
    fn visit_block(&mut self, b: &'ast syn::Block) {
        self.scopes.push(Vec::new());
        visit::visit_block(self, b);
        self.scopes.pop();
    }

    fn visit_local(&mut self, l: &'ast syn::Local) {
        if let Some(init) = &l.init {
            self.visit_expr(&init.expr);
            if let Some((_, e)) = &init.diverge {
                self.visit_expr(e);
            }
        }
        self.declare_pat(&l.pat);
    }

    fn visit_expr_closure(&mut self, c: &'ast syn::ExprClosure) {
        self.scopes.push(Vec::new());
        for p in &c.inputs {
            self.declare_pat(p);
        }
        self.visit_expr(&c.body);
        self.scopes.pop();
    }

    fn visit_expr_for_loop(&mut self, f: &'ast syn::ExprForLoop) {
        self.visit_expr(&f.expr);
        self.scopes.push(Vec::new());
        self.declare_pat(&f.pat);
        self.visit_block(&f.body);
        self.scopes.pop();
    }

    fn visit_expr_assign(&mut self, a: &'ast syn::ExprAssign) {
        self.target(&a.left);
        self.visit_expr(&a.right);
    }

    fn visit_expr_binary(&mut self, b: &'ast syn::ExprBinary) {
        let compound = matches!(
            b.op,
            BinOp::AddAssign(_)
                | BinOp::SubAssign(_)
                | BinOp::MulAssign(_)
                | BinOp::DivAssign(_)
                | BinOp::RemAssign(_)
                | BinOp::BitAndAssign(_)
                | BinOp::BitOrAssign(_)
                | BinOp::BitXorAssign(_)
                | BinOp::ShlAssign(_)
                | BinOp::ShrAssign(_)
        );
        if compound {
            self.target(&b.left);
            self.visit_expr(&b.right);
        } else {
            visit::visit_expr_binary(self, b);
        }
    }
}

/// Outer variables that `block` assigns (see [`Assigned`]).
pub fn assigned_in_block(block: &syn::Block) -> Assigned {
    let mut f = Finder {
        scopes: vec![Vec::new()],
        found: Assigned::default(),
    };
    f.visit_block(block);
    f.found
}

/// Outer variables that `expr` assigns.
pub fn assigned_in_expr(expr: &Expr) -> Assigned {
    let mut f = Finder {
        scopes: vec![Vec::new()],
        found: Assigned::default(),
    };
    f.visit_expr(expr);
    f.found
}
