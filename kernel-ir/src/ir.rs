//! The block-level IR: a kernel is a grid, refs with BlockSpecs, and an SSA body.
//!
//! The vocabulary follows JAX Pallas: the grid is iterated in row-major order, each
//! iteration ("program") sees one block of every input and output through a *ref*
//! whose position is chosen by the operand's index map, and scratch buffers persist
//! across the iterations one core runs.

use crate::types::TensorType;

/// An SSA value; its type lives in [`Kernel::value_types`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(pub u32);

/// A ref: an input, output or scratch buffer, by position in [`Kernel::refs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RefId(pub u32);

/// Whether a grid dimension's iterations are independent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DimSemantics {
    /// Iterations are independent and may run on different cores.
    Parallel,
    /// Iterations run in order on one core (reductions, accumulators in scratch).
    Arbitrary,
}

impl DimSemantics {
    /// Text-form name.
    pub fn name(self) -> &'static str {
        match self {
            DimSemantics::Parallel => "parallel",
            DimSemantics::Arbitrary => "arbitrary",
        }
    }
}

/// Where a ref's block lives on the accelerator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemorySpace {
    /// Vector memory (the default for blocks and scratch).
    Vmem,
    /// Scalar memory.
    Smem,
    /// Left in HBM / main memory, no blocking copy.
    Any,
}

impl MemorySpace {
    /// Text-form name.
    pub fn name(self) -> &'static str {
        match self {
            MemorySpace::Vmem => "vmem",
            MemorySpace::Smem => "smem",
            MemorySpace::Any => "any",
        }
    }
}

/// One dimension of a block shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockDim {
    /// A block of this many elements; block index `b` starts at element `b * n`.
    Size(u64),
    /// Size one and removed from the kernel's view of the ref (Pallas `None`).
    Squeezed,
}

impl BlockDim {
    /// Elements covered along this dimension.
    pub fn extent(self) -> u64 {
        match self {
            BlockDim::Size(n) => n,
            BlockDim::Squeezed => 1,
        }
    }
}

/// Binary operators allowed in index maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IndexBinOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// Floor division.
    FloorDiv,
    /// Remainder with the sign of the divisor.
    Rem,
    /// `min(a, b)`
    Min,
    /// `max(a, b)`
    Max,
}

impl IndexBinOp {
    /// Text-form name.
    pub fn name(self) -> &'static str {
        match self {
            IndexBinOp::Add => "+",
            IndexBinOp::Sub => "-",
            IndexBinOp::Mul => "*",
            IndexBinOp::FloorDiv => "floordiv",
            IndexBinOp::Rem => "mod",
            IndexBinOp::Min => "min",
            IndexBinOp::Max => "max",
        }
    }

    /// The element-wise op that computes this one on i32 scalars (the lowerings emit
    /// index maps through their element-wise rules).
    pub fn as_binary(self) -> BinaryOp {
        match self {
            IndexBinOp::Add => BinaryOp::Add,
            IndexBinOp::Sub => BinaryOp::Sub,
            IndexBinOp::Mul => BinaryOp::Mul,
            IndexBinOp::FloorDiv => BinaryOp::Div,
            IndexBinOp::Rem => BinaryOp::Rem,
            IndexBinOp::Min => BinaryOp::Min,
            IndexBinOp::Max => BinaryOp::Max,
        }
    }

    /// Applies the operator (division rounds toward negative infinity); `None` on
    /// division by zero or overflow.
    pub fn apply(self, a: i64, b: i64) -> Option<i64> {
        match self {
            IndexBinOp::Add => a.checked_add(b),
            IndexBinOp::Sub => a.checked_sub(b),
            IndexBinOp::Mul => a.checked_mul(b),
            IndexBinOp::FloorDiv => crate::ops::floor_div(a, b),
            IndexBinOp::Rem => crate::ops::floor_rem(a, b),
            IndexBinOp::Min => Some(a.min(b)),
            IndexBinOp::Max => Some(a.max(b)),
        }
    }
}

