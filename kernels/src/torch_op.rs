//! The library's PyTorch ops, each declared once ([`OpSpec`]): its schema and doc, its
//! result types, and its plan — the argument checks (one wording everywhere), the
//! library kernel it launches, that kernel's parameters, and the shapes the kernel sees.
//!
//! The checks read only shapes and dtypes ([`Value`]), so every caller runs the same
//! ones: the eager CPU kernels (Python extension), the fake kernels and graph mode's
//! lowering (through the extension's `op_plan`), and `aten-bindings`. Each op's spec
//! lives beside its kernel; [`crate::torch_ops`] lists them.

use kernel_ir::DType;

use crate::ParamValue;

/// One of PyTorch's dtypes as Tessera sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TorchDType {
    /// PyTorch's name (`torch.float32`).
    pub torch: &'static str,
    /// The dtype Tessera's kernels take it as, if they do.
    pub kernel: Option<DType>,
    /// The runtime's element name for it (what XLA buffers and graph mode's runner
    /// carry: `runtime::pjrt::Element`).
    pub element: &'static str,
}

const fn row(torch: &'static str, kernel: Option<DType>, element: &'static str) -> TorchDType {
    TorchDType {
        torch,
        kernel,
        element,
    }
}

/// PyTorch's dtypes Tessera takes: the one table of them (the extension, the fake
/// kernels, user op libraries and graph mode read it; `torch.int64` index tensors are
/// taken by kernels as int32, range-checked, where an op says so).
pub const DTYPES: &[TorchDType] = &[
    row("torch.float32", Some(DType::F32), "f32"),
    row("torch.bfloat16", Some(DType::BF16), "bf16"),
    row("torch.float16", Some(DType::F16), "f16"),
    row("torch.int32", Some(DType::I32), "i32"),
    row("torch.bool", Some(DType::Bool), "bool"),
    row("torch.int64", None, "i64"),
    row("torch.float64", None, "f64"),
    row("torch.int16", None, "i16"),
    row("torch.int8", None, "i8"),
    row("torch.uint8", None, "u8"),
];

/// The Tessera dtype of PyTorch's dtype `name` (`torch.float32` -> f32), if it has one.
pub fn tessera_dtype(name: &str) -> Option<DType> {
    DTYPES
        .iter()
        .find(|d| d.torch == name)
        .and_then(|d| d.kernel)
}

/// A tensor argument as the checks see it.
#[derive(Clone, Debug, PartialEq)]
pub struct Meta {
    /// Its shape.
    pub shape: Vec<u64>,
    /// PyTorch's name of its dtype (`torch.float32`).
    pub dtype: String,
    /// Its device (`cpu`, `meta`): a call's tensors share one.
    pub device: String,
}

/// One argument of a call, in schema order (defaults filled in).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A tensor.
    Tensor(Meta),
    /// A float.
    Float(f64),
    /// An integer.
    Int(i64),
    /// A bool.
    Bool(bool),
    /// `None` (an optional argument left out).
    None,
}

/// One dimension of a result: dimension `.1` of argument `.0`, or 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dim {
    /// `args[arg].shape[dim]`.
    Of(usize, usize),
    /// A dimension of size 1.
    One,
}

/// A result's shape, from the arguments' shapes (so fake kernels can evaluate it on
/// symbolic sizes too).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Shape {
    /// The shape of argument `.0`.
    Like(usize),
    /// These dimensions.
    Dims(&'static [Dim]),
}

/// A result's dtype.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ResultDtype {
    /// The dtype of argument `.0`.
    Of(usize),
    /// float32 (log-sum-exps).
    F32,
}

/// One result of the op's kernel, in the op's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Out {
    /// Its shape.
    pub shape: Shape,
    /// Its dtype.
    pub dtype: ResultDtype,
    /// Its value when there is nothing to compute (no queries or no keys): 0, or -inf
    /// for a log-sum-exp.
    pub empty: f32,
}

impl Out {
    /// A result shaped like argument `arg`, of its dtype.
    pub const fn like(arg: usize) -> Out {
        Out {
            shape: Shape::Like(arg),
            dtype: ResultDtype::Of(arg),
            empty: 0.0,
        }
    }

