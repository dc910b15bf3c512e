//! Who runs a grid's shares with the calling thread: the process's OpenMP team, when the
//! embedder installed one ([`use_openmp`]), else Tessera's own crew (`crew.rs`).
//!
//! Inside PyTorch the OpenMP team is ATen's intra-op pool. Its threads spin for a while
//! after each PyTorch op, so a crew of Tessera's own would compete with them for the
//! cores whenever the two alternate (measured in one process on 2 cores: a GQA attention
//! forward through the torch op took 0.91 ms alternating with PyTorch's calls, 0.63 ms
//! with PyTorch's threads told not to spin). On the team PyTorch already keeps hot, the
//! two take turns instead, and its thread count (`torch.set_num_threads`) bounds both.

use std::ffi::{c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use super::crew;

/// libgomp's entry points (GCC's OpenMP ABI, which PyTorch's Linux wheels ship).
#[derive(Clone, Copy)]
pub struct OpenMp {
    /// `GOMP_parallel(fn, data, num_threads, flags)`: runs `fn(data)` on every thread of
    /// a team, the caller as thread 0, and returns when all have.
    parallel: unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, c_uint, c_uint),
    thread_num: unsafe extern "C" fn() -> c_int,
    num_threads: unsafe extern "C" fn() -> c_int,
    max_threads: unsafe extern "C" fn() -> c_int,
    in_parallel: unsafe extern "C" fn() -> c_int,
}

/// The symbols [`OpenMp::from_symbols`] takes, in its argument order.
pub const OPENMP_SYMBOLS: [&str; 5] = [
    "GOMP_parallel",
    "omp_get_thread_num",
    "omp_get_num_threads",
    "omp_get_max_threads",
    "omp_in_parallel",
];

impl OpenMp {
    /// The entry points from the addresses of [`OPENMP_SYMBOLS`], in that order.
    ///
    /// # Safety
    /// Each address is the function of that name in one loaded libgomp, which stays
    /// loaded for the life of the process.
    pub unsafe fn from_symbols(addresses: [*const c_void; 5]) -> OpenMp {
        /// An address as a C function without arguments returning an `int`.
        ///
        /// # Safety
        /// It is one.
        unsafe fn nullary(address: *const c_void) -> unsafe extern "C" fn() -> c_int {
            unsafe { std::mem::transmute(address) }
        }
        // SAFETY: the caller's guarantee: these are libgomp's functions, whose C
        // signatures the fields declare.
        unsafe {
            OpenMp {
                parallel: std::mem::transmute::<
                    *const c_void,
                    unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, c_uint, c_uint),
                >(addresses[0]),
                thread_num: nullary(addresses[1]),
                num_threads: nullary(addresses[2]),
                max_threads: nullary(addresses[3]),
                in_parallel: nullary(addresses[4]),
            }
        }
    }

    /// The threads a region started by the calling thread would have (its `nthreads`
    /// setting: `OMP_NUM_THREADS`, `torch.set_num_threads`).
    fn threads(&self) -> usize {
        // SAFETY: a libgomp function without arguments.
        unsafe { (self.max_threads)() }.max(1) as usize
    }

    /// Runs `run(w)` for every `w` in `0..workers` on a team of up to `workers` threads
    /// (thread `t` of `n` runs shares `t, t + n, ...`, so a smaller team still runs all
    /// of them). Returns whether a share panicked: panics stop at each share, never
    /// unwinding through libgomp's frames.
    fn run(&self, workers: usize, run: &(dyn Fn(usize) + Sync)) -> bool {
        let region = Region {
            omp: *self,
            workers,
            run,
            panicked: AtomicBool::new(false),
        };
        // SAFETY: `region` outlives the call, which returns after every thread ran
        // `share` on it; `share` only reads it (and sets the atomic flag).
        unsafe {
            (self.parallel)(
                share,
                &region as *const Region as *mut c_void,
                workers as c_uint,
                0,
            )
        };
        region.panicked.load(Ordering::Relaxed)
    }
}

/// What every thread of an OpenMP region reads.
struct Region<'a> {
    omp: OpenMp,
    workers: usize,
    run: &'a (dyn Fn(usize) + Sync),
    panicked: AtomicBool,
}

/// The region's body: this thread's shares.
extern "C" fn share(data: *mut c_void) {
    // SAFETY: `OpenMp::run` passes a live `Region`.
    let region = unsafe { &*(data as *const Region) };
    // SAFETY: libgomp functions without arguments, called inside its region.
    let (t, n) = unsafe { ((region.omp.thread_num)(), (region.omp.num_threads)()) };
    let (t, n) = (t.max(0) as usize, n.max(1) as usize);
    for w in (t..region.workers).step_by(n) {
        if catch_unwind(AssertUnwindSafe(|| (region.run)(w))).is_err() {
            region.panicked.store(true, Ordering::Relaxed);
        }
    }
}

