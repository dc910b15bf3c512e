//! One interface over the lowerings: a [`Lowering`] checks that its target can take a
//! verified kernel (TPU tiling and VMEM rules, what native code can report) and emits
//! it, through one fallible entry. Callers that pick a target by name use [`Target`].

use std::fmt;
use std::sync::Once;

use kernel_ir::{Kernel, OpKind};

use crate::cpu::CpuModule;
use crate::tpu_rules::{TpuLimits, TpuRuleError};

/// Why a target cannot take a kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LowerError {
    /// A TPU tiling, layout or VMEM rule is broken (Mosaic).
    Tpu(TpuRuleError),
    /// The target cannot express something the kernel does.
    Unsupported {
        /// The kernel's name.
        kernel: String,
        /// What and why.
        reason: String,
    },
}

impl fmt::Display for LowerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LowerError::Tpu(e) => e.fmt(f),
            LowerError::Unsupported { kernel, reason } => write!(f, "@{kernel}: {reason}"),
        }
    }
}

impl std::error::Error for LowerError {}

impl LowerError {
    /// What is wrong, without the kernel's name (for messages that already give it).
    pub fn reason(&self) -> String {
        match self {
            LowerError::Tpu(e) => e.to_string(),
            LowerError::Unsupported { reason, .. } => reason.clone(),
        }
    }
}

impl From<TpuRuleError> for LowerError {
    fn from(e: TpuRuleError) -> Self {
        LowerError::Tpu(e)
    }
}

/// A lowering of verified kernels to one target.
pub trait Lowering {
    /// What it produces: MLIR text, with what running it needs.
    type Output;
    /// Whether this target can take `kernel`, without emitting it.
    fn check(&self, kernel: &Kernel) -> Result<(), LowerError>;
    /// Checks, then emits `kernel`.
    fn lower(&self, kernel: &Kernel) -> Result<Self::Output, LowerError>;
}

/// StableHLO for XLA: takes every verified kernel.
pub struct StableHlo;

impl Lowering for StableHlo {
    type Output = String;
    fn check(&self, _kernel: &Kernel) -> Result<(), LowerError> {
        Ok(())
    }
    fn lower(&self, kernel: &Kernel) -> Result<String, LowerError> {
        static WARNED: Once = Once::new();
        warn_dropped_debug_ops(kernel, "XLA", &WARNED);
        Ok(crate::stablehlo::lower(kernel))
    }
}

/// Warns, once per process and target, that the target drops `kernel`'s `debug_print`s
/// and `check`s (StableHLO has neither; Mosaic's prints and asserts need a TPU to show).
fn warn_dropped_debug_ops(kernel: &Kernel, target: &str, warned: &'static Once) {
    let (mut prints, mut checks) = (0, 0);
    kernel.body.walk(&mut |op| match op.kind {
        OpKind::DebugPrint { .. } => prints += 1,
        OpKind::Check { .. } => checks += 1,
        _ => {}
    });
    if prints + checks > 0 {
        warned.call_once(|| {
            eprintln!(
                "warning: tessera: the {target} lowering drops debug_print ({prints}) and \
                 check ({checks}) in `{}`; run on the interpreter or the native backend to \
                 see prints and have checks fail",
                kernel.name
            )
        });
    }
}

/// Mosaic TPU under `limits`: the StableHLO module wrapping the `tpu_custom_call`, or
/// with `body_only` the Mosaic body alone.
pub struct Mosaic {
    /// The target's VMEM and tiling limits.
    pub limits: TpuLimits,
    /// Emit the Mosaic body instead of the wrapping module.
    pub body_only: bool,
}

impl Lowering for Mosaic {
    type Output = String;
    fn check(&self, kernel: &Kernel) -> Result<(), LowerError> {
        Ok(crate::tpu_rules::check(kernel, &self.limits)?)
    }
    fn lower(&self, kernel: &Kernel) -> Result<String, LowerError> {
        static WARNED: Once = Once::new();
        warn_dropped_debug_ops(kernel, "Mosaic", &WARNED);
        Ok(if self.body_only {
            crate::mosaic::lower_body(kernel, &self.limits)?
        } else {
            crate::mosaic::lower(kernel, &self.limits)?
        })
    }
}

/// Upstream MLIR for the native CPU backend, for hosts with `registers`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cpu {
    /// The vector registers the code is for.
    pub registers: crate::cpu::Registers,
}

impl Lowering for Cpu {
    type Output = CpuModule;
    fn check(&self, kernel: &Kernel) -> Result<(), LowerError> {
        match crate::cpu::unsupported(kernel) {
            None => Ok(()),
            Some(reason) => Err(LowerError::Unsupported {
                kernel: kernel.name.clone(),
                reason,
            }),
        }
    }
    fn lower(&self, kernel: &Kernel) -> Result<CpuModule, LowerError> {
        self.check(kernel)?;
        Ok(crate::cpu::lower(kernel, self.registers))
    }
}

/// A lowering chosen by name (`tessera lower --target NAME`).
pub enum Target {
    /// `stablehlo`
    StableHlo,
    /// `mosaic` / `mosaic-body`
    Mosaic(Mosaic),
    /// `cpu-mlir` (for this host's registers; set `registers` to choose)
    Cpu(Cpu),
}

impl Target {
    /// The names [`Target::named`] takes.
    pub const NAMES: &'static [&'static str] = &["stablehlo", "mosaic", "mosaic-body", "cpu-mlir"];

    /// The target called `name` (Mosaic under `limits`), if there is one.
    pub fn named(name: &str, limits: TpuLimits) -> Option<Target> {
        Some(match name {
            "stablehlo" => Target::StableHlo,
            "mosaic" | "mosaic-body" => Target::Mosaic(Mosaic {
                limits,
                body_only: name == "mosaic-body",
            }),
            "cpu-mlir" => Target::Cpu(Cpu {
                registers: crate::cpu::Registers::host(),
            }),
            _ => return None,
        })
    }

    /// Checks, then emits `kernel` as MLIR text.
    pub fn lower_text(&self, kernel: &Kernel) -> Result<String, LowerError> {
        match self {
            Target::StableHlo => StableHlo.lower(kernel),
            Target::Mosaic(m) => m.lower(kernel),
            Target::Cpu(c) => c.lower(kernel).map(|m| m.text),
        }
    }
}
