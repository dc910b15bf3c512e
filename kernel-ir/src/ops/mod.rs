//! The op families. Each file owns a group of [`OpKind`] variants: the traits they
//! declare (pure, element-wise, regions), their type rule and — for the value families —
//! their interpreter rule. Every lowering is split into the same families, so one op's
//! meaning is found by family name in each crate.
//!
//! | family | ops | interpreter rule |
//! |---|---|---|
//! | [`source`](OpFamily::Source) | `program_id`, `num_programs`, `const`, `iota` | here |
//! | [`elementwise`](OpFamily::Elementwise) | unary, binary, `cmp`, `select`, `cast` | here |
//! | [`layout`](OpFamily::Layout) | `broadcast`, `reshape`, `transpose`, `gather` | here |
//! | [`reduce`](OpFamily::Reduce) | `reduce_sum`, `reduce_max`, `reduce_min` | here |
//! | [`dot`](OpFamily::Dot) | `dot` | here |
//! | [`memory`](OpFamily::Memory) | `load`, `store` | the [`WindowDim`] plan here; `interp/window.rs` reads and writes it |
//! | [`control`](OpFamily::Control) | `for`, `if`, `yield` | the interpreter's region loop |
//! | [`debug`](OpFamily::Debug) | `debug_print`, `check`, `check_index` | the formatting here; the interpreter prints and fails |

mod control;
mod debug;
mod dot;
mod elementwise;
mod layout;
mod memory;
mod reduce;
mod source;

use std::rc::Rc;

use crate::array::Array;
use crate::ir::{Kernel, OpKind, RefDecl, RefId, Value};
use crate::types::{DType, TensorType};

pub use debug::{format_debug_print, CheckFailure, DEBUG_PRINT_ELEMENTS};
pub use dot::accumulator_dtype;
pub use elementwise::{floor_div, floor_rem};
pub use memory::{window_plan, WindowDim, WindowStart};

/// The families of ops. Every backend lowers each family in its own file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpFamily {
    /// Values from attributes and the grid: `program_id`, `num_programs`, `const`, `iota`.
    Source,
    /// Element-wise math, comparisons, `select`, `cast`.
    Elementwise,
    /// Elements moved, not computed: `broadcast`, `reshape`, `transpose`, `gather`.
    Layout,
    /// Reductions over axes.
    Reduce,
    /// Matrix products.
    Dot,
    /// Loads and stores of ref windows.
    Memory,
    /// `for`, `if` and the `yield` that ends their regions.
    Control,
    /// `debug_print` and `check`: output for the developer and checks of the data, no
    /// effect on the results.
    Debug,
}

/// What an op declares about itself; other code asks these instead of listing ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpTraits {
    /// The op's only effect is its results: it may be removed when they are unused.
    pub pure: bool,
    /// Each result element depends only on the operands' elements at its position (all
    /// operands and the result share one shape).
    pub elementwise: bool,
    /// The op holds nested regions.
    pub has_regions: bool,
}

impl OpTraits {
    /// A pure op that is not element-wise and has no regions.
    pub const PURE: OpTraits = OpTraits {
        pure: true,
        elementwise: false,
        has_regions: false,
    };
}

impl OpKind {
    /// The family that owns this op (the one place that lists which op is where).
    pub fn family(&self) -> OpFamily {
        match self {
            OpKind::ProgramId { .. }
            | OpKind::NumPrograms { .. }
            | OpKind::Constant { .. }
            | OpKind::Iota { .. } => OpFamily::Source,
            OpKind::Unary { .. }
            | OpKind::Binary { .. }
            | OpKind::Compare { .. }
            | OpKind::Select { .. }
            | OpKind::Cast { .. } => OpFamily::Elementwise,
            OpKind::Broadcast { .. }
            | OpKind::Reshape { .. }
            | OpKind::Transpose { .. }
            | OpKind::Gather { .. } => OpFamily::Layout,
            OpKind::Reduce { .. } => OpFamily::Reduce,
            OpKind::Dot { .. } => OpFamily::Dot,
            OpKind::Load { .. } | OpKind::Store { .. } => OpFamily::Memory,
            OpKind::For { .. } | OpKind::If { .. } | OpKind::Yield { .. } => OpFamily::Control,
            OpKind::DebugPrint { .. } | OpKind::Check { .. } => OpFamily::Debug,
        }
    }

