//! Every `TESSERA_*` environment variable, declared once: its name, default and what it
//! does. Rust reads them through [`Var`]; Python reads the same table through the
//! extension (`tessera.config`); `tessera config` and `python -m tessera config` print
//! it with the current values. Values are read at each use (tests and users set them
//! at run time); an empty value counts as unset.

macro_rules! variables {
    ($($var:ident => $name:literal, $default:literal, $doc:literal;)*) => {
        /// A `TESSERA_*` environment variable.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Var {
            $(#[doc = $doc] $var),*
        }

        impl Var {
            /// Every variable, in the table's order.
            pub const ALL: &'static [Var] = &[$(Var::$var),*];

            /// Its name in the environment.
            pub fn name(self) -> &'static str {
                match self { $(Var::$var => $name),* }
            }

            /// What applies when it is unset (empty: nothing).
            pub fn default(self) -> &'static str {
                match self { $(Var::$var => $default),* }
            }

            /// What it does.
            pub fn doc(self) -> &'static str {
                match self { $(Var::$var => $doc),* }
            }
        }
    };
}

variables! {
    Backend => "TESSERA_BACKEND", "auto",
        "Backend for kernels: native, xla, interp or auto (native > xla > interp).";
    Log => "TESSERA_LOG", "",
        "`debug`: one stderr line per compilation, cache lookup and backend choice (Rust), and the graph-mode log at DEBUG (Python's `tessera` logger).";
    CacheDir => "TESSERA_CACHE_DIR", "$XDG_CACHE_HOME/tessera, else ~/.cache/tessera",
        "Directory of the on-disk compilation cache (XLA executables).";
    CacheWriteDelayMs => "TESSERA_CACHE_WRITE_DELAY_MS", "0",
        "Test hook: milliseconds a cache write waits before its rename (to exercise concurrent writers).";
    PjrtPlugin => "TESSERA_PJRT_PLUGIN", "the plugin `make setup` installs",
        "Path of the PJRT CPU plugin the XLA backend loads.";
    NativeRegisters => "TESSERA_NATIVE_REGISTERS", "this CPU's",
        "Vector registers the native backend compiles for: avx2, or avx512 where the CPU has it.";
    NativePipeline => "TESSERA_NATIVE_PIPELINE", "the built-in pass pipeline",
        "MLIR pass pipeline of the native backend (for experiments).";
    InterpPoison => "TESSERA_INTERP_POISON", "0",
        "`1`: the interpreter fills scratch and outputs with NaN first, so reads of unwritten data show.";
    Tune => "TESSERA_TUNE", "on",
        "`off`: ignore configurations stored by `tessera tune`.";
    ThreadPool => "TESSERA_THREAD_POOL", "openmp",
        "Python: `tessera` runs native kernels on Tessera's own threads instead of PyTorch's OpenMP pool.";
    NativeAutograd => "TESSERA_NATIVE_AUTOGRAD", "1",
        "Python: `0` keeps the ops' autograd kernels (and user ops' CPU kernels) in Python.";
    GraphCompiler => "TESSERA_GRAPH_COMPILER", "inductor",
        "Python graph mode: the compiler after substitution, inductor or xla (`options={'compiler': ...}` wins).";
    XlaClient => "TESSERA_XLA_CLIENT", "jaxlib",
        "Python graph mode, XLA path: the XLA client, `jaxlib` (jaxlib's in-process CPU client, when jaxlib is installed; else the plugin) or `plugin` (the PJRT plugin).";
    GraphKernels => "TESSERA_GRAPH_KERNELS", "auto",
        "Python graph mode: the kernels substituted, `auto` (on the Inductor path, those that make the graph faster, measured once per graph and kept in the cache directory; on the XLA path, all), `all`, `none` or a list such as `flash_attention,rms_norm` (`options={'kernels': ...}` wins).";
    GraphShapes => "TESSERA_GRAPH_SHAPES", "8",
        "Python graph mode, XLA path: shapes compiled per dynamic graph before it falls back to eager.";
    GraphStrict => "TESSERA_GRAPH_STRICT", "0",
        "Python graph mode: `1` raises instead of falling back to eager PyTorch with a warning.";
    Dump => "TESSERA_DUMP", "",
        "Python graph mode: a directory to write each graph's FX code and StableHLO to.";
    RequireXla => "TESSERA_REQUIRE_XLA", "",
        "Tests: fail instead of skipping when the XLA backend is unavailable (`make test` sets it).";
    RequireJax => "TESSERA_REQUIRE_JAX", "",
        "Tests: fail instead of skipping when jax/jaxlib/libtpu are missing (`make test` sets it).";
}

impl Var {
    /// The value set in the environment, if any (empty counts as unset).
    pub fn get(self) -> Option<String> {
        std::env::var(self.name()).ok().filter(|v| !v.is_empty())
    }

    /// Whether the variable is set to `value`.
    pub fn is(self, value: &str) -> bool {
        self.get().is_some_and(|v| v == value)
    }
}

/// Whether `TESSERA_LOG=debug`: the one place that reads it.
pub fn debug_log() -> bool {
    Var::Log.is("debug")
}

/// The table as text: one line per variable with its current value, default and doc.
pub fn describe() -> String {
    Var::ALL
        .iter()
        .map(|v| {
            let value = v.get().unwrap_or_else(|| "(unset)".into());
            let default = match v.default() {
                "" => String::new(),
                d => format!(" [default: {d}]"),
            };
            format!("{}={value}{default}\n    {}\n", v.name(), v.doc())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variable_is_named_tessera_and_documented_once() {
        let mut names: Vec<&str> = Var::ALL.iter().map(|v| v.name()).collect();
        assert!(names.iter().all(|n| n.starts_with("TESSERA_")));
        assert!(Var::ALL.iter().all(|v| v.doc().ends_with('.')));
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Var::ALL.len());
        assert!(describe().contains("TESSERA_BACKEND="));
    }
}
