//! Runs kernels on a backend and says which one and why.
//!
//! The rule (DESIGN.md): native code when its constraints hold, else the XLA fallback,
//! else the interpreter. A request is `interp`, `xla`, `native` or `auto`; it comes from
//! the caller or `TESSERA_BACKEND`. A backend that cannot run a kernel says why (the
//! native backend declines some kernels; XLA needs the PJRT plugin), `auto` records
//! those reasons, and an explicit request for such a backend is an error.

use std::fmt;
use std::str::FromStr;

pub mod cache;
pub mod config;
#[cfg(all(tessera_pjrt, tessera_xla_ffi))]
pub mod custom_call;
#[cfg(feature = "native")]
pub mod native;
pub mod peak;
#[cfg(tessera_pjrt)]
pub mod pjrt;
pub mod tune;
#[cfg(tessera_pjrt)]
pub mod xla;

use kernel_ir::{interpret, Array, InterpretOptions, Kernel, RunError};

/// A backend, or `Auto` to let the runtime choose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The reference interpreter (always available).
    Interp,
    /// StableHLO through a PJRT XLA CPU plugin.
    Xla,
    /// Native code JIT-compiled from upstream MLIR.
    Native,
    /// The best available backend whose constraints hold.
    Auto,
}

impl Backend {
    /// Every concrete backend, best first.
    pub const PREFERENCE: [Backend; 3] = [Backend::Native, Backend::Xla, Backend::Interp];

    /// The name used on the command line and in `TESSERA_BACKEND`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Interp => "interp",
            Backend::Xla => "xla",
            Backend::Native => "native",
            Backend::Auto => "auto",
        }
    }

    /// Why this backend cannot run `kernel` here, or `None` if it can.
    pub fn unavailable_because(self, kernel: &Kernel) -> Option<String> {
        match self {
            Backend::Interp | Backend::Auto => None,
            Backend::Xla => xla_unavailable().map(String::from),
            Backend::Native => native_unavailable(kernel),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "interp" => Ok(Backend::Interp),
            "xla" => Ok(Backend::Xla),
            "native" => Ok(Backend::Native),
            "auto" => Ok(Backend::Auto),
            other => Err(Error::UnknownBackend(other.to_string())),
        }
    }
}

#[cfg(feature = "native")]
fn native_unavailable(kernel: &Kernel) -> Option<String> {
    use lowering::Lowering;
    lowering::Cpu::default()
        .check(kernel)
        .err()
        .map(|e| e.reason())
}

/// The vector registers the native backend compiles for: `$TESSERA_NATIVE_REGISTERS`
/// (`avx2` or `avx512`, the latter only where the CPU has AVX-512F) when set, else this
/// CPU's own.
pub fn native_registers() -> Result<lowering::cpu::Registers, String> {
    use lowering::cpu::Registers;
    let Some(name) = config::Var::NativeRegisters.get() else {
        return Ok(Registers::host());
    };
    match Registers::named(&name) {
        Some(r) if r.runs_here() => Ok(r),
        Some(_) => Err(format!(
            "TESSERA_NATIVE_REGISTERS={name}: this CPU has no AVX-512F"
        )),
        None => Err(format!(
            "TESSERA_NATIVE_REGISTERS={name}: expected avx2 or avx512"
        )),
    }
}

#[cfg(not(feature = "native"))]
fn native_unavailable(_kernel: &Kernel) -> Option<String> {
    Some("tessera was built without the `native` feature (it links LLVM/MLIR 22)".into())
}

#[cfg(tessera_pjrt)]
fn xla_unavailable() -> Option<&'static str> {
    xla::backend().err()
}

#[cfg(not(tessera_pjrt))]
fn xla_unavailable() -> Option<&'static str> {
    Some(if cfg!(feature = "xla") {
        "tessera was built without the PJRT header: run `make setup`, then rebuild"
    } else {
        "tessera was built without the `xla` feature"
    })
}

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A backend name that does not exist.
    #[error("unknown backend `{0}`: expected interp, xla, native or auto")]
    UnknownBackend(String),
    /// A backend that cannot run here.
    #[error("backend `{backend}` is unavailable: {reason}")]
    Unavailable {
        /// The backend asked for.
        backend: Backend,
        /// Why it cannot run.
        reason: String,
    },
    /// The kernel failed while running.
    #[error(transparent)]
    Run(#[from] RunError),
    /// XLA failed to compile or run the lowered kernel (XLA's message included).
    #[error("XLA: {0}")]
    Xla(String),
    /// MLIR/LLVM failed to compile the kernel for the native backend.
    #[error("native: {0}")]
    Native(String),
    /// Native code detected an access outside a block (and kept it inside).
    #[error("native: {0}")]
    NativeFault(String),
}

