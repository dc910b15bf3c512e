//! Library ops run natively on arrays reused across calls, as the torch ops run them on
//! PyTorch's tensors: what `tessera bench` and `tessera demo` time where they can. The
//! steps run on [`runtime::native::ChainRun`], the executor the torch ops use.

use std::ffi::c_void;

use kernel_ir::{Array, TensorType};
use kernels::{BoxError, Chain, LibraryKernel, Params, Source, Step};
use runtime::native::{ChainRun, NativeArray, Prepared};
use runtime::Backend;

/// An op's chain of kernels compiled for in-place runs on its inputs, which it holds in
/// the native layout (bf16/f16 in 2 bytes, as tensors hold them), with the op's outputs
/// allocated once. A call derives the op's host arrays (varlen's tile plan) from the
/// inputs the chain reads and runs the steps on the inputs' storage and the reused
/// outputs.
pub(crate) struct InPlaceOp<'k> {
    op: &'k dyn LibraryKernel,
    params: Params,
    chain: Chain,
    /// The op's kernels by build position, compiled.
    kernels: Vec<Option<Prepared>>,
    /// The inputs [`Chain::reads`] names, in order (what `derive` takes).
    read: Vec<Array>,
    inputs: Vec<NativeArray>,
    outputs: Vec<NativeArray>,
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
        let built = op.build(params).ok()?;
        let native = runtime::native::backend();
        let kernels: Vec<Option<Prepared>> = built.iter().map(|k| native.prepare(k).ok()).collect();
        let chain = match op.chain(params, inputs.len()) {
            Some(chain) => chain,
            None => single_kernel_chain(kernels.first()?.as_ref()?, inputs.len())?,
        };
        let outputs = chain
            .outputs
            .iter()
            .map(|s| match *s {
                Source::Output { step, index } => {
                    let kernel = chain.steps.get(step)?.kernel;
                    let ty = kernels.get(kernel)?.as_ref()?.output_types().get(index)?;
                    NativeArray::zeros(ty.clone(), "an in-place output").ok()
                }
                Source::Input(_) | Source::Derived(_) => None,
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
            kernels,
            read,
            inputs,
            outputs,
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
        let types = |arrays: &[NativeArray]| -> Vec<TensorType> {
            arrays.iter().map(|a| a.ty().clone()).collect()
        };
        let run = ChainRun::new(
            &self.chain,
            &self.kernels,
            &types(&self.inputs),
            &types(&derived),
            &types(&self.outputs),
        )
        .ok_or("the op's chain does not fit its arrays")?;
        let addresses = |arrays: &[NativeArray]| -> Vec<*const c_void> {
            arrays.iter().map(NativeArray::as_ptr).collect()
        };
        let outputs: Vec<*mut c_void> = self
            .outputs
            .iter_mut()
            .map(NativeArray::as_mut_ptr)
            .collect();
        let name = self.op.name();
        // SAFETY: the arrays are live and of the types `ChainRun::new` checked; the
        // outputs are this op's own arrays, which no input aliases.
        unsafe {
            run.run(
                &addresses(&self.inputs),
                &addresses(&derived),
                &outputs,
                &|| name.to_string(),
            )
        }?;
        Ok(())
    }
}

/// The chain of a single-kernel op: its inputs in, every output out.
fn single_kernel_chain(kernel: &Prepared, inputs: usize) -> Option<Chain> {
    (kernel.input_types().len() == inputs).then(|| Chain {
        reads: Vec::new(),
        steps: vec![Step {
            kernel: 0,
            inputs: (0..inputs).map(Source::Input).collect(),
        }],
        outputs: (0..kernel.output_types().len())
            .map(|index| Source::output(0, index))
            .collect(),
    })
}
