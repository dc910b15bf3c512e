//! The compilation cache with a fake compiler: single-flight compiles, the disk tier,
//! and corrupt, truncated, foreign and half-written entries.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use runtime::cache::{disk_usage, Cache, Compiler, Source};

/// "Compiles" a module into `exe:<module>`, slowly, counting compiles.
#[derive(Default)]
struct Fake {
    compiles: Arc<AtomicUsize>,
}

impl Compiler for Fake {
    type Executable = String;
    fn fingerprint(&self) -> String {
        "fake-compiler-1".into()
    }
    fn compile(&self, module: &str) -> Result<String, String> {
        if module.contains("syntax error") {
            return Err(format!("cannot compile `{module}`"));
        }
        self.compiles.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        Ok(format!("exe:{module}"))
    }
    fn serialize(&self, exe: &String) -> Result<Vec<u8>, String> {
        Ok(exe.as_bytes().to_vec())
    }
    fn deserialize(&self, bytes: &[u8]) -> Result<String, String> {
        let s = String::from_utf8(bytes.to_vec()).map_err(|e| e.to_string())?;
        if s.starts_with("exe:") {
            Ok(s)
        } else {
            Err("not an executable".into())
        }
    }
}

fn cache(dir: &Path) -> (Cache<Fake>, Arc<AtomicUsize>) {
    let fake = Fake::default();
    let count = fake.compiles.clone();
    (Cache::new(fake, Some(dir.to_path_buf())), count)
}

#[test]
fn concurrent_callers_compile_once() {
    let dir = tempfile::tempdir().unwrap();
    let (c, count) = cache(dir.path());
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| assert_eq!(*c.get("module A").unwrap().0, "exe:module A"));
        }
    });
    assert_eq!(count.load(Ordering::SeqCst), 1);
    let st = c.stats();
    assert_eq!((st.compiles, st.memory_hits), (1, 7));
}

#[test]
fn the_disk_tier_serves_a_new_process() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = cache(dir.path());
    assert_eq!(first.get("module B").unwrap().1, Source::Compiled);
    assert_eq!(first.get("module B").unwrap().1, Source::Memory);
    let (second, count) = cache(dir.path());
    assert_eq!(second.get("module B").unwrap().1, Source::Disk);
    assert_eq!(count.load(Ordering::SeqCst), 0);
    assert_eq!(disk_usage(dir.path()).unwrap().entries, 1);
}

#[test]
fn failed_compiles_are_reported_and_not_cached() {
    let dir = tempfile::tempdir().unwrap();
    let (c, _) = cache(dir.path());
    let e = c.get("syntax error here").unwrap_err();
    assert!(e.contains("cannot compile"), "{e}");
    assert!(c.get("syntax error here").is_err());
    assert_eq!(disk_usage(dir.path()).unwrap().entries, 0);
}

/// Damages the stored entry of a module with `damage`, then checks a fresh cache drops
/// it, recompiles and stores a good entry again.
fn damaged_entry_is_recompiled(damage: impl FnOnce(&Path, Vec<u8>)) {
    let dir = tempfile::tempdir().unwrap();
    let (c, _) = cache(dir.path());
    c.get("module C").unwrap();
    let path = c.entry_path(&c.key("module C")).unwrap();
    damage(&path, std::fs::read(&path).unwrap());
    let (fresh, count) = cache(dir.path());
    let (exe, source) = fresh.get("module C").unwrap();
    assert_eq!((exe.as_str(), source), ("exe:module C", Source::Compiled));
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert_eq!(fresh.stats().dropped, 1);
    let (again, _) = cache(dir.path());
    assert_eq!(again.get("module C").unwrap().1, Source::Disk);
}

#[test]
fn corrupt_entries_are_dropped() {
    damaged_entry_is_recompiled(|path, mut bytes| {
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        std::fs::write(path, bytes).unwrap();
    });
}