/// The backend a call resolved to and the reasons other backends were passed over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolution {
    /// The backend that runs the kernel.
    pub backend: Backend,
    /// One line per better backend that was skipped, with the reason.
    pub fallbacks: Vec<String>,
}

/// The backend requested by `TESSERA_BACKEND`, if set.
pub fn backend_from_env() -> Result<Option<Backend>, Error> {
    config::Var::Backend.get().map(|v| v.parse()).transpose()
}

/// Prints a line on stderr when `TESSERA_LOG=debug` (how executables were obtained,
/// which path a call took); `message` is only built then.
pub(crate) fn debug(message: impl FnOnce() -> String) {
    if config::debug_log() {
        eprintln!("debug: {}", message());
    }
}

/// Interpreter options from the environment: `TESSERA_INTERP_POISON=1` fills scratch
/// and outputs with NaN before running, so reads of unwritten data show in the results.
fn interpreter_options() -> InterpretOptions {
    InterpretOptions {
        poison_uninitialized: config::Var::InterpPoison.is("1"),
        ..InterpretOptions::default()
    }
}

/// Picks the backend for `kernel`: the requested one if it can run it, or for `Auto`
/// the first of [`Backend::PREFERENCE`] that can.
pub fn resolve(requested: Backend, kernel: &Kernel) -> Result<Resolution, Error> {
    if requested != Backend::Auto {
        return match requested.unavailable_because(kernel) {
            None => Ok(Resolution {
                backend: requested,
                fallbacks: vec![],
            }),
            Some(reason) => Err(Error::Unavailable {
                backend: requested,
                reason,
            }),
        };
    }
    let mut fallbacks = Vec::new();
    for b in Backend::PREFERENCE {
        match b.unavailable_because(kernel) {
            None => {
                return Ok(Resolution {
                    backend: b,
                    fallbacks,
                })
            }
            Some(reason) => fallbacks.push(format!("{b}: {reason}")),
        }
    }
    unreachable!("the interpreter is always available")
}

/// Runs `kernel` on the resolved backend.
pub fn run(
    kernel: &Kernel,
    inputs: &[Array],
    requested: Backend,
) -> Result<(Vec<Array>, Resolution), Error> {
    let mut resolution = resolve(requested, kernel)?;
    let outputs = match resolution.backend {
        Backend::Interp => interpret(kernel, inputs, &interpreter_options())?,
        Backend::Xla => {
            // XLA aborts on some failed host allocations: ask for the memory first.
            kernel_ir::check_allocatable(kernel)?;
            run_xla(kernel, inputs)?
        }
        Backend::Native => match run_native(kernel, inputs) {
            // `auto` moves on when the JIT cannot compile the kernel.
            Err(Error::Native(reason)) if requested == Backend::Auto => {
                let fallback = Backend::PREFERENCE[1..]
                    .iter()
                    .copied()
                    .find(|b| b.unavailable_because(kernel).is_none())
                    .expect("the interpreter is always available");
                let (outputs, mut rest) = run(kernel, inputs, fallback)?;
                rest.fallbacks.insert(0, format!("native: {reason}"));
                resolution = rest;
                outputs
            }
            other => other?,
        },
        Backend::Auto => unreachable!("resolve() returns a concrete backend"),
    };
    Ok((outputs, resolution))
}

#[cfg(feature = "native")]
fn run_native(kernel: &Kernel, inputs: &[Array]) -> Result<Vec<Array>, Error> {
    native::backend().run(kernel, inputs)
}

#[cfg(not(feature = "native"))]
fn run_native(kernel: &Kernel, _inputs: &[Array]) -> Result<Vec<Array>, Error> {
    Err(Error::Unavailable {
        backend: Backend::Native,
        reason: native_unavailable(kernel).unwrap_or_default(),
    })
}

