//! The event schemas in `contract/schemas/`: every change since a schema
//! was released is additive, and what the code produces matches the schema.

use boxoffice_contract::envelope::{CloudEvent, OrderConfirmed, ORDER_CONFIRMED_V1};
use boxoffice_contract::schema::{breaking_changes, mismatches, ORDER_CONFIRMED_V1_SCHEMA};
use serde_json::Value;

fn parse(text: &str) -> Value {
    serde_json::from_str(text).expect("a schema is JSON")
}

#[test]
fn every_schema_is_additive_to_its_released_copy() {
    let released = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/released");
    let mut checked = 0;
    for entry in std::fs::read_dir(&released).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let current =
            std::fs::read_to_string(released.join("..").join(&name)).unwrap_or_else(|_| {
                panic!("{name} was released; its schema must stay (make a new type instead)")
            });
        let problems = breaking_changes(
            &parse(&std::fs::read_to_string(&path).unwrap()),
            &parse(&current),
        );
        assert!(
            problems.is_empty(),
            "{name} changed in a breaking way: {problems:#?}\nMake a new `.v2` type instead (see contract/schemas/README.md)."
        );
        checked += 1;
    }
    assert!(checked >= 1, "no released schema found");
}

#[test]
fn the_order_confirmed_event_the_code_produces_matches_its_schema() {
    let schema = parse(ORDER_CONFIRMED_V1_SCHEMA);
    assert_eq!(schema["title"], ORDER_CONFIRMED_V1);
    let event = CloudEvent::new(
        ORDER_CONFIRMED_V1,
        "0190a5c4-0000-7000-8000-000000000000".into(),
        OrderConfirmed {
            order_id: uuid::Uuid::now_v7(),
            event_id: "ev".into(),
            fan_id: "fan".into(),
            quantity: 2,
            first_seat: 7,
            amount_cents: 9_000,
        },
    );
    let value = serde_json::to_value(&event).unwrap();
    assert_eq!(mismatches(&schema, &value), Vec::<String>::new());
}