    /// A float32 log-sum-exp of these dims (-inf when there is nothing to compute).
    pub const fn lse(dims: &'static [Dim]) -> Out {
        Out {
            shape: Shape::Dims(dims),
            dtype: ResultDtype::F32,
            empty: f32::NEG_INFINITY,
        }
    }

    /// The result's shape and dtype for these (checked) arguments.
    pub fn eval(&self, args: &[Value]) -> Meta {
        let meta = |i: usize| match args.get(i) {
            Some(Value::Tensor(m)) => m.clone(),
            _ => Meta {
                shape: vec![],
                dtype: "torch.float32".into(),
                device: "cpu".into(),
            },
        };
        let shape = match self.shape {
            Shape::Like(i) => meta(i).shape,
            Shape::Dims(dims) => dims
                .iter()
                .map(|d| match *d {
                    Dim::Of(i, d) => meta(i).shape.get(d).copied().unwrap_or(1),
                    Dim::One => 1,
                })
                .collect(),
        };
        let first = meta(0);
        let dtype = match self.dtype {
            ResultDtype::Of(i) => meta(i).dtype,
            ResultDtype::F32 => "torch.float32".into(),
        };
        Meta {
            shape,
            dtype,
            device: first.device,
        }
    }
}

/// Which dim of an argument a [`Split`] shards.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Axis {
    /// This dim (negative: from the end).
    Dim(i8),
    /// Any dim but the last (one way to split per dim; a kernel that sees the argument as
    /// `[rows, cols]` splits its rows).
    Leading,
    /// Any dim (one way to split per dim, the same for every argument split with it).
    Any,
    /// The batch dim of a score mask: dim 0 of a 4-D mask that has one entry per batch
    /// entry; a broadcast mask is whole on every device.
    MaskBatch,
}

/// Where a [`Split`] leaves an output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Placement {
    /// Split on this dim.
    Dim(i8),
    /// Split on the dim the arguments are split on ([`Axis::Leading`], [`Axis::Any`]).
    Same,
    /// A partial sum on every device (a split contraction).
    Partial,
}

/// One way to run the op on shards (tensor parallelism): the arguments split together,
/// the other tensors whole on every device, and where the outputs land. DTensor's
/// sharding rules and graph mode's sharded export are both made from these.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Split {
    /// What it splits (`heads`, `rows`, ...).
    pub name: &'static str,
    /// The arguments split, by schema name, and on which dim (a name the op does not
    /// have, or an argument left out, is skipped).
    pub args: &'static [(&'static str, Axis)],
    /// Each output's placement, in order.
    pub outputs: &'static [Placement],
    /// Kernel parameters counting the split dim: the local kernel takes each divided by
    /// the device count, which must divide it. Graph mode's export splits by the first
    /// split that names some.
    pub divides: &'static [&'static str],
    /// Whether the split dims must divide evenly (attention heads: every device keeps
    /// whole GQA groups).
    pub even: bool,
}

/// The row-wise ops' split: rows (any leading dim of `x`; the vectors whole).
pub const ROWS: &[Split] = &[Split {
    name: "rows",
    args: &[("x", Axis::Leading)],
    outputs: &[Placement::Same],
    divides: &["rows"],
    even: false,
}];

