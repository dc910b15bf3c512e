//! Loops over tensors 8 lanes at a time: reading values and views into registers,
//! writing buffers, materializing, and reductions.

use super::*;

impl<'k> Emitter<'k> {
    /// Computes every element of a fresh `ty`-shaped buffer with `f`.
    pub(super) fn materialize(
        &mut self,
        ty: &TensorType,
        f: &mut dyn FnMut(&mut Self, &Lane) -> String,
    ) -> Val {
        let buf = self.alloc(&ty.shape, ty.dtype);
        self.lanes(&ty.shape, &mut |e, lane| {
            let x = f(e, lane);
            e.write(&buf, ty.dtype, lane, &x);
        });
        Val::View(buf)
    }

    /// Like [`Self::materialize`], and also reduces the value along its last dim for each
    /// `(op, result)` in the same pass, binding those results.
    pub(super) fn materialize_reducing(
        &mut self,
        ty: &TensorType,
        f: &mut dyn FnMut(&mut Self, &Lane) -> String,
        reductions: &[(ReduceOp, Value)],
    ) -> Val {
        let buf = self.alloc(&ty.shape, ty.dtype);
        let (&last, outer) = ty.shape.split_last().expect("rank >= 1");
        let mut idx = Vec::new();
        for &n in outer {
            let (zero, one, hi) = (self.index(0), self.index(1), self.index(n));
            idx.push(self.open_for(&zero, &hi, &one));
        }
        let elem = reg(ty.dtype);
        let ops: Vec<_> = reductions
            .iter()
            .map(|(op, _)| reduction(*op, ty.dtype))
            .collect();
        // Per reduction: the partial result of each segment, with its width.
        let mut partial: Vec<Vec<(String, u64)>> = vec![Vec::new(); ops.len()];
        for (lo, hi, width) in segments(last) {
            let t = lanes_of(elem, width);
            let (lo, hi, step) = (self.index(lo), self.index(hi), self.index(width));
            let inits: Vec<String> = ops
                .iter()
                .map(|(identity, ..)| self.literal(ty.dtype, *identity, width))
                .collect();
            let (iv, res) = (self.w.fresh(), self.w.fresh());
            let args: Vec<String> = ops.iter().map(|_| self.w.fresh()).collect();
            let bindings = args
                .iter()
                .zip(&inits)
                .map(|(a, i)| format!("{a} = {i}"))
                .collect::<Vec<_>>()
                .join(", ");
            let types = vec![t.clone(); ops.len()].join(", ");
            self.line(&format!(
                "{res}:{} = scf.for {iv} = {lo} to {hi} step {step} iter_args({bindings}) -> ({types}) {{",
                ops.len()
            ));
            self.w.indent += 1;
            let mut lane_idx = idx.clone();
            lane_idx.push(iv);
            let lane = Lane {
                idx: lane_idx,
                width,
            };
            let x = f(self, &lane);
            self.write(&buf, ty.dtype, &lane, &x);
            let next: Vec<String> = ops
                .iter()
                .zip(&args)
                .map(|((_, combine, _), a)| self.assign(&format!("arith.{combine} {a}, {x} : {t}")))
                .collect();
            self.line(&format!("scf.yield {} : {types}", next.join(", ")));
            self.close();
            for (i, p) in partial.iter_mut().enumerate() {
                p.push((format!("{res}#{i}"), width));
            }
        }
        for (((_, combine, kind), parts), (_, result)) in ops.iter().zip(partial).zip(reductions) {
            let total = self.reduce_partials(&parts, combine, kind, elem);
            let rty = self.ty(*result).clone();
            let total = self.round(rty.dtype, &total, 1);
            if rty.is_scalar() {
                self.values.insert(*result, Val::Scalar(total));
            } else {
                let out = self.alloc(&rty.shape, rty.dtype);
                self.values.insert(*result, Val::View(out.clone()));
                let lane = Lane {
                    idx: idx.clone(),
                    width: 1,
                };
                self.write(&out, rty.dtype, &lane, &total);
            }
        }
        for _ in outer {
            self.close();
        }
        Val::View(buf)
    }

