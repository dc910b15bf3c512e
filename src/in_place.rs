//! Library ops run natively on arrays reused across calls, as the torch ops run them on
//! PyTorch's tensors: what `tessera bench` and `tessera demo` time where they can.

use kernel_ir::Array;
use kernels::{BoxError, Chain, LibraryKernel, Params, Source, Step};
use runtime::native::{NativeArray, Prepared};
use runtime::Backend;

/// An op's chain of kernels compiled for in-place runs on its inputs, which it holds in
/// the native layout (bf16/f16 in 2 bytes, as tensors hold them), with each step's
/// outputs allocated once. A call derives the op's host arrays (varlen's tile plan) from
/// the inputs the chain reads and runs the steps on the inputs' storage and the reused
/// outputs.
pub(crate) struct InPlaceOp<'k> {
    op: &'k dyn LibraryKernel,
    params: Params,
    chain: Chain,
    /// The inputs [`Chain::reads`] names, in order (what `derive` takes).
    read: Vec<Array>,
    inputs: Vec<NativeArray>,
    steps: Vec<(Prepared, Vec<NativeArray>)>,
}

impl<'k> InPlaceOp<'k> {
    /// The op made ready for `inputs` on the backend that ran it (`used`): `None` unless
    /// that is the native backend, the op has a chain for these inputs (a single-kernel op
    /// is its own), every kernel compiles and one call succeeds.
    pub(crate) fn new(
        op: &'k dyn LibraryKernel,
        params: &Params,
        used: Backend,
        inputs: &[Array],
    ) -> Option<Self> {
        if used != Backend::Native {
            return None;
        }
        let kernels = op.build(params).ok()?;
        let chain = match op.chain(params, inputs.len()) {
            Some(chain) => chain,
            None if kernels.len() == 1 => Chain {
                reads: Vec::new(),
                steps: vec![Step {
                    kernel: 0,
                    inputs: (0..inputs.len()).map(Source::Input).collect(),
                }],
                outputs: Vec::new(),
            },
            None => return None,
        };
        let native = runtime::native::backend();
        let steps = chain
            .steps
            .iter()
            .map(|step| {
                let prepared = native.prepare(kernels.get(step.kernel)?).ok()?;
                let outputs = prepared
                    .output_types()
                    .iter()
                    .map(|t| NativeArray::zeros(t.clone(), "an in-place output").ok())
                    .collect::<Option<Vec<_>>>()?;
                Some((prepared, outputs))
            })
            .collect::<Option<Vec<_>>>()?;
        let read = chain
            .reads
            .iter()
            .map(|&i| inputs.get(i).cloned())
            .collect::<Option<_>>()?;
        let inputs = inputs
            .iter()
            .map(NativeArray::from_array)
            .collect::<Result<_, _>>()
            .ok()?;
        let mut op = InPlaceOp {
            op,
            params: params.clone(),
            chain,
            read,
            inputs,
            steps,
        };
        op.run().ok()?;
        Some(op)
    }

    /// One call: the derived arrays, then each step in place.
    pub(crate) fn run(&mut self) -> Result<(), BoxError> {
        let derived = self
            .op
            .derive(&self.params, &self.read)?
            .iter()
            .map(NativeArray::from_array)
            .collect::<Result<Vec<_>, _>>()?;
        for (at, step) in self.chain.steps.iter().enumerate() {
            let (done, rest) = self.steps.split_at_mut(at);
            let (prepared, outputs) = &mut rest[0];
            // Clones share the arrays' storage (dropped before the next step writes).
            let ins = step
                .inputs
                .iter()
                .map(|s| {
                    let output = |step: usize, index| done.get(step)?.1.get(index);
                    s.resolve(&self.inputs, &derived, output)
                        .cloned()
                        .ok_or_else(|| format!("the chain names {s:?}, which does not exist"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            prepared.run_on(&ins, outputs)?;
        }
        Ok(())
    }
}