/// An expression over program ids (and scalar-prefetch operands): one result of an
/// index map.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum IndexExpr {
    /// The program id along a grid axis.
    ProgramId(usize),
    /// A constant.
    Const(i64),
    /// A binary operation.
    Bin(IndexBinOp, Box<IndexExpr>, Box<IndexExpr>),
    /// One element of a scalar-prefetch operand (Pallas's `PrefetchScalarGridSpec`): an
    /// i32 input among the kernel's leading ones, whole in SMEM, read before the
    /// program's blocks are placed.
    Scalar(RefId, Vec<IndexExpr>),
}

/// Reads element `index` of scalar-prefetch operand `ref`, or says why it cannot.
pub type ScalarRead<'a> = dyn FnMut(RefId, &[i64]) -> Result<i64, String> + 'a;

impl IndexExpr {
    /// Evaluates the expression at the given program ids; `None` if it reads a
    /// scalar-prefetch operand (see [`IndexExpr::eval_with`]), divides by zero or
    /// overflows.
    pub fn eval(&self, pids: &[u64]) -> Option<i64> {
        self.eval_with(pids, &mut |_, _| Err(String::new())).ok()
    }

    /// Evaluates the expression at the given program ids, reading scalar-prefetch
    /// operands through `read`.
    pub fn eval_with(&self, pids: &[u64], read: &mut ScalarRead) -> Result<i64, String> {
        self.fold(&mut |node| match node {
            IndexNode::ProgramId(axis) => pids
                .get(axis)
                .map(|&p| p as i64)
                .ok_or_else(|| format!("program id {axis} is outside the grid")),
            IndexNode::Const(c) => Ok(c),
            IndexNode::Bin(op, a, b) => op
                .apply(a?, b?)
                .ok_or_else(|| "division by zero or overflow".to_string()),
            IndexNode::Scalar(r, index) => {
                let index = index.into_iter().collect::<Result<Vec<_>, _>>()?;
                read(r, &index)
            }
        })
    }

    /// Computes the expression bottom-up, `f` giving each node's value from its
    /// children's: how the interpreter evaluates index maps and every lowering emits them.
    pub fn fold<V>(&self, f: &mut impl FnMut(IndexNode<V>) -> V) -> V {
        match self {
            IndexExpr::ProgramId(axis) => f(IndexNode::ProgramId(*axis)),
            IndexExpr::Const(c) => f(IndexNode::Const(*c)),
            IndexExpr::Bin(op, a, b) => {
                let (a, b) = (a.fold(f), b.fold(f));
                f(IndexNode::Bin(*op, a, b))
            }
            IndexExpr::Scalar(r, index) => {
                let index = index.iter().map(|e| e.fold(f)).collect();
                f(IndexNode::Scalar(*r, index))
            }
        }
    }

    /// The largest program axis referenced, if any.
    pub fn max_axis(&self) -> Option<usize> {
        self.fold(&mut |node: IndexNode<Option<usize>>| match node {
            IndexNode::ProgramId(axis) => Some(axis),
            IndexNode::Const(_) => None,
            IndexNode::Bin(_, a, b) => a.max(b),
            IndexNode::Scalar(_, index) => index.into_iter().flatten().max(),
        })
    }

    /// The last scalar-prefetch operand the expression reads, if any (no allocation
    /// for expressions that read none).
    pub fn last_scalar_read(&self) -> Option<RefId> {
        self.fold(&mut |node: IndexNode<Option<u32>>| match node {
            IndexNode::ProgramId(_) | IndexNode::Const(_) => None,
            IndexNode::Bin(_, a, b) => a.max(b),
            IndexNode::Scalar(r, index) => index.into_iter().flatten().max().max(Some(r.0)),
        })
        .map(RefId)
    }

    /// The scalar-prefetch operands the expression reads, with the index rank of each
    /// read.
    pub fn scalar_reads(&self) -> Vec<(RefId, usize)> {
        let mut reads = Vec::new();
        self.fold(&mut |node: IndexNode<()>| {
            if let IndexNode::Scalar(r, index) = node {
                reads.push((r, index.len()));
            }
        });
        reads
    }