/// The tensors of an attention op split together on `axis`: the query, keys and
/// values, and a backward's gradient and saved forward (names an op lacks are skipped).
pub const fn attention_tensors(axis: Axis) -> [(&'static str, Axis); 6] {
    [
        ("q", axis),
        ("k", axis),
        ("v", axis),
        ("grad_out", axis),
        ("out", axis),
        ("lse", axis),
    ]
}

/// A library op as a PyTorch op, declared once.
pub struct OpSpec {
    /// Its schema: `name(args) -> results`.
    pub schema: &'static str,
    /// What it computes, its arguments and its errors (the torch op's docstring).
    pub doc: &'static str,
    /// Every output of its kernel, in the op's shapes; the op returns the first
    /// [`OpSpec::returns`].
    pub outputs: &'static [Out],
    /// How many of the outputs the op returns.
    pub returns: usize,
    /// The ways it runs on shards (besides every tensor whole on every device).
    pub splits: &'static [Split],
    /// Checks a call's arguments and plans its launch.
    pub plan: fn(&[Value]) -> Result<Plan, String>,
}

impl OpSpec {
    /// The same op under another schema and doc, returning the first `returns` of its
    /// outputs (an autograd forward that also returns the log-sum-exp).
    pub const fn variant(self, schema: &'static str, doc: &'static str, returns: usize) -> OpSpec {
        OpSpec {
            schema,
            doc,
            returns,
            ..self
        }
    }

    /// The op's name: the schema up to `(`.
    pub fn name(&self) -> &'static str {
        &self.schema[..self.schema.find('(').unwrap_or(0)]
    }

    /// Its arguments as the schema declares them, in order: `(type, name)`, such as
    /// `("float?", "scale")`.
    pub fn args(&self) -> Vec<(&'static str, &'static str)> {
        let schema = self.schema;
        let start = schema.find('(').map_or(0, |i| i + 1);
        let end = schema.find(')').unwrap_or(start);
        schema[start..end]
            .split(',')
            .filter_map(|a| {
                let mut words = a.split_whitespace();
                let ty = words.next()?;
                let name = words.next().unwrap_or("");
                Some((ty, name.split('=').next().unwrap_or(name)))
            })
            .collect()
    }
}

/// How an operand reaches the kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Form {
    /// The argument's data seen with the operand's shape (converted to its dtype when
    /// the argument's differs: int64 indices checked into int32, gradients).
    Data,
    /// A score mask (boolean: true where the query sees the key; or additive float),
    /// made additive float32 and broadcast to the operand's shape.
    ScoreMask,
}

/// One operand of the kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Operand {
    /// The argument it comes from.
    pub arg: usize,
    /// The shape the kernel sees (the argument's elements, in row-major order).
    pub shape: Vec<u64>,
    /// The dtype the kernel takes.
    pub dtype: DType,
    /// How the argument becomes the operand.
    pub form: Form,
}

/// Checks the values of a call's int32 index operands (in operand order) before a
/// launch: data the shapes cannot vouch for (block tables, offsets).
pub type IndexCheck = Box<dyn Fn(&[&[i32]]) -> Result<(), String> + Send + Sync>;

/// A checked call, planned: what to launch on which operands.
pub struct Plan {
    /// The library kernel.
    pub kernel: &'static str,
    /// Its parameters, typed (each of its `ParamDef`'s kind).
    pub params: Vec<(&'static str, ParamValue)>,
    /// Its operands, in order.
    pub inputs: Vec<Operand>,
    /// The shape the kernel sees of each output (the op's [`OpSpec::outputs`], in order).
    pub outputs: Vec<Vec<u64>>,
    /// False when there is nothing to compute: the results are their `empty` values.
    pub launch: bool,
    /// Checks the index operands' values, when the kernel indexes with them.
    pub check_indices: Option<IndexCheck>,
}

impl Plan {
    /// The plan's library kernel and its parameters (the plan's typed values over the
    /// kernel's defaults).
    pub fn library_call(
        &self,
    ) -> Result<(&'static dyn crate::LibraryKernel, crate::Params), String> {
        let kernel = crate::find(self.kernel)
            .ok_or_else(|| format!("`{}` is not a library kernel", self.kernel))?;
        let params = crate::Params::from_values(kernel.params(), &self.params)
            .map_err(|e| format!("{}: {e}", self.kernel))?;
        Ok((kernel, params))
    }
}

/// `(5, 3)` / `(5,)` / `()`: a shape as Python prints it (messages quote shapes so).
pub fn py_shape(shape: &[u64]) -> String {
    match shape {
        [one] => format!("({one},)"),
        _ => {
            let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
            format!("({})", dims.join(", "))
        }
    }
}

/// A checked tensor argument.
#[derive(Clone, Debug)]
pub struct Tensor {
    /// Its position among the arguments.
    pub arg: usize,
    /// Its name in messages.
    pub name: &'static str,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Its dtype.
    pub dtype: DType,
    /// PyTorch's name of its dtype (`torch.int64` for an index tensor seen as int32).
    pub torch_dtype: String,
}

impl Tensor {
    /// Checks that the rank is `rank`.
    pub fn rank(self, rank: usize) -> Result<Tensor, String> {
        if self.shape.len() != rank {
            return Err(format!(
                "{}: expected rank {rank}, got shape {}",
                self.name,
                py_shape(&self.shape)
            ));
        }
        Ok(self)
    }