    /// Combines partial results `(value, lanes)` of one reduction into a scalar: vectors
    /// are reduced horizontally, then all are combined in order.
    fn reduce_partials(
        &mut self,
        parts: &[(String, u64)],
        combine: &str,
        kind: &str,
        elem: &str,
    ) -> String {
        let mut total: Option<String> = None;
        for (value, width) in parts {
            let x = if *width == 1 {
                value.clone()
            } else if width.is_power_of_two() {
                self.halving_reduction(value, *width, combine, elem)
            } else {
                let vt = lanes_of(elem, *width);
                self.assign(&format!(
                    "vector.reduction <{kind}>, {value} : {vt} into {elem}"
                ))
            };
            total = Some(match total {
                None => x,
                Some(t) => self.assign(&format!("arith.{combine} {t}, {x} : {elem}")),
            });
        }
        total.expect("at least one partial result")
    }

    /// Reduces a vector of `width` lanes (a power of two) by combining its halves until
    /// one lane is left: a few shuffles and vector ops, where `vector.reduction` of an
    /// ordered sum or a NaN-propagating max becomes a chain of scalar steps per lane.
    fn halving_reduction(&mut self, value: &str, width: u64, combine: &str, elem: &str) -> String {
        let mut v = value.to_string();
        let mut w = width;
        while w > 1 {
            let half = w / 2;
            let (from, to) = (
                format!("vector<{w}x{elem}>"),
                format!("vector<{half}x{elem}>"),
            );
            let part = |e: &mut Self, offset: u64| {
                e.assign(&format!(
                    "vector.extract_strided_slice {v} {{offsets = [{offset}], sizes = [{half}], \
                     strides = [1]}} : {from} to {to}"
                ))
            };
            let (lo, hi) = (part(self, 0), part(self, half));
            v = self.assign(&format!("arith.{combine} {lo}, {hi} : {to}"));
            w = half;
        }
        self.assign(&format!(
            "vector.extract {v}[0] : {elem} from vector<1x{elem}>"
        ))
    }

    /// Loops over every index of `shape`, the last dim 8 lanes at a time, then a scalar tail.
    pub(super) fn lanes(&mut self, shape: &[u64], f: &mut dyn FnMut(&mut Self, &Lane)) {
        let Some((&last, outer)) = shape.split_last() else {
            return f(
                self,
                &Lane {
                    idx: vec![],
                    width: 1,
                },
            );
        };
        let mut idx = Vec::new();
        for &n in outer {
            let (zero, one, hi) = (self.index(0), self.index(1), self.index(n));
            idx.push(self.open_for(&zero, &hi, &one));
        }
        for (lo, hi, width) in segments(last) {
            let (lo, hi, step) = (self.index(lo), self.index(hi), self.index(width));
            let j = self.open_for(&lo, &hi, &step);
            let mut lane_idx = idx.clone();
            lane_idx.push(j);
            f(
                self,
                &Lane {
                    idx: lane_idx,
                    width,
                },
            );
            self.close();
        }
        for _ in outer {
            self.close();
        }
    }

    /// The memref indices of `lane` in `view`, with the innermost value dim shifted by
    /// `shift` lanes.
    pub(super) fn view_indices(&mut self, view: &View, lane: &Lane, shift: u64) -> Vec<String> {
        let last = lane.idx.len().wrapping_sub(1);
        (0..view.dims.len())
            .map(|i| {
                let mut ix = view.dims[i].map(|d| lane.idx[d].clone());
                if shift > 0 && view.dims[i] == Some(last) {
                    let s = self.index(shift);
                    ix = Some(self.add_index(ix.as_ref().unwrap(), &s));
                }
                match (&view.offsets[i], ix) {
                    (Some(o), Some(x)) => self.add_index(o, &x),
                    (Some(o), None) => o.clone(),
                    (None, Some(x)) => x,
                    (None, None) => self.index(0),
                }
            })
            .collect()
    }

