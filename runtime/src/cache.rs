//! The compilation cache: an in-memory tier where concurrent callers of the same module
//! compile it once, over an on-disk tier of serialized executables.
//!
//! Key: SHA-256 of (module text, compiler fingerprint: target, options, plugin file,
//! tessera version). Disk entries are `KEY.bin` files:
//! `b"TSRC" | format u32 | key [32] | payload length u64 | payload SHA-256 [32] | payload`,
//! written to a temporary file and renamed into place, so a killed writer never leaves
//! a partial entry. A corrupt, truncated or foreign entry (or one the compiler cannot
//! load) is dropped with a warning and recompiled.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use sha2::{Digest, Sha256};

const MAGIC: &[u8; 4] = b"TSRC";
const FORMAT: u32 = 1;
const HEADER: usize = 4 + 4 + 32 + 8 + 32;

/// What the cache compiles with.
pub trait Compiler: Send + Sync {
    /// A compiled program.
    type Executable: Send + Sync;
    /// Identifies target, options and compiler build: part of every key.
    fn fingerprint(&self) -> String;
    /// Compiles a module.
    fn compile(&self, module: &str) -> Result<Self::Executable, String>;
    /// Serializes an executable for the disk tier.
    fn serialize(&self, exe: &Self::Executable) -> Result<Vec<u8>, String>;
    /// Loads a serialized executable.
    fn deserialize(&self, bytes: &[u8]) -> Result<Self::Executable, String>;
}

/// Where a lookup was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Already compiled in this process.
    Memory,
    /// Loaded from the disk tier.
    Disk,
    /// Compiled now.
    Compiled,
}

impl Source {
    /// `memory`, `disk` or `compiled`.
    pub fn name(self) -> &'static str {
        match self {
            Source::Memory => "memory",
            Source::Disk => "disk",
            Source::Compiled => "compiled",
        }
    }
}

/// Counters of this process's lookups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Answered from memory.
    pub memory_hits: u64,
    /// Answered from disk.
    pub disk_hits: u64,
    /// Compiled.
    pub compiles: u64,
    /// Disk entries dropped as corrupt, truncated, foreign or unloadable.
    pub dropped: u64,
}

type Slot<E> = Arc<OnceLock<Result<Arc<E>, String>>>;

/// A two-tier compilation cache.
pub struct Cache<C: Compiler> {
    compiler: C,
    dir: Option<PathBuf>,
    memory: Mutex<HashMap<[u8; 32], Slot<C::Executable>>>,
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    compiles: AtomicU64,
    dropped: AtomicU64,
    /// A store failed (reported once: an unwritable directory fails every store).
    store_failed: AtomicBool,
}