    /// Checks that the rank is at least `rank`.
    pub fn min_rank(self, rank: usize) -> Result<Tensor, String> {
        if self.shape.len() < rank {
            return Err(format!(
                "{}: expected at least {rank} dimension(s), got shape {}",
                self.name,
                py_shape(&self.shape)
            ));
        }
        Ok(self)
    }

    /// Checks that the dtype is `first`'s.
    pub fn same_dtype(self, first: &Tensor) -> Result<Tensor, String> {
        if self.dtype != first.dtype {
            return Err(format!(
                "{}: dtype {} differs from the first argument's {}",
                self.name, self.torch_dtype, first.torch_dtype
            ));
        }
        Ok(self)
    }

    /// Checks that the shape is `first`'s.
    pub fn same_shape(self, first: &Tensor) -> Result<Tensor, String> {
        if self.shape != first.shape {
            return Err(format!(
                "{}: shape {} differs from {}'s {}",
                self.name,
                py_shape(&self.shape),
                first.name,
                py_shape(&first.shape)
            ));
        }
        Ok(self)
    }

    /// A 1-D argument of `first`'s dtype with `n` elements.
    pub fn vector(self, first: &Tensor, n: u64) -> Result<Tensor, String> {
        let t = self.same_dtype(first)?.rank(1)?;
        if t.shape[0] != n {
            return Err(format!(
                "{}: expected {n} elements, got {}",
                t.name, t.shape[0]
            ));
        }
        Ok(t)
    }

    /// Its element count.
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// The operand of this argument as it is.
    pub fn operand(&self) -> Operand {
        self.seen_as(self.shape.clone())
    }

    /// The operand of this argument seen with `shape`.
    pub fn seen_as(&self, shape: Vec<u64>) -> Operand {
        Operand {
            arg: self.arg,
            shape,
            dtype: self.dtype,
            form: Form::Data,
        }
    }
}

/// Reads a call's arguments in schema order, checking each as it goes.
pub struct Args<'a> {
    values: &'a [Value],
    next: usize,
    /// The first tensor's name and device.
    device: Option<(&'static str, &'a str)>,
}

