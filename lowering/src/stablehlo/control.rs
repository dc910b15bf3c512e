//! Control flow: the grid and `for` loops become `stablehlo.while` (an i32 counter
//! first, then the carried values and the writable arrays), `if` becomes `stablehlo.if`.

use kernel_ir::{DType, Op, OpKind};

use super::Emitter;
use crate::hlo::tensor_type as ty_of;

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
                let writable = self.writable();
                let mut init_names = vec![self.v(*lower)];
                init_names.extend(inits.iter().map(|&v| self.v(v)));
                init_names.extend(writable.iter().map(|&i| self.arrays[i].clone()));
                let mut types = vec![ty_of(DType::I32, &[])];
                types.extend(inits.iter().map(|&v| self.vt(v)));
                types.extend(self.writable_types());
                let (upper, step) = (self.v(*upper), self.v(*step));
                let carried = inits.len();
                let results = self.while_loop(&init_names, &types, &upper, |e, args| {
                    for (arg, &v) in args.iter().zip(&body.args) {
                        e.values.insert(v, arg.clone());
                    }
                    for (slot, &i) in writable.iter().enumerate() {
                        e.arrays[i] = args[1 + carried + slot].clone();
                    }
                    let yielded = e.region_ops(body);
                    let next = e.binary_raw("add", &args[0], &step, &ty_of(DType::I32, &[]));
                    let mut out = vec![next];
                    out.extend(yielded);
                    out.extend(writable.iter().map(|&i| e.arrays[i].clone()));
                    out
                });
                for (i, &r) in op.results.iter().enumerate() {
                    self.values.insert(r, results[1 + i].clone());
                }
                for (slot, &i) in writable.iter().enumerate() {
                    self.arrays[i] = results[1 + carried + slot].clone();
                }
            }
            OpKind::If {
                cond,
                then_region,
                else_region,
            } => {
                let writable = self.writable();
                let mut types: Vec<String> = op.results.iter().map(|&r| self.vt(r)).collect();
                types.extend(self.writable_types());
                let before: Vec<String> =
                    writable.iter().map(|&i| self.arrays[i].clone()).collect();
                let r = self.fresh();
                let n = types.len();
                self.line(&format!(
                    "{r}:{n} = \"stablehlo.if\"({}) ({{",
                    self.v(*cond)
                ));
                for (which, region) in [then_region, else_region].into_iter().enumerate() {
                    if which == 1 {
                        self.line("}, {");
                    }
                    self.b.w.indent += 1;
                    for (slot, &i) in writable.iter().enumerate() {
                        self.arrays[i] = before[slot].clone();
                    }
                    let mut out = self.region_ops(region);
                    out.extend(writable.iter().map(|&i| self.arrays[i].clone()));
                    self.line(&format!(
                        "\"stablehlo.return\"({}) : ({}) -> ()",
                        out.join(", "),
                        types.join(", ")
                    ));
                    self.b.w.indent -= 1;
                }
                self.line(&format!("}}) : (tensor<i1>) -> ({})", types.join(", ")));
                for (i, &res) in op.results.iter().enumerate() {
                    self.values.insert(res, format!("{r}#{i}"));
                }
                for (slot, &i) in writable.iter().enumerate() {
                    self.arrays[i] = format!("{r}#{}", op.results.len() + slot);
                }
            }
            _ => unreachable!("`yield` ends a region; other ops are not control flow"),
        }
    }

    /// Emits a block header `^bb0(%a: t, ...)` with fresh arguments of `types`.
    fn block_header(&mut self, types: &[String]) -> Vec<String> {
        let args: Vec<String> = types.iter().map(|_| self.fresh()).collect();
        let decl: Vec<String> = args
            .iter()
            .zip(types)
            .map(|(a, t)| format!("{a}: {t}"))
            .collect();
        self.line(&format!("^bb0({}):", decl.join(", ")));
        args
    }

    /// A `stablehlo.while` whose first carried value is an i32 counter running while it is
    /// below `limit`. `body` gets the region arguments and returns the next values.
    pub(super) fn while_loop(
        &mut self,
        inits: &[String],
        types: &[String],
        limit: &str,
        body: impl FnOnce(&mut Self, &[String]) -> Vec<String>,
    ) -> Vec<String> {
        let r = self.fresh();
        let n = inits.len();
        let sig = types.join(", ");
        self.line(&format!(
            "{r}:{n} = \"stablehlo.while\"({}) ({{",
            inits.join(", ")
        ));
        let cond_args = self.block_header(types);
        self.b.w.indent += 1;
        let c = self.compare("LT", &cond_args[0], limit, DType::I32, &[]);
        self.line(&format!("\"stablehlo.return\"({c}) : (tensor<i1>) -> ()"));
        self.b.w.indent -= 1;
        self.line("}, {");
        let body_args = self.block_header(types);
        self.b.w.indent += 1;
        let next = body(self, &body_args);
        self.line(&format!(
            "\"stablehlo.return\"({}) : ({sig}) -> ()",
            next.join(", ")
        ));
        self.b.w.indent -= 1;
        self.line(&format!("}}) : ({sig}) -> ({sig})"));
        (0..n).map(|i| format!("{r}#{i}")).collect()
    }
}
