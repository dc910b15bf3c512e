//! Kernels as torch ops from a separately compiled library: the protocol between a
//! user's `cdylib` (which exports its ops with [`export_ops!`](crate::export_ops)) and
//! `tessera.load_library(path)` in Python.
//!
//! The boundary is C strings and IR text, the stable interchange format, so the library
//! and Tessera's extension may be built separately (any compiler, any Tessera build that
//! speaks the same protocol version). A library exports three symbols:
//! - `tessera_op_library_v1() -> *mut c_char`: the manifest, [`manifest`]'s text:
//!   `tessera-op-library 1`, `ir <IR_VERSION>`, `namespace <ns>`, then one
//!   `op <torch schema>` line per op (`add_rms_norm(Tensor x, float eps=1e-06) -> Tensor`);
//! - `tessera_build_v1(op, request) -> *mut c_char`: builds op `op` for the argument types
//!   in `request` ([`OpArgs`] text: one `name value` line per argument, tensors as their
//!   type `f32[37, 256]`, scalars as numbers) and answers `ok\n<kernel IR text>`,
//!   `outputs\n<type>\n...` (a call with nothing to compute, such as an empty batch:
//!   the host returns zero-filled outputs of these types without a launch, see
//!   [`Built::Outputs`]) or `error\n<message>`;
//! - `tessera_free_v1(ptr)`: frees a string returned by the other two.
//!
//! The kernel's inputs are the op's tensor arguments in order; its outputs are the op's
//! results. Panics inside a build become error answers; nothing unwinds across the FFI.

use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::ir::Kernel;
use crate::types::TensorType;

/// The protocol version in the manifest's first line and the symbols' `_v1` suffix.
pub const PROTOCOL_VERSION: u32 = 1;

/// The version of the IR text a library emits; a host accepts the same version only.
pub const IR_VERSION: u32 = 1;

/// The arguments an op is built for: tensor types and scalar values by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpArgs {
    items: Vec<(String, OpArg)>,
}

/// One argument of an op call.
#[derive(Clone, Debug, PartialEq)]
pub enum OpArg {
    /// A tensor, by its type.
    Tensor(TensorType),
    /// A number (`float`, `int` and `bool` schema arguments).
    Scalar(f64),
}

impl OpArgs {
    /// Parses the request text (`name value` lines).
    pub fn parse(text: &str) -> Result<OpArgs, String> {
        let mut items = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let (name, value) = line
                .trim()
                .split_once(' ')
                .ok_or_else(|| format!("argument line `{line}` has no value"))?;
            let value = value.trim();
            let arg = match value.parse::<f64>() {
                Ok(x) => OpArg::Scalar(x),
                Err(_) => OpArg::Tensor(value.parse()?),
            };
            items.push((name.to_string(), arg));
        }
        Ok(OpArgs { items })
    }

    /// Adds an argument (for hosts and tests building a request).
    pub fn with(mut self, name: &str, arg: OpArg) -> OpArgs {
        self.items.push((name.to_string(), arg));
        self
    }

    /// The request text [`parse`](OpArgs::parse) reads.
    pub fn to_text(&self) -> String {
        self.items
            .iter()
            .map(|(name, arg)| match arg {
                OpArg::Tensor(t) => format!("{name} {t}\n"),
                OpArg::Scalar(x) => format!("{name} {x:?}\n"),
            })
            .collect()
    }

    /// The type of tensor argument `name`.
    pub fn tensor(&self, name: &str) -> Result<&TensorType, String> {
        match self.get(name)? {
            OpArg::Tensor(t) => Ok(t),
            OpArg::Scalar(x) => Err(format!("argument `{name}` is the number {x}, not a tensor")),
        }
    }

    /// The value of scalar argument `name`.
    pub fn scalar(&self, name: &str) -> Result<f64, String> {
        match self.get(name)? {
            OpArg::Scalar(x) => Ok(*x),
            OpArg::Tensor(t) => Err(format!("argument `{name}` is a tensor ({t}), not a number")),
        }
    }

    fn get(&self, name: &str) -> Result<&OpArg, String> {
        self.items
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a)
            .ok_or_else(|| {
                let known: Vec<&str> = self.items.iter().map(|(n, _)| n.as_str()).collect();
                format!("no argument `{name}` (the call has: {})", known.join(", "))
            })
    }
}