impl<'a> Args<'a> {
    /// A reader of `values`.
    pub fn new(values: &'a [Value]) -> Args<'a> {
        Args {
            values,
            next: 0,
            device: None,
        }
    }

    fn take(&mut self) -> (usize, &'a Value) {
        let i = self.next;
        self.next += 1;
        (i, self.values.get(i).unwrap_or(&Value::None))
    }

    /// The next argument, a tensor of any dtype (`None` if left out) on the first
    /// tensor's device.
    pub fn optional(
        &mut self,
        name: &'static str,
    ) -> Result<Option<(Tensor, Option<DType>)>, String> {
        Ok(match self.take() {
            (arg, Value::Tensor(m)) => {
                match self.device {
                    None => self.device = Some((name, &m.device)),
                    Some((first, device)) if device != m.device => {
                        return Err(format!(
                            "tensor arguments are on different devices: {first} on {device}, \
                             {name} on {}",
                            m.device
                        ))
                    }
                    Some(_) => {}
                }
                let dtype = tessera_dtype(&m.dtype);
                let tensor = Tensor {
                    arg,
                    name,
                    shape: m.shape.clone(),
                    dtype: dtype.unwrap_or(DType::I32),
                    torch_dtype: m.dtype.clone(),
                };
                Some((tensor, dtype))
            }
            _ => None,
        })
    }

    fn required(&mut self, name: &'static str) -> Result<(Tensor, Option<DType>), String> {
        self.optional(name)?
            .ok_or_else(|| format!("{name}: expected a tensor, got None"))
    }

    /// The next argument: a float32, bfloat16 or float16 tensor.
    pub fn tensor(&mut self, name: &'static str) -> Result<Tensor, String> {
        match self.required(name)? {
            (t, Some(DType::F32 | DType::BF16 | DType::F16)) => Ok(t),
            (t, _) => Err(format!(
                "{name}: dtype {} is not supported (float32, bfloat16, float16)",
                t.torch_dtype
            )),
        }
    }

    /// The next argument: an int32 tensor, or an int64 one (PyTorch's index dtype; its
    /// values are converted with a range check), seen as int32.
    pub fn index(&mut self, name: &'static str) -> Result<Tensor, String> {
        let (t, _) = self.required(name)?;
        if !["torch.int32", "torch.int64"].contains(&t.torch_dtype.as_str()) {
            return Err(format!(
                "{name}: expected torch.int32 or torch.int64, got {}",
                t.torch_dtype
            ));
        }
        Ok(Tensor {
            dtype: DType::I32,
            ..t
        })
    }

    /// The next argument: an optional finite float.
    pub fn float(&mut self, name: &str) -> Result<Option<f64>, String> {
        match self.take().1 {
            Value::Float(f) if f.is_finite() => Ok(Some(*f)),
            Value::Float(f) => Err(format!("{name}: expected a finite number, got {f}")),
            Value::Int(i) => Ok(Some(*i as f64)),
            _ => Ok(None),
        }
    }

    /// The next argument: an optional non-negative integer.
    pub fn count(&mut self, name: &str) -> Result<Option<u64>, String> {
        match self.take().1 {
            Value::Int(i) => u64::try_from(*i)
                .map(Some)
                .map_err(|_| format!("{name}: expected a non-negative integer, got {i}")),
            _ => Ok(None),
        }
    }

    /// The next argument: a bool (false if left out).
    pub fn flag(&mut self) -> bool {
        matches!(self.take().1, Value::Bool(true))
    }
}

/// `(rows, cols)` of a shape seen as rows of its last dimension.
pub fn rows(shape: &[u64]) -> (u64, u64) {
    let cols = *shape.last().unwrap_or(&1);
    let n: u64 = shape.iter().product();
    (n.checked_div(cols).unwrap_or(0), cols)
}

/// The plan of a row-wise op (softmax, the norms, swiglu): `matrices` seen as `[rows,
/// cols]` of the first one's last dim, then `vectors` of `[cols]`, one output like the
/// first; `eps` when the kernel takes one.
pub fn row_plan(
    kernel: &'static str,
    matrices: &[Tensor],
    vectors: &[Tensor],
    eps: Option<f64>,
) -> Plan {
    let first = &matrices[0];
    let (r, c) = rows(&first.shape);
    let mut params = vec![
        ("rows", ParamValue::Int(r)),
        ("cols", ParamValue::Int(c)),
        ("dtype", ParamValue::DType(first.dtype)),
    ];
    if let Some(eps) = eps {
        params.push(("eps", ParamValue::Float(eps)));
    }
    let inputs = matrices
        .iter()
        .map(|m| m.seen_as(vec![r, c]))
        .chain(vectors.iter().map(|v| v.seen_as(vec![c])))
        .collect();
    Plan {
        kernel,
        params,
        inputs,
        outputs: vec![vec![r, c]],
        launch: first.numel() > 0,
        check_indices: None,
    }
}

/// Attention's head counts (GQA: the kv heads divide the query heads) and head dim
/// (1..=256, what the kernels take).
pub fn check_heads(heads: u64, kv_heads: u64, head_dim: u64) -> Result<(), String> {
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(format!(
            "key: {kv_heads} heads do not divide the query's {heads} heads"
        ));
    }
    if !(1..=256).contains(&head_dim) {
        return Err(format!(
            "query: head_dim must be in 1..=256, got {head_dim}"
        ));
    }
    Ok(())
}