/// The installed team, the process that installed it (a forked child has none of its
/// threads), and the lock its caller holds (another caller runs its shares itself).
struct Team {
    omp: OpenMp,
    pid: u32,
    busy: Mutex<()>,
}

static TEAM: OnceLock<Team> = OnceLock::new();

/// Runs grids on the OpenMP team of `omp` from now on, for the life of the process
/// (the first call wins); returns how many threads it has.
pub fn use_openmp(omp: OpenMp) -> usize {
    TEAM.get_or_init(|| Team {
        omp,
        pid: std::process::id(),
        busy: Mutex::new(()),
    })
    .omp
    .threads()
}

/// The installed team, if this process may use it from this thread: not in a forked
/// child, and not inside one of its regions already (a nested region would get one
/// thread anyway).
fn team() -> Option<&'static Team> {
    // SAFETY: a libgomp function without arguments.
    TEAM.get()
        .filter(|t| t.pid == std::process::id() && unsafe { (t.omp.in_parallel)() } == 0)
}

/// What runs the shares: `openmp` or `tessera` (the crew).
pub fn name() -> &'static str {
    if TEAM.get().is_some() {
        "openmp"
    } else {
        "tessera"
    }
}

/// How many threads a grid may use at most: the team's (one where this thread may not use
/// it: a forked child, a call inside one of its regions), else one per core.
pub(super) fn threads() -> usize {
    match TEAM.get() {
        Some(_) => team().map_or(1, |t| t.omp.threads()),
        None => crew::cores(),
    }
}

/// Runs `run(w)` for every worker `w` in `0..workers`, the calling thread among them,
/// on the OpenMP team (while another caller has it, on this thread alone) or on the
/// crew. Returns when all are done; a share that panicked
/// panics here.
pub(super) fn run_shares(workers: usize, run: &(dyn Fn(usize) + Sync)) {
    let Some(installed) = TEAM.get() else {
        return crew::run_shares(workers, run);
    };
    let guard = team().and_then(|t| t.busy.try_lock().ok());
    let panicked = match guard {
        Some(_held) => installed.omp.run(workers, run),
        None => catch_unwind(AssertUnwindSafe(|| (0..workers).for_each(run))).is_err(),
    };
    assert!(!panicked, "a share of the grid panicked");
}

#[cfg(test)]
mod tests {
    use super::OpenMp;
    use std::cell::Cell;
    use std::ffi::{c_int, c_uint, c_void};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The fake team's size: libgomp may give a region fewer threads than asked.
    const TEAM: usize = 3;

    thread_local! {
        static THREAD: Cell<c_int> = const { Cell::new(0) };
    }

    /// `GOMP_parallel` on scoped threads: thread `t` of [`TEAM`] runs `f(data)`.
    extern "C" fn parallel(f: extern "C" fn(*mut c_void), data: *mut c_void, _: c_uint, _: c_uint) {
        let data = data as usize;
        std::thread::scope(|s| {
            for t in 1..TEAM {
                s.spawn(move || {
                    THREAD.set(t as c_int);
                    f(data as *mut c_void)
                });
            }
            f(data as *mut c_void);
        });
    }
    extern "C" fn thread_num() -> c_int {
        THREAD.get()
    }
    extern "C" fn num_threads() -> c_int {
        TEAM as c_int
    }
    extern "C" fn in_parallel() -> c_int {
        0
    }

    fn fake() -> OpenMp {
        // SAFETY: functions with libgomp's signatures and meanings.
        unsafe {
            OpenMp::from_symbols([
                parallel as *const c_void,
                thread_num as *const c_void,
                num_threads as *const c_void,
                num_threads as *const c_void,
                in_parallel as *const c_void,
            ])
        }
    }

    #[test]
    fn a_team_runs_every_share_once_whatever_its_size() {
        for workers in [1, 2, 3, 7] {
            let ran: Vec<AtomicUsize> = (0..workers).map(|_| AtomicUsize::new(0)).collect();
            let panicked = fake().run(workers, &|w| {
                ran[w].fetch_add(1, Ordering::Relaxed);
            });
            assert!(!panicked);
            let ran: Vec<usize> = ran.iter().map(|r| r.load(Ordering::Relaxed)).collect();
            assert_eq!(ran, vec![1; workers], "{workers} shares on {TEAM} threads");
        }
    }

    #[test]
    fn a_panicking_share_is_reported_not_unwound_through_the_team() {
        for bad in [0, 1, 4] {
            let others = AtomicUsize::new(0);
            let panicked = fake().run(5, &|w| {
                assert_ne!(w, bad, "share {w} fails");
                others.fetch_add(1, Ordering::Relaxed);
            });
            assert!(panicked, "share {bad} panicked");
            assert_eq!(others.load(Ordering::Relaxed), 4, "the other shares ran");
        }
    }
}
