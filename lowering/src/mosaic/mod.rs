//! Kernel IR -> a Mosaic TPU module in the form JAX Pallas emits, and the StableHLO
//! module that calls it through `stablehlo.custom_call @tpu_custom_call`.
//!
//! The kernel function takes the grid indices (i32), then one memref per input, output
//! and scratch buffer (`#tpu.memory_space<vmem>`; squeezed block dims stay as size-1
//! dims, as in Pallas), and carries `dimension_semantics`, `iteration_bounds`,
//! `scalar_prefetch`, `scratch_operands` and `window_params` whose `transform_indices`
//! name one `@transform_i` function per input/output (the index map). The body uses
//! `vector.load`/`tpu.vector_store`, `arith`/`math` element-wise ops, `tpu.matmul`,
//! `vector.multi_reduction`, `tpu.iota` and `scf.for`/`scf.if` with i32 loop bounds.
//! Masked loads and stores are a `select` against the block's contents (blocks are whole
//! in VMEM, so reading the masked-off lanes is safe).
//!
//! The body goes into the custom call as base64 MLIR text without `serialization_format`
//! (which the Mosaic compiler accepts); JAX itself stores versioned bytecode
//! (`mosaic-serde`), which needs the `tpu` dialect that only jaxlib/libtpu link.

mod control;
mod dot;
mod elementwise;
mod layout;
mod memory;
mod reduce;
mod source;

use std::collections::HashMap;
use std::fmt::Write;

use kernel_ir::{
    DType, DimSemantics, Kernel, MemorySpace, Op, OpFamily, OpKind, RefKind, Region, TensorType,
    Value,
};

use crate::text::{element_type as elem, literal, Emit, Writer};
use crate::tpu_rules::{self, TpuLimits, TpuRuleError};

/// The MLIR type of a value: a scalar for rank 0, else a vector.
fn vty(dtype: DType, shape: &[u64]) -> String {
    if shape.is_empty() {
        return elem(dtype).into();
    }
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("vector<{}x{}>", dims.join("x"), elem(dtype))
}

fn tty(t: &TensorType) -> String {
    vty(t.dtype, &t.shape)
}

fn memory_space(space: MemorySpace) -> &'static str {
    match space {
        MemorySpace::Vmem => "#tpu.memory_space<vmem>",
        MemorySpace::Smem => "#tpu.memory_space<smem>",
        MemorySpace::Any => "#tpu.memory_space<any>",
    }
}

/// The memref shape of each ref: the block shape with squeezed dims as 1 (I/O), or
/// the buffer shape (scratch).
fn memref_shape(k: &Kernel, r: usize) -> Vec<u64> {
    k.refs[r].block_dims().iter().map(|d| d.extent()).collect()
}

fn memref_type(k: &Kernel, r: usize) -> String {
    let decl = &k.refs[r];
    let space = decl.space();
    let dims: Vec<String> = memref_shape(k, r).iter().map(|d| d.to_string()).collect();
    format!(
        "memref<{}x{}, {}>",
        dims.join("x"),
        elem(decl.ty.dtype),
        memory_space(space)
    )
}

/// Checks the TPU rules, then emits the Mosaic module text.
pub fn lower_body(kernel: &Kernel, limits: &TpuLimits) -> Result<String, TpuRuleError> {
    tpu_rules::check(kernel, limits)?;
    Ok(Emitter::new(kernel).module())
}

/// Checks the TPU rules, then returns the `backend_config` JSON of the
/// `tpu_custom_call` that runs the kernel: its Mosaic body, base64-encoded as text.
pub fn custom_call_config(kernel: &Kernel, limits: &TpuLimits) -> Result<String, TpuRuleError> {
    let body = lower_body(kernel, limits)?;
    Ok(format!(
        r#"{{"custom_call_config": {{"body": "{}", "needs_layout_passes": true}}}}"#,
        base64(body.as_bytes())
    ))
}

