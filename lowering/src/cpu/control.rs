//! `for` and `if`: carried tensors in buffers, scalars as `scf` results.

use super::*;

impl<'k> Emitter<'k> {
    /// Copies `v` into the buffer `dst` (a `ty` tensor).
    fn copy_into(&mut self, v: &Val, dst: &View, ty: &TensorType) {
        let v = v.clone();
        self.lanes(&ty.shape, &mut |e, lane| {
            let x = e.read(&v, ty.dtype, lane);
            e.write(dst, ty.dtype, lane, &x);
        });
    }

    /// Carried tensors live in one buffer each for the whole loop; scalars are `iter_args`.
    pub(super) fn for_op(
        &mut self,
        op: &Op,
        lower: Value,
        upper: Value,
        step: Value,
        inits: &[Value],
        body: &Region,
    ) {
        let (lo, hi, st) = (self.scalar(lower), self.scalar(upper), self.scalar(step));
        let (lo, hi, st) = (self.index_of(&lo), self.index_of(&hi), self.index_of(&st));
        let mut buffers: Vec<Option<View>> = Vec::new();
        let mut scalar_inits = Vec::new();
        for &init in inits {
            let ty = self.ty(init).clone();
            if ty.is_scalar() {
                buffers.push(None);
                scalar_inits.push((self.scalar(init), reg(ty.dtype)));
            } else {
                let b = self.alloc(&ty.shape, ty.dtype);
                let v = self.val(init);
                self.copy_into(&v, &b, &ty);
                buffers.push(Some(b));
            }
        }
        let iv = self.w.fresh();
        let res = self.w.fresh();
        let scalar_args: Vec<String> = scalar_inits.iter().map(|_| self.w.fresh()).collect();
        let types: Vec<&str> = scalar_inits.iter().map(|(_, t)| *t).collect();
        if scalar_inits.is_empty() {
            self.line(&format!("scf.for {iv} = {lo} to {hi} step {st} {{"));
        } else {
            let args = scalar_args
                .iter()
                .zip(&scalar_inits)
                .map(|(a, (i, _))| format!("{a} = {i}"))
                .collect::<Vec<_>>()
                .join(", ");
            self.line(&format!(
                "{res}:{} = scf.for {iv} = {lo} to {hi} step {st} iter_args({args}) -> ({}) {{",
                types.len(),
                types.join(", ")
            ));
        }
        self.w.indent += 1;
        let iv32 = self.i32_of(&iv);
        self.values.insert(body.args[0], Val::Scalar(iv32));
        let mut scalars = scalar_args.iter();
        for (arg, buf) in body.args[1..].iter().zip(&buffers) {
            let v = match buf {
                Some(b) => Val::View(b.clone()),
                None => Val::Scalar(scalars.next().unwrap().clone()),
            };
            self.values.insert(*arg, v);
        }
        self.region(body);
        let yielded = yield_values(body);
        let mut scalar_yields = Vec::new();
        // Stage tensors that read a carried buffer, so no copy clobbers another's source.
        let carried: Vec<String> = buffers.iter().flatten().map(|b| b.mem.clone()).collect();
        let mut sources = Vec::new();
        for (&y, buf) in yielded.iter().zip(&buffers) {
            let v = self.val(y);
            match buf {
                None => scalar_yields.push(self.scalar(y)),
                Some(b) => {
                    let ty = self.ty(y).clone();
                    let identical =
                        |w: &View| w.mem == b.mem && w.dims == b.dims && w.offsets == b.offsets;
                    if matches!(&v, Val::View(w) if identical(w)) {
                        continue;
                    }
                    // Reading its own buffer element by element is safe; anything else
                    // that reads a carried buffer is staged before the first copy.
                    let mut leaves = Vec::new();
                    v.leaves(&mut leaves);
                    let hazard = leaves
                        .iter()
                        .any(|w| carried.contains(&w.mem) && !identical(w));
                    let v = if hazard {
                        Val::View(self.pack(&v, &ty))
                    } else {
                        v
                    };
                    sources.push((v, b.clone(), ty));
                }
            }
        }
        for (v, b, ty) in sources {
            self.copy_into(&v, &b, &ty);
        }
        if !scalar_yields.is_empty() {
            self.line(&format!(
                "scf.yield {} : {}",
                scalar_yields.join(", "),
                types.join(", ")
            ));
        }
        self.close();
        self.bind_results(op, buffers, &res);
    }

    /// Binds a `for`/`if`'s results: tensors to their buffers, scalars to the
    /// successive results `res#i` of the `scf` op.
    fn bind_results(&mut self, op: &Op, buffers: Vec<Option<View>>, res: &str) {
        let mut scalars = 0;
        for (r, buf) in op.results.iter().zip(buffers) {
            let v = match buf {
                Some(b) => Val::View(b),
                None => {
                    scalars += 1;
                    Val::Scalar(format!("{res}#{}", scalars - 1))
                }
            };
            self.values.insert(*r, v);
        }
    }

    pub(super) fn if_op(
        &mut self,
        op: &Op,
        cond: Value,
        then_region: &Region,
        else_region: &Region,
    ) {
        let c = self.scalar(cond);
        let mut buffers = Vec::new();
        let mut types = Vec::new();
        for &r in &op.results {
            let ty = self.ty(r).clone();
            if ty.is_scalar() {
                buffers.push(None);
                types.push(reg(ty.dtype));
            } else {
                buffers.push(Some(self.alloc(&ty.shape, ty.dtype)));
            }
        }
        let res = self.w.fresh();
        self.line(&scf_if_header(&res, &c, &types));
        for (i, region) in [then_region, else_region].into_iter().enumerate() {
            if i == 1 {
                self.line("} else {");
            }
            self.w.indent += 1;
            self.region(region);
            let mut scalars = Vec::new();
            for (&y, buf) in yield_values(region).iter().zip(&buffers) {
                let v = self.val(y);
                match buf {
                    None => scalars.push(self.scalar(y)),
                    Some(b) => {
                        let ty = self.ty(y).clone();
                        self.copy_into(&v, b, &ty);
                    }
                }
            }
            if !types.is_empty() {
                self.line(&format!(
                    "scf.yield {} : {}",
                    scalars.join(", "),
                    types.join(", ")
                ));
            }
            self.w.indent -= 1;
        }
        self.line("}");
        self.bind_results(op, buffers, &res);
    }
}

/// The values a region's closing `yield` passes out (none when it has no yield).
fn yield_values(r: &Region) -> Vec<Value> {
    match r.ops.last().map(|op| &op.kind) {
        Some(OpKind::Yield { values }) => values.clone(),
        _ => vec![],
    }
}