    /// `self op rhs`, for building maps by hand.
    pub fn bin(self, op: IndexBinOp, rhs: impl Into<IndexExpr>) -> IndexExpr {
        IndexExpr::Bin(op, Box::new(self), Box::new(rhs.into()))
    }
}

/// One node of an [`IndexExpr`] with its children already computed (see
/// [`IndexExpr::fold`]).
#[derive(Clone, Debug)]
pub enum IndexNode<V> {
    /// The program id along a grid axis.
    ProgramId(usize),
    /// A constant.
    Const(i64),
    /// A binary operation on the children's values.
    Bin(IndexBinOp, V, V),
    /// A read of a scalar-prefetch operand at the children's values.
    Scalar(RefId, Vec<V>),
}

impl From<i64> for IndexExpr {
    fn from(c: i64) -> Self {
        IndexExpr::Const(c)
    }
}

/// Maps program ids to block indices, one expression per array dimension
/// (Pallas `index_map`, Mosaic `transform_i`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IndexMap {
    /// One block index per array dimension.
    pub exprs: Vec<IndexExpr>,
}

impl IndexMap {
    /// Builds a map from a closure over the program-id expressions of a `grid_rank` grid.
    pub fn from_fn(grid_rank: usize, f: impl FnOnce(&[IndexExpr]) -> Vec<IndexExpr>) -> Self {
        let pids: Vec<IndexExpr> = (0..grid_rank).map(IndexExpr::ProgramId).collect();
        IndexMap { exprs: f(&pids) }
    }

    /// Block indices at the given program ids; `None` if an expression cannot be evaluated.
    pub fn eval(&self, pids: &[u64]) -> Option<Vec<i64>> {
        self.exprs.iter().map(|e| e.eval(pids)).collect()
    }

    /// Whether some block index depends on a scalar-prefetch operand.
    pub fn reads_scalars(&self) -> bool {
        self.exprs.iter().any(|e| e.last_scalar_read().is_some())
    }
}

/// How an input or output array is cut into blocks (Pallas `BlockSpec`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BlockSpec {
    /// Block shape, one entry per array dimension.
    pub block_shape: Vec<BlockDim>,
    /// Program ids to block indices.
    pub index_map: IndexMap,
    /// Where the block lives.
    pub memory_space: MemorySpace,
}

impl BlockSpec {
    /// A VMEM block spec.
    pub fn new(block_shape: Vec<BlockDim>, index_map: IndexMap) -> Self {
        BlockSpec {
            block_shape,
            index_map,
            memory_space: MemorySpace::Vmem,
        }
    }

    /// The shape the kernel sees: the block shape without squeezed dims.
    pub fn kernel_shape(&self) -> Vec<u64> {
        self.block_shape
            .iter()
            .filter_map(|d| match d {
                BlockDim::Size(n) => Some(*n),
                BlockDim::Squeezed => None,
            })
            .collect()
    }
}

/// What a ref is to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefKind {
    /// Read-only array argument.
    Input,
    /// Array result.
    Output,
    /// Per-core buffer that persists across the iterations one core runs.
    Scratch,
}

impl RefKind {
    /// Text-form keyword.
    pub fn keyword(self) -> &'static str {
        match self {
            RefKind::Input => "in",
            RefKind::Output => "out",
            RefKind::Scratch => "scratch",
        }
    }
}

/// A declared input, output or scratch buffer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RefDecl {
    /// Name, unique in the kernel.
    pub name: String,
    /// Input, output or scratch.
    pub kind: RefKind,
    /// The whole array (inputs/outputs) or the buffer (scratch).
    pub ty: TensorType,
    /// The blocking of inputs and outputs; `None` for scratch.
    pub block: Option<BlockSpec>,
    /// Memory space of scratch buffers (blocks carry their own).
    pub memory_space: MemorySpace,
}

impl RefDecl {
    /// Where the ref lives: its block's memory space (I/O) or its own (scratch).
    pub fn space(&self) -> MemorySpace {
        self.block
            .as_ref()
            .map_or(self.memory_space, |b| b.memory_space)
    }