#[test]
fn truncated_entries_are_dropped() {
    damaged_entry_is_recompiled(|path, bytes| {
        std::fs::write(path, &bytes[..bytes.len() - 3]).unwrap()
    });
    damaged_entry_is_recompiled(|path, bytes| std::fs::write(path, &bytes[..10]).unwrap());
}

#[test]
fn foreign_entries_are_dropped() {
    // Another module's entry under this module's name.
    damaged_entry_is_recompiled(|path, _| {
        let dir = tempfile::tempdir().unwrap();
        let (other, _) = cache(dir.path());
        other.get("module Z").unwrap();
        let theirs = std::fs::read(other.entry_path(&other.key("module Z")).unwrap()).unwrap();
        std::fs::write(path, theirs).unwrap();
    });
    // Not a cache entry at all.
    damaged_entry_is_recompiled(|path, _| std::fs::write(path, vec![7u8; 200]).unwrap());
}

#[test]
fn entries_the_compiler_cannot_load_are_dropped() {
    // A well-formed entry (right key, right checksum) whose payload the compiler rejects.
    damaged_entry_is_recompiled(|path, mut bytes| {
        let header = bytes.len() - "exe:module C".len();
        bytes.truncate(header);
        bytes.extend_from_slice(b"xyz:module C");
        let sum: [u8; 32] = sha2::Digest::finalize(sha2::Digest::chain_update(
            <sha2::Sha256 as sha2::Digest>::new(),
            &bytes[header..],
        ))
        .into();
        bytes[48..80].copy_from_slice(&sum);
        std::fs::write(path, bytes).unwrap();
    });
}

/// Child half of `a_killed_writer_leaves_no_entry`: writes one entry, slowly.
#[test]
#[ignore = "run by a_killed_writer_leaves_no_entry in a child process"]
fn slow_writer_child() {
    let dir = std::env::var("TESSERA_TEST_CACHE_DIR").expect("set by the parent test");
    let (c, _) = cache(Path::new(&dir));
    c.get("module K").unwrap();
}

#[test]
fn a_killed_writer_leaves_no_entry() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "cache::slow_writer_child",
            "--ignored",
            "--nocapture",
        ])
        .env("TESSERA_TEST_CACHE_DIR", dir.path())
        .env("TESSERA_CACHE_WRITE_DELAY_MS", "20000")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait for the half-written temporary file, then kill the writer.
    let mut waited = 0;
    while disk_usage(dir.path()).unwrap().leftovers == 0 {
        assert!(waited < 200, "the child never started writing");
        std::thread::sleep(Duration::from_millis(50));
        waited += 1;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let u = disk_usage(dir.path()).unwrap();
    assert_eq!((u.entries, u.leftovers), (0, 1));
    let (c, count) = cache(dir.path());
    assert_eq!(c.get("module K").unwrap().1, Source::Compiled);
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert_eq!(runtime::cache::clear(dir.path()).unwrap(), 2);
}

/// The cache-entry fuzzer's kept inputs (`kernel-ir/fuzz/regressions/cache_entry`) go
/// through the same checks as in the fuzzer: decoding never panics, and what decodes is
/// exactly the encoding of its payload.
#[test]
fn kept_fuzz_inputs_decode_or_are_rejected() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../kernel-ir/fuzz/regressions/cache_entry");
    let key = [7u8; 32];
    let mut accepted = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        if let Ok(payload) = runtime::cache::decode_entry(&bytes, &key) {
            assert_eq!(runtime::cache::encode_entry(&key, payload), bytes);
            accepted += 1;
        }
    }
    assert_eq!(accepted, 1, "exactly one kept input is a valid entry");
}

/// A cache directory that cannot be written (here: a path under a regular file, which
/// even root cannot create) leaves every lookup working from memory.
#[test]
fn an_unwritable_directory_keeps_executables_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let (c, count) = cache(&file.join("cache"));
    for module in ["module D", "module E", "module D"] {
        assert_eq!(*c.get(module).unwrap().0, format!("exe:{module}"));
    }
    assert_eq!(count.load(Ordering::SeqCst), 2);
    assert_eq!((c.stats().compiles, c.stats().memory_hits), (2, 1));
}