/// The default disk-tier directory: `$TESSERA_CACHE_DIR`, else the user cache dir.
pub fn default_dir() -> Option<PathBuf> {
    if let Some(d) = crate::config::Var::CacheDir.get() {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("tessera"))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl<C: Compiler> Cache<C> {
    /// A cache over `compiler`, with a disk tier under `dir` (none if `None`).
    pub fn new(compiler: C, dir: Option<PathBuf>) -> Self {
        Cache {
            compiler,
            dir,
            memory: Mutex::new(HashMap::new()),
            memory_hits: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            compiles: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            store_failed: AtomicBool::new(false),
        }
    }

    /// The compiler.
    pub fn compiler(&self) -> &C {
        &self.compiler
    }

    /// This process's counters.
    pub fn stats(&self) -> Stats {
        Stats {
            memory_hits: self.memory_hits.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
            compiles: self.compiles.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }

    /// The cache key of a module.
    pub fn key(&self, module: &str) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.compiler.fingerprint().as_bytes());
        h.update([0]);
        h.update(env!("CARGO_PKG_VERSION").as_bytes());
        h.update([0]);
        h.update(module.as_bytes());
        h.finalize().into()
    }

    /// The disk file of a key.
    pub fn entry_path(&self, key: &[u8; 32]) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|d| d.join(format!("{}.bin", hex(key))))
    }

    /// The executable for `module`: from memory, else disk, else compiled (and stored).
    /// Concurrent callers with the same module wait for one compile.
    pub fn get(&self, module: &str) -> Result<(Arc<C::Executable>, Source), String> {
        let key = self.key(module);
        let slot = {
            let mut memory = self.memory.lock().unwrap_or_else(|p| p.into_inner());
            memory.entry(key).or_default().clone()
        };
        let mut source = Source::Memory;
        let result = slot.get_or_init(|| {
            let (exe, s) = self.load_or_compile(&key, module)?;
            source = s;
            Ok(Arc::new(exe))
        });
        match result {
            Ok(exe) => {
                let counter = match source {
                    Source::Memory => &self.memory_hits,
                    Source::Disk => &self.disk_hits,
                    Source::Compiled => &self.compiles,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                Ok((exe.clone(), source))
            }
            Err(e) => {
                // Failed compiles are not cached: the next call tries again.
                self.memory
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&key);
                Err(e.clone())
            }
        }
    }

    fn load_or_compile(
        &self,
        key: &[u8; 32],
        module: &str,
    ) -> Result<(C::Executable, Source), String> {
        if let Some(path) = self.entry_path(key) {
            match read_entry(&path, key) {
                Ok(Some(payload)) => match self.compiler.deserialize(&payload) {
                    Ok(exe) => return Ok((exe, Source::Disk)),
                    Err(e) => self.drop_entry(&path, &format!("the compiler cannot load it ({e})")),
                },
                Ok(None) => {}
                Err(reason) => self.drop_entry(&path, &reason),
            }
        }
        let exe = self.compiler.compile(module)?;
        if let Some(path) = self.entry_path(key) {
            let stored = self
                .compiler
                .serialize(&exe)
                .and_then(|payload| write_entry(&path, key, &payload).map_err(|e| e.to_string()));
            if let Err(e) = stored {
                if !self.store_failed.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "warning: tessera cache: could not store {}: {e}; executables \
                         are kept in memory only (further store failures are not reported)",
                        path.display()
                    );
                }
            }
        }
        Ok((exe, Source::Compiled))
    }

    fn drop_entry(&self, path: &Path, reason: &str) {
        eprintln!(
            "warning: tessera cache: dropping {}: {reason}; recompiling",
            path.display()
        );
        self.dropped.fetch_add(1, Ordering::Relaxed);
        let _ = fs::remove_file(path);
    }
}

/// Reads and checks an entry: `Ok(None)` when absent, `Err(reason)` when unusable.
pub(crate) fn read_entry(path: &Path, key: &[u8; 32]) -> Result<Option<Vec<u8>>, String> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("unreadable ({e})")),
    };
    decode_entry(&bytes, key).map(|payload| Some(payload.to_vec()))
}

/// The payload of an entry's bytes, checked against `key` (magic, format, key, length,
/// checksum); `Err(reason)` when unusable. Total on any input (fuzzed).
pub fn decode_entry<'b>(bytes: &'b [u8], key: &[u8; 32]) -> Result<&'b [u8], String> {
    if bytes.len() < HEADER {
        return Err(format!(
            "truncated ({} bytes, the header alone is {HEADER})",
            bytes.len()
        ));
    }
    if &bytes[..4] != MAGIC {
        return Err("not a tessera cache entry (bad magic)".into());
    }
    let format = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    if format != FORMAT {
        return Err(format!(
            "entry format {format}, this tessera reads {FORMAT}"
        ));
    }
    if &bytes[8..40] != key {
        return Err("foreign entry (its key does not match its name)".into());
    }
    let len = u64::from_le_bytes(bytes[40..48].try_into().expect("8 bytes"));
    let payload = &bytes[HEADER..];
    if payload.len() as u64 != len {
        return Err(format!(
            "truncated (payload {} of {len} bytes)",
            payload.len()
        ));
    }
    let sum: [u8; 32] = Sha256::digest(payload).into();
    if bytes[48..80] != sum {
        return Err("checksum mismatch".into());
    }
    Ok(payload)
}