    /// The blocking of each array dim: the block spec's, or whole dims for scratch.
    pub fn block_dims(&self) -> Vec<BlockDim> {
        match &self.block {
            Some(spec) => spec.block_shape.clone(),
            None => self.ty.shape.iter().map(|&n| BlockDim::Size(n)).collect(),
        }
    }

    /// Where the program's block starts in the array, per dim, as expressions over the
    /// program ids (block index times block extent); `None` for scratch, which starts at 0.
    pub fn block_start(&self) -> Option<Vec<IndexExpr>> {
        let spec = self.block.as_ref()?;
        Some(
            spec.index_map
                .exprs
                .iter()
                .zip(&spec.block_shape)
                .map(|(e, b)| {
                    IndexExpr::Bin(
                        IndexBinOp::Mul,
                        Box::new(e.clone()),
                        Box::new(IndexExpr::Const(b.extent() as i64)),
                    )
                })
                .collect(),
        )
    }

    /// The array's shape padded up to a whole number of blocks (the shape itself for
    /// scratch): what the backends allocate so that every block window is in bounds.
    pub fn padded_shape(&self) -> Vec<u64> {
        match &self.block {
            Some(spec) => self
                .ty
                .shape
                .iter()
                .zip(&spec.block_shape)
                .map(|(&n, b)| n.div_ceil(b.extent()) * b.extent())
                .collect(),
            None => self.ty.shape.clone(),
        }
    }

    /// The type the kernel body sees when it loads or stores this ref.
    pub fn kernel_type(&self) -> TensorType {
        match &self.block {
            Some(spec) => TensorType::new(self.ty.dtype, spec.kernel_shape()),
            None => self.ty.clone(),
        }
    }
}

/// Element-wise unary operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x`
    Neg,
    /// `|x|`
    Abs,
    /// `e^x`
    Exp,
    /// Natural logarithm.
    Log,
    /// Hyperbolic tangent.
    Tanh,
    /// `1 / sqrt(x)`
    Rsqrt,
    /// Square root.
    Sqrt,
    /// The Gauss error function (exact GELU: `x * (1 + erf(x / sqrt(2))) / 2`).
    Erf,
    /// Sine (radians).
    Sin,
    /// Cosine (radians).
    Cos,
    /// Logical / bitwise not (bool and i32).
    Not,
}

/// Element-wise binary operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b` (rounded toward negative infinity for integers, Python's `//`).
    Div,
    /// Remainder: `a - b * floor(a / b)`, with the sign of `b` (Python's `%`).
    Rem,
    /// `max(a, b)`
    Max,
    /// `min(a, b)`
    Min,
    /// `a ^ b` for floats.
    Pow,
    /// Logical and (bool) or bitwise and (i32).
    And,
    /// Logical or (bool) or bitwise or (i32).
    Or,
}

/// Comparison predicates; results are bool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpPred {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

/// Reductions over axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (accumulated in f32 for floats).
    Sum,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

macro_rules! op_names {
    ($ty:ident { $($variant:ident => $name:literal),* $(,)? }) => {
        impl $ty {
            /// Every operator, in a stable order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),*];

            /// Text-form name.
            pub fn name(self) -> &'static str {
                match self { $($ty::$variant => $name),* }
            }

            /// Parses a name printed by `name`.
            pub fn from_name(name: &str) -> Option<$ty> {
                Self::ALL.iter().copied().find(|op| op.name() == name)
            }
        }
    };
}

op_names!(UnaryOp { Neg => "neg", Abs => "abs", Exp => "exp", Log => "log", Tanh => "tanh",
    Rsqrt => "rsqrt", Sqrt => "sqrt", Erf => "erf", Sin => "sin", Cos => "cos", Not => "not" });
op_names!(BinaryOp { Add => "add", Sub => "sub", Mul => "mul", Div => "div", Rem => "rem",
    Max => "max", Min => "min", Pow => "pow", And => "and", Or => "or" });
op_names!(CmpPred { Eq => "eq", Ne => "ne", Lt => "lt", Le => "le", Gt => "gt", Ge => "ge" });
op_names!(ReduceOp { Sum => "reduce_sum", Max => "reduce_max", Min => "reduce_min" });

