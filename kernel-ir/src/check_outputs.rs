//! Checks as outputs, for backends that cannot stop a run (XLA): each `check` becomes
//! stores into outputs added for it — the flat index + 1 of the first program whose
//! condition fails (0 while none has), and the values it reports, from that program —
//! and after the run [`CheckOutputs::finish`] turns what they hold into the failure the
//! interpreter reports, or returns the kernel's own outputs.

use crate::array::Array;
use crate::ir::{
    BinaryOp, BlockDim, BlockSpec, CheckKind, CmpPred, Index, IndexExpr, IndexMap, Kernel, Literal,
    Op, OpKind, ReduceOp, RefDecl, RefId, RefKind, Region, Value,
};
use crate::ops::{format_debug_print, CheckFailure};
use crate::types::{DType, TensorType};
use crate::verify::unflatten;

/// A kernel whose checks are outputs.
pub struct CheckOutputs {
    /// The kernel with every check replaced by stores into its outputs (after the
    /// original ones).
    pub kernel: Kernel,
    /// How many outputs the original kernel has.
    pub outputs: usize,
    sites: Vec<Site>,
}

/// One check: what it reports, and the types of the values whose outputs follow its
/// status output (scalars are stored as one-element arrays).
struct Site {
    kind: CheckKind,
    message: String,
    values: Vec<TensorType>,
}

impl CheckOutputs {
    /// `kernel` with its checks as outputs; `None` when it has no checks.
    pub fn new(kernel: &Kernel) -> Option<CheckOutputs> {
        let mut any = false;
        kernel
            .body
            .walk(&mut |op| any |= matches!(op.kind, OpKind::Check { .. }));
        if !any {
            return None;
        }
        let outputs = kernel.output_types().len();
        let first_scratch = kernel
            .refs
            .iter()
            .position(|r| r.kind == RefKind::Scratch)
            .unwrap_or(kernel.refs.len());
        // The added outputs go before the scratch refs, whose ids move up by their count.
        let mut added = 0;
        kernel.body.walk(&mut |op| {
            if let OpKind::Check { values, .. } = &op.kind {
                added += 1 + values.len() as u32;
            }
        });
        let mut kernel = kernel.clone();
        shift_refs(&mut kernel.body, first_scratch as u32, added);
        let mut rewrite = Rewrite {
            kernel,
            next_ref: first_scratch,
            added: Vec::new(),
            sites: Vec::new(),
        };
        let mut body = std::mem::take(&mut rewrite.kernel.body);
        rewrite.region(&mut body);
        rewrite.kernel.body = body;
        let mut refs = rewrite.kernel.refs;
        let scratch = refs.split_off(first_scratch);
        refs.extend(rewrite.added);
        refs.extend(scratch);
        rewrite.kernel.refs = refs;
        Some(CheckOutputs {
            kernel: rewrite.kernel,
            outputs,
            sites: rewrite.sites,
        })
    }

    /// The original kernel's outputs, or the failure of the first program (grid order;
    /// then the earliest check) whose condition failed, as the interpreter words it.
    pub fn finish(&self, mut outputs: Vec<Array>) -> Result<Vec<Array>, CheckFailure> {
        let recorded = outputs.split_off(self.outputs);
        let mut at = 0;
        let mut first: Option<(i64, &Site, &[Array])> = None;
        for site in &self.sites {
            let status = recorded[at].to_f64()[0] as i64;
            let values = &recorded[at + 1..at + 1 + site.values.len()];
            if status > 0 && first.is_none_or(|(s, ..)| status < s) {
                first = Some((status, site, values));
            }
            at += 1 + site.values.len();
        }
        let Some((status, site, values)) = first else {
            return Ok(outputs);
        };
        let program = unflatten(status as u64 - 1, &self.kernel.grid);
        let values: Vec<Array> = values
            .iter()
            .zip(&site.values)
            .map(|(a, ty)| Array::from_parts(ty.clone(), a.data().clone()))
            .collect();
        let values: Vec<&Array> = values.iter().collect();
        Err(CheckFailure {
            kind: site.kind,
            line: format_debug_print(&site.message, &program, &values),
            program,
        })
    }
}

/// Moves the ids of refs from `first` on up by `by`, in loads and stores.
fn shift_refs(region: &mut Region, first: u32, by: u32) {
    for op in &mut region.ops {
        match &mut op.kind {
            OpKind::Load { src: r, .. } | OpKind::Store { dst: r, .. } if r.0 >= first => r.0 += by,
            _ => {}
        }
        for r in op.kind.regions_mut() {
            shift_refs(r, first, by);
        }
    }
}

/// The state of the rewrite: the kernel being changed and the outputs added so far.
struct Rewrite {
    kernel: Kernel,
    /// The id the next added output gets.
    next_ref: usize,
    added: Vec<RefDecl>,
    sites: Vec<Site>,
}

impl Rewrite {
    fn region(&mut self, region: &mut Region) {
        let mut ops = Vec::with_capacity(region.ops.len());
        for mut op in std::mem::take(&mut region.ops) {
            for r in op.kind.regions_mut() {
                self.region(r);
            }
            match op.kind {
                OpKind::Check {
                    kind,
                    cond,
                    message,
                    values,
                } => self.check(&mut ops, kind, cond, message, &values),
                _ => ops.push(op),
            }
        }
        region.ops = ops;
    }

