//! Tuned configurations on disk: `$TESSERA_CACHE_DIR/tune/`, one entry per kernel,
//! problem (its non-tunable parameters), target, machine fingerprint and Tessera version.
//!
//! `tessera tune` writes entries; `tessera run/bench/lower`, the torch ops and graph
//! mode's custom calls read them through [`lookup`] (the parameters a caller sets
//! itself are never replaced). Entries use the compilation cache's format and rules
//! ([`crate::cache::encode_entry`]: magic, key, length, SHA-256; written to a temporary
//! file and renamed): a corrupt, truncated or foreign entry is dropped with a warning,
//! and the caller falls back to the defaults (or `tessera tune` measures again).
//! `TESSERA_TUNE=off` makes [`lookup`] ignore every entry.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::cache;
use crate::Backend;

/// What a configuration is tuned for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TuneTarget {
    /// The native CPU backend: measured.
    Native,
    /// XLA through PJRT: measured.
    Xla,
    /// Mosaic TPU kernels: ranked by a cost model (no TPU here to time them).
    Mosaic,
}

impl TuneTarget {
    /// Every target, by name.
    pub const ALL: [TuneTarget; 3] = [TuneTarget::Native, TuneTarget::Xla, TuneTarget::Mosaic];

    /// The name used on the command line and in entries.
    pub fn name(self) -> &'static str {
        match self {
            TuneTarget::Native => "native",
            TuneTarget::Xla => "xla",
            TuneTarget::Mosaic => "mosaic",
        }
    }

    /// The target of a backend that runs kernels here (none for the interpreter).
    pub fn of_backend(b: Backend) -> Option<TuneTarget> {
        match b {
            Backend::Native => Some(TuneTarget::Native),
            Backend::Xla => Some(TuneTarget::Xla),
            Backend::Interp | Backend::Auto => None,
        }
    }
}

/// The target whose tuned configurations apply to a run on `requested`: `auto` is the
/// backend that would run the op's first kernel (`first_kernel`, built only then).
fn target_for(
    requested: Backend,
    first_kernel: impl FnOnce() -> Option<kernel_ir::Kernel>,
) -> Option<TuneTarget> {
    match requested {
        Backend::Auto => {
            let resolution = crate::resolve(requested, &first_kernel()?).ok()?;
            TuneTarget::of_backend(resolution.backend)
        }
        concrete => TuneTarget::of_backend(concrete),
    }
}

impl fmt::Display for TuneTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for TuneTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        TuneTarget::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| format!("unknown tuning target `{s}`: expected native, xla or mosaic"))
    }
}

/// What identifies a tuned configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TuneKey {
    /// Library kernel name.
    pub kernel: String,
    /// Its non-tunable parameters, `name=value,...` in name order.
    pub problem: String,
    /// Where it runs.
    pub target: TuneTarget,
}

/// A tuned configuration, as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct Tuned {
    /// What it is for.
    pub key: TuneKey,
    /// The machine fingerprint it was measured on ([`machine`]).
    pub machine: String,
    /// The Tessera version that measured it.
    pub version: String,
    /// The chosen values of the tunable parameters.
    pub config: Vec<(String, String)>,
    /// Median time of the chosen configuration (modeled for Mosaic), ms.
    pub best_ms: f64,
    /// Median time of the defaults, ms.
    pub default_ms: f64,
    /// Candidates timed (or modeled).
    pub tried: usize,
}

impl Tuned {
    /// The configuration as `name=value,...`.
    pub fn config_text(&self) -> String {
        let parts: Vec<String> = self
            .config
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        parts.join(",")
    }

    /// Whether it was made for this machine and this Tessera.
    pub fn is_current(&self) -> bool {
        self.machine == machine(self.key.target) && self.version == env!("CARGO_PKG_VERSION")
    }

    fn payload(&self) -> String {
        format!(
            "tessera-tune 1\nkernel {}\nproblem {}\ntarget {}\nmachine {}\nversion {}\n\
             config {}\nbest_ms {}\ndefault_ms {}\ntried {}\n",
            self.key.kernel,
            self.key.problem,
            self.key.target,
            self.machine,
            self.version,
            self.config_text(),
            self.best_ms,
            self.default_ms,
            self.tried
        )
    }

