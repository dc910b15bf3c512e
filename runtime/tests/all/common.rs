//! What several of the runtime's test modules share.

use runtime::Backend;

/// The native backend, and XLA when it can run `kernel` (where `TESSERA_REQUIRE_XLA` is
/// set it must); XLA's executables are cached under `cache` in the temp directory.
pub fn compiled_backends(kernel: &kernel_ir::Kernel, cache: &str) -> Vec<Backend> {
    std::env::set_var("TESSERA_CACHE_DIR", std::env::temp_dir().join(cache));
    let mut backends = vec![Backend::Native];
    match Backend::Xla.unavailable_because(kernel) {
        None => backends.push(Backend::Xla),
        Some(reason) => assert!(
            std::env::var_os("TESSERA_REQUIRE_XLA").is_none(),
            "{reason}"
        ),
    }
    backends
}