/// A constant splatted over its result type.
#[derive(Clone, Copy, Debug)]
pub enum Literal {
    /// A float constant (also `inf`, `-inf`, `nan`).
    Float(f64),
    /// An integer constant.
    Int(i64),
    /// A boolean constant.
    Bool(bool),
}

/// Literals are equal when they are the same constant: floats compare by their bits
/// (so `NaN == NaN` and `0.0 != -0.0`, as their printed and lowered forms do).
impl PartialEq for Literal {
    fn eq(&self, other: &Self) -> bool {
        match (*self, *other) {
            (Literal::Float(a), Literal::Float(b)) => a.to_bits() == b.to_bits(),
            (Literal::Int(a), Literal::Int(b)) => a == b,
            (Literal::Bool(a), Literal::Bool(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Literal {}

impl std::hash::Hash for Literal {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match *self {
            Literal::Float(f) => f.to_bits().hash(state),
            Literal::Int(i) => i.hash(state),
            Literal::Bool(b) => b.hash(state),
        }
    }
}

impl Literal {
    /// The constant as a number (`true` is 1).
    pub fn as_f64(self) -> f64 {
        match self {
            Literal::Float(f) => f,
            Literal::Int(i) => i as f64,
            Literal::Bool(b) => f64::from(u8::from(b)),
        }
    }
}

/// The start of a sliced dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Start {
    /// Known when the kernel is built.
    Static(u64),
    /// An i32 scalar computed by the kernel.
    Dynamic(Value),
}

/// How a load or store addresses one dimension of a ref.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Index {
    /// The whole dimension.
    Full,
    /// One position (an i32 scalar); the dimension is dropped from the result.
    At(Value),
    /// `size` elements from `start` (Pallas `pl.ds(start, size)`).
    Slice {
        /// First element.
        start: Start,
        /// Number of elements.
        size: u64,
    },
}

/// A list of ops with block arguments (loop induction variable and carried values).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Region {
    /// Values defined on entry.
    pub args: Vec<Value>,
    /// The ops, in order; nested regions end with [`OpKind::Yield`].
    pub ops: Vec<Op>,
}

impl Region {
    /// Calls `f` on every op of this region and of the regions nested in it, in
    /// program order (an op before the ops of its regions).
    pub fn walk<'a>(&'a self, f: &mut impl FnMut(&'a Op)) {
        for op in &self.ops {
            f(op);
            for r in op.kind.regions() {
                r.walk(f);
            }
        }
    }

    /// Calls `f` on this region and every region nested in it, outer first.
    pub fn walk_regions<'a>(&'a self, f: &mut impl FnMut(&'a Region)) {
        f(self);
        for op in &self.ops {
            for r in op.kind.regions() {
                r.walk_regions(f);
            }
        }
    }
}

/// One operation and the values it defines.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Op {
    /// Results, in order.
    pub results: Vec<Value>,
    /// What the op does.
    pub kind: OpKind,
}

