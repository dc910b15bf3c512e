//! The library ops' specs for Python: what `tessera` registers each torch op from
//! (schema, doc, result rules) and the plan of a call (checks, kernel parameters,
//! operand shapes), which the fake kernels and graph mode's lowering use.

use kernels::torch_op::{self, Axis, Dim, Form, Meta, Placement, ResultDtype, Shape, Split};
use kernels::ParamValue;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

/// PyTorch's dtypes Tessera takes (`kernels::torch_op::DTYPES`, the one table):
/// `(torch name, the kernels' dtype name or None, the runtime's element name)`.
#[pyfunction]
pub(crate) fn dtypes() -> Vec<(&'static str, Option<&'static str>, &'static str)> {
    torch_op::DTYPES
        .iter()
        .map(|d| (d.torch, d.kernel.map(|k| k.name()), d.element))
        .collect()
}

/// Every library op: `{name, schema, doc, outputs, returns, splits}` (see [`split_dict`]). Each output is `{shape,
/// dtype, empty}`: `shape` is `("like", arg)` or `("dims", [[arg, dim] or None (a 1),
/// ...])`; `dtype` an argument index or `"float32"`.
#[pyfunction]
pub(crate) fn op_specs(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    kernels::torch_ops()
        .iter()
        .map(|op| {
            let d = PyDict::new(py);
            d.set_item("name", op.name())?;
            d.set_item("schema", op.schema)?;
            d.set_item("doc", op.doc)?;
            d.set_item("returns", op.returns)?;
            let outputs = op
                .outputs
                .iter()
                .map(|o| {
                    let out = PyDict::new(py);
                    match o.shape {
                        Shape::Like(arg) => out.set_item("shape", ("like", arg))?,
                        Shape::Dims(dims) => {
                            let dims: Vec<Option<(usize, usize)>> = dims
                                .iter()
                                .map(|d| match *d {
                                    Dim::Of(arg, dim) => Some((arg, dim)),
                                    Dim::One => None,
                                })
                                .collect();
                            out.set_item("shape", ("dims", dims))?
                        }
                    }
                    match o.dtype {
                        ResultDtype::Of(arg) => out.set_item("dtype", arg)?,
                        ResultDtype::F32 => out.set_item("dtype", "float32")?,
                    }
                    out.set_item("empty", o.empty)?;
                    Ok(out)
                })
                .collect::<PyResult<Vec<_>>>()?;
            d.set_item("outputs", outputs)?;
            let splits = op
                .splits
                .iter()
                .map(|split| split_dict(py, split))
                .collect::<PyResult<Vec<_>>>()?;
            d.set_item("splits", splits)?;
            Ok(d)
        })
        .collect()
}

/// A split as Python reads it: `{name, args: [(arg name, axis)], outputs: [placement],
/// divides, even}`; an axis is a dim or `"leading"`, `"any"`, `"mask_batch"`; a placement
/// a dim or `"same"`, `"partial"`.
fn split_dict<'py>(py: Python<'py>, split: &Split) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", split.name)?;
    let args = PyList::empty(py);
    for (name, axis) in split.args {
        let axis = match axis {
            Axis::Dim(dim) => dim.into_pyobject(py)?.into_any(),
            Axis::Leading => "leading".into_pyobject(py)?.into_any(),
            Axis::Any => "any".into_pyobject(py)?.into_any(),
            Axis::MaskBatch => "mask_batch".into_pyobject(py)?.into_any(),
        };
        args.append((name, axis))?;
    }
    d.set_item("args", args)?;
    let outputs = PyList::empty(py);
    for placement in split.outputs {
        match placement {
            Placement::Dim(dim) => outputs.append(dim)?,
            Placement::Same => outputs.append("same")?,
            Placement::Partial => outputs.append("partial")?,
        }
    }
    d.set_item("outputs", outputs)?;
    d.set_item("divides", split.divides.to_vec())?;
    d.set_item("even", split.even)?;
    Ok(d)
}

/// One argument from Python: None, a bool, an int, a float, or a tensor as `(shape,
/// dtype name, device)` (`str(tensor.dtype)`, `tensor.device.type`).
fn value(arg: &Bound<'_, PyAny>) -> PyResult<torch_op::Value> {
    if arg.is_none() {
        return Ok(torch_op::Value::None);
    }
    if let Ok(b) = arg.extract::<bool>() {
        return Ok(torch_op::Value::Bool(b));
    }
    if let Ok(i) = arg.extract::<i64>() {
        return Ok(torch_op::Value::Int(i));
    }
    if let Ok(f) = arg.extract::<f64>() {
        return Ok(torch_op::Value::Float(f));
    }
    let (shape, dtype, device): (Vec<u64>, String, String) = arg.extract()?;
    Ok(torch_op::Value::Tensor(Meta {
        shape,
        dtype,
        device,
    }))
}

/// The plan of a call of library op `name` with `args` (schema order, defaults filled;
/// tensors as `(shape, dtype name, device)`): `{kernel, params: [(name, value)], inputs: [(arg,
/// shape, dtype, is_score_mask)], outputs: [(shape, dtype)], launch}` (dtypes as Tessera
/// names; the outputs in the shapes the kernel sees). A bad argument raises
/// `ValueError` with the eager op's message.
#[pyfunction]
pub(crate) fn op_plan<'py>(
    py: Python<'py>,
    name: &str,
    args: &Bound<'py, PyTuple>,
) -> PyResult<Bound<'py, PyDict>> {
    let op = kernels::torch_op(name)
        .ok_or_else(|| PyValueError::new_err(format!("{name}: not a library op")))?;
    let values = args
        .iter()
        .map(|a| value(&a))
        .collect::<PyResult<Vec<_>>>()?;
    let plan = (op.plan)(&values).map_err(PyValueError::new_err)?;
    let d = PyDict::new(py);
    d.set_item("kernel", plan.kernel)?;
    let params = plan
        .params
        .iter()
        .map(|(name, value)| Ok((*name, py_param(py, value)?)))
        .collect::<PyResult<Vec<_>>>()?;
    d.set_item("params", params)?;
    let inputs: Vec<(usize, Vec<u64>, &str, bool)> = plan
        .inputs
        .iter()
        .map(|o| {
            (
                o.arg,
                o.shape.clone(),
                o.dtype.name(),
                o.form == Form::ScoreMask,
            )
        })
        .collect();
    d.set_item("inputs", inputs)?;
    let outputs: Vec<(Vec<u64>, &str)> = plan
        .outputs
        .iter()
        .zip(op.outputs)
        .map(|(shape, out)| {
            let dtype = torch_op::tessera_dtype(&out.eval(&values).dtype);
            (shape.clone(), dtype.map_or("f32", |d| d.name()))
        })
        .collect();
    d.set_item("outputs", outputs)?;
    d.set_item("launch", plan.launch)?;
    Ok(d)
}

/// A parameter's value as Python's: an int, float, bool, str (a dtype's name, a word)
/// or None (`none`).
fn py_param<'py>(py: Python<'py>, value: &ParamValue) -> PyResult<Bound<'py, PyAny>> {
    Ok(match *value {
        ParamValue::Int(v) => v.into_pyobject(py)?.into_any(),
        ParamValue::Float(v) => v.into_pyobject(py)?.into_any(),
        ParamValue::Flag(v) => v.into_pyobject(py)?.to_owned().into_any(),
        ParamValue::DType(d) => d.name().into_pyobject(py)?.into_any(),
        ParamValue::Word(w) => w.into_pyobject(py)?.into_any(),
        ParamValue::Unset => py.None().into_bound(py),
    })
}
