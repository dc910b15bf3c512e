//! The XLA fallback backend: kernels lowered to StableHLO, compiled by a PJRT CPU
//! plugin through the compilation cache, and executed on whole arrays.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use kernel_ir::{Array, Kernel, TensorType};
use sha2::{Digest, Sha256};

use crate::cache::{self, Cache, Compiler, Source};
use crate::debug;
use crate::pjrt::{Client, Executable, HostBuffer, Plugin};

/// PJRT as a [`Compiler`] for the cache.
pub struct PjrtCompiler {
    client: Client,
    fingerprint: String,
}

impl Compiler for PjrtCompiler {
    type Executable = Executable;

    fn fingerprint(&self) -> String {
        self.fingerprint.clone()
    }

    fn compile(&self, module: &str) -> Result<Executable, String> {
        self.client.compile(module).map_err(|e| e.to_string())
    }

    fn serialize(&self, exe: &Executable) -> Result<Vec<u8>, String> {
        exe.serialize().map_err(|e| e.to_string())
    }

    fn deserialize(&self, bytes: &[u8]) -> Result<Executable, String> {
        self.client.deserialize(bytes).map_err(|e| e.to_string())
    }
}

/// The process-wide XLA backend.
pub struct Xla {
    cache: Cache<PjrtCompiler>,
    plugin_path: PathBuf,
    custom_calls: Result<(), String>,
}

/// The plugin file: `$TESSERA_PJRT_PLUGIN`, else the one `make setup` installed.
pub fn plugin_path() -> PathBuf {
    crate::config::Var::PjrtPlugin
        .get()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("TESSERA_DEFAULT_PJRT_PLUGIN")))
}

