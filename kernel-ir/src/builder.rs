//! An SSA builder for kernels. Every op method appends to the innermost open region and
//! returns the new value; regions (`for`, `if`) are built by closures. Type errors are
//! not panics: the first one is kept and returned by [`KernelBuilder::finish`], which
//! also runs the verifier.

use crate::ir::{
    BinaryOp, BlockSpec, CheckKind, CmpPred, DimSemantics, Index, Kernel, Literal, MemorySpace, Op,
    OpKind, ReduceOp, RefDecl, RefId, RefKind, Region, UnaryOp, Value,
};
use crate::ops::{infer, TypeEnv};
use crate::types::{DType, TensorType};
use crate::verify::{verify, VerifyError};

/// Builds a [`Kernel`] op by op.
#[derive(Debug)]
pub struct KernelBuilder {
    name: String,
    grid: Vec<u64>,
    dimension_semantics: Vec<DimSemantics>,
    refs: Vec<RefDecl>,
    value_types: Vec<TensorType>,
    regions: Vec<Region>,
    open: Vec<Open>,
    first_error: Option<VerifyError>,
    location: Option<String>,
}

/// A region-holding op whose regions are being built.
#[derive(Debug)]
enum Open {
    For {
        lower: Value,
        upper: Value,
        step: Value,
        inits: Vec<Value>,
    },
    Then {
        cond: Value,
    },
    Else {
        cond: Value,
        then_region: Region,
    },
}

impl TypeEnv for KernelBuilder {
    fn value_type(&self, v: Value) -> &TensorType {
        &self.value_types[v.0 as usize]
    }
    fn ref_decl(&self, r: RefId) -> Option<&RefDecl> {
        self.refs.get(r.0 as usize)
    }
}

impl KernelBuilder {
    /// Starts a kernel with the given grid; every axis is `parallel` until
    /// [`KernelBuilder::dimension_semantics`] says otherwise.
    pub fn new(name: impl Into<String>, grid: impl Into<Vec<u64>>) -> Self {
        let grid = grid.into();
        KernelBuilder {
            name: name.into(),
            dimension_semantics: vec![DimSemantics::Parallel; grid.len()],
            grid,
            refs: Vec::new(),
            value_types: Vec::new(),
            regions: vec![Region::default()],
            open: Vec::new(),
            first_error: None,
            location: None,
        }
    }

    /// Sets the semantics of each grid axis.
    pub fn dimension_semantics(&mut self, semantics: impl Into<Vec<DimSemantics>>) -> &mut Self {
        self.dimension_semantics = semantics.into();
        self
    }

    /// The grid, as given to [`KernelBuilder::new`].
    pub fn grid(&self) -> &[u64] {
        &self.grid
    }

    /// Declares an input array cut into blocks by `block`.
    pub fn input(&mut self, name: impl Into<String>, ty: TensorType, block: BlockSpec) -> RefId {
        // As the parser does: an I/O ref's space is its block's.
        let space = block.memory_space;
        self.add_ref(name.into(), RefKind::Input, ty, Some(block), space)
    }

    /// Declares an output array cut into blocks by `block`.
    pub fn output(&mut self, name: impl Into<String>, ty: TensorType, block: BlockSpec) -> RefId {
        // As the parser does: an I/O ref's space is its block's.
        let space = block.memory_space;
        self.add_ref(name.into(), RefKind::Output, ty, Some(block), space)
    }

    /// Declares a VMEM scratch buffer that persists across the programs one core runs.
    pub fn scratch(&mut self, name: impl Into<String>, ty: TensorType) -> RefId {
        self.add_ref(name.into(), RefKind::Scratch, ty, None, MemorySpace::Vmem)
    }

    fn add_ref(
        &mut self,
        name: String,
        kind: RefKind,
        ty: TensorType,
        block: Option<BlockSpec>,
        memory_space: MemorySpace,
    ) -> RefId {
        self.refs.push(RefDecl {
            name,
            kind,
            ty,
            block,
            memory_space,
        });
        RefId(self.refs.len() as u32 - 1)
    }

    /// The type the body sees for a ref.
    pub fn ref_type(&self, r: RefId) -> TensorType {
        self.refs[r.0 as usize].kernel_type()
    }

    /// The type of a value built so far.
    pub fn type_of(&self, v: Value) -> &TensorType {
        &self.value_types[v.0 as usize]
    }

    fn new_value(&mut self, ty: TensorType) -> Value {
        self.value_types.push(ty);
        Value(self.value_types.len() as u32 - 1)
    }

