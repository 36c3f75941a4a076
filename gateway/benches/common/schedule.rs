//! When the edge benchmark's open-model client sends each request, with
//! the servers of a round interleaved: the run is cut into slices of
//! `per_slice` requests, and in each cycle every server takes one slice, in
//! an order shuffled afresh each cycle (so a stall that comes back about
//! every second, as a paused vCPU can, is not always met by the same
//! server), at one offered rate throughout. A stall of the machine (a
//! paused vCPU, a neighbour's burst) then lands in every server's share of
//! the run alike, where back-to-back measures gave it to whichever server
//! ran at the time.
//! One slice a server (`per_slice` = all its requests) is the back-to-back
//! order, servers in their given order.
//!
//! Kept apart from the bench so that a test (`tests/open_schedule.rs`) can
//! check the arithmetic.

/// The order in which the requests of a round fall due.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    /// Requests a second, for every server alike.
    pub rate: f64,
    /// The servers taking turns.
    pub servers: u64,
    /// Requests each server is sent.
    pub per_server: u64,
    /// Requests in one of a server's slices (at least one).
    pub per_slice: u64,
}

impl Schedule {
    /// `seconds` of `rate` requests a second for each of `servers`, in
    /// slices of `slice_ms` (0: one slice a server, back to back).
    pub fn new(rate: f64, seconds: f64, servers: u64, slice_ms: u64) -> Self {
        let per_server = (rate * seconds) as u64;
        let per_slice = if slice_ms == 0 {
            per_server
        } else {
            (rate * slice_ms as f64 / 1000.0).round() as u64
        };
        Self {
            rate,
            servers: servers.max(1),
            per_server,
            per_slice: per_slice.clamp(1, per_server.max(1)),
        }
    }

    /// The place of server `server`'s `k`-th request among all the round's.
    pub fn slot(&self, server: u64, k: u64) -> u64 {
        let (cycle, within) = (k / self.per_slice, k % self.per_slice);
        (cycle * self.servers + self.turn(cycle, server)) * self.per_slice + within
    }

    /// The servers in the order they take their slices in cycle `cycle`: a
    /// Fisher-Yates shuffle drawn from the cycle's number (splitmix64), the
    /// same in every run; their given order when each has one slice.
    fn order(&self, cycle: u64) -> Vec<u64> {
        let mut order: Vec<u64> = (0..self.servers).collect();
        if self.per_slice >= self.per_server {
            return order;
        }
        let mut state = cycle;
        for i in (1..order.len()).rev() {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            order.swap(i, (z % (i as u64 + 1)) as usize);
        }
        order
    }

    /// When, 0 first, server `server` takes its slice of cycle `cycle`
    /// (see [`Schedule::order`]).
    pub fn turn(&self, cycle: u64, server: u64) -> u64 {
        self.order(cycle)
            .iter()
            .position(|&s| s == server)
            .expect("one of the servers") as u64
    }

    /// When server `server`'s `k`-th request falls due, in seconds from the start.
    pub fn due_s(&self, server: u64, k: u64) -> f64 {
        self.slot(server, k) as f64 / self.rate
    }

    /// Whose slice it is `elapsed_s` seconds from the start: the server
    /// whose request holds that moment's slot (in a short last cycle, the
    /// server the slot's slice belongs to, whether or not it has a request
    /// left); `None` before the start and after the round's last slot.
    pub fn server_at(&self, elapsed_s: f64) -> Option<u64> {
        if elapsed_s < 0.0 {
            return None;
        }
        let slot = (elapsed_s * self.rate) as u64;
        let cycle_slots = self.per_slice * self.servers;
        let cycles = self.per_server.div_ceil(self.per_slice);
        let cycle = slot / cycle_slots;
        if cycle >= cycles {
            return None;
        }
        let turn = slot % cycle_slots / self.per_slice;
        Some(self.order(cycle)[turn as usize])
    }

    /// How many of server `server`'s requests have fallen due `elapsed_s`
    /// seconds from the start (the first falls due at 0).
    pub fn due_by(&self, server: u64, elapsed_s: f64) -> u64 {
        if elapsed_s < 0.0 {
            return 0;
        }
        // Slots 0..=elapsed*rate have fallen due.
        let slots = (elapsed_s * self.rate) as u64 + 1;
        let cycle = self.per_slice * self.servers;
        let (cycles, rest) = (slots / cycle, slots % cycle);
        let in_last = rest
            .saturating_sub(self.turn(cycles, server) * self.per_slice)
            .min(self.per_slice);
        (cycles * self.per_slice + in_last).min(self.per_server)
    }
}
