//! `ChainRun`, the executor the torch ops and `tessera bench` share: an op's kernel chain
//! run in place on native arrays gives the op's reference results, and a chain refuses
//! arrays that are not of the types its kernels take.

use kernel_ir::{Array, TensorType};
use kernels::{compare, find, Chain, LibraryKernel, Params};
use runtime::native::{ChainRun, NativeArray, Prepared};

/// An op's parameters, inputs, chain and compiled kernels.
struct Case {
    op: &'static dyn LibraryKernel,
    params: Params,
    inputs: Vec<Array>,
    chain: Chain,
    kernels: Vec<Option<Prepared>>,
}

impl Case {
    fn new(name: &str, overrides: &str) -> Case {
        let op = find(name).unwrap();
        let params = Params::parse(op.params(), &[overrides.to_string()]).unwrap();
        let inputs = op.inputs(&params, 7).unwrap();
        let chain = op
            .chain(&params, inputs.len())
            .expect("the op declares a chain");
        let native = runtime::native::backend();
        let kernels = op
            .build(&params)
            .unwrap()
            .iter()
            .map(|k| Some(native.prepare(k).unwrap()))
            .collect();
        Case {
            op,
            params,
            inputs,
            chain,
            kernels,
        }
    }

    /// The types of the op's outputs: the steps' outputs the chain names.
    fn output_types(&self) -> Vec<TensorType> {
        self.chain
            .outputs
            .iter()
            .map(|s| match *s {
                kernels::Source::Output { step, index } => {
                    let kernel = self.chain.steps[step].kernel;
                    let prepared = self.kernels[kernel].as_ref().unwrap();
                    prepared.output_types()[index].clone()
                }
                other => panic!("an op output from {other:?}"),
            })
            .collect()
    }

    fn run(&self) -> Vec<Array> {
        let read: Vec<Array> = self
            .chain
            .reads
            .iter()
            .map(|&i| self.inputs[i].clone())
            .collect();
        let native = |arrays: &[Array]| -> Vec<NativeArray> {
            arrays
                .iter()
                .map(|a| NativeArray::from_array(a).unwrap())
                .collect()
        };
        let derived = native(&self.op.derive(&self.params, &read).unwrap());
        let inputs = native(&self.inputs);
        let mut outputs: Vec<NativeArray> = self
            .output_types()
            .into_iter()
            .map(|t| NativeArray::zeros(t, "an output").unwrap())
            .collect();
        let types = |a: &[NativeArray]| a.iter().map(|x| x.ty().clone()).collect::<Vec<_>>();
        let run = ChainRun::new(
            &self.chain,
            &self.kernels,
            &types(&inputs),
            &types(&derived),
            &types(&outputs),
        )
        .expect("the chain fits the op's own arrays");
        let addresses = |a: &[NativeArray]| a.iter().map(NativeArray::as_ptr).collect::<Vec<_>>();
        let outs: Vec<_> = outputs.iter_mut().map(NativeArray::as_mut_ptr).collect();
        // SAFETY: live arrays of the checked types; the outputs are fresh.
        unsafe {
            run.run(&addresses(&inputs), &addresses(&derived), &outs, &|| {
                "test".into()
            })
        }
        .unwrap();
        outputs
            .into_iter()
            .map(|o| o.into_array().unwrap())
            .collect()
    }
}

#[test]
fn chains_run_in_place_give_the_reference_results() {
    for (name, overrides) in [
        (
            "flash_attention_bwd",
            "heads=4,kv_heads=2,q_len=33,kv_len=47",
        ),
        (
            "flash_attention_bwd",
            "batch=2,heads=2,kv_heads=1,q_len=19,kv_len=24,mask=batch,dtype=bf16",
        ),
        (
            "varlen_attention",
            "batch=3,heads=2,kv_heads=1,total_q=50,total_k=41,head_dim=16",
        ),
        (
            "varlen_attention_bwd",
            "batch=4,heads=4,kv_heads=2,total_q=60,causal=true,head_dim=16",
        ),
    ] {
        let case = Case::new(name, overrides);
        let got = case.run();
        let want = case.op.reference(&case.params, &case.inputs).unwrap();
        let c = compare(&got, &want, case.op.tolerance(&case.params));
        assert!(c.ok(), "{name} {overrides}: {c:?}");
    }
}

#[test]
fn a_chain_refuses_arrays_of_other_types() {
    let case = Case::new(
        "flash_attention_bwd",
        "heads=2,kv_heads=2,q_len=16,kv_len=16",
    );
    let inputs: Vec<TensorType> = case.inputs.iter().map(|a| a.ty().clone()).collect();
    let outputs = case.output_types();
    assert!(ChainRun::new(&case.chain, &case.kernels, &inputs, &[], &outputs).is_some());
    let mut wrong = inputs.clone();
    wrong[0].shape[2] += 1;
    assert!(ChainRun::new(&case.chain, &case.kernels, &wrong, &[], &outputs).is_none());
    assert!(ChainRun::new(&case.chain, &case.kernels, &inputs, &[], &outputs[..2]).is_none());
    let missing: Vec<Option<Prepared>> = case.kernels.iter().map(|_| None).collect();
    assert!(ChainRun::new(&case.chain, &missing, &inputs, &[], &outputs).is_none());
}