    /// Appends an op whose result types follow from its operands (or are `declared`).
    fn push(&mut self, kind: OpKind, declared: Vec<TensorType>) -> Vec<Value> {
        let types = match infer(self, &kind, &declared, self.grid.len()) {
            Ok(types) => types,
            Err(message) => {
                let op = match &self.location {
                    Some(loc) => format!("{} at {loc}", kind.mnemonic()),
                    None => format!("{} (op #{} built)", kind.mnemonic(), self.op_count()),
                };
                self.first_error.get_or_insert(VerifyError { op, message });
                if declared.is_empty() {
                    vec![TensorType::scalar(DType::F32); expected_results(&kind)]
                } else {
                    declared
                }
            }
        };
        let results: Vec<Value> = types.into_iter().map(|t| self.new_value(t)).collect();
        self.current().ops.push(Op {
            results: results.clone(),
            kind,
        });
        results
    }

    fn push_one(&mut self, kind: OpKind, declared: Vec<TensorType>) -> Value {
        self.push(kind, declared)[0]
    }

    fn current(&mut self) -> &mut Region {
        self.regions
            .last_mut()
            .expect("the body region is always open")
    }

    fn op_count(&self) -> usize {
        self.regions.iter().map(|r| r.ops.len()).sum()
    }

    /// This program's index along `axis`.
    pub fn program_id(&mut self, axis: usize) -> Value {
        self.push_one(OpKind::ProgramId { axis }, vec![])
    }

    /// The grid size along `axis`.
    pub fn num_programs(&mut self, axis: usize) -> Value {
        self.push_one(OpKind::NumPrograms { axis }, vec![])
    }

    /// A literal splatted to `ty`.
    pub fn constant(&mut self, value: Literal, ty: TensorType) -> Value {
        self.push_one(OpKind::Constant { value }, vec![ty])
    }

    /// An i32 scalar constant.
    pub fn index_const(&mut self, value: i64) -> Value {
        self.constant(Literal::Int(value), TensorType::scalar(DType::I32))
    }

    /// Positions along `dim` of an i32 tensor of type `ty`.
    pub fn iota(&mut self, ty: TensorType, dim: usize) -> Value {
        self.push_one(OpKind::Iota { dim }, vec![ty])
    }

    /// Loads a window of `src`.
    pub fn load(
        &mut self,
        src: RefId,
        index: Vec<Index>,
        mask: Option<Value>,
        other: Option<Value>,
    ) -> Value {
        self.push_one(
            OpKind::Load {
                src,
                index,
                mask,
                other,
            },
            vec![],
        )
    }

    /// Stores `value` into a window of `dst`.
    pub fn store(&mut self, dst: RefId, index: Vec<Index>, value: Value, mask: Option<Value>) {
        self.push(
            OpKind::Store {
                dst,
                index,
                value,
                mask,
            },
            vec![],
        );
    }

    /// Prints `message` and `values` with the program id (on the interpreter and native).
    pub fn debug_print(&mut self, message: impl Into<String>, values: Vec<Value>) {
        let message = message.into();
        self.push(OpKind::DebugPrint { message, values }, vec![]);
    }

    /// Fails the run (as `kind`) with `message` and `values` when an element of the bool
    /// tensor `cond` is false (on the interpreter and native).
    pub fn check(
        &mut self,
        kind: CheckKind,
        cond: Value,
        message: impl Into<String>,
        values: Vec<Value>,
    ) {
        let message = message.into();
        self.push(
            OpKind::Check {
                kind,
                cond,
                message,
                values,
            },
            vec![],
        );
    }

    /// Broadcasts `x` into `shape`, operand dim `i` going to result dim `dims[i]`.
    pub fn broadcast(&mut self, x: Value, dims: Vec<usize>, shape: Vec<u64>) -> Value {
        let ty = TensorType::new(self.type_of(x).dtype, shape);
        self.push_one(OpKind::Broadcast { x, dims }, vec![ty])
    }

    /// Reshapes `x` to `shape`.
    pub fn reshape(&mut self, x: Value, shape: Vec<u64>) -> Value {
        let ty = TensorType::new(self.type_of(x).dtype, shape);
        self.push_one(OpKind::Reshape { x }, vec![ty])
    }

    /// Permutes the dims of `x`.
    pub fn transpose(&mut self, x: Value, perm: Vec<usize>) -> Value {
        self.push_one(OpKind::Transpose { x, perm }, vec![])
    }

    /// `x`'s elements at `indices` (i32) along `axis` (NumPy `take_along_axis`; indices
    /// are clamped into range).
    pub fn gather(&mut self, x: Value, indices: Value, axis: usize) -> Value {
        self.push_one(OpKind::Gather { x, indices, axis }, vec![])
    }