    /// Parses a payload; `Err` names the missing or bad field. Total on any input.
    fn parse(payload: &[u8]) -> Result<Tuned, String> {
        let text = std::str::from_utf8(payload).map_err(|_| "not UTF-8 text".to_string())?;
        let mut lines = text.lines();
        if lines.next() != Some("tessera-tune 1") {
            return Err("not a tuned configuration (bad first line)".into());
        }
        let fields: Vec<(&str, &str)> = lines.filter_map(|l| l.split_once(' ')).collect();
        let field = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| *v)
                .ok_or_else(|| format!("field `{name}` is missing"))
        };
        let number = |name: &str| -> Result<f64, String> {
            field(name)?
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| format!("field `{name}` is not a time"))
        };
        let config = field("config")?
            .split(',')
            .map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .ok_or_else(|| format!("config item `{kv}` is not name=value"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Tuned {
            key: TuneKey {
                kernel: field("kernel")?.to_string(),
                problem: field("problem")?.to_string(),
                target: field("target")?.parse()?,
            },
            machine: field("machine")?.to_string(),
            version: field("version")?.to_string(),
            config,
            best_ms: number("best_ms")?,
            default_ms: number("default_ms")?,
            tried: field("tried")?
                .parse()
                .map_err(|_| "field `tried` is not a count".to_string())?,
        })
    }
}

/// This machine as tuning sees it: for CPU targets the CPU model, its logical CPUs and
/// its L2 size; for Mosaic the cost model's TPU.
pub fn machine(target: TuneTarget) -> &'static str {
    match target {
        TuneTarget::Mosaic => MOSAIC_MODEL,
        TuneTarget::Native | TuneTarget::Xla => cpu(),
    }
}

/// The CPU part of [`machine`], read once per process.
fn cpu() -> &'static str {
    static CPU: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    CPU.get_or_init(|| {
        let model = fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| {
                c.lines()
                    .find_map(|l| l.strip_prefix("model name"))
                    .map(|l| l.trim_start_matches([' ', '\t', ':']).trim().to_string())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        format!("{model}; {cpus} cpus; L2 {} KiB", l2_bytes() / 1024)
    })
}

/// The TPU the Mosaic cost model describes (part of Mosaic entries' fingerprint).
pub const MOSAIC_MODEL: &str = "TPU v5e cost model: 819 GB/s HBM, 197 TFLOP/s, 0.35 us per step";

/// Bytes of one core's L2 cache (sysfs; 512 KiB when unknown).
pub fn l2_bytes() -> u64 {
    let parse = |s: &str| {
        let s = s.trim();
        let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
        let n: u64 = n.parse().ok()?;
        Some(match unit {
            "K" => n << 10,
            "M" => n << 20,
            _ => n,
        })
    };
    fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index2/size")
        .ok()
        .and_then(|s| parse(&s))
        .unwrap_or(512 << 10)
}

fn digest(key: &TuneKey) -> [u8; 32] {
    digest_of(&[
        key.kernel.as_str(),
        key.problem.as_str(),
        key.target.name(),
        machine(key.target),
        env!("CARGO_PKG_VERSION"),
    ])
}