/// The operations of the IR.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// This program's index along a grid axis (i32 scalar).
    ProgramId {
        /// Grid axis.
        axis: usize,
    },
    /// The grid size along an axis (i32 scalar).
    NumPrograms {
        /// Grid axis.
        axis: usize,
    },
    /// A literal splatted to the result type.
    Constant {
        /// The value.
        value: Literal,
    },
    /// Positions along `dim` of the (i32) result type.
    Iota {
        /// The dimension that counts.
        dim: usize,
    },
    /// Reads a window of a ref; masked-off lanes read `other` (zero by default).
    Load {
        /// The ref read.
        src: RefId,
        /// One entry per dimension of the ref's kernel type.
        index: Vec<Index>,
        /// Bool tensor of the result shape.
        mask: Option<Value>,
        /// Scalar fill for masked-off lanes.
        other: Option<Value>,
    },
    /// Writes a window of a ref; masked-off lanes are left untouched.
    Store {
        /// The ref written.
        dst: RefId,
        /// One entry per dimension of the ref's kernel type.
        index: Vec<Index>,
        /// The data, shaped like the window.
        value: Value,
        /// Bool tensor of the window shape.
        mask: Option<Value>,
    },
    /// Broadcasts `x` to the result shape; operand dim `i` becomes result dim `dims[i]`
    /// and must be 1 or equal to it (StableHLO `broadcast_in_dim`).
    Broadcast {
        /// The operand.
        x: Value,
        /// Result dimension of each operand dimension, increasing.
        dims: Vec<usize>,
    },
    /// Same elements, new shape.
    Reshape {
        /// The operand.
        x: Value,
    },
    /// Permutes dimensions: result dim `i` is operand dim `perm[i]`.
    Transpose {
        /// The operand.
        x: Value,
        /// The permutation.
        perm: Vec<usize>,
    },
    /// Picks elements of `x` along `axis` (NumPy `take_along_axis`): the result has
    /// the shape of `indices` (i32, same rank as `x`, equal to it on every other dim)
    /// and `result[.., i, ..] = x[.., indices[.., i, ..], ..]`. Indices outside
    /// `0..x.shape[axis]` are clamped into it, on every backend (as XLA's gather does).
    Gather {
        /// The operand.
        x: Value,
        /// The positions along `axis` (i32).
        indices: Value,
        /// The dimension indexed.
        axis: usize,
    },
    /// Element-wise unary op.
    Unary {
        /// Which op.
        op: UnaryOp,
        /// The operand.
        x: Value,
    },
    /// Element-wise binary op on equal types.
    Binary {
        /// Which op.
        op: BinaryOp,
        /// Left operand.
        lhs: Value,
        /// Right operand.
        rhs: Value,
    },
    /// Element-wise comparison; the result is bool.
    Compare {
        /// Which predicate.
        pred: CmpPred,
        /// Left operand.
        lhs: Value,
        /// Right operand.
        rhs: Value,
    },
    /// `cond ? on_true : on_false`, element-wise.
    Select {
        /// Bool condition, same shape as the result.
        cond: Value,
        /// Taken where `cond` is true.
        on_true: Value,
        /// Taken where `cond` is false.
        on_false: Value,
    },
    /// Converts element type (floats round to nearest even, float to int truncates).
    Cast {
        /// The operand.
        x: Value,
    },
    /// Reduces over `axes`, which are removed from the shape.
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// The operand.
        x: Value,
        /// Axes to reduce, increasing.
        axes: Vec<usize>,
    },
    /// Matrix product of 2-D operands, accumulated in f32 (i32 for integers).
    Dot {
        /// `[M, K]`, or `[K, M]` when `transpose_lhs`.
        lhs: Value,
        /// `[K, N]`, or `[N, K]` when `transpose_rhs`.
        rhs: Value,
        /// Contract over lhs dim 0 instead of 1.
        transpose_lhs: bool,
        /// Contract over rhs dim 1 instead of 0.
        transpose_rhs: bool,
    },
    /// `for i in (lower..upper).step_by(step)` with carried values; results are the
    /// final carried values. Body args: the induction variable, then the carried values.
    For {
        /// i32 scalar.
        lower: Value,
        /// i32 scalar (exclusive).
        upper: Value,
        /// i32 scalar, positive.
        step: Value,
        /// Initial carried values.
        inits: Vec<Value>,
        /// Ends with a yield of the next carried values.
        body: Region,
    },
    /// Runs one of two regions; results are what the taken region yields.
    If {
        /// Bool scalar.
        cond: Value,
        /// Region taken when true.
        then_region: Region,
        /// Region taken when false.
        else_region: Region,
    },
    /// Ends a `for` body or an `if` region.
    Yield {
        /// The values passed out.
        values: Vec<Value>,
    },
    /// Prints `message` and the values with the program id, on the backends that can
    /// print (the interpreter, native); the XLA and Mosaic lowerings drop it.
    DebugPrint {
        /// Text printed before the values.
        message: String,
        /// The values printed (any types).
        values: Vec<Value>,
    },
    /// Fails the run when any element of `cond` is false (Pallas' `checkify`): the
    /// interpreter and native report the first failing program with `message` and the
    /// values, as the error `kind` names; the XLA and Mosaic lowerings drop it.
    Check {
        /// What the failure stands for (a bad value, an index out of range).
        kind: CheckKind,
        /// Bool tensor of any shape; every element must be true.
        cond: Value,
        /// Text of the error, before the values.
        message: String,
        /// Values reported with the failure (any types).
        values: Vec<Value>,
    },
}