    /// `lane`'s elements of `v` as registers of `dtype` (a scalar or `vector<8x..>`).
    pub(super) fn read(&mut self, v: &Val, dtype: DType, lane: &Lane) -> String {
        let w = lane.width;
        match v {
            Val::Expr(e) => {
                let args: Vec<String> = e
                    .operands
                    .iter()
                    .map(|(v, d)| self.read(v, *d, lane))
                    .collect();
                let x = self.scalar_op(&e.kind, &args, &e.operands, e.dtype, w);
                self.round(e.dtype, &x, w)
            }
            Val::Scalar(s) | Val::Splat(s) => {
                if w == 1 {
                    s.clone()
                } else {
                    let t = lanes_of(reg(dtype), w);
                    self.assign(&format!("vector.broadcast {s} : {} to {t}", reg(dtype)))
                }
            }
            Val::Iota(d) => {
                let last = lane.idx.len() - 1;
                let i = self.i32_of(&lane.idx[*d]);
                if w == 1 {
                    return i;
                }
                let t = lanes_of("i32", w);
                let base = self.assign(&format!("vector.broadcast {i} : i32 to {t}"));
                if *d != last {
                    return base;
                }
                let steps = (0..w).map(|l| l.to_string()).collect::<Vec<_>>().join(", ");
                let step = self.constant(&format!("[{steps}]"), &t);
                self.assign(&format!("arith.addi {base}, {step} : {t}"))
            }
            Val::View(view) => {
                let elem = view.elem;
                let last = lane.idx.len().wrapping_sub(1);
                let contiguous = view.dims.last() == Some(&Some(last));
                let varies = view.dims.contains(&Some(last));
                let loaded = if w == 1 || !varies {
                    let ix = self.view_indices(view, lane, 0);
                    let s = self.assign(&format!(
                        "memref.load {}[{}] : {}",
                        view.mem,
                        ix.join(", "),
                        view.mem_type
                    ));
                    if w == 1 {
                        s
                    } else {
                        let t = lanes_of(elem, w);
                        self.assign(&format!("vector.broadcast {s} : {elem} to {t}"))
                    }
                } else if contiguous {
                    let ix = self.view_indices(view, lane, 0);
                    self.assign(&format!(
                        "vector.load {}[{}] : {}, {}",
                        view.mem,
                        ix.join(", "),
                        view.mem_type,
                        lanes_of(elem, w)
                    ))
                } else {
                    let elems: Vec<String> = (0..w)
                        .map(|l| {
                            let ix = self.view_indices(view, lane, l);
                            self.assign(&format!(
                                "memref.load {}[{}] : {}",
                                view.mem,
                                ix.join(", "),
                                view.mem_type
                            ))
                        })
                        .collect();
                    self.assign(&format!(
                        "vector.from_elements {} : {}",
                        elems.join(", "),
                        lanes_of(elem, w)
                    ))
                };
                if dtype == DType::Bool {
                    let (from, to) = (lanes_of("i8", w), lanes_of("i1", w));
                    self.assign(&format!("arith.trunci {loaded} : {from} to {to}"))
                } else if view.narrow() {
                    let (from, to) = (lanes_of(elem, w), lanes_of("f32", w));
                    self.assign(&format!("arith.extf {loaded} : {from} to {to}"))
                } else {
                    loaded
                }
            }
        }
    }

    /// Stores `x` (registers of `dtype`) at `lane` of `view` (contiguous in its last dim).
    pub(super) fn write(&mut self, view: &View, dtype: DType, lane: &Lane, x: &str) {
        let w = lane.width;
        let x = if dtype == DType::Bool {
            let (from, to) = (lanes_of("i1", w), lanes_of("i8", w));
            self.assign(&format!("arith.extui {x} : {from} to {to}"))
        } else if view.narrow() {
            // Rounds to nearest even, as the interpreter does (values computed in the
            // kernel are already rounded).
            let (from, to) = (lanes_of("f32", w), lanes_of(view.elem, w));
            self.assign(&format!("arith.truncf {x} : {from} to {to}"))
        } else {
            x.to_string()
        };
        let ix = self.view_indices(view, lane, 0);
        if w == 1 {
            self.line(&format!(
                "memref.store {x}, {}[{}] : {}",
                view.mem,
                ix.join(", "),
                view.mem_type
            ));
        } else {
            self.line(&format!(
                "vector.store {x}, {}[{}] : {}, {}",
                view.mem,
                ix.join(", "),
                view.mem_type,
                lanes_of(view.elem, w)
            ));
        }
    }