/// The SHA-256 of `parts`, each ended by a zero byte (so no two lists hash alike by
/// moving text across a boundary).
fn digest_of(parts: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in parts {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.finalize().into()
}

/// The tuned configurations under one directory.
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// The store under `dir`.
    pub fn at(dir: impl Into<PathBuf>) -> Store {
        Store { dir: dir.into() }
    }

    /// `tune/` under the cache directory ([`cache::default_dir`]), if there is one.
    pub fn default_store() -> Option<Store> {
        cache::default_dir().map(|d| Store::at(d.join("tune")))
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of a key.
    pub fn entry_path(&self, key: &TuneKey) -> PathBuf {
        self.path_of(key, &digest(key))
    }

    fn path_of(&self, key: &TuneKey, digest: &[u8; 32]) -> PathBuf {
        let hex = cache::hex(&digest[..8]);
        self.dir.join(format!("{}-{hex}.bin", key.kernel))
    }

    /// The configuration tuned for `key` on this machine, if any. A corrupt entry is
    /// removed and reported as `Err(reason)`.
    pub fn get(&self, key: &TuneKey) -> Result<Option<Tuned>, String> {
        let digest = digest(key);
        let path = self.path_of(key, &digest);
        let checked = match cache::read_entry(&path, &digest) {
            Ok(None) => return Ok(None),
            Ok(Some(payload)) => Tuned::parse(&payload).and_then(|t| match t.key == *key {
                true => Ok(t),
                false => Err("foreign entry (it is for another kernel or problem)".into()),
            }),
            Err(reason) => Err(reason),
        };
        match checked {
            Ok(t) => Ok(Some(t)),
            Err(reason) => {
                let _ = fs::remove_file(&path);
                Err(format!("dropped {}: {reason}", path.display()))
            }
        }
    }

    /// Stores `tuned` (replacing an older entry for its key); returns the file.
    pub fn put(&self, tuned: &Tuned) -> std::io::Result<PathBuf> {
        let path = self.entry_path(&tuned.key);
        cache::write_entry(&path, &digest(&tuned.key), tuned.payload().as_bytes())?;
        Ok(path)
    }

    /// Every entry, readable or not (entries of other machines and versions included:
    /// see [`Tuned::is_current`]).
    pub fn list(&self) -> std::io::Result<Vec<(PathBuf, Result<Tuned, String>)>> {
        let mut out = Vec::new();
        for path in self.entries()? {
            let parsed = fs::read(&path)
                .map_err(|e| format!("unreadable ({e})"))
                .and_then(|bytes| {
                    // The key is not known before parsing: check the header's own key.
                    let key = cache::stored_key(&bytes)?;
                    cache::decode_entry(&bytes, &key).and_then(Tuned::parse)
                });
            out.push((path, parsed));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Removes the entries of `kernel`, or every entry and leftover temporary file when
    /// `None`; returns how many files went.
    pub fn clear(&self, kernel: Option<&str>) -> std::io::Result<usize> {
        cache::remove_files(&self.dir, |name| {
            kernel.is_none_or(|k| name.rsplit_once('-').is_some_and(|(stem, _)| stem == k))
        })
    }

    fn entries(&self) -> std::io::Result<Vec<PathBuf>> {
        let files = cache::cache_files(&self.dir)?;
        Ok(files
            .into_iter()
            .filter(|(_, kind)| *kind == cache::CacheFile::Entry)
            .map(|(path, _)| path)
            .collect())
    }
}

/// The configuration tuned for `kernel`'s `problem` on `target` in the default store,
/// or `None` (no store, no entry, `TESSERA_TUNE=off`, or a corrupt entry, which is
/// dropped with a warning). `TESSERA_LOG=debug` says which.
pub fn lookup(kernel: &str, problem: &str, target: TuneTarget) -> Option<Tuned> {
    let what = || format!("{kernel} {problem} on {target}");
    if crate::config::Var::Tune.is("off") {
        crate::debug(|| format!("TESSERA_TUNE=off: default blocks for {}", what()));
        return None;
    }
    let store = Store::default_store()?;
    let key = TuneKey {
        kernel: kernel.to_string(),
        problem: problem.to_string(),
        target,
    };
    match store.get(&key) {
        Ok(Some(t)) => {
            crate::debug(|| {
                format!(
                    "tuned config {} for {} ({})",
                    t.config_text(),
                    what(),
                    store.entry_path(&key).display()
                )
            });
            Some(t)
        }
        Ok(None) => {
            crate::debug(|| format!("no tuned config for {}: default blocks", what()));
            None
        }
        Err(reason) => {
            eprintln!("warning: tessera tune: {reason}; using the default blocks (run `tessera tune {kernel}` again)");
            None
        }
    }
}

/// The stored config (`name=value` pairs) for `kernel`'s `problem` on `target`, or, for
/// `None`, on the target of the backend `requested` resolves to (`first_kernel` builds the
/// op's first kernel, only for `auto`): what the CLI, the torch ops and graph mode apply
/// through `kernels::tuning::apply_stored`.
pub fn stored_config(
    kernel: &str,
    problem: &str,
    target: Option<TuneTarget>,
    requested: Backend,
    first_kernel: impl FnOnce() -> Option<kernel_ir::Kernel>,
) -> Option<Vec<(String, String)>> {
    let target = target.or_else(|| target_for(requested, first_kernel))?;
    Some(lookup(kernel, problem, target)?.config)
}

/// Graph mode's measured choices: which kernels a graph substitutes, kept per graph
/// (its code and input types), machine and Tessera version under `graph-choices/` of
/// the cache directory, in the entries' format (a corrupt, truncated or foreign entry
/// is dropped and reported, and the graph is measured again).
#[derive(Clone, Debug)]
pub struct GraphChoices {
    dir: PathBuf,
}

impl GraphChoices {
    /// The choices under `dir`.
    pub fn at(dir: impl Into<PathBuf>) -> GraphChoices {
        GraphChoices { dir: dir.into() }
    }

    /// `graph-choices/` under the cache directory, if there is one.
    pub fn default_choices() -> Option<GraphChoices> {
        cache::default_dir().map(|d| GraphChoices::at(d.join("graph-choices")))
    }

    fn digest(graph: &str) -> [u8; 32] {
        digest_of(&[graph, cpu(), env!("CARGO_PKG_VERSION")])
    }

    fn path(&self, digest: &[u8; 32]) -> PathBuf {
        self.dir
            .join(format!("graph-{}.bin", cache::hex(&digest[..8])))
    }

    /// The choice stored for `graph` on this machine, if any. A corrupt entry is removed
    /// and reported as `Err(reason)`.
    pub fn get(&self, graph: &str) -> Result<Option<String>, String> {
        let digest = Self::digest(graph);
        let path = self.path(&digest);
        let read = cache::read_entry(&path, &digest).and_then(|payload| {
            payload
                .map(|p| String::from_utf8(p).map_err(|_| "not UTF-8".to_string()))
                .transpose()
        });
        read.map_err(|reason| {
            let _ = fs::remove_file(&path);
            format!("dropped {}: {reason}", path.display())
        })
    }

    /// Stores `choice` for `graph` (replacing an older one); returns the file.
    pub fn put(&self, graph: &str, choice: &str) -> std::io::Result<PathBuf> {
        let digest = Self::digest(graph);
        let path = self.path(&digest);
        cache::write_entry(&path, &digest, choice.as_bytes())?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuned(kernel: &str) -> Tuned {
        Tuned {
            key: TuneKey {
                kernel: kernel.into(),
                problem: "dtype=f32,rows=64".into(),
                target: TuneTarget::Native,
            },
            machine: machine(TuneTarget::Native).into(),
            version: env!("CARGO_PKG_VERSION").into(),
            config: vec![("block_rows".into(), "16".into())],
            best_ms: 0.25,
            default_ms: 0.5,
            tried: 7,
        }
    }

    #[test]
    fn graph_choices_round_trip_and_drop_corrupt_entries() {
        let dir = tempfile::tempdir().unwrap();
        let choices = GraphChoices::at(dir.path());
        assert_eq!(choices.get("graph a").unwrap(), None);
        let path = choices
            .put("graph a", r#"{"kernels": ["rms_norm"]}"#)
            .unwrap();
        assert_eq!(
            choices.get("graph a").unwrap().as_deref(),
            Some(r#"{"kernels": ["rms_norm"]}"#)
        );
        assert_eq!(choices.get("graph b").unwrap(), None);
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&path, bytes).unwrap();
        let err = choices.get("graph a").unwrap_err();
        assert!(
            err.starts_with("dropped ") && err.contains("graph-"),
            "{err}"
        );
        assert!(!path.exists());
        assert_eq!(choices.get("graph a").unwrap(), None);
    }

    #[test]
    fn entries_round_trip_and_clear_by_kernel() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::at(dir.path());
        let (a, b) = (tuned("softmax"), tuned("rms_norm"));
        store.put(&a).unwrap();
        store.put(&b).unwrap();
        assert_eq!(store.get(&a.key).unwrap(), Some(a.clone()));
        assert!(a.is_current());
        let mut other = a.key.clone();
        other.problem = "dtype=f32,rows=65".into();
        assert_eq!(store.get(&other).unwrap(), None);
        assert_eq!(store.list().unwrap().len(), 2);
        assert_eq!(store.clear(Some("softmax")).unwrap(), 1);
        assert_eq!(store.get(&a.key).unwrap(), None);
        assert_eq!(store.get(&b.key).unwrap(), Some(b));
    }

    #[test]
    fn corrupt_entries_are_dropped_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::at(dir.path());
        let t = tuned("softmax");
        let path = store.put(&t).unwrap();
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 3;
        bytes[last] ^= 0x55;
        fs::write(&path, &bytes).unwrap();
        let err = store.get(&t.key).unwrap_err();
        assert!(err.contains("checksum mismatch"), "{err}");
        assert!(!path.exists(), "the corrupt entry is removed");
        assert_eq!(store.get(&t.key).unwrap(), None);
        fs::write(&path, b"short").unwrap();
        assert!(store.get(&t.key).unwrap_err().contains("truncated"));
    }

    #[test]
    fn payloads_with_missing_or_bad_fields_are_refused() {
        let good = tuned("softmax").payload();
        assert_eq!(Tuned::parse(good.as_bytes()).unwrap(), tuned("softmax"));
        for (from, to, want) in [
            ("best_ms 0.25", "best_ms fast", "best_ms"),
            ("tried 7", "", "tried"),
            ("target native", "target gpu", "gpu"),
            ("config block_rows=16", "config block_rows", "name=value"),
            ("tessera-tune 1", "tessera-tune 2", "first line"),
        ] {
            let bad = good.replace(from, to);
            let err = Tuned::parse(bad.as_bytes()).unwrap_err();
            assert!(err.contains(want), "{from} -> {to}: {err}");
        }
        assert!(Tuned::parse(&[0xff, 0xfe]).is_err());
    }
}