#[cfg(tessera_pjrt)]
fn run_xla(kernel: &Kernel, inputs: &[Array]) -> Result<Vec<Array>, Error> {
    match xla::backend() {
        Ok(x) => x.run(kernel, inputs),
        Err(reason) => Err(Error::Unavailable {
            backend: Backend::Xla,
            reason: reason.into(),
        }),
    }
}

/// Compiles and runs a StableHLO module (MLIR text) on the XLA backend, through the
/// compilation cache; `outputs` are its result types.
#[cfg(tessera_pjrt)]
pub fn run_stablehlo(
    name: &str,
    module: &str,
    inputs: &[Array],
    outputs: &[kernel_ir::TensorType],
) -> Result<Vec<Array>, Error> {
    match xla::backend() {
        Ok(x) => x.run_module(name, module, inputs, outputs),
        Err(reason) => Err(Error::Unavailable {
            backend: Backend::Xla,
            reason: reason.into(),
        }),
    }
}

/// Compiles and runs a StableHLO module: unavailable in a build without PJRT.
#[cfg(not(tessera_pjrt))]
pub fn run_stablehlo(
    _name: &str,
    _module: &str,
    _inputs: &[Array],
    _outputs: &[kernel_ir::TensorType],
) -> Result<Vec<Array>, Error> {
    Err(Error::Unavailable {
        backend: Backend::Xla,
        reason: xla_unavailable().unwrap_or_default().into(),
    })
}

#[cfg(not(tessera_pjrt))]
fn run_xla(_kernel: &Kernel, _inputs: &[Array]) -> Result<Vec<Array>, Error> {
    Err(Error::Unavailable {
        backend: Backend::Xla,
        reason: xla_unavailable().unwrap_or_default().into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_ir::dsl::prelude::*;

    fn tiny() -> Kernel {
        pallas_call(|x: Ref, o: Ref| o.write(x.read()))
            .grid([1])
            .input(
                TensorType::new(DType::F32, [8]),
                block_spec([8], |_| vec![0.into()]),
            )
            .output(
                TensorType::new(DType::F32, [8]),
                block_spec([8], |_| vec![0.into()]),
            )
            .build()
            .unwrap()
    }

    /// A kernel the native backend declines (integer division by a loaded divisor).
    fn divides() -> Kernel {
        let ty = TensorType::new(DType::I32, [8]);
        pallas_call(|a: Ref, b: Ref, o: Ref| o.write(a.read() / b.read()))
            .grid([1])
            .input(ty.clone(), block_spec([8], |_| vec![0.into()]))
            .input(ty.clone(), block_spec([8], |_| vec![0.into()]))
            .output(ty, block_spec([8], |_| vec![0.into()]))
            .build()
            .unwrap()
    }

    #[test]
    fn auto_picks_the_best_available_backend_and_says_why() {
        let r = resolve(Backend::Auto, &tiny()).unwrap();
        assert_eq!(r.backend, Backend::Native);
        assert!(r.fallbacks.is_empty());
        let r = resolve(Backend::Auto, &divides()).unwrap();
        let best = Backend::PREFERENCE
            .into_iter()
            .find(|b| b.unavailable_because(&divides()).is_none())
            .unwrap();
        assert_eq!(r.backend, best);
        assert!(r.fallbacks[0].starts_with("native: "), "{:?}", r.fallbacks);
        let skipped = Backend::PREFERENCE.iter().position(|&b| b == best).unwrap();
        assert_eq!(r.fallbacks.len(), skipped);
    }

    #[test]
    fn unavailable_backends_are_errors_when_asked_for() {
        let e = resolve(Backend::Native, &divides()).unwrap_err();
        assert!(e.to_string().starts_with("backend `native` is unavailable"));
        assert!("cuda".parse::<Backend>().is_err());
        assert_eq!("native".parse::<Backend>().unwrap(), Backend::Native);
    }

    #[test]
    fn runs_on_the_interpreter() {
        let x = Array::from_f32(DType::F32, [8], (0..8).map(|i| i as f32).collect()).unwrap();
        let (out, r) = run(&tiny(), std::slice::from_ref(&x), Backend::Interp).unwrap();
        assert_eq!(out[0], x);
        assert_eq!(r.backend, Backend::Interp);
    }
}