/// Refuses float16 queries: the attention kernels take float32 or bfloat16.
pub fn f32_or_bf16(op: &str, q: &Tensor) -> Result<(), String> {
    if q.dtype == DType::F16 {
        return Err(format!(
            "query: {op} takes float32 or bfloat16, got torch.float16"
        ));
    }
    Ok(())
}

/// The operands of the forward's output and log-sum-exp (float32, `q`'s shape with a
/// last dim of 1) when the caller saved them (both or neither), checked against the
/// query; none when not saved.
pub fn saved_forward(a: &mut Args, q: &Tensor) -> Result<Vec<Operand>, String> {
    let (out, lse) = match (a.optional("out")?, a.optional("lse")?) {
        (Some((o, _)), Some((l, _))) => (o, l),
        (None, None) => return Ok(Vec::new()),
        _ => return Err("out/lse: pass both of the forward's results or neither".into()),
    };
    let out = out.same_dtype(q)?;
    let mut lse_shape = q.shape.clone();
    if let Some(last) = lse_shape.last_mut() {
        *last = 1;
    }
    if out.shape != q.shape || lse.shape != lse_shape || lse.dtype != DType::F32 {
        return Err(format!(
            "out/lse: expected the forward's {} output and float32 {} log-sum-exp, got {} and {} {}",
            py_shape(&q.shape),
            py_shape(&lse_shape),
            py_shape(&out.shape),
            lse.torch_dtype,
            py_shape(&lse.shape)
        ));
    }
    Ok(vec![out.operand(), lse.operand()])
}

/// The gradient of the output: `q`'s shape (taken in `q`'s dtype).
pub fn grad_out(a: &mut Args, q: &Tensor) -> Result<Tensor, String> {
    let g = a.tensor("grad_out")?;
    if g.shape != q.shape {
        return Err(format!(
            "grad_out: shape {} differs from query's {}",
            py_shape(&g.shape),
            py_shape(&q.shape)
        ));
    }
    Ok(Tensor {
        dtype: q.dtype,
        ..g
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[u64], dtype: &str) -> Value {
        Value::Tensor(Meta {
            shape: shape.to_vec(),
            dtype: dtype.into(),
            device: "cpu".into(),
        })
    }

    #[test]
    fn the_dtype_table_names_each_dtype_once() {
        for d in DTYPES {
            assert_eq!(tessera_dtype(d.torch), d.kernel);
            let same = |f: &dyn Fn(&TorchDType) -> bool| DTYPES.iter().filter(|r| f(r)).count();
            assert_eq!(same(&|r| r.torch == d.torch), 1, "{}", d.torch);
            assert_eq!(same(&|r| r.element == d.element), 1, "{}", d.element);
            assert!(d.kernel.is_none() || same(&|r| r.kernel == d.kernel) == 1);
        }
        assert_eq!(tessera_dtype("torch.float64"), None);
        assert_eq!(tessera_dtype("torch.complex64"), None);
    }

    #[test]
    fn results_follow_the_arguments_shapes() {
        let args = [t(&[2, 3, 5, 8], "torch.bfloat16"), Value::None];
        let lse = Out::lse(&[Dim::Of(0, 0), Dim::Of(0, 1), Dim::Of(0, 2), Dim::One]);
        assert_eq!(lse.eval(&args).shape, [2, 3, 5, 1]);
        assert_eq!(lse.eval(&args).dtype, "torch.float32");
        assert_eq!(Out::like(0).eval(&args).dtype, "torch.bfloat16");
    }

    #[test]
    fn the_reader_names_the_argument_it_refuses() {
        let args = [t(&[4], "torch.float64"), Value::Float(f64::NAN)];
        let mut a = Args::new(&args);
        let e = a.tensor("x").unwrap_err();
        assert_eq!(
            e,
            "x: dtype torch.float64 is not supported (float32, bfloat16, float16)"
        );
        assert!(a
            .float("eps")
            .unwrap_err()
            .starts_with("eps: expected a finite"));
        let mut a = Args::new(&[]);
        assert_eq!(a.tensor("q").unwrap_err(), "q: expected a tensor, got None");
    }
}
