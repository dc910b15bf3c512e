//! The helper threads that run shares of a grid with the calling thread.
//!
//! One fewer than the cores, so that the caller and its helpers never outnumber them.
//! After a share a helper spins on its slot for a while before it parks: waking a parked
//! thread takes tens of microseconds on a VM, as long as a medium kernel's share (rayon's
//! pool, whose idle threads yield in a loop, cost a PyTorch process ~40 context switches
//! per softmax of 512x2048; PyTorch's OpenMP threads spin the same way after a region).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long a helper spins for its next share before it parks.
const SPIN: Duration = Duration::from_micros(200);

/// A share's states in its slot.
const IDLE: u8 = 0;
const READY: u8 = 1;
const DONE: u8 = 2;
const PANICKED: u8 = 3;

/// A call's shares: run with a worker index (borrowed for the call; see [`run_shares`]).
type Job = &'static (dyn Fn(usize) + Sync);

/// One helper's mailbox: the share to run (worker index and job) and its state.
struct Slot {
    state: AtomicU8,
    job: Mutex<Option<(usize, Job)>>,
}

/// The helpers, each with its slot and thread handle.
struct Crew {
    helpers: Vec<(Arc<Slot>, Thread)>,
    /// The process that started them: a child forked from it has none of its threads.
    pid: u32,
    /// Held by the caller whose shares the helpers run (another caller runs its shares
    /// itself meanwhile).
    busy: Mutex<()>,
}

/// The cores this process may use, asked once: the answer reads the cgroup's files
/// (five system calls and ~15 µs a launch when asked every time).
pub(super) fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn crew() -> &'static Crew {
    static CREW: OnceLock<Crew> = OnceLock::new();
    CREW.get_or_init(|| {
        let helpers = (1..cores())
            .filter_map(|i| {
                let slot = Arc::new(Slot {
                    state: AtomicU8::new(IDLE),
                    job: Mutex::new(None),
                });
                let mine = slot.clone();
                let thread = std::thread::Builder::new()
                    .name(format!("tessera-native-{i}"))
                    .spawn(move || serve(&mine))
                    .ok()?;
                Some((slot, thread.thread().clone()))
            })
            .collect();
        Crew {
            helpers,
            pid: std::process::id(),
            busy: Mutex::new(()),
        }
    })
}

/// A helper's loop: wait for a share (spinning, then parked), run it, report.
fn serve(slot: &Slot) {
    loop {
        let start = Instant::now();
        while slot.state.load(Ordering::Acquire) != READY {
            if start.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::park();
            }
        }
        let job = slot.job.lock().unwrap_or_else(|e| e.into_inner()).take();
        let ok =
            job.is_some_and(|(worker, run)| catch_unwind(AssertUnwindSafe(|| run(worker))).is_ok());
        slot.state
            .store(if ok { DONE } else { PANICKED }, Ordering::Release);
    }
}

/// Runs `run(w)` for every worker `w` in `0..workers`: worker 0 on the calling thread, the
/// others on helpers (on the calling thread too when there are fewer helpers, they serve
/// another call, or this is a forked child, which has no helpers). Returns when all are
/// done; a share that panicked panics here.
pub(super) fn run_shares(workers: usize, run: &(dyn Fn(usize) + Sync)) {
    let crew = crew();
    let guard = (crew.pid == std::process::id())
        .then(|| crew.busy.try_lock().ok())
        .flatten();
    let helpers = if guard.is_some() {
        &crew.helpers[..crew.helpers.len().min(workers.saturating_sub(1))]
    } else {
        &[]
    };
    // SAFETY: the helpers drop the job before reporting DONE/PANICKED, and this function
    // returns only after every one has reported, so the borrow outlives every use.
    let job: Job = unsafe { std::mem::transmute(run) };
    for (i, (slot, thread)) in helpers.iter().enumerate() {
        *slot.job.lock().unwrap_or_else(|e| e.into_inner()) = Some((i + 1, job));
        slot.state.store(READY, Ordering::Release);
        thread.unpark();
    }
    let mine = catch_unwind(AssertUnwindSafe(|| {
        run(0);
        for w in helpers.len() + 1..workers {
            run(w);
        }
    }));
    let mut panicked = mine.is_err();
    let waiting = Instant::now();
    for (slot, _) in helpers {
        loop {
            match slot.state.load(Ordering::Acquire) {
                DONE => break,
                PANICKED => {
                    panicked = true;
                    break;
                }
                // A long share: let other threads have the core meanwhile.
                _ if waiting.elapsed() > SPIN => std::thread::yield_now(),
                _ => std::hint::spin_loop(),
            }
        }
        slot.state.store(IDLE, Ordering::Relaxed);
    }
    drop(guard);
    assert!(!panicked, "a share of the grid panicked");
}

#[cfg(test)]
mod tests {
    use super::run_shares;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Runs `workers` shares and returns how often each ran.
    fn counts(workers: usize) -> Vec<usize> {
        let ran: Vec<AtomicUsize> = (0..workers).map(|_| AtomicUsize::new(0)).collect();
        run_shares(workers, &|w| {
            ran[w].fetch_add(1, Ordering::Relaxed);
        });
        ran.iter().map(|r| r.load(Ordering::Relaxed)).collect()
    }

    #[test]
    fn every_share_runs_once_whoever_calls() {
        for workers in [1, 2, 3, 7] {
            assert_eq!(counts(workers), vec![1; workers], "{workers} workers");
        }
        // Callers on several threads at once: one has the helpers, the others run their
        // shares themselves.
        std::thread::scope(|s| {
            let callers: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..200).all(|_| counts(5) == vec![1; 5])))
                .collect();
            assert!(callers.into_iter().all(|c| c.join().unwrap()));
        });
    }

    #[test]
    fn a_panicking_share_panics_the_caller_and_the_crew_goes_on() {
        for bad in [0, 1] {
            let got = std::panic::catch_unwind(|| {
                run_shares(2, &|w| assert_ne!(w, bad, "share {w} fails"));
            });
            assert!(got.is_err(), "share {bad} panicked");
            assert_eq!(counts(2), vec![1, 1]);
        }
    }
}
