//! The BoxOffice load test: a goose flash-sale scenario (`main.rs`) and the
//! invariants every run, test and fault drill ends by checking.
#![forbid(unsafe_code)]

pub mod invariants;
pub mod scenario;
