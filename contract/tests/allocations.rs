//! What the hot paths allocate: the status poll reads a queue ticket on
//! every request, and reading the fan out of it copies the fan id and
//! nothing else; an answer's small numbers (its length, its `Retry-After`)
//! come from a table. Counted by a global allocator that tallies the calling
//! thread's allocations, so the other tests' threads do not count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use boxoffice_contract::header_number::header_number;
use boxoffice_contract::token::{generate_ed25519_pem, now_s, Claims, KeySet, TokenUse};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // `try_with`: a thread being torn down has no counter left.
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATIONS.with(Cell::get);
    let value = f();
    (value, ALLOCATIONS.with(Cell::get) - before)
}

#[test]
fn reading_a_tickets_fan_allocates_only_the_fan_id() {
    let keys = KeySet::from_pems(
        "boxoffice",
        &generate_ed25519_pem(),
        &[],
        b"0123456789abcdef0123456789abcdef",
    )
    .unwrap();
    let fan = "fan-with-a-realistic-id-0123456789";
    let ticket = keys.sign(&Claims::new(
        "boxoffice",
        "ev1",
        fan,
        TokenUse::Queue,
        now_s(),
        600,
    ));
    let (read, allocations) = allocations_of(|| keys.queue_ticket_fan(&ticket, "ev1"));
    assert_eq!(read.as_deref(), Ok(fan));
    assert_eq!(allocations, 1, "the fan id, and nothing else");
    // The full check still hands back owned claims (the comparison point).
    let (claims, allocations) =
        allocations_of(|| keys.verify(&ticket, TokenUse::Queue, Some("ev1")));
    assert_eq!(claims.unwrap().sub, fan);
    assert_eq!(allocations, 4, "iss, aud, sub and jti");
}

#[test]
fn a_small_number_as_a_header_allocates_nothing() {
    // The table, built once, before counting.
    let _ = header_number(0);
    let (value, allocations) = allocations_of(|| header_number(348));
    assert_eq!(value, "348");
    assert_eq!(allocations, 0, "a copy of a static value");
    // Past the table, `HeaderValue::from` (the counter counts: its buffer,
    // and with http 1 a shared handle for it too).
    let (value, allocations) = allocations_of(|| header_number(1_000_000));
    assert_eq!(value, "1000000");
    assert!(allocations > 0);
}