/// Checks the TPU rules, then emits the StableHLO module whose `main` calls the kernel
/// through `stablehlo.custom_call @tpu_custom_call`, as JAX does.
pub fn lower(kernel: &Kernel, limits: &TpuLimits) -> Result<String, TpuRuleError> {
    let config = custom_call_config(kernel, limits)?.replace('"', "\\22");
    let tensor = |t: &TensorType| {
        let mut s = String::from("tensor<");
        for d in &t.shape {
            let _ = write!(s, "{d}x");
        }
        s.push_str(elem(t.dtype));
        s.push('>');
        s
    };
    let layout = |t: &TensorType| {
        let dims: Vec<String> = (0..t.rank()).rev().map(|d| d.to_string()).collect();
        format!("dense<[{}]> : tensor<{}xindex>", dims.join(", "), t.rank())
    };
    let inputs = kernel.input_types();
    let outputs = kernel.output_types();
    let params: Vec<String> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| format!("%arg{i}: {}", tensor(t)))
        .collect();
    let args: Vec<String> = (0..inputs.len()).map(|i| format!("%arg{i}")).collect();
    let in_types: Vec<String> = inputs.iter().map(tensor).collect();
    let out_types: Vec<String> = outputs.iter().map(tensor).collect();
    let results = if outputs.len() == 1 {
        "%0".to_string()
    } else {
        format!("%0:{}", outputs.len())
    };
    let returned: Vec<String> = if outputs.len() == 1 {
        vec!["%0".into()]
    } else {
        (0..outputs.len()).map(|i| format!("%0#{i}")).collect()
    };
    let out_sig = if outputs.len() == 1 {
        out_types[0].clone()
    } else {
        format!("({})", out_types.join(", "))
    };
    Ok(format!(
        "module @{name} attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{\n  \
         func.func public @main({params}) -> ({outs}) {{\n    \
         {results} = stablehlo.custom_call @tpu_custom_call({args}) {{backend_config = \"{config}\", \
         kernel_name = \"{name}\", operand_layouts = [{in_layouts}], result_layouts = [{out_layouts}]}} : \
         ({in_types}) -> {out_sig}\n    \
         return {returned} : {outs}\n  }}\n}}\n",
        name = kernel.name,
        params = params.join(", "),
        outs = out_types.join(", "),
        args = args.join(", "),
        in_layouts = inputs.iter().map(layout).collect::<Vec<_>>().join(", "),
        out_layouts = outputs.iter().map(layout).collect::<Vec<_>>().join(", "),
        in_types = in_types.join(", "),
        returned = returned.join(", "),
    ))
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(TABLE[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

struct Emitter<'k> {
    k: &'k Kernel,
    w: Writer,
    values: HashMap<Value, String>,
}

impl<'k> Emitter<'k> {
    fn new(k: &'k Kernel) -> Self {
        Emitter {
            k,
            w: Writer::new("", 2),
            values: HashMap::new(),
        }
    }

    fn fresh(&mut self) -> String {
        self.w.fresh()
    }

    fn line(&mut self, s: &str) {
        self.w.line(s)
    }

    /// Emits `%r = <text>` and returns `%r`.
    fn def(&mut self, text: &str) -> String {
        let r = self.fresh();
        self.line(&format!("{r} = {text}"));
        r
    }
}

impl Emit for Emitter<'_> {
    fn emit(&mut self, rhs: &str) -> String {
        self.def(rhs)
    }
}

