//! The edge benchmark's interleaved fixed-rate schedule
//! (`benches/common/schedule.rs`): every request has a slot of its own,
//! the servers take turns slice by slice, and the pacer's count of due
//! requests agrees with the due times.

#[path = "../benches/common/schedule.rs"]
mod schedule;

use schedule::Schedule;

/// Each server's requests, in order, with their slots.
fn slots(schedule: &Schedule) -> Vec<Vec<u64>> {
    (0..schedule.servers)
        .map(|server| {
            (0..schedule.per_server)
                .map(|k| schedule.slot(server, k))
                .collect()
        })
        .collect()
}

#[test]
fn interleaved_servers_take_turns_slice_by_slice() {
    // 1,000 a second for 2 s each, slices of 100 ms: 100 requests a slice,
    // 20 cycles of three slices.
    let schedule = Schedule::new(1000.0, 2.0, 3, 100);
    assert_eq!((schedule.per_server, schedule.per_slice), (2000, 100));
    let slots = slots(&schedule);
    for (server, slots) in slots.iter().enumerate() {
        for cycle in 0..20u64 {
            // A slice is 100 consecutive slots within its cycle's 300.
            let slice = &slots[cycle as usize * 100..][..100];
            let first = slice[0];
            assert_eq!(first % 100, 0, "server {server} cycle {cycle}");
            assert_eq!(first / 300, cycle);
            assert_eq!(first % 300 / 100, schedule.turn(cycle, server as u64));
            assert!(slice.iter().zip(first..).all(|(a, b)| *a == b));
        }
    }
    // Every slot of the round is taken once: 6,000 in all, none shared.
    let mut all: Vec<u64> = slots.concat();
    all.sort_unstable();
    assert_eq!(all, (0..6000).collect::<Vec<_>>());
    // The order changes from cycle to cycle, and each server goes first
    // in some cycles.
    let firsts: Vec<u64> = (0..20)
        .map(|cycle| (0..3).find(|&s| schedule.turn(cycle, s) == 0).unwrap())
        .collect();
    for server in 0..3 {
        assert!(firsts.contains(&server), "{firsts:?}");
    }
}

#[test]
fn no_slices_is_back_to_back() {
    let schedule = Schedule::new(1000.0, 2.0, 3, 0);
    assert_eq!(schedule.per_slice, 2000);
    let slots = slots(&schedule);
    assert_eq!(slots[1][0], 2000);
    assert_eq!(slots[2][1999], 5999);
}

#[test]
fn a_short_last_slice_leaves_gaps_but_no_overlap() {
    // 250 requests each, slices of 100: the last slice has 50.
    let schedule = Schedule::new(1000.0, 0.25, 2, 100);
    let mut all: Vec<u64> = slots(&schedule).concat();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 500);
    // Three cycles of 200 slots, the last one's slices half used.
    assert!(*all.last().unwrap() < 600);
}

/// Schedules of every shape: interleaved, with a short last slice, back to
/// back, and one server in slices that do not divide its second.
fn varied() -> [Schedule; 4] {
    [
        Schedule::new(1000.0, 2.0, 3, 100),
        Schedule::new(1000.0, 0.25, 2, 100),
        Schedule::new(1000.0, 1.0, 4, 0),
        Schedule::new(3000.0, 0.5, 1, 7),
    ]
}

#[test]
fn due_by_counts_the_requests_whose_due_time_has_come() {
    for schedule in varied() {
        for server in 0..schedule.servers {
            let dues: Vec<f64> = (0..schedule.per_server)
                .map(|k| schedule.due_s(server, k))
                .collect();
            let last = dues.iter().copied().fold(0.0, f64::max);
            // Between due times too, and after the last.
            for step in 0..=(last * schedule.rate * 2.0) as u64 + 4 {
                let at = step as f64 / (schedule.rate * 2.0) + 1e-9;
                let expected = dues.iter().filter(|due| **due <= at).count() as u64;
                assert_eq!(
                    schedule.due_by(server, at),
                    expected,
                    "{schedule:?} server {server} at {at}"
                );
            }
        }
    }
    assert_eq!(Schedule::new(1000.0, 1.0, 2, 100).due_by(0, -0.1), 0);
}

#[test]
fn server_at_names_the_server_whose_request_holds_the_slot() {
    for schedule in varied() {
        let mut owner = std::collections::HashMap::new();
        for server in 0..schedule.servers {
            for k in 0..schedule.per_server {
                owner.insert(schedule.slot(server, k), server);
            }
        }
        let last = *owner.keys().max().unwrap();
        for slot in 0..=last {
            // Half way through the slot.
            let found = schedule.server_at((slot as f64 + 0.5) / schedule.rate);
            match owner.get(&slot) {
                Some(&server) => assert_eq!(found, Some(server), "{schedule:?} slot {slot}"),
                // A gap of a short last slice: still that slice's server.
                None => assert_eq!(
                    found,
                    owner.get(&(slot - slot % schedule.per_slice)).copied(),
                    "{schedule:?} slot {slot}"
                ),
            }
        }
        assert_eq!(schedule.server_at(-0.001), None);
        let cycles = schedule.per_server.div_ceil(schedule.per_slice);
        let end = (cycles * schedule.per_slice * schedule.servers) as f64 / schedule.rate;
        assert_eq!(
            schedule.server_at(end + 0.5 / schedule.rate),
            None,
            "{schedule:?}"
        );
    }
}