    /// The traits this op declares, as its family states them.
    pub fn traits(&self) -> OpTraits {
        match self.family() {
            OpFamily::Source | OpFamily::Layout | OpFamily::Reduce | OpFamily::Dot => {
                OpTraits::PURE
            }
            OpFamily::Elementwise => elementwise::TRAITS,
            OpFamily::Memory => memory::traits(self),
            OpFamily::Control => control::traits(self),
            OpFamily::Debug => debug::TRAITS,
        }
    }

    /// True when the op may be removed when its results are unused (stores and control
    /// flow may not).
    pub fn is_pure(&self) -> bool {
        self.traits().pure
    }

    /// True for element-wise ops: unary and binary math, comparisons, `select`, casts.
    pub fn is_elementwise(&self) -> bool {
        self.traits().elementwise
    }
}

/// What an op's type rule needs to see: the types of values and the ref declarations.
pub(crate) trait TypeEnv {
    fn value_type(&self, v: Value) -> &TensorType;
    fn ref_decl(&self, r: RefId) -> Option<&RefDecl>;
}

impl TypeEnv for Kernel {
    fn value_type(&self, v: Value) -> &TensorType {
        self.type_of(v)
    }
    fn ref_decl(&self, r: RefId) -> Option<&RefDecl> {
        self.refs.get(r.0 as usize)
    }
}

/// The context of one type rule: value types, the types recorded for the op's results
/// (for ops whose result type is an attribute) and the grid rank.
struct TypeCx<'a> {
    env: &'a dyn TypeEnv,
    declared: &'a [TensorType],
    grid_rank: usize,
}

impl TypeCx<'_> {
    fn ty(&self, v: Value) -> TensorType {
        self.env.value_type(v).clone()
    }

    /// The single declared result type.
    fn declared_one(&self) -> Result<TensorType, String> {
        match self.declared {
            [t] => Ok(t.clone()),
            _ => Err(format!(
                "must have exactly one result, found {}",
                self.declared.len()
            )),
        }
    }

    /// Checks that `v` is an i32 scalar (an index, a loop bound).
    fn expect_index_scalar(&self, v: Value, what: &str) -> Result<(), String> {
        let ty = self.env.value_type(v);
        if *ty != TensorType::scalar(DType::I32) {
            return Err(format!("{what} has type {ty}, expected i32"));
        }
        Ok(())
    }
}

/// The result types of `op`, or why its operands are ill-typed, by its family's type
/// rule. Ops whose result type is an attribute (`const`, `iota`, `broadcast`, `reshape`,
/// `cast`, `if`) are checked against `declared`, the types recorded for their results.
pub(crate) fn infer(
    env: &dyn TypeEnv,
    op: &OpKind,
    declared: &[TensorType],
    grid_rank: usize,
) -> Result<Vec<TensorType>, String> {
    let cx = TypeCx {
        env,
        declared,
        grid_rank,
    };
    match op.family() {
        OpFamily::Source => source::infer(&cx, op),
        OpFamily::Elementwise => elementwise::infer(&cx, op),
        OpFamily::Layout => layout::infer(&cx, op),
        OpFamily::Reduce => reduce::infer(&cx, op),
        OpFamily::Dot => dot::infer(&cx, op),
        OpFamily::Memory => memory::infer(&cx, op),
        OpFamily::Control => control::infer(&cx, op),
        OpFamily::Debug => debug::infer(&cx, op),
    }
}

/// What a value op's interpreter rule sees.
pub(crate) struct EvalCx<'a> {
    /// The value of an operand.
    pub operand: &'a dyn Fn(Value) -> Rc<Array>,
    /// The type of the op's (single) result.
    pub result: &'a TensorType,
    /// The running program's ids.
    pub pids: &'a [u64],
    /// The grid.
    pub grid: &'a [u64],
}

/// Evaluates an op of a value family (not memory or control flow, which need the
/// interpreter's state) on whole arrays.
pub(crate) fn eval(op: &OpKind, cx: &EvalCx) -> Result<Array, String> {
    match op.family() {
        OpFamily::Source => Ok(source::eval(op, cx)),
        OpFamily::Elementwise => elementwise::eval(op, cx),
        OpFamily::Layout => Ok(layout::eval(op, cx)),
        OpFamily::Reduce => Ok(reduce::eval(op, cx)),
        OpFamily::Dot => Ok(dot::eval(op, cx)),
        OpFamily::Memory | OpFamily::Control | OpFamily::Debug => {
            unreachable!("`{}` is run by the interpreter itself", op.mnemonic())
        }
    }
}

/// Where a family rule was handed an op of another family (a bug in [`OpKind::family`]).
fn not_in_family(op: &OpKind, family: &str) -> ! {
    unreachable!("`{}` is not a {family} op", op.mnemonic())
}