    /// An element-wise unary op.
    pub fn unary(&mut self, op: UnaryOp, x: Value) -> Value {
        self.push_one(OpKind::Unary { op, x }, vec![])
    }

    /// An element-wise binary op on equal types.
    pub fn binary(&mut self, op: BinaryOp, lhs: Value, rhs: Value) -> Value {
        self.push_one(OpKind::Binary { op, lhs, rhs }, vec![])
    }

    /// An element-wise comparison.
    pub fn compare(&mut self, pred: CmpPred, lhs: Value, rhs: Value) -> Value {
        self.push_one(OpKind::Compare { pred, lhs, rhs }, vec![])
    }

    /// Element-wise `cond ? on_true : on_false`.
    pub fn select(&mut self, cond: Value, on_true: Value, on_false: Value) -> Value {
        self.push_one(
            OpKind::Select {
                cond,
                on_true,
                on_false,
            },
            vec![],
        )
    }

    /// Converts `x` to `dtype`.
    pub fn cast(&mut self, x: Value, dtype: DType) -> Value {
        let ty = self.type_of(x).with_dtype(dtype);
        self.push_one(OpKind::Cast { x }, vec![ty])
    }

    /// Reduces `x` over `axes`.
    pub fn reduce(&mut self, op: ReduceOp, x: Value, axes: Vec<usize>) -> Value {
        self.push_one(OpKind::Reduce { op, x, axes }, vec![])
    }

    /// Matrix product with optional transposes.
    pub fn dot(
        &mut self,
        lhs: Value,
        rhs: Value,
        transpose_lhs: bool,
        transpose_rhs: bool,
    ) -> Value {
        self.push_one(
            OpKind::Dot {
                lhs,
                rhs,
                transpose_lhs,
                transpose_rhs,
            },
            vec![],
        )
    }

    /// Opens a `for` loop from `lower` to `upper` (exclusive) by `step`, carrying
    /// `inits`. Returns the induction variable and the carried values as seen in the
    /// body; close it with [`KernelBuilder::end_for`].
    pub fn begin_for(
        &mut self,
        lower: Value,
        upper: Value,
        step: Value,
        inits: &[Value],
    ) -> (Value, Vec<Value>) {
        let iv = self.new_value(TensorType::scalar(DType::I32));
        let carried: Vec<Value> = inits
            .iter()
            .map(|&v| {
                let t = self.type_of(v).clone();
                self.new_value(t)
            })
            .collect();
        let mut args = vec![iv];
        args.extend(&carried);
        self.regions.push(Region { args, ops: vec![] });
        self.open.push(Open::For {
            lower,
            upper,
            step,
            inits: inits.to_vec(),
        });
        (iv, carried)
    }

    /// Closes the innermost `for` with the next carried values; returns the loop results.
    pub fn end_for(&mut self, next: Vec<Value>) -> Vec<Value> {
        let body = self.close_region(next);
        match self.open.pop() {
            Some(Open::For {
                lower,
                upper,
                step,
                inits,
            }) => self.push(
                OpKind::For {
                    lower,
                    upper,
                    step,
                    inits,
                    body,
                },
                vec![],
            ),
            other => self.misnested("end_for", other),
        }
    }

    /// Opens an `if` on a bool scalar; the then-branch comes first, then
    /// [`KernelBuilder::begin_else`], then [`KernelBuilder::end_if`].
    pub fn begin_if(&mut self, cond: Value) {
        self.regions.push(Region::default());
        self.open.push(Open::Then { cond });
    }

    /// Ends the then-branch with the values it yields and opens the else-branch.
    pub fn begin_else(&mut self, then_values: Vec<Value>) {
        let then_region = self.close_region(then_values);
        match self.open.pop() {
            Some(Open::Then { cond }) => {
                self.regions.push(Region::default());
                self.open.push(Open::Else { cond, then_region });
            }
            other => {
                self.misnested("begin_else", other);
            }
        }
    }

    /// Ends the else-branch; returns the results (the yielded values of the branches).
    pub fn end_if(&mut self, else_values: Vec<Value>) -> Vec<Value> {
        let else_region = self.close_region(else_values);
        match self.open.pop() {
            Some(Open::Else { cond, then_region }) => {
                let types: Vec<TensorType> = yielded(&then_region)
                    .iter()
                    .map(|&v| self.type_of(v).clone())
                    .collect();
                self.push(
                    OpKind::If {
                        cond,
                        then_region,
                        else_region,
                    },
                    types,
                )
            }
            other => self.misnested("end_if", other),
        }
    }

    fn close_region(&mut self, values: Vec<Value>) -> Region {
        self.current().ops.push(Op {
            results: vec![],
            kind: OpKind::Yield { values },
        });
        if self.regions.len() > 1 {
            self.regions.pop().expect("checked above")
        } else {
            Region::default()
        }
    }