    /// Copies `v` (a `ty` tensor) into a fresh contiguous buffer.
    pub(super) fn pack(&mut self, v: &Val, ty: &TensorType) -> View {
        match self.materialize(ty, &mut |e, lane| e.read(v, ty.dtype, lane)) {
            Val::View(b) => b,
            _ => unreachable!("materialize returns a buffer"),
        }
    }

    pub(super) fn reduce(
        &mut self,
        op: ReduceOp,
        x: Value,
        axes: &[usize],
        ty: &TensorType,
    ) -> Val {
        let xt = self.ty(x).clone();
        let src = self.val(x);
        let rank = xt.rank();
        let (identity, combine, kind) = reduction(op, xt.dtype);
        let elem = reg(xt.dtype);
        if !axes.contains(&(rank - 1)) {
            // The last dim survives: accumulate rows into the result buffer.
            let out = self.alloc(&ty.shape, ty.dtype);
            let init = Val::Splat(self.literal(ty.dtype, identity, 1));
            self.lanes(&ty.shape, &mut |e, lane| {
                let x = e.read(&init, ty.dtype, lane);
                e.write(&out, ty.dtype, lane, &x);
            });
            let out_val = Val::View(out.clone());
            let kept: Vec<usize> = (0..rank).filter(|d| !axes.contains(d)).collect();
            self.lanes(&xt.shape, &mut |e, lane| {
                let v = e.read(&src, xt.dtype, lane);
                let out_lane = Lane {
                    idx: kept.iter().map(|&d| lane.idx[d].clone()).collect(),
                    width: lane.width,
                };
                let acc = e.read(&out_val, ty.dtype, &out_lane);
                let t = lanes_of(elem, lane.width);
                let r = e.assign(&format!("arith.{combine} {acc}, {v} : {t}"));
                e.write(&out, ty.dtype, &out_lane, &r);
            });
            return out_val;
        }
        // The last dim is reduced: per result element, loop over the reduced dims with a
        // vector accumulator, then reduce it horizontally.
        let kept: Vec<usize> = (0..rank).filter(|d| !axes.contains(d)).collect();
        let out = (!ty.is_scalar()).then(|| self.alloc(&ty.shape, ty.dtype));
        let mut idx = vec![String::new(); rank];
        let mut opened = 0;
        for &d in &kept {
            let (zero, one, hi) = (self.index(0), self.index(1), self.index(xt.shape[d]));
            idx[d] = self.open_for(&zero, &hi, &one);
            opened += 1;
        }
        let last = xt.shape[rank - 1];
        let main = last / WIDE * WIDE;
        let vt = lanes_of(elem, WIDE);
        let vinit = self.literal(xt.dtype, identity, WIDE);
        let sinit = self.literal(xt.dtype, identity, 1);
        let outer_reduced: Vec<usize> = axes.iter().copied().filter(|&d| d != rank - 1).collect();
        // Nested loops over the other reduced dims carry (vector acc, scalar acc).
        let mut accs = (vinit, sinit);
        let mut headers = Vec::new();
        for &d in &outer_reduced {
            let (zero, one, hi) = (self.index(0), self.index(1), self.index(xt.shape[d]));
            let iv = self.w.fresh();
            let (va, sa) = (self.w.fresh(), self.w.fresh());
            let res = self.w.fresh();
            self.line(&format!(
                "{res}:2 = scf.for {iv} = {zero} to {hi} step {one} iter_args({va} = {}, {sa} = {}) -> ({vt}, {elem}) {{",
                accs.0, accs.1
            ));
            self.w.indent += 1;
            idx[d] = iv;
            headers.push(res);
            accs = (va, sa);
        }
        let (mut vacc, mut sacc) = accs.clone();
        // Independent accumulators hide the latency of the combining op.
        let unrolled = last / (WIDE * REDUCE_ACCUMULATORS) * WIDE * REDUCE_ACCUMULATORS;
        let segments = [
            (0, unrolled, WIDE, REDUCE_ACCUMULATORS),
            (unrolled, main, WIDE, 1),
            (main, last, 1, 1),
        ];
        for (lo, hi, width, count) in segments {
            if lo == hi {
                continue;
            }
            let (lo_c, hi_c) = (self.index(lo), self.index(hi));
            let step = self.index(width * count);
            let iv = self.w.fresh();
            let res = self.w.fresh();
            let t = lanes_of(elem, width);
            let init = if width == 1 {
                sacc.clone()
            } else {
                vacc.clone()
            };
            let args: Vec<String> = (0..count).map(|_| self.w.fresh()).collect();
            // The first accumulator starts from the running value, the others from the
            // identity.
            let identity = self.literal(xt.dtype, identity, width);
            let inits = args
                .iter()
                .enumerate()
                .map(|(i, a)| format!("{a} = {}", if i == 0 { &init } else { &identity }))
                .collect::<Vec<_>>()
                .join(", ");
            let types = vec![t.clone(); count as usize].join(", ");
            self.line(&format!(
                "{res}:{count} = scf.for {iv} = {lo_c} to {hi_c} step {step} iter_args({inits}) -> ({types}) {{"
            ));
            self.w.indent += 1;
            let mut next = Vec::new();
            for (i, a) in args.iter().enumerate() {
                let off = self.index(i as u64 * width);
                idx[rank - 1] = self.add_index(&iv, &off);
                let lane = Lane {
                    idx: idx.clone(),
                    width,
                };
                let v = self.read(&src, xt.dtype, &lane);
                next.push(self.assign(&format!("arith.{combine} {a}, {v} : {t}")));
            }
            self.line(&format!("scf.yield {} : {types}", next.join(", ")));
            self.close();
            let mut acc = format!("{res}#0");
            for i in 1..count {
                acc = self.assign(&format!("arith.{combine} {acc}, {res}#{i} : {t}"));
            }
            if width == 1 {
                sacc = acc;
            } else {
                vacc = acc;
            }
        }
        for res in headers.iter().rev() {
            self.line(&format!("scf.yield {vacc}, {sacc} : {vt}, {elem}"));
            self.close();
            vacc = format!("{res}#0");
            sacc = format!("{res}#1");
        }
        let total = self.reduce_partials(&[(vacc, WIDE), (sacc, 1)], combine, kind, elem);
        let total = self.round(ty.dtype, &total, 1);
        match out {
            Some(out) => {
                let lane = Lane {
                    idx: kept.iter().map(|&d| idx[d].clone()).collect(),
                    width: 1,
                };
                self.write(&out, ty.dtype, &lane, &total);
                for _ in 0..opened {
                    self.close();
                }
                Val::View(out)
            }
            None => Val::Scalar(total),
        }
    }
}

