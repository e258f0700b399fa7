//! How a claim orders the claimable tasks: by priority, highest first,
//! then oldest `not_before` first; except a share of every claim batch,
//! taken oldest-first regardless of priority, so that a steady stream of
//! high-priority tasks cannot keep a low one waiting forever.
//!
//! Both orders are walks of an index of the claimable tasks (one by
//! `not_before`, one by priority then `not_before`), so the claim stays
//! one statement whose cost does not grow with the backlog.
//!
//! The bound: a Scheduler keeping an [`OldestShare`] of `every` takes, of
//! every `every` consecutive tasks it claims, at least one oldest-first.
//! So once no claimable task is older than a given task, that task is
//! claimed within the next `every` tasks any one Scheduler claims; with
//! `k` claimable tasks older than it, within `every × (k + 1)`.

/// The default of [`OldestShare`]'s `every`: one task in eight is claimed
/// oldest-first.
pub const OLDEST_SHARE_EVERY_DEFAULT: u32 = 8;

/// One claim's size and order (see [`crate::Tasks::claim_tasks_by`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// At most this many tasks.
    pub max: u32,
    /// How many of them (at most `max`) are the oldest claimable tasks,
    /// whatever their priority; the rest are taken by priority.
    pub oldest_first: u32,
}

impl Claim {
    /// Up to `max` tasks, all by priority.
    pub fn by_priority(max: u32) -> Claim {
        Claim { max, oldest_first: 0 }
    }

    /// How many of the claim's tasks are taken by priority.
    pub fn by_priority_count(&self) -> u32 {
        self.max - self.oldest_first.min(self.max)
    }
}

/// A Scheduler's count of the tasks it claimed, which decides how many of
/// each claim are taken oldest-first: the places numbered 0, `every`,
/// `2 × every`… in the sequence of its claimed tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OldestShare {
    every: u32,
    claimed: u64,
}

impl OldestShare {
    /// A share of one task in `every` (at least 1: 1 claims oldest-first
    /// only, ignoring priorities).
    pub fn new(every: u32) -> OldestShare {
        assert!(every >= 1, "an oldest share of one task in 0 is not a share");
        OldestShare { every, claimed: 0 }
    }

    /// The next claim of up to `max` tasks.
    pub fn plan(&self, max: u32) -> Claim {
        let every = u64::from(self.every);
        let places_before = |end: u64| end.div_ceil(every);
        let oldest_first = places_before(self.claimed + u64::from(max)) - places_before(self.claimed);
        Claim { max, oldest_first: u32::try_from(oldest_first).unwrap_or(max) }
    }

    /// Counts the tasks a claim returned.
    pub fn record(&mut self, claimed: usize) {
        self.claimed += claimed as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_claimed_task_in_every_is_taken_oldest_first() {
        for every in 1..=9u32 {
            for max in 1..=20u32 {
                let mut share = OldestShare::new(every);
                let mut oldest = 0u64;
                let mut claimed = 0u64;
                for round in 0..50u32 {
                    // A claim that comes back short (fewer claimable
                    // tasks than asked) took every claimable task, its
                    // oldest-first places first.
                    let got = if round % 3 == 2 { max / 2 } else { max };
                    let claim = share.plan(max);
                    assert!(claim.oldest_first <= claim.max);
                    oldest += u64::from(claim.oldest_first.min(got));
                    claimed += u64::from(got);
                    share.record(got as usize);
                    assert!(oldest >= claimed.div_ceil(u64::from(every)), "every {every}, max {max}: {oldest} of {claimed}");
                }
            }
        }
    }

    #[test]
    fn the_first_claim_starts_with_an_oldest_one() {
        let mut share = OldestShare::new(4);
        let planned: Vec<u32> = (0..8)
            .map(|_| {
                let claim = share.plan(1);
                share.record(1);
                claim.oldest_first
            })
            .collect();
        assert_eq!(planned, [1, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(OldestShare::new(1).plan(5), Claim { max: 5, oldest_first: 5 });
        assert_eq!(OldestShare::new(8).plan(64), Claim { max: 64, oldest_first: 8 });
        assert_eq!(Claim { max: 3, oldest_first: 1 }.by_priority_count(), 2);
    }
}