    fn misnested(&mut self, what: &str, found: Option<Open>) -> Vec<Value> {
        self.first_error.get_or_insert(VerifyError {
            op: what.to_string(),
            message: format!("regions are not properly nested (innermost open: {found:?})"),
        });
        vec![]
    }

    /// A `for` loop built by a closure: `body` gets the induction variable and the
    /// carried values and returns the next carried values; returns the final ones.
    pub fn for_loop(
        &mut self,
        lower: Value,
        upper: Value,
        step: Value,
        inits: &[Value],
        body: impl FnOnce(&mut Self, Value, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        let (iv, carried) = self.begin_for(lower, upper, step, inits);
        let next = body(self, iv, &carried);
        self.end_for(next)
    }

    /// An `if` built by closures; both branches return values of the same types, which
    /// become the results.
    pub fn if_else(
        &mut self,
        cond: Value,
        then_branch: impl FnOnce(&mut Self) -> Vec<Value>,
        else_branch: impl FnOnce(&mut Self) -> Vec<Value>,
    ) -> Vec<Value> {
        self.begin_if(cond);
        let then_values = then_branch(self);
        self.begin_else(then_values);
        let else_values = else_branch(self);
        self.end_if(else_values)
    }

    /// Names the source location that the next ops come from (used in error messages).
    pub fn set_location(&mut self, location: Option<String>) {
        self.location = location;
    }

    /// Records an error found while tracing a kernel (the first one wins).
    pub fn report(&mut self, op: impl Into<String>, message: impl Into<String>) {
        let op = match &self.location {
            Some(loc) => format!("{} at {loc}", op.into()),
            None => op.into(),
        };
        self.first_error.get_or_insert(VerifyError {
            op,
            message: message.into(),
        });
    }

    /// Renames the kernel.
    pub fn set_name(&mut self, name: impl Into<String>) {
        self.name = name.into();
    }

    /// Renames a ref (the `#[kernel]` macro names refs after the function's parameters).
    pub fn rename_ref(&mut self, r: RefId, name: impl Into<String>) {
        if let Some(decl) = self.refs.get_mut(r.0 as usize) {
            decl.name = name.into();
        }
    }

    /// Number of declared refs.
    pub fn num_refs(&self) -> usize {
        self.refs.len()
    }

    /// Closes the kernel and verifies it.
    pub fn finish(mut self) -> Result<Kernel, VerifyError> {
        if let Some(e) = self.first_error.take() {
            return Err(e);
        }
        if !self.open.is_empty() {
            return Err(VerifyError {
                op: format!("kernel @{}", self.name),
                message: format!("{} regions were opened but not closed", self.open.len()),
            });
        }
        remove_dead_ops(&mut self.regions[0]);
        let kernel = Kernel {
            name: self.name,
            grid: self.grid,
            dimension_semantics: self.dimension_semantics,
            refs: self.refs,
            body: self.regions.pop().expect("the body region"),
            value_types: self.value_types,
        };
        verify(&kernel)?;
        Ok(kernel)
    }
}

/// Removes ops without side effects whose results are never used (tracing leaves some
/// behind, e.g. index constants of a path not taken), until none is left.
fn remove_dead_ops(body: &mut Region) {
    fn count_uses(region: &Region, uses: &mut std::collections::HashMap<Value, usize>) {
        region.walk(&mut |op| {
            for v in op.kind.operands() {
                *uses.entry(v).or_default() += 1;
            }
        });
    }
    fn sweep(region: &mut Region, uses: &std::collections::HashMap<Value, usize>) -> bool {
        let before = region.ops.len();
        region
            .ops
            .retain(|op| !op.kind.is_pure() || op.results.iter().any(|r| uses.contains_key(r)));
        let mut changed = region.ops.len() != before;
        for op in &mut region.ops {
            for nested in op.kind.regions_mut() {
                changed |= sweep(nested, uses);
            }
        }
        changed
    }
    loop {
        let mut uses = std::collections::HashMap::new();
        count_uses(body, &mut uses);
        if !sweep(body, &uses) {
            return;
        }
    }
}

fn yielded(region: &Region) -> &[Value] {
    match region.ops.last() {
        Some(Op {
            kind: OpKind::Yield { values },
            ..
        }) => values,
        _ => &[],
    }
}

fn expected_results(kind: &OpKind) -> usize {
    match kind {
        OpKind::Store { .. }
        | OpKind::Yield { .. }
        | OpKind::DebugPrint { .. }
        | OpKind::Check { .. } => 0,
        OpKind::For { inits, .. } => inits.len(),
        _ => 1,
    }
}
