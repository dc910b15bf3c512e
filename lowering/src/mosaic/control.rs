//! Control flow: `scf.for` with i32 bounds and `iter_args`, `scf.if` with results.

use kernel_ir::{Op, OpKind, Region};

use super::{tty, Emitter};
use crate::text::scf_if_header;

impl Emitter<'_> {
    pub(super) fn control(&mut self, op: &Op) {
        match &op.kind {
            OpKind::For {
                lower,
                upper,
                step,
                inits,
                body,
            } => {
                let (lo, hi, st) = (self.v(*lower), self.v(*upper), self.v(*step));
                let iv = self.fresh();
                let args: Vec<String> = body.args[1..].iter().map(|_| self.fresh()).collect();
                self.values.insert(body.args[0], iv.clone());
                for (a, &v) in args.iter().zip(&body.args[1..]) {
                    self.values.insert(v, a.clone());
                }
                let types: Vec<String> = inits.iter().map(|&v| tty(&self.ty(v))).collect();
                let r = self.fresh();
                let head = if inits.is_empty() {
                    format!("scf.for {iv} = {lo} to {hi} step {st} : i32 {{")
                } else {
                    let pairs: Vec<String> = args
                        .iter()
                        .zip(inits)
                        .map(|(a, &i)| format!("{a} = {}", self.v(i)))
                        .collect();
                    format!(
                        "{r}:{} = scf.for {iv} = {lo} to {hi} step {st} iter_args({}) -> ({}) : i32 {{",
                        inits.len(),
                        pairs.join(", "),
                        types.join(", ")
                    )
                };
                self.line(&head);
                self.nested_region(body, &types);
                self.line("}");
                self.bind_results(op, &r);
            }
            OpKind::If {
                cond,
                then_region,
                else_region,
            } => {
                let c = self.v(*cond);
                let types: Vec<String> = op.results.iter().map(|&v| tty(&self.ty(v))).collect();
                let r = self.fresh();
                self.line(&scf_if_header(&r, &c, &types));
                for (which, region) in [then_region, else_region].into_iter().enumerate() {
                    if which == 1 {
                        self.line("} else {");
                    }
                    self.nested_region(region, &types);
                }
                self.line("}");
                self.bind_results(op, &r);
            }
            _ => unreachable!("`yield` ends a region; other ops are not control flow"),
        }
    }

    /// Emits a region's ops one level deeper, ending with `scf.yield` of its values
    /// (of `types`) when it yields any.
    fn nested_region(&mut self, region: &Region, types: &[String]) {
        self.w.indent += 1;
        let yielded = self.region_ops(region);
        if !yielded.is_empty() {
            self.line(&format!(
                "scf.yield {} : {}",
                yielded.join(", "),
                types.join(", ")
            ));
        }
        self.w.indent -= 1;
    }

    /// Names `op`'s results `{r}#i`.
    fn bind_results(&mut self, op: &Op, r: &str) {
        for (i, &res) in op.results.iter().enumerate() {
            self.values.insert(res, format!("{r}#{i}"));
        }
    }
}
