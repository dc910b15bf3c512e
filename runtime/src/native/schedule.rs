//! Which programs of a grid each worker runs.
//!
//! Each worker starts on its own contiguous share of the programs, as OpenMP's static
//! schedule and ATen's `parallel_for` split work: a kernel then mostly reads what the
//! kernel before it (Inductor's, ATen's) wrote on the same core, from that core's
//! cache. It takes its share from the front in shrinking ranges. A worker whose share is
//! done takes ranges from the back of the share with the most left, so programs of
//! uneven cost (causal attention's rows of blocks, varlen attention's tiles) still
//! finish together, and a worker that starts late or is preempted runs fewer.

use std::sync::Mutex;

/// The programs `0..programs` split among workers.
pub(crate) struct Schedule {
    /// What is left of each worker's share: `lo..hi`.
    shares: Vec<Mutex<(u64, u64)>>,
}

impl Schedule {
    /// `programs` split into `workers` contiguous shares (the first ones one longer when
    /// they do not divide evenly).
    pub(crate) fn new(programs: u64, workers: u64) -> Schedule {
        let workers = workers.max(1);
        let (base, extra) = (programs / workers, programs % workers);
        let mut lo = 0;
        let shares = (0..workers)
            .map(|w| {
                let hi = lo + base + u64::from(w < extra);
                let share = Mutex::new((lo, hi));
                lo = hi;
                share
            })
            .collect();
        Schedule { shares }
    }

    /// The next programs `lo..hi` for worker `worker` to run: from the front of its own
    /// share (an eighth of what is left, at least one), else from the back of the share
    /// with the most left; `None` when every program is taken.
    pub(crate) fn next(&self, worker: usize) -> Option<(u64, u64)> {
        let own = &self.shares[worker % self.shares.len()];
        if let Some(range) = take(own, |lo, hi| (lo, lo + piece(lo, hi))) {
            return Some(range);
        }
        loop {
            let victim = self.shares.iter().max_by_key(|s| left(s))?;
            if left(victim) == 0 {
                return None;
            }
            if let Some(range) = take(victim, |lo, hi| (hi - piece(lo, hi), hi)) {
                return Some(range);
            }
        }
    }
}

/// How many programs one take removes from `lo..hi`.
fn piece(lo: u64, hi: u64) -> u64 {
    ((hi - lo) / 8).max(1)
}

fn left(share: &Mutex<(u64, u64)>) -> u64 {
    let (lo, hi) = *share.lock().unwrap_or_else(|e| e.into_inner());
    hi - lo
}

/// Removes the range `pick(lo, hi)` (at one end of `lo..hi`) from `share` and returns
/// it; `None` if the share is empty.
fn take(share: &Mutex<(u64, u64)>, pick: impl Fn(u64, u64) -> (u64, u64)) -> Option<(u64, u64)> {
    let mut s = share.lock().unwrap_or_else(|e| e.into_inner());
    let (lo, hi) = *s;
    if lo >= hi {
        return None;
    }
    let (a, b) = pick(lo, hi);
    *s = if a == lo { (b, hi) } else { (lo, a) };
    Some((a, b))
}

#[cfg(test)]
mod tests {
    use super::Schedule;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn workers_run_every_program_once() {
        for workers in 1..=4u64 {
            for programs in [0u64, 1, 2, 7, 64, 1000] {
                let schedule = Schedule::new(programs, workers);
                let seen: Vec<AtomicU64> = (0..programs).map(|_| AtomicU64::new(0)).collect();
                std::thread::scope(|s| {
                    for w in 0..workers as usize {
                        let (schedule, seen) = (&schedule, &seen);
                        s.spawn(move || {
                            while let Some((lo, hi)) = schedule.next(w) {
                                assert!(lo < hi && hi <= programs, "{lo}..{hi} of {programs}");
                                (lo..hi).for_each(|p| {
                                    seen[p as usize].fetch_add(1, Ordering::Relaxed);
                                });
                            }
                        });
                    }
                });
                assert!(
                    seen.iter().all(|n| n.load(Ordering::Relaxed) == 1),
                    "{workers} workers, {programs} programs"
                );
            }
        }
    }

    #[test]
    fn a_worker_runs_its_own_share_from_the_front_then_takes_from_the_back() {
        let schedule = Schedule::new(100, 2);
        // Worker 1's share is 50..100, taken in shrinking ranges.
        let own: Vec<_> = std::iter::from_fn(|| schedule.next(1)).take(3).collect();
        assert_eq!(own, [(50, 56), (56, 61), (61, 65)]);
        // Worker 0 alone: its share 0..50 first, in order, then the rest of worker 1's
        // from the back.
        let rest: Vec<_> = std::iter::from_fn(|| schedule.next(0)).collect();
        let split = rest.iter().position(|r| r.0 >= 50).unwrap();
        assert_eq!(rest[0], (0, 6));
        assert_eq!(rest[split - 1].1, 50);
        assert!(rest[..split].windows(2).all(|w| w[0].1 == w[1].0));
        assert_eq!(rest[split], (96, 100));
        assert!(rest[split..].windows(2).all(|w| w[1].1 == w[0].0));
        assert_eq!(rest.last().unwrap().0, 65);
    }
}
