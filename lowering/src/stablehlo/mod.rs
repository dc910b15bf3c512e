//! Kernel IR -> a StableHLO module (MLIR text, generic op form) that computes the same
//! outputs over whole arrays: the XLA fallback path.
//!
//! * Every input and output array is padded up to a whole number of blocks, so every
//!   block window is in bounds and `dynamic_slice` never clamps; outputs are sliced back
//!   at the end. Masked-off lanes read `other` (a `select` after the load) and are left
//!   untouched by stores (a read-`select`-write).
//! * The grid becomes a `stablehlo.while` over the flat program index in row-major order
//!   (a valid schedule for parallel and arbitrary axes alike); program ids are its
//!   div/mod by the grid strides.
//! * Refs are values: outputs and scratch buffers are threaded through the grid loop
//!   and through every `for` (another `while`) and `if`, and a store produces a new
//!   version of its array (`dynamic_update_slice`).
//! * bf16/f16 reductions and dots compute in f32, as the interpreter does.

mod control;
mod dot;
mod elementwise;
mod layout;
mod memory;
mod reduce;
mod source;

use std::collections::HashMap;

use crate::hlo::{i64_array, tensor as tty, tensor_type as ty_of, HloBuilder};
use kernel_ir::{DType, Kernel, Op, OpFamily, OpKind, RefKind, Region, TensorType, Value};

/// Lowers a verified kernel to a StableHLO module whose `main` takes the inputs and
/// returns the outputs.
pub fn lower(kernel: &Kernel) -> String {
    let mut e = Emitter::new(kernel);
    e.module()
}

struct Emitter<'k> {
    k: &'k Kernel,
    b: HloBuilder,
    values: HashMap<Value, String>,
    /// Current version of each ref's (padded) array, by ref index; inputs never change.
    arrays: Vec<String>,
    /// Padded shape of each ref's array.
    padded: Vec<Vec<u64>>,
    /// Program ids of the current program.
    pids: Vec<String>,
    /// Block start (element offset) per array dim of each I/O ref, in the current program.
    starts: Vec<Vec<String>>,
}

impl<'k> Emitter<'k> {
    fn new(k: &'k Kernel) -> Self {
        let padded = k.refs.iter().map(|r| r.padded_shape()).collect();
        Emitter {
            k,
            b: HloBuilder::default(),
            values: HashMap::new(),
            arrays: vec![String::new(); k.refs.len()],
            padded,
            pids: Vec::new(),
            starts: Vec::new(),
        }
    }

    fn fresh(&mut self) -> String {
        self.b.fresh()
    }

    fn line(&mut self, s: &str) {
        self.b.line(s)
    }

    fn op(&mut self, name: &str, operands: &[(&str, &str)], attrs: &str, result: &str) -> String {
        self.b.op(name, operands, attrs, result)
    }

    fn constant(&mut self, dtype: DType, shape: &[u64], value: f64) -> String {
        self.b.constant(dtype, shape, value)
    }

    fn index_const(&mut self, v: i64) -> String {
        self.constant(DType::I32, &[], v as f64)
    }

    fn binary_raw(&mut self, name: &str, a: &str, b: &str, t: &str) -> String {
        self.b.binary(name, a, b, t)
    }

    fn compare(&mut self, dir: &str, a: &str, b: &str, dtype: DType, shape: &[u64]) -> String {
        self.b.compare(dir, a, b, dtype, shape)
    }

    fn convert(&mut self, x: &str, from: &TensorType, to: DType) -> String {
        self.b.convert(x, &tty(from), &ty_of(to, &from.shape))
    }

    fn reshape(&mut self, x: &str, dtype: DType, from: &[u64], to: &[u64]) -> String {
        if from == to {
            return x.to_string();
        }
        self.op(
            "reshape",
            &[(x, &ty_of(dtype, from))],
            "",
            &ty_of(dtype, to),
        )
    }

    /// Writable refs (outputs, scratch), whose arrays are threaded through control flow.
    fn writable(&self) -> Vec<usize> {
        (0..self.k.refs.len())
            .filter(|&i| self.k.refs[i].kind != RefKind::Input)
            .collect()
    }

    fn writable_types(&self) -> Vec<String> {
        self.writable()
            .into_iter()
            .map(|i| ty_of(self.k.refs[i].ty.dtype, &self.padded[i]))
            .collect()
    }