    /// A new value of type `ty` defined by `kind`, appended to `ops`.
    fn push(&mut self, ops: &mut Vec<Op>, kind: OpKind, ty: TensorType) -> Value {
        let v = Value(self.kernel.value_types.len() as u32);
        self.kernel.value_types.push(ty);
        ops.push(Op {
            results: vec![v],
            kind,
        });
        v
    }

    /// A whole-array output of `ty`, the same block for every program.
    fn output(&mut self, name: String, ty: TensorType) -> RefId {
        let block = BlockSpec::new(
            ty.shape.iter().map(|&n| BlockDim::Size(n)).collect(),
            IndexMap {
                exprs: ty.shape.iter().map(|_| IndexExpr::Const(0)).collect(),
            },
        );
        self.added.push(RefDecl {
            name,
            kind: RefKind::Output,
            ty,
            block: Some(block),
            memory_space: crate::ir::MemorySpace::Vmem,
        });
        self.next_ref += 1;
        RefId(self.next_ref as u32 - 1)
    }

    /// The ops standing for one check: is any element of `cond` false, and is this the
    /// first program to fail it; if so, record the program and the values.
    fn check(
        &mut self,
        ops: &mut Vec<Op>,
        kind: CheckKind,
        cond: Value,
        message: String,
        values: &[Value],
    ) {
        let site = self.sites.len();
        let scalar = |d| TensorType::scalar(d);
        let one = |d| TensorType::new(d, [1]);
        let int = |e: &mut Self, ops: &mut Vec<Op>, v: i64| {
            e.push(
                ops,
                OpKind::Constant {
                    value: Literal::Int(v),
                },
                scalar(DType::I32),
            )
        };
        let cond_ty = self.kernel.type_of(cond).clone();
        let as_int = self.push(
            ops,
            OpKind::Cast { x: cond },
            TensorType::new(DType::I32, cond_ty.shape.clone()),
        );
        let least = if cond_ty.is_scalar() {
            as_int
        } else {
            let axes = (0..cond_ty.rank()).collect();
            let reduce = OpKind::Reduce {
                op: ReduceOp::Min,
                x: as_int,
                axes,
            };
            self.push(ops, reduce, scalar(DType::I32))
        };
        let zero = int(self, ops, 0);
        let compare = |pred, lhs, rhs| OpKind::Compare { pred, lhs, rhs };
        let failed = self.push(ops, compare(CmpPred::Eq, least, zero), scalar(DType::Bool));
        let status = self.output(format!("tessera_check{site}_status"), one(DType::I32));
        let full = |rank| vec![Index::Full; rank];
        let load = OpKind::Load {
            src: status,
            index: full(1),
            mask: None,
            other: None,
        };
        let seen = self.push(ops, load, one(DType::I32));
        let seen = self.push(ops, OpKind::Reshape { x: seen }, scalar(DType::I32));
        let fresh = self.push(ops, compare(CmpPred::Eq, seen, zero), scalar(DType::Bool));
        let and = OpKind::Binary {
            op: BinaryOp::And,
            lhs: failed,
            rhs: fresh,
        };
        let first = self.push(ops, and, scalar(DType::Bool));
        // The flat program index, plus one.
        let mut flat = int(self, ops, 1);
        for axis in 0..self.kernel.grid.len() {
            let stride: u64 = self.kernel.grid[axis + 1..].iter().product();
            let pid = self.push(ops, OpKind::ProgramId { axis }, scalar(DType::I32));
            let stride = int(self, ops, stride as i64);
            let mul = OpKind::Binary {
                op: BinaryOp::Mul,
                lhs: pid,
                rhs: stride,
            };
            let term = self.push(ops, mul, scalar(DType::I32));
            let add = OpKind::Binary {
                op: BinaryOp::Add,
                lhs: flat,
                rhs: term,
            };
            flat = self.push(ops, add, scalar(DType::I32));
        }
        let flat = self.push(ops, OpKind::Reshape { x: flat }, one(DType::I32));
        let mask = self.push(ops, OpKind::Reshape { x: first }, one(DType::Bool));
        ops.push(Op {
            results: vec![],
            kind: OpKind::Store {
                dst: status,
                index: full(1),
                value: flat,
                mask: Some(mask),
            },
        });
        for (j, &v) in values.iter().enumerate() {
            let ty = self.kernel.type_of(v).clone();
            let (value, mask) = if ty.is_scalar() {
                let value = self.push(ops, OpKind::Reshape { x: v }, one(ty.dtype));
                (value, mask)
            } else {
                let dims = vec![];
                let bool_ty = TensorType::new(DType::Bool, ty.shape.clone());
                let mask = self.push(ops, OpKind::Broadcast { x: first, dims }, bool_ty);
                (v, mask)
            };
            let out_ty = self.kernel.type_of(value).clone();
            let rank = out_ty.rank();
            let dst = self.output(format!("tessera_check{site}_value{j}"), out_ty);
            ops.push(Op {
                results: vec![],
                kind: OpKind::Store {
                    dst,
                    index: full(rank),
                    value,
                    mask: Some(mask),
                },
            });
        }
        self.sites.push(Site {
            kind,
            message,
            values: values
                .iter()
                .map(|&v| self.kernel.type_of(v).clone())
                .collect(),
        });
    }
}