/// Identifies a plugin file cheaply: its size, modification time and a hash of its
/// first and last 4 MiB (hashing all of a 250 MB plugin would cost a second per process).
fn plugin_fingerprint(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let meta = f.metadata()?;
    let mut h = Sha256::new();
    h.update(meta.len().to_le_bytes());
    if let Ok(m) = meta.modified() {
        h.update(format!("{m:?}").as_bytes());
    }
    let window = 4 << 20;
    let mut buf = Vec::with_capacity(window);
    f.by_ref().take(window as u64).read_to_end(&mut buf)?;
    h.update(&buf);
    if meta.len() > 2 * window as u64 {
        f.seek(SeekFrom::End(-(window as i64)))?;
        buf.clear();
        f.read_to_end(&mut buf)?;
        h.update(&buf);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The backend, loaded on first use; `Err` says why it cannot be used.
pub fn backend() -> Result<&'static Xla, &'static str> {
    static XLA: OnceLock<Result<Xla, String>> = OnceLock::new();
    XLA.get_or_init(|| {
        let path = plugin_path();
        let plugin: &'static Plugin =
            Box::leak(Box::new(Plugin::load(&path).map_err(|e| e.to_string())?));
        let client = plugin
            .client()
            .map_err(|e| format!("PJRT client creation failed: {e}"))?;
        let custom_calls = register_custom_calls(plugin);
        let file = plugin_fingerprint(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let (major, minor) = plugin.api_version();
        let fingerprint = format!(
            "xla-cpu|pjrt {major}.{minor}|plugin {file}|options {:02x?}",
            crate::pjrt::COMPILE_OPTIONS
        );
        let dir = cache::default_dir().map(|d| d.join("xla"));
        Ok(Xla {
            cache: Cache::new(
                PjrtCompiler {
                    client,
                    fingerprint,
                },
                dir,
            ),
            plugin_path: path,
            custom_calls,
        })
    })
    .as_ref()
    .map_err(String::as_str)
}

/// Registers the `tessera_op` custom-call handler with the plugin (before any compile,
/// so programs calling it compile and deserialized ones find it).
fn register_custom_calls(plugin: &Plugin) -> Result<(), String> {
    #[cfg(tessera_xla_ffi)]
    {
        plugin
            .register_ffi_handler(
                crate::custom_call::TARGET,
                crate::custom_call::handler_ptr(),
            )
            .map_err(|e| format!("registering the Tessera custom-call handler failed: {e}"))
    }
    #[cfg(not(tessera_xla_ffi))]
    {
        let _ = plugin;
        Err("built without the XLA FFI header (jaxlib; run `make setup`)".into())
    }
}

impl Xla {
    /// Whether XLA programs can call Tessera ops (`Err` says why not).
    pub fn custom_calls(&self) -> Result<(), &str> {
        self.custom_calls
            .as_ref()
            .map(|_| ())
            .map_err(String::as_str)
    }

    /// Compiles a StableHLO module (or finds it in the cache); says where it came from.
    pub fn compile(&self, module: &str) -> Result<(std::sync::Arc<Executable>, Source), String> {
        self.cache.get(module)
    }

    /// Runs a compiled module on host memory (see [`Client::execute_host`]).
    ///
    /// # Safety
    /// As [`Client::execute_host`]: every buffer points at its elements, inputs alive and
    /// unchanged for the call, outputs writable.
    pub unsafe fn run_host(
        &self,
        exe: &Executable,
        inputs: &[HostBuffer],
        outputs: &[HostBuffer],
    ) -> Result<(), String> {
        // SAFETY: forwarded from the caller.
        unsafe {
            self.cache
                .compiler()
                .client
                .execute_host(exe, inputs, outputs)
        }
        .map_err(|e| e.to_string())
    }

    /// The plugin file in use.
    pub fn plugin_path(&self) -> &Path {
        &self.plugin_path
    }

    /// The compilation cache.
    pub fn cache(&self) -> &Cache<PjrtCompiler> {
        &self.cache
    }

    /// Lowers, compiles (or finds in the cache) and runs `kernel` on `inputs`.
    pub fn run(&self, kernel: &Kernel, inputs: &[Array]) -> Result<Vec<Array>, crate::Error> {
        kernel_ir::check_inputs(kernel, inputs)?;
        // XLA's dynamic slices would clamp a block that scalar-prefetch data places
        // outside its array: refuse such data instead.
        kernel_ir::check_scalar_prefetch(kernel, &kernel_ir::prefetch_data(kernel, inputs))?;
        use lowering::Lowering;
        // Checks cannot stop an XLA program: they become outputs, read after the run.
        let checked = kernel_ir::CheckOutputs::new(kernel);
        let lowered = checked.as_ref().map_or(kernel, |c| &c.kernel);
        let module = lowering::StableHlo
            .lower(lowered)
            .expect("StableHLO takes every verified kernel");
        let outputs = self.run_module(&kernel.name, &module, inputs, &lowered.output_types())?;
        match checked {
            Some(checked) => checked
                .finish(outputs)
                .map_err(|f| crate::Error::Run(kernel_ir::RunError::CheckFailed(f))),
            None => Ok(outputs),
        }
    }

    /// Compiles (or finds in the cache) and runs a StableHLO module given as text;
    /// `outputs` are its result types.
    pub fn run_module(
        &self,
        name: &str,
        module: &str,
        inputs: &[Array],
        outputs: &[TensorType],
    ) -> Result<Vec<Array>, crate::Error> {
        let t = Instant::now();
        let (exe, source) = self
            .cache
            .get(module)
            .map_err(|e| crate::Error::Xla(format!("compiling @{name}: {e}")))?;
        debug(|| {
            let how = match source {
                Source::Memory => "memory hit",
                Source::Disk => "loaded from the disk cache",
                Source::Compiled => "compiled",
            };
            format!(
                "xla @{name}: {how} in {:.1} ms",
                t.elapsed().as_secs_f64() * 1e3
            )
        });
        self.cache
            .compiler()
            .client
            .execute(&exe, inputs, outputs)
            .map_err(|e| crate::Error::Xla(format!("running @{name}: {e}")))
    }
}