    fn module(&mut self) -> String {
        let k = self.k;
        let mut params = Vec::new();
        for (i, r) in k.refs.iter().enumerate() {
            if r.kind == RefKind::Input {
                params.push(format!("%arg{i}: {}", tty(&r.ty)));
            }
        }
        let results: Vec<String> = k.output_types().iter().map(tty).collect();
        // Pad inputs; start outputs and scratch at zero.
        for (i, r) in k.refs.iter().enumerate() {
            let padded = self.padded[i].clone();
            self.arrays[i] = if r.kind == RefKind::Input {
                let arg = format!("%arg{i}");
                if padded == r.ty.shape {
                    arg
                } else {
                    let zero = self.constant(r.ty.dtype, &[], 0.0);
                    let high = padded.iter().zip(&r.ty.shape).map(|(p, n)| p - n);
                    let attrs = format!(
                        "edge_padding_low = {}, edge_padding_high = {}, interior_padding = {}",
                        i64_array(padded.iter().map(|_| 0)),
                        i64_array(high),
                        i64_array(padded.iter().map(|_| 0))
                    );
                    self.op(
                        "pad",
                        &[(&arg, &tty(&r.ty)), (&zero, &ty_of(r.ty.dtype, &[]))],
                        &attrs,
                        &ty_of(r.ty.dtype, &padded),
                    )
                }
            } else {
                self.constant(r.ty.dtype, &padded, 0.0)
            };
        }
        self.grid_loop();
        let mut returned = Vec::new();
        for (i, r) in k.refs.iter().enumerate() {
            if r.kind != RefKind::Output {
                continue;
            }
            let a = self.arrays[i].clone();
            let v = if self.padded[i] == r.ty.shape {
                a
            } else {
                let attrs = format!(
                    "start_indices = {}, limit_indices = {}, strides = {}",
                    i64_array(r.ty.shape.iter().map(|_| 0)),
                    i64_array(r.ty.shape.iter().copied()),
                    i64_array(r.ty.shape.iter().map(|_| 1))
                );
                self.op(
                    "slice",
                    &[(&a, &ty_of(r.ty.dtype, &self.padded[i]))],
                    &attrs,
                    &tty(&r.ty),
                )
            };
            returned.push(v);
        }
        let results: Vec<(String, String)> = returned.into_iter().zip(results).collect();
        std::mem::take(&mut self.b).module(&k.name, &params, &results)
    }

    /// Runs the body once per program: inline for a single program, else a `while` over
    /// the flat program index carrying the writable arrays.
    fn grid_loop(&mut self) {
        let total = self.k.num_programs();
        if total == 1 {
            self.pids = (0..self.k.grid.len())
                .map(|_| self.index_const(0))
                .collect();
            self.program_body();
            return;
        }
        let writable = self.writable();
        let types = self.writable_types();
        let i32t = ty_of(DType::I32, &[]);
        let zero = self.index_const(0);
        let limit = self.index_const(total as i64);
        let one = self.index_const(1);
        let mut inits = vec![zero];
        inits.extend(writable.iter().map(|&i| self.arrays[i].clone()));
        let mut all_types = vec![i32t.clone()];
        all_types.extend(types.iter().cloned());
        let results = self.while_loop(&inits, &all_types, &limit, |e, args| {
            for (slot, &i) in writable.iter().enumerate() {
                e.arrays[i] = args[slot + 1].clone();
            }
            let p = args[0].clone();
            let grid = e.k.grid.clone();
            let mut stride: u64 = grid.iter().product();
            e.pids = grid
                .iter()
                .map(|&g| {
                    stride /= g;
                    let s = e.index_const(stride as i64);
                    let q = e.binary_raw("divide", &p, &s, &i32t);
                    let gg = e.index_const(g as i64);
                    e.binary_raw("remainder", &q, &gg, &i32t)
                })
                .collect();
            e.program_body();
            let next = e.binary_raw("add", &p, &one, &i32t);
            let mut yields = vec![next];
            yields.extend(writable.iter().map(|&i| e.arrays[i].clone()));
            yields
        });
        for (slot, &i) in writable.iter().enumerate() {
            self.arrays[i] = results[slot + 1].clone();
        }
    }

    fn program_body(&mut self) {
        let k = self.k;
        self.starts = k
            .refs
            .iter()
            .map(|r| match r.block_start() {
                Some(exprs) => exprs.iter().map(|e| self.index_expr(e)).collect(),
                None => Vec::new(),
            })
            .collect();
        self.region_ops(&k.body);
    }

    fn v(&self, v: Value) -> String {
        self.values[&v].clone()
    }

    fn vt(&self, v: Value) -> String {
        tty(self.k.type_of(v))
    }

    /// Lowers a region's ops; returns the values of its `yield` (empty for the body).
    fn region_ops(&mut self, region: &Region) -> Vec<String> {
        for op in &region.ops {
            if let OpKind::Yield { values } = &op.kind {
                return values.iter().map(|&v| self.v(v)).collect();
            }
            self.lower_op(op);
        }
        Vec::new()
    }

    /// Element-wise `cond ? a : b` on values of type `t`.
    fn select(&mut self, cond: &str, a: &str, b: &str, t: &TensorType) -> String {
        let operands = [
            (cond, ty_of(DType::Bool, &t.shape)),
            (a, tty(t)),
            (b, tty(t)),
        ];
        let refs: Vec<(&str, &str)> = operands.iter().map(|(n, ty)| (*n, ty.as_str())).collect();
        self.op("select", &refs, "", &tty(t))
    }

    /// Lowers one op by its family's rule (one file per family).
    fn lower_op(&mut self, op: &Op) {
        let value = match op.kind.family() {
            OpFamily::Source => self.source(op),
            OpFamily::Elementwise => self.elementwise(op),
            OpFamily::Layout => self.layout(op),
            OpFamily::Reduce => self.reduce(op),
            OpFamily::Dot => self.dot(op),
            OpFamily::Memory => match self.memory(op) {
                Some(v) => v,
                None => return,
            },
            OpFamily::Control => return self.control(op),
            // Dropped, with a warning from `target.rs`.
            OpFamily::Debug => return,
        };
        self.values.insert(op.results[0], value);
    }
}