/// What a build function answers for one call.
#[derive(Clone, Debug, PartialEq)]
pub enum Built {
    /// The kernel that computes the call.
    Kernel(Kernel),
    /// The output types of a call with nothing to compute (an empty batch, where a grid
    /// of size 0 is not a kernel): the host returns outputs of these types, zero-filled
    /// (a reduction over nothing is 0), without a launch.
    Outputs(Vec<TensorType>),
}

impl From<Kernel> for Built {
    fn from(kernel: Kernel) -> Built {
        Built::Kernel(kernel)
    }
}

/// A build function's result as a [`Built`]: build functions return a `Kernel` or a
/// `Built` ([`export_ops!`](crate::export_ops) calls this on either).
pub fn built<T: Into<Built>>(result: Result<T, String>) -> Result<Built, String> {
    result.map(Into::into)
}

/// How an exported op builds its kernel for the given arguments.
pub type BuildFn = fn(&OpArgs) -> Result<Built, String>;

/// The manifest text of a library exporting `schemas` under `namespace`.
pub fn manifest(namespace: &str, schemas: &[&str]) -> String {
    let mut text =
        format!("tessera-op-library {PROTOCOL_VERSION}\nir {IR_VERSION}\nnamespace {namespace}\n");
    for s in schemas {
        text.push_str(&format!("op {}\n", s.trim()));
    }
    text
}

/// The op name of a schema: what comes before `(`.
pub fn schema_name(schema: &str) -> &str {
    schema.split('(').next().unwrap_or_default().trim()
}

/// Builds op `op` for the `request` text: the answer `tessera_build_v1` returns.
pub fn build_answer(ops: &[(&str, BuildFn)], op: &str, request: &str) -> String {
    let Some((_, build)) = ops.iter().find(|(schema, _)| schema_name(schema) == op) else {
        let names: Vec<&str> = ops.iter().map(|(s, _)| schema_name(s)).collect();
        return format!(
            "error\nno op `{op}` in this library (it has: {})",
            names.join(", ")
        );
    };
    let built = OpArgs::parse(request).and_then(|args| {
        catch_unwind(AssertUnwindSafe(|| build(&args)))
            .unwrap_or_else(|_| Err("the op's build function panicked".into()))
    });
    match built {
        Ok(Built::Kernel(kernel)) => format!("ok\n{}", crate::print_kernel(&kernel)),
        Ok(Built::Outputs(types)) => {
            let lines: Vec<String> = types.iter().map(|t| format!("{t}\n")).collect();
            format!("outputs\n{}", lines.concat())
        }
        Err(e) => format!("error\n{e}"),
    }
}

/// Reads an answer of `tessera_build_v1` (what [`build_answer`] writes): the kernel,
/// verified, or the output types; the library's error message, or what is malformed.
pub fn read_answer(answer: &str) -> Result<Built, String> {
    match answer.split_once('\n') {
        Some(("ok", ir)) => crate::parse_kernel(ir)
            .map(Built::Kernel)
            .map_err(|e| format!("the kernel it built is invalid: {e}")),
        Some(("outputs", types)) => types
            .lines()
            .map(|t| {
                t.parse()
                    .map_err(|e| format!("the output type `{t}` it declared is invalid: {e}"))
            })
            .collect::<Result<_, _>>()
            .map(Built::Outputs),
        Some(("error", message)) => Err(message.to_string()),
        _ => Err(format!("malformed build answer `{answer}`")),
    }
}

/// Hands `text` to C as an owned string (interior NULs replaced).
pub fn to_c(text: String) -> *mut c_char {
    CString::new(text.replace('\0', " "))
        .expect("NULs were replaced")
        .into_raw()
}

/// Reads a C string argument; `None` for a null pointer.
///
/// # Safety
/// `p` must be null or point at a NUL-terminated string alive for the call.
pub unsafe fn from_c<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    CStr::from_ptr(p).to_str().ok()
}

/// Frees a string made by [`to_c`].
///
/// # Safety
/// `p` must be null or a pointer [`to_c`] returned, not yet freed.
pub unsafe fn free_c(p: *mut c_char) {
    if !p.is_null() {
        drop(CString::from_raw(p));
    }
}

