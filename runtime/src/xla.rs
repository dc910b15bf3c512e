//! The XLA fallback backend: kernels lowered to StableHLO, compiled by a PJRT CPU
//! plugin (through the compilation cache) and executed on whole arrays.

use std::path::PathBuf;
use std::sync::OnceLock;

use kernel_ir::{Array, Kernel};

use crate::pjrt::{Client, Plugin};

/// The process-wide XLA backend.
pub struct Xla {
    client: Client,
    plugin_path: PathBuf,
}

/// The plugin file: `$TESSERA_PJRT_PLUGIN`, else the one `make setup` installed.
fn plugin_path() -> PathBuf {
    std::env::var_os("TESSERA_PJRT_PLUGIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("TESSERA_DEFAULT_PJRT_PLUGIN")))
}

/// The backend, loaded on first use; `Err` says why it cannot be used.
pub fn backend() -> Result<&'static Xla, &'static str> {
    static XLA: OnceLock<Result<Xla, String>> = OnceLock::new();
    XLA.get_or_init(|| {
        let path = plugin_path();
        let plugin: &'static Plugin = Box::leak(Box::new(Plugin::load(&path).map_err(|e| e.to_string())?));
        let client = plugin.client().map_err(|e| format!("PJRT client creation failed: {e}"))?;
        Ok(Xla { client, plugin_path: path })
    })
    .as_ref()
    .map_err(String::as_str)
}

impl Xla {
    /// The plugin file in use.
    pub fn plugin_path(&self) -> &std::path::Path {
        &self.plugin_path
    }

    /// Lowers, compiles and runs `kernel` on `inputs`.
    pub fn run(&self, kernel: &Kernel, inputs: &[Array]) -> Result<Vec<Array>, crate::Error> {
        crate::check_inputs(kernel, inputs)?;
        let module = lowering::stablehlo::lower(kernel);
        let exe = self.client.compile(&module).map_err(|e| crate::Error::Xla(format!("compiling @{}: {e}", kernel.name)))?;
        self.client
            .execute(&exe, inputs, &kernel.output_types())
            .map_err(|e| crate::Error::Xla(format!("running @{}: {e}", kernel.name)))
    }
}