/// What a failed [`OpKind::Check`] stands for; torch ops raise the matching Python error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CheckKind {
    /// A bad value (`ValueError`).
    Value,
    /// An index out of range (`IndexError`).
    Index,
}

impl CheckKind {
    /// The op's mnemonic for this kind (`check`, `check_index`).
    pub fn mnemonic(self) -> &'static str {
        match self {
            CheckKind::Value => "check",
            CheckKind::Index => "check_index",
        }
    }

    /// The Python exception a failure of this kind raises through the torch ops.
    pub fn python_error(self) -> &'static str {
        match self {
            CheckKind::Value => "ValueError",
            CheckKind::Index => "IndexError",
        }
    }
}

impl OpKind {
    /// The op's mnemonic in the text form.
    pub fn mnemonic(&self) -> &'static str {
        match self {
            OpKind::ProgramId { .. } => "program_id",
            OpKind::NumPrograms { .. } => "num_programs",
            OpKind::Constant { .. } => "const",
            OpKind::Iota { .. } => "iota",
            OpKind::Load { .. } => "load",
            OpKind::Store { .. } => "store",
            OpKind::Broadcast { .. } => "broadcast",
            OpKind::Reshape { .. } => "reshape",
            OpKind::Transpose { .. } => "transpose",
            OpKind::Gather { .. } => "gather",
            OpKind::Unary { op, .. } => op.name(),
            OpKind::Binary { op, .. } => op.name(),
            OpKind::Compare { .. } => "cmp",
            OpKind::Select { .. } => "select",
            OpKind::Cast { .. } => "cast",
            OpKind::Reduce { op, .. } => op.name(),
            OpKind::Dot { .. } => "dot",
            OpKind::For { .. } => "for",
            OpKind::If { .. } => "if",
            OpKind::Yield { .. } => "yield",
            OpKind::DebugPrint { .. } => "debug_print",
            OpKind::Check { kind, .. } => kind.mnemonic(),
        }
    }

    /// The regions nested in this op (a `for` body, an `if`'s two branches).
    pub fn regions(&self) -> Vec<&Region> {
        match self {
            OpKind::For { body, .. } => vec![body],
            OpKind::If {
                then_region,
                else_region,
                ..
            } => vec![then_region, else_region],
            _ => vec![],
        }
    }

    /// The regions nested in this op, mutably.
    pub fn regions_mut(&mut self) -> Vec<&mut Region> {
        match self {
            OpKind::For { body, .. } => vec![body],
            OpKind::If {
                then_region,
                else_region,
                ..
            } => vec![then_region, else_region],
            _ => vec![],
        }
    }

    /// The SSA values this op reads directly (not those inside its regions).
    pub fn operands(&self) -> Vec<Value> {
        fn index_values(index: &[Index]) -> impl Iterator<Item = Value> + '_ {
            index.iter().filter_map(|i| match i {
                Index::At(v) => Some(*v),
                Index::Slice {
                    start: Start::Dynamic(v),
                    ..
                } => Some(*v),
                _ => None,
            })
        }
        match self {
            OpKind::ProgramId { .. }
            | OpKind::NumPrograms { .. }
            | OpKind::Constant { .. }
            | OpKind::Iota { .. } => vec![],
            OpKind::Load {
                index, mask, other, ..
            } => index_values(index).chain(*mask).chain(*other).collect(),
            OpKind::Store {
                index, value, mask, ..
            } => index_values(index).chain([*value]).chain(*mask).collect(),
            OpKind::Broadcast { x, .. }
            | OpKind::Reshape { x }
            | OpKind::Transpose { x, .. }
            | OpKind::Unary { x, .. }
            | OpKind::Cast { x }
            | OpKind::Reduce { x, .. } => vec![*x],
            OpKind::Gather { x, indices, .. } => vec![*x, *indices],
            OpKind::Binary { lhs, rhs, .. }
            | OpKind::Compare { lhs, rhs, .. }
            | OpKind::Dot { lhs, rhs, .. } => vec![*lhs, *rhs],
            OpKind::Select {
                cond,
                on_true,
                on_false,
            } => vec![*cond, *on_true, *on_false],
            OpKind::For {
                lower,
                upper,
                step,
                inits,
                ..
            } => [*lower, *upper, *step]
                .into_iter()
                .chain(inits.iter().copied())
                .collect(),
            OpKind::If { cond, .. } => vec![*cond],
            OpKind::Yield { values } | OpKind::DebugPrint { values, .. } => values.clone(),
            OpKind::Check { cond, values, .. } => std::iter::once(*cond)
                .chain(values.iter().copied())
                .collect(),
        }
    }
}

