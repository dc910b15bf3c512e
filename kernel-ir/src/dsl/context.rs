//! The kernel being traced: one [`KernelBuilder`] per thread, installed by
//! [`crate::dsl::pallas_call`] for the duration of the body.

use std::cell::RefCell;
use std::panic::Location;

use crate::builder::KernelBuilder;

thread_local! {
    static CURRENT: RefCell<Option<KernelBuilder>> = const { RefCell::new(None) };
}

/// Runs `f` on the builder of the kernel being traced, tagging errors with `location`.
///
/// # Panics
/// When no kernel is being traced: DSL values only exist inside a `pallas_call` body.
pub(crate) fn with_builder<R>(
    location: &'static Location<'static>,
    f: impl FnOnce(&mut KernelBuilder) -> R,
) -> R {
    CURRENT.with(|c| {
        let mut slot = c.borrow_mut();
        let b = slot.as_mut().expect(
            "a Tessera kernel value was used outside a kernel body: \
             kernel code only runs while `pallas_call(...).build()` traces it",
        );
        b.set_location(Some(format!(
            "{}:{}:{}",
            location.file(),
            location.line(),
            location.column()
        )));
        f(b)
    })
}

/// Installs `builder` as the current kernel; returns false (and drops it) if a kernel
/// is already being traced.
pub(crate) fn install(builder: KernelBuilder) -> bool {
    CURRENT.with(|c| {
        let mut slot = c.borrow_mut();
        if slot.is_some() {
            return false;
        }
        *slot = Some(builder);
        true
    })
}

/// Removes and returns the current kernel.
pub(crate) fn take() -> Option<KernelBuilder> {
    CURRENT.with(|c| c.borrow_mut().take())
}

/// Uninstalls the current kernel when dropped, so a panicking body leaves no state behind.
pub(crate) struct InstallGuard;

impl Drop for InstallGuard {
    fn drop(&mut self) {
        take();
    }
}
