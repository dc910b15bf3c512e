//! An op's kernels run one after another on the caller's storage (a
//! [`kernel_ir::chain::Chain`]): the one executor the torch ops and `tessera bench` share.
//! Each step reads op inputs, arrays the op derived on the host, or earlier steps'
//! outputs; the op's outputs are written where the caller says, and intermediates live in
//! host memory for the call.

use std::ffi::c_void;

use kernel_ir::chain::{Chain, Source};
use kernel_ir::{try_with_capacity, RunError, TensorType};

use super::Prepared;

/// A chain checked against its compiled kernels and the types of the arrays it runs on.
pub struct ChainRun<'c> {
    chain: &'c Chain,
    /// Each step's compiled kernel.
    steps: Vec<&'c Prepared>,
    /// For each step, for each of its outputs, the op output it is (if any).
    op_outputs: Vec<Vec<Option<usize>>>,
}

impl<'c> ChainRun<'c> {
    /// The chain over `kernels` (the op's kernels by build position; `None` where one
    /// cannot run in place) for op inputs, derived arrays and op outputs of these types.
    /// `None` when a step's kernel is missing, a source does not exist when its step
    /// runs, an op output is not a step's output, or an array is not of the type its
    /// step takes.
    pub fn new(
        chain: &'c Chain,
        kernels: &'c [Option<Prepared>],
        inputs: &[TensorType],
        derived: &[TensorType],
        outputs: &[TensorType],
    ) -> Option<ChainRun<'c>> {
        if chain.outputs.len() != outputs.len() {
            return None;
        }
        let steps = chain
            .steps
            .iter()
            .map(|s| kernels.get(s.kernel)?.as_ref())
            .collect::<Option<Vec<&Prepared>>>()?;
        let mut op_outputs = Vec::with_capacity(steps.len());
        for (at, (step, compiled)) in chain.steps.iter().zip(&steps).enumerate() {
            let in_types = compiled.input_types();
            if step.inputs.len() != in_types.len() {
                return None;
            }
            for (source, want) in step.inputs.iter().zip(in_types) {
                let got = match *source {
                    Source::Input(i) => inputs.get(i),
                    Source::Derived(i) => derived.get(i),
                    // Only an earlier step's output exists when this one runs.
                    Source::Output { step, index } if step < at => {
                        steps[step].output_types().get(index)
                    }
                    Source::Output { .. } => None,
                };
                if got != Some(want) {
                    return None;
                }
            }
            let outs: Vec<Option<usize>> = (0..compiled.output_types().len())
                .map(|index| {
                    let out = Source::Output { step: at, index };
                    chain.outputs.iter().position(|s| *s == out)
                })
                .collect();
            for (to, t) in outs.iter().zip(compiled.output_types()) {
                if to.is_some_and(|o| outputs[o] != *t) {
                    return None;
                }
            }
            op_outputs.push(outs);
        }
        // Every op output is some step's output, so nothing is left unwritten.
        let produced = |o: usize| op_outputs.iter().flatten().any(|to| *to == Some(o));
        (0..outputs.len()).all(produced).then_some(ChainRun {
            chain,
            steps,
            op_outputs,
        })
    }

    /// Runs the steps in order on the arrays at these addresses (of the types given to
    /// [`ChainRun::new`]); intermediate outputs are allocated for the call. `context`
    /// names the call in an allocation error.
    ///
    /// # Safety
    /// The addresses are live, contiguous arrays of their types; the outputs' are fresh
    /// storage that no input aliases.
    pub unsafe fn run(
        &self,
        inputs: &[*const c_void],
        derived: &[*const c_void],
        outputs: &[*mut c_void],
        context: &dyn Fn() -> String,
    ) -> Result<(), crate::Error> {
        let mut produced: Vec<Vec<*mut c_void>> = Vec::with_capacity(self.steps.len());
        // Intermediates: whole words of 4 bytes (f32, i32), 2 (bf16, f16) or 1 (bool).
        let mut scratch: Vec<Vec<u32>> = Vec::new();
        for ((step, compiled), outs) in self
            .chain
            .steps
            .iter()
            .zip(&self.steps)
            .zip(&self.op_outputs)
        {
            let ins = step
                .inputs
                .iter()
                .map(|s| match *s {
                    Source::Input(i) => inputs[i],
                    Source::Derived(i) => derived[i],
                    Source::Output { step, index } => produced[step][index] as *const c_void,
                })
                .collect::<Vec<_>>();
            let mut step_outs = Vec::with_capacity(outs.len());
            for (to, t) in outs.iter().zip(compiled.output_types()) {
                step_outs.push(match to {
                    Some(o) => outputs[*o],
                    None => {
                        let words = t.byte_size().unwrap_or(u64::MAX).div_ceil(4);
                        let mut w = try_with_capacity::<u32>(
                            || format!("{}: an intermediate array", context()),
                            words,
                        )
                        .map_err(RunError::Alloc)?;
                        w.resize(words as usize, 0);
                        let addr = w.as_mut_ptr() as *mut c_void;
                        scratch.push(w);
                        addr
                    }
                });
            }
            // SAFETY: the caller's guarantee for inputs and outputs; the intermediates
            // are allocated above at their types' sizes (checked in `new`).
            unsafe { compiled.run_in_place(&ins, &step_outs)? };
            produced.push(step_outs);
        }
        Ok(())
    }
}