/// The key an entry's header names (to check an entry whose key is not known, as
/// listings do); `Err` when the header is truncated.
pub(crate) fn stored_key(bytes: &[u8]) -> Result<[u8; 32], String> {
    bytes
        .get(8..40)
        .and_then(|k| k.try_into().ok())
        .ok_or_else(|| {
            format!(
                "truncated ({} bytes, the header alone is {HEADER})",
                bytes.len()
            )
        })
}

/// The bytes of an entry holding `payload` under `key`.
pub fn encode_entry(key: &[u8; 32], payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER + payload.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&FORMAT.to_le_bytes());
    bytes.extend_from_slice(key);
    bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&Sha256::digest(payload));
    bytes.extend_from_slice(payload);
    bytes
}

/// Delay between the two halves of an entry's write, for the kill-a-writer test.
fn write_delay() -> Option<std::time::Duration> {
    crate::config::Var::CacheWriteDelayMs
        .get()
        .and_then(|v| v.parse().ok())
        .map(std::time::Duration::from_millis)
}

/// Writes an entry atomically: a temporary file in the same directory, then a rename.
pub(crate) fn write_entry(path: &Path, key: &[u8; 32], payload: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("entries live in a directory");
    fs::create_dir_all(dir)?;
    let bytes = encode_entry(key, payload);
    let tmp = dir.join(format!(".{}.{}.tmp", hex(&key[..8]), std::process::id()));
    let mut f = fs::File::create(&tmp)?;
    let half = bytes.len() / 2;
    f.write_all(&bytes[..half])?;
    if let Some(d) = write_delay() {
        f.flush()?;
        std::thread::sleep(d);
    }
    f.write_all(&bytes[half..])?;
    f.sync_all()?;
    fs::rename(&tmp, path)
}

/// Entries (and leftover temporary files) in a cache directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// Complete entries.
    pub entries: usize,
    /// Their total size in bytes.
    pub bytes: u64,
    /// Temporary files left by interrupted writers.
    pub leftovers: usize,
}

/// A file a cache directory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CacheFile {
    /// A complete entry (`.bin`).
    Entry,
    /// A temporary file an interrupted writer left (`.tmp`).
    Leftover,
}

/// The entries and leftovers directly under `dir` (none when it does not exist).
pub(crate) fn cache_files(dir: &Path) -> std::io::Result<Vec<(PathBuf, CacheFile)>> {
    let listing = match fs::read_dir(dir) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut files = Vec::new();
    for entry in listing.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let kind = if name.ends_with(".bin") {
            CacheFile::Entry
        } else if name.ends_with(".tmp") {
            CacheFile::Leftover
        } else {
            continue;
        };
        files.push((entry.path(), kind));
    }
    Ok(files)
}

/// Counts the entries under `dir`.
pub fn disk_usage(dir: &Path) -> std::io::Result<DiskUsage> {
    let mut u = DiskUsage::default();
    for (path, kind) in cache_files(dir)? {
        match kind {
            CacheFile::Entry => {
                u.entries += 1;
                u.bytes += fs::metadata(&path).map_or(0, |m| m.len());
            }
            CacheFile::Leftover => u.leftovers += 1,
        }
    }
    Ok(u)
}

/// Removes every entry and leftover under `dir`; returns how many files went.
pub fn clear(dir: &Path) -> std::io::Result<usize> {
    remove_files(dir, |_| true)
}

/// Removes the entries and leftovers under `dir` whose file name `chosen` accepts;
/// returns how many files went.
pub(crate) fn remove_files(dir: &Path, chosen: impl Fn(&str) -> bool) -> std::io::Result<usize> {
    let mut removed = 0;
    for (path, _) in cache_files(dir)? {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.as_deref().is_some_and(&chosen) {
            fs::remove_file(&path)?;
            removed += 1;
        }
    }
    Ok(removed)
}