impl Emitter<'_> {
    fn constant(&mut self, dtype: DType, shape: &[u64], v: f64) -> String {
        let t = vty(dtype, shape);
        if shape.is_empty() {
            self.def(&format!("arith.constant {} : {t}", literal(dtype, v)))
        } else {
            self.def(&format!(
                "arith.constant dense<{}> : {t}",
                literal(dtype, v)
            ))
        }
    }

    fn i32_const(&mut self, v: i64) -> String {
        self.def(&format!("arith.constant {v} : i32"))
    }

    fn index(&mut self, v: &str) -> String {
        self.def(&format!("arith.index_cast {v} : i32 to index"))
    }

    fn shape_cast(&mut self, x: &str, dtype: DType, from: &[u64], to: &[u64]) -> String {
        if from == to {
            return x.to_string();
        }
        if to.is_empty() {
            let zeros: Vec<&str> = from.iter().map(|_| "0").collect();
            return self.def(&format!(
                "vector.extract {x}[{}] : {} from {}",
                zeros.join(", "),
                elem(dtype),
                vty(dtype, from)
            ));
        }
        if from.is_empty() {
            return self.def(&format!(
                "vector.broadcast {x} : {} to {}",
                elem(dtype),
                vty(dtype, to)
            ));
        }
        self.def(&format!(
            "vector.shape_cast {x} : {} to {}",
            vty(dtype, from),
            vty(dtype, to)
        ))
    }

    fn module(&mut self) -> String {
        let k = self.k;
        let grid_args: Vec<String> = (0..k.grid.len()).map(|i| format!("%arg{i}: i32")).collect();
        let ref_args: Vec<String> = (0..k.refs.len())
            .map(|r| format!("%arg{}: {}", k.grid.len() + r, memref_type(k, r)))
            .collect();
        let semantics: Vec<String> = k
            .dimension_semantics
            .iter()
            .map(|s| {
                let n = match s {
                    DimSemantics::Parallel => "parallel",
                    DimSemantics::Arbitrary => "arbitrary",
                };
                format!("#tpu.dimension_semantics<{n}>")
            })
            .collect();
        // Scalar-prefetch operands are not windowed (Pallas gives them no window_params
        // entry and no transform): they are whole in SMEM.
        let prefetch = k.scalar_prefetch();
        let io: Vec<usize> = (prefetch..k.refs.len())
            .filter(|&r| k.refs[r].block.is_some())
            .collect();
        let windows: Vec<String> = io
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                let bounds: Vec<String> =
                    memref_shape(k, r).iter().map(|d| d.to_string()).collect();
                format!(
                    "{{transform_indices = @transform_{i}, window_bounds = array<i64: {}>}}",
                    bounds.join(", ")
                )
            })
            .collect();
        let scratch = k.refs.iter().filter(|r| r.kind == RefKind::Scratch).count();
        let bounds: Vec<String> = k.grid.iter().map(|g| g.to_string()).collect();
        self.region_ops(&k.body);
        let body = self.w.take();
        let mut text = format!(
            "module attributes {{stable_mosaic.version = 11 : i64}} {{\n  func.func @{name}({args}) attributes \
             {{dimension_semantics = [{semantics}], iteration_bounds = array<i64: {bounds}>, \
             scalar_prefetch = {prefetch} : i64, scratch_operands = {scratch} : i64, tpu.core_type = #tpu.core_type<tc>, \
             window_params = [{windows}]}} {{\n{body}    return\n  }}\n",
            name = k.name,
            args = grid_args.iter().chain(&ref_args).cloned().collect::<Vec<_>>().join(", "),
            semantics = semantics.join(", "),
            bounds = bounds.join(", "),
            windows = windows.join(", "),
        );
        for (i, &r) in io.iter().enumerate() {
            text.push_str(&self.transform(i, r));
        }
        text.push_str("}\n");
        text
    }

    /// `@transform_i`: the index map of ref `r` as a function of the grid indices and the
    /// scalar-prefetch operands.
    fn transform(&mut self, i: usize, r: usize) -> String {
        let k = self.k;
        let spec = k.refs[r].block.as_ref().expect("I/O refs have block specs");
        self.w.indent = 2;
        let results: Vec<String> = spec
            .index_map
            .exprs
            .iter()
            .map(|e| self.index_expr(e))
            .collect();
        let body = self.w.take();
        let mut args: Vec<String> = (0..k.grid.len()).map(|a| format!("%arg{a}: i32")).collect();
        args.extend(
            (0..k.scalar_prefetch())
                .map(|p| format!("%arg{}: {}", k.grid.len() + p, memref_type(k, p))),
        );
        let types: Vec<&str> = results.iter().map(|_| "i32").collect();
        format!(
            "  func.func @transform_{i}({}) -> ({}) {{\n{body}    return {} : {}\n  }}\n",
            args.join(", "),
            types.join(", "),
            results.join(", "),
            types.join(", ")
        )
    }

    fn v(&self, v: Value) -> String {
        self.values[&v].clone()
    }

    fn ty(&self, v: Value) -> TensorType {
        self.k.type_of(v).clone()
    }

    fn region_ops(&mut self, region: &Region) -> Vec<String> {
        for op in &region.ops {
            if let OpKind::Yield { values } = &op.kind {
                return values.iter().map(|&v| self.v(v)).collect();
            }
            self.lower_op(op);
        }
        Vec::new()
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

    fn select(&mut self, c: &str, a: &str, b: &str, t: &TensorType) -> String {
        if t.is_scalar() {
            self.def(&format!("arith.select {c}, {a}, {b} : {}", tty(t)))
        } else {
            self.def(&format!(
                "arith.select {c}, {a}, {b} : {}, {}",
                vty(DType::Bool, &t.shape),
                tty(t)
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        assert_eq!(super::base64(b""), "");
        assert_eq!(super::base64(b"f"), "Zg==");
        assert_eq!(super::base64(b"fo"), "Zm8=");
        assert_eq!(super::base64(b"foo"), "Zm9v");
        assert_eq!(super::base64(b"foobar"), "Zm9vYmFy");
    }
}
