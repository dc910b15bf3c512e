//! A builder of StableHLO text in the generic op form, shared by the kernel lowering
//! (`stablehlo`) and anything else that writes StableHLO (the benches' XLA baselines).

use kernel_ir::{DType, TensorType};

use crate::text::{element_type, literal, Writer};

/// `tensor<AxBxf32>` (or `tensor<f32>` for a scalar).
pub fn tensor_type(dtype: DType, shape: &[u64]) -> String {
    let mut s = String::from("tensor<");
    for d in shape {
        s.push_str(&format!("{d}x"));
    }
    s.push_str(element_type(dtype));
    s.push('>');
    s
}

/// The type of a [`TensorType`].
pub fn tensor(t: &TensorType) -> String {
    tensor_type(t.dtype, &t.shape)
}

/// `array<i64: ...>`.
pub fn i64_array(v: impl IntoIterator<Item = u64>) -> String {
    let items: Vec<String> = v.into_iter().map(|x| x.to_string()).collect();
    if items.is_empty() {
        "array<i64>".into()
    } else {
        format!("array<i64: {}>", items.join(", "))
    }
}

/// Appends StableHLO ops, one per line, naming results `%vN`.
pub struct HloBuilder {
    pub(crate) w: Writer,
}

impl Default for HloBuilder {
    fn default() -> Self {
        HloBuilder {
            w: Writer::new("v", 2),
        }
    }
}

impl HloBuilder {
    /// A new SSA name.
    pub fn fresh(&mut self) -> String {
        self.w.fresh()
    }

    /// Appends a raw line (region headers, terminators).
    pub fn line(&mut self, s: &str) {
        self.w.line(s)
    }

    /// `%r = "stablehlo.NAME"(operands) {attrs} : (operand types) -> result`; returns `%r`.
    pub fn op(
        &mut self,
        name: &str,
        operands: &[(&str, &str)],
        attrs: &str,
        result: &str,
    ) -> String {
        let r = self.fresh();
        let names: Vec<&str> = operands.iter().map(|o| o.0).collect();
        let types: Vec<&str> = operands.iter().map(|o| o.1).collect();
        let attrs = if attrs.is_empty() {
            String::new()
        } else {
            format!(" {{{attrs}}}")
        };
        // Bare names are StableHLO ops; CHLO ops (`chlo.erf`) come qualified.
        let dialect = if name.contains('.') { "" } else { "stablehlo." };
        let text = format!(
            "{r} = \"{dialect}{name}\"({}){attrs} : ({}) -> {result}",
            names.join(", "),
            types.join(", ")
        );
        self.line(&text);
        r
    }

    /// A splat constant.
    pub fn constant(&mut self, dtype: DType, shape: &[u64], value: f64) -> String {
        let t = tensor_type(dtype, shape);
        self.op(
            "constant",
            &[],
            &format!("value = dense<{}> : {t}", literal(dtype, value)),
            &t,
        )
    }

    /// An element-wise binary op on operands of type `t`.
    pub fn binary(&mut self, name: &str, a: &str, b: &str, t: &str) -> String {
        self.op(name, &[(a, t), (b, t)], "", t)
    }

    /// An element-wise unary op on an operand of type `t`.
    pub fn unary(&mut self, name: &str, a: &str, t: &str) -> String {
        self.op(name, &[(a, t)], "", t)
    }

    /// `compare` with direction `dir` (`LT`, `EQ`, ...), typed by `dtype`.
    pub fn compare(&mut self, dir: &str, a: &str, b: &str, dtype: DType, shape: &[u64]) -> String {
        let t = tensor_type(dtype, shape);
        let kind = match dtype {
            DType::I32 => "SIGNED",
            DType::Bool => "UNSIGNED",
            _ => "FLOAT",
        };
        let attrs = format!(
            "comparison_direction = #stablehlo<comparison_direction {dir}>, \
             compare_type = #stablehlo<comparison_type {kind}>"
        );
        self.op(
            "compare",
            &[(a, &t), (b, &t)],
            &attrs,
            &tensor_type(DType::Bool, shape),
        )
    }

    /// `convert` from type `from` to `to` (nothing when they are equal).
    pub fn convert(&mut self, x: &str, from: &str, to: &str) -> String {
        if from == to {
            return x.to_string();
        }
        self.op("convert", &[(x, from)], "", to)
    }

    /// `broadcast_in_dim`: operand dim `i` goes to result dim `dims[i]`.
    pub fn broadcast(&mut self, x: &str, from: &str, dims: &[u64], to: &str) -> String {
        let attrs = format!("broadcast_dimensions = {}", i64_array(dims.iter().copied()));
        self.op("broadcast_in_dim", &[(x, from)], &attrs, to)
    }

    /// `reduce` of `x` (of type `from`) over `axes` with the element-wise op `combine`
    /// (`add`, `maximum`, `minimum`) from `init`, in `from`'s element type.
    pub fn reduce(
        &mut self,
        combine: &str,
        x: &str,
        from: &TensorType,
        init: f64,
        axes: &[u64],
    ) -> String {
        let acc = from.dtype;
        let kept: Vec<u64> = (0..from.rank())
            .filter(|d| !axes.contains(&(*d as u64)))
            .map(|d| from.shape[d])
            .collect();
        let init = self.constant(acc, &[], init);
        let st = tensor_type(acc, &[]);
        let res = self.fresh();
        self.line(&format!("{res} = \"stablehlo.reduce\"({x}, {init}) ({{"));
        let (a, b) = (self.fresh(), self.fresh());
        self.line(&format!("^bb0({a}: {st}, {b}: {st}):"));
        self.w.indent += 1;
        let c = self.binary(combine, &a, &b, &st);
        self.line(&format!("\"stablehlo.return\"({c}) : ({st}) -> ()"));
        self.w.indent -= 1;
        self.line(&format!(
            "}}) {{dimensions = {}}} : ({}, {st}) -> {}",
            i64_array(axes.iter().copied()),
            tensor(from),
            tensor_type(acc, &kept)
        ));
        res
    }

    /// The module `@name` whose public `main` takes `params` (`%argN: type`) and
    /// returns `results` (name, type), with the ops built so far as its body.
    pub fn module(mut self, name: &str, params: &[String], results: &[(String, String)]) -> String {
        let names: Vec<&str> = results.iter().map(|r| r.0.as_str()).collect();
        let types: Vec<&str> = results.iter().map(|r| r.1.as_str()).collect();
        self.line(&format!(
            "\"func.return\"({}) : ({}) -> ()",
            names.join(", "),
            types.join(", ")
        ));
        format!(
            "module @{name} {{\n  func.func public @main({}) -> ({}) {{\n{}  }}\n}}\n",
            params.join(", "),
            types.join(", "),
            self.w.take()
        )
    }
}
