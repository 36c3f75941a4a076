//! Event schema rules: a schema change must be additive, and an event must
//! match its schema. A deliberately small reading of JSON Schema: object
//! `properties`, `required` and `type` are what compatibility is about.

use serde_json::Value;

/// The JSON Schema files of every event type, as shipped in this build.
pub const ORDER_CONFIRMED_V1_SCHEMA: &str =
    include_str!("../schemas/boxoffice.order.confirmed.v1.json");

fn properties(schema: &Value) -> serde_json::Map<String, Value> {
    schema["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default()
}

fn required(schema: &Value) -> Vec<&str> {
    schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Every way `new` breaks readers or writers of `old`: a field removed (or
/// renamed), retyped, made required, or a new required field. Empty when
/// the change is additive.
pub fn breaking_changes(old: &Value, new: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    compare(old, new, "", &mut problems);
    problems
}

fn compare(old: &Value, new: &Value, path: &str, problems: &mut Vec<String>) {
    if old["type"] != new["type"] {
        problems.push(format!(
            "{}: type changed from {} to {}",
            display(path),
            old["type"],
            new["type"]
        ));
        return;
    }
    let (old_props, new_props) = (properties(old), properties(new));
    let (old_required, new_required) = (required(old), required(new));
    for (name, old_field) in &old_props {
        let field = format!("{path}.{name}");
        match new_props.get(name) {
            None => problems.push(format!("{}: removed or renamed", display(&field))),
            Some(new_field) => compare(old_field, new_field, &field, problems),
        }
    }
    for name in &new_required {
        let name = *name;
        if !old_required.contains(&name) {
            let field = format!("{path}.{name}");
            if old_props.contains_key(name) {
                problems.push(format!("{}: optional field made required", display(&field)));
            } else {
                problems.push(format!("{}: new field is required", display(&field)));
            }
        }
    }
    // Old readers count on every field that was required.
    for name in old_required.iter().filter(|n| !required(new).contains(n)) {
        if new_props.contains_key(*name) {
            problems.push(format!(
                "{}: required field made optional",
                display(&format!("{path}.{name}"))
            ));
        }
    }
}

fn display(path: &str) -> &str {
    if path.is_empty() {
        "(root)"
    } else {
        path
    }
}

/// Every way `value` fails `schema`: a required field missing, a field of
/// the wrong JSON type, or a field the schema does not declare (the
/// producer must declare what it sends). Empty when it matches.
pub fn mismatches(schema: &Value, value: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    check(schema, value, "", &mut problems);
    problems
}

fn check(schema: &Value, value: &Value, path: &str, problems: &mut Vec<String>) {
    let type_ok = match schema["type"].as_str() {
        Some("object") => value.is_object(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some("array") => value.is_array(),
        _ => true,
    };
    if !type_ok {
        problems.push(format!("{}: expected {}", display(path), schema["type"]));
        return;
    }
    if let Some(expected) = schema.get("const") {
        if expected != value {
            problems.push(format!("{}: expected {expected}", display(path)));
        }
    }
    let Some(object) = value.as_object() else {
        return;
    };
    let props = properties(schema);
    for name in required(schema) {
        if !object.contains_key(name) {
            problems.push(format!("{}: missing", display(&format!("{path}.{name}"))));
        }
    }
    for (name, field) in object {
        let field_path = format!("{path}.{name}");
        match props.get(name) {
            Some(field_schema) => check(field_schema, field, &field_path, problems),
            None => problems.push(format!("{}: not declared", display(&field_path))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "required": ["id", "data"],
            "properties": {
                "id": { "type": "string" },
                "data": {
                    "type": "object",
                    "required": ["quantity"],
                    "properties": {
                        "quantity": { "type": "integer" },
                        "note": { "type": "string" }
                    }
                }
            }
        })
    }

    #[test]
    fn an_unchanged_schema_and_an_added_optional_field_are_additive() {
        assert!(breaking_changes(&schema(), &schema()).is_empty());
        let mut added = schema();
        added["properties"]["data"]["properties"]["seat_map"] = json!({ "type": "string" });
        assert_eq!(breaking_changes(&schema(), &added), Vec::<String>::new());
    }

    #[test]
    fn a_removed_field_breaks() {
        let mut removed = schema();
        removed["properties"]["data"]["properties"]
            .as_object_mut()
            .unwrap()
            .remove("note");
        assert_eq!(
            breaking_changes(&schema(), &removed),
            vec![".data.note: removed or renamed"]
        );
    }

    #[test]
    fn a_renamed_field_breaks() {
        let mut renamed = schema();
        let data = renamed["properties"]["data"].as_object_mut().unwrap();
        let props = data["properties"].as_object_mut().unwrap();
        let quantity = props.remove("quantity").unwrap();
        props.insert("qty".into(), quantity);
        data["required"] = json!(["qty"]);
        let problems = breaking_changes(&schema(), &renamed);
        assert!(
            problems.contains(&".data.quantity: removed or renamed".to_owned()),
            "{problems:?}"
        );
        assert!(
            problems.contains(&".data.qty: new field is required".to_owned()),
            "{problems:?}"
        );
    }

    #[test]
    fn a_retyped_field_breaks() {
        let mut retyped = schema();
        retyped["properties"]["data"]["properties"]["quantity"] = json!({ "type": "string" });
        assert_eq!(
            breaking_changes(&schema(), &retyped),
            vec![".data.quantity: type changed from \"integer\" to \"string\""]
        );
    }

    #[test]
    fn changing_what_is_required_breaks() {
        let mut stricter = schema();
        stricter["properties"]["data"]["required"] = json!(["quantity", "note"]);
        assert_eq!(
            breaking_changes(&schema(), &stricter),
            vec![".data.note: optional field made required"]
        );
        let mut looser = schema();
        looser["required"] = json!(["id"]);
        assert_eq!(
            breaking_changes(&schema(), &looser),
            vec![".data: required field made optional"]
        );
    }

    #[test]
    fn values_are_checked_for_presence_type_and_declaration() {
        let good = json!({ "id": "x", "data": { "quantity": 2 } });
        assert!(mismatches(&schema(), &good).is_empty());
        let bad = json!({ "id": 1, "data": { "note": "n", "extra": true } });
        assert_eq!(
            mismatches(&schema(), &bad),
            vec![
                ".data.quantity: missing",
                ".data.extra: not declared",
                ".id: expected \"string\""
            ]
        );
    }
}