/// A kernel: the unit that is verified, printed, interpreted and lowered. Equality and
/// hashing are structural (float literals by their bits), so backends can memoize work
/// per kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    /// Symbol name.
    pub name: String,
    /// Number of programs along each grid axis.
    pub grid: Vec<u64>,
    /// One entry per grid axis.
    pub dimension_semantics: Vec<DimSemantics>,
    /// Inputs, then outputs, then scratch buffers.
    pub refs: Vec<RefDecl>,
    /// The program body (no args, no terminator).
    pub body: Region,
    /// The type of every SSA value, indexed by [`Value`].
    pub value_types: Vec<TensorType>,
}

impl Kernel {
    /// The type of an SSA value.
    pub fn type_of(&self, v: Value) -> &TensorType {
        &self.value_types[v.0 as usize]
    }

    /// The declaration of a ref.
    pub fn ref_decl(&self, r: RefId) -> &RefDecl {
        &self.refs[r.0 as usize]
    }

    /// Refs of one kind, with their ids.
    pub fn refs_of(&self, kind: RefKind) -> impl Iterator<Item = (RefId, &RefDecl)> {
        self.refs
            .iter()
            .enumerate()
            .filter(move |(_, r)| r.kind == kind)
            .map(|(i, r)| (RefId(i as u32), r))
    }

    /// Input array types, in order.
    pub fn input_types(&self) -> Vec<TensorType> {
        self.refs_of(RefKind::Input)
            .map(|(_, r)| r.ty.clone())
            .collect()
    }

    /// Output array types, in order.
    pub fn output_types(&self) -> Vec<TensorType> {
        self.refs_of(RefKind::Output)
            .map(|(_, r)| r.ty.clone())
            .collect()
    }

    /// Total number of programs in the grid.
    pub fn num_programs(&self) -> u64 {
        self.grid.iter().product()
    }

    /// How many leading inputs are scalar-prefetch operands: up to the last one an index
    /// map reads (Pallas's `num_scalar_prefetch`; 0 when no index map reads one).
    pub fn scalar_prefetch(&self) -> usize {
        self.refs
            .iter()
            .filter_map(|r| r.block.as_ref())
            .flat_map(|b| &b.index_map.exprs)
            .filter_map(IndexExpr::last_scalar_read)
            .map(|r| r.0 as usize + 1)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn float_literals_compare_and_hash_by_bits() {
        assert_eq!(Literal::Float(f64::NAN), Literal::Float(f64::NAN));
        assert_ne!(Literal::Float(0.0), Literal::Float(-0.0));
        assert_ne!(Literal::Float(1.0), Literal::Int(1));
        let set: HashSet<Literal> = [0.0, -0.0, f64::NAN, f64::NAN]
            .into_iter()
            .map(Literal::Float)
            .collect();
        assert_eq!(set.len(), 3);
    }

    #[test]
    fn kernels_built_twice_are_one_key() {
        let zoo = crate::testing::op_zoo;
        let set: HashSet<Kernel> = [zoo(), zoo()].into_iter().collect();
        assert_eq!(set.len(), 1);
        let mut other = zoo();
        other.grid[0] += 1;
        assert_ne!(other, zoo());
    }
}