/// Exports kernels as torch ops from a `cdylib` (see [`op_library`](crate::op_library)):
///
/// ```ignore
/// tessera::export_ops! {
///     namespace: "my_ops",
///     "add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps=1e-06) -> Tensor"
///         => build_add_rms_norm,
/// }
/// ```
///
/// Each build function is `fn(&OpArgs) -> Result<Kernel, String>`, or returns a
/// [`Built`](crate::op_library::Built) to answer an empty batch with its output types;
/// Python loads the library with `tessera.load_library(path)` and calls
/// `torch.ops.my_ops.add_rms_norm`.
#[macro_export]
macro_rules! export_ops {
    (namespace: $ns:literal, $($schema:literal => $build:path),+ $(,)?) => {
        const _TESSERA_OPS: &[(&str, $crate::op_library::BuildFn)] =
            &[$((
                $schema,
                (|args: &$crate::op_library::OpArgs| $crate::op_library::built($build(args)))
                    as $crate::op_library::BuildFn,
            )),+];

        /// The manifest of this Tessera op library.
        #[no_mangle]
        pub extern "C" fn tessera_op_library_v1() -> *mut ::std::ffi::c_char {
            $crate::op_library::to_c($crate::op_library::manifest($ns, &[$($schema),+]))
        }

        /// Builds one op's kernel for the argument types in `request`.
        ///
        /// # Safety
        /// `op` and `request` must be NUL-terminated strings.
        #[no_mangle]
        pub unsafe extern "C" fn tessera_build_v1(
            op: *const ::std::ffi::c_char,
            request: *const ::std::ffi::c_char,
        ) -> *mut ::std::ffi::c_char {
            let answer = match (
                $crate::op_library::from_c(op),
                $crate::op_library::from_c(request),
            ) {
                (Some(op), Some(request)) => {
                    $crate::op_library::build_answer(_TESSERA_OPS, op, request)
                }
                _ => "error\nthe op name or request is not UTF-8 text".to_string(),
            };
            $crate::op_library::to_c(answer)
        }

        /// Frees a string this library returned.
        ///
        /// # Safety
        /// `p` must come from this library's other functions, freed once.
        #[no_mangle]
        pub unsafe extern "C" fn tessera_free_v1(p: *mut ::std::ffi::c_char) {
            $crate::op_library::free_c(p)
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DType;

    #[test]
    fn requests_round_trip_and_name_what_is_missing() {
        let args = OpArgs::default()
            .with("x", OpArg::Tensor(TensorType::new(DType::BF16, [37, 256])))
            .with("eps", OpArg::Scalar(1e-6));
        let parsed = OpArgs::parse(&args.to_text()).unwrap();
        assert_eq!(parsed, args);
        assert_eq!(parsed.tensor("x").unwrap().shape, vec![37, 256]);
        assert_eq!(parsed.scalar("eps").unwrap(), 1e-6);
        assert!(parsed.tensor("eps").unwrap_err().contains("not a tensor"));
        assert!(parsed
            .scalar("w")
            .unwrap_err()
            .contains("the call has: x, eps"));
        assert!(OpArgs::parse("x f64[2]")
            .unwrap_err()
            .contains("unknown dtype"));
    }

    #[test]
    fn unknown_ops_and_panics_become_error_answers() {
        fn panics(_: &OpArgs) -> Result<Built, String> {
            panic!("boom")
        }
        fn empty(_: &OpArgs) -> Result<Built, String> {
            Ok(Built::Outputs(vec![
                TensorType::new(DType::F32, [0, 3]),
                TensorType::new(DType::I32, [2]),
            ]))
        }
        let ops: &[(&str, BuildFn)] = &[
            ("bad(Tensor x) -> Tensor", panics),
            ("empty(Tensor x) -> (Tensor, Tensor)", empty),
        ];
        let answer = build_answer(ops, "empty", "x f32[0, 3]");
        assert_eq!(answer, "outputs\nf32[0, 3]\ni32[2]\n");
        assert_eq!(read_answer(&answer), empty(&OpArgs::default()));
        assert!(read_answer("outputs\nf64[1]")
            .unwrap_err()
            .contains("output type `f64[1]`"));
        assert_eq!(read_answer("error\nbad x").unwrap_err(), "bad x");
        assert!(build_answer(ops, "nope", "").starts_with("error\nno op `nope`"));
        assert_eq!(
            build_answer(ops, "bad", "x f32[2]"),
            "error\nthe op's build function panicked"
        );
        assert_eq!(schema_name("add(Tensor x) -> Tensor"), "add");
        assert!(
            manifest("ns", &["add(Tensor x) -> Tensor"]).ends_with("op add(Tensor x) -> Tensor\n")
        );
    }
}
