//! How an op's kernels feed each other, for executors that run them on the callers'
//! storage (`runtime::native::ChainRun`) instead of through the op's own `run`: which op
//! input, host-derived array or earlier kernel output each kernel reads, and where the
//! op's outputs come from. The library declares its ops' chains (`kernels::Op::chain`).

/// Where a kernel's input, or one of the op's outputs, comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The op's input at this position.
    Input(usize),
    /// Array `i` of those the op derives on the host before the chain runs (the library
    /// op's `derive`, from the inputs [`Chain::reads`] names).
    Derived(usize),
    /// Output `index` of the chain's step `step`.
    Output { step: usize, index: usize },
}

impl Source {
    /// Output `index` of chain step `step`.
    pub fn output(step: usize, index: usize) -> Source {
        Source::Output { step, index }
    }

    /// What this source names, for an executor holding the op's `inputs`, the `derived`
    /// arrays and the steps' outputs (`output(step, index)`); `None` when it has none
    /// such.
    pub fn resolve<'a, T>(
        self,
        inputs: &'a [T],
        derived: &'a [T],
        output: impl FnOnce(usize, usize) -> Option<&'a T>,
    ) -> Option<&'a T> {
        match self {
            Source::Input(i) => inputs.get(i),
            Source::Derived(i) => derived.get(i),
            Source::Output { step, index } => output(step, index),
        }
    }
}

/// One kernel run of a chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The kernel, by its position in the op's `build`.
    pub kernel: usize,
    /// Where each of its inputs comes from (earlier steps only).
    pub inputs: Vec<Source>,
}

/// An op's kernels as a chain: derive the host arrays from the op inputs `reads`, run the
/// steps in order; the op's outputs are `outputs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    /// The op inputs (small ones, such as offsets) the op's `derive` takes, in order;
    /// empty when no step reads a [`Source::Derived`] array.
    pub reads: Vec<usize>,
    /// The kernel runs, in order.
    pub steps: Vec<Step>,
    /// Where each of the op's outputs comes from (a step's output, never an input).
    pub outputs: Vec<Source>,
}