/// How element-wise loops cover a last dim of `n`: `(start, end, lanes)` runs of
/// [`WIDE`] lanes (two AVX2 registers, one AVX-512 register), then [`LANES`], then
/// scalars; empty runs left out.
fn segments(n: u64) -> Vec<(u64, u64, u64)> {
    let wide = n / WIDE * WIDE;
    let narrow = n / LANES * LANES;
    [(0, wide, WIDE), (wide, narrow, LANES), (narrow, n, 1)]
        .into_iter()
        .filter(|(lo, hi, _)| lo < hi)
        .collect()
}

/// A reduction's identity, its combining `arith` op and its `vector.reduction` kind.
fn reduction(op: ReduceOp, dtype: DType) -> (f64, &'static str, &'static str) {
    let init = op.identity(kernel_ir::ops::accumulator_dtype(dtype));
    let (combine, kind) = match (op, dtype.is_float()) {
        (ReduceOp::Sum, true) => ("addf", "add"),
        (ReduceOp::Max, true) => ("maximumf", "maximumf"),
        (ReduceOp::Min, true) => ("minimumf", "minimumf"),
        (ReduceOp::Sum, false) => ("addi", "add"),
        (ReduceOp::Max, false) => ("maxsi", "maxsi"),
        (ReduceOp::Min, false) => ("minsi", "minsi"),
    };
    (init, combine, kind)
}
