//! `state::apply`: each op's semantics, every failure reported per op and
//! never fatal, and failed ops leaving the state untouched.

use serde_json::{Value, json};
use spindle::state::{ApplyError, Op, OpCode, OpError, apply, apply_one, ops_from_payload};

fn op(v: Value) -> Op {
    Op::from_json(&v).unwrap_or_else(|e| panic!("{v}: {e}"))
}

/// (ops, state before, state after, which ops succeed)
type Case = (Value, Value, Value, &'static [bool]);

#[test]
fn table() {
    let cases: Vec<Case> = vec![
        // SET: replace, create, create intermediates, Unicode keys.
        (
            json!([["SET", "纯田真奈.好感度", 2]]),
            json!({"纯田真奈": {"好感度": 1}}),
            json!({"纯田真奈": {"好感度": 2}}),
            &[true],
        ),
        (json!([["SET", "a.b.c", "x"]]), json!({}), json!({"a": {"b": {"c": "x"}}}), &[true]),
        (json!([["SET", "a.b", 1]]), json!({"a": null}), json!({"a": {"b": 1}}), &[true]),
        (json!([["SET", "list[1]", "B"]]), json!({"list": ["a", "b"]}), json!({"list": ["a", "B"]}), &[true]),
        (json!([["SET", "list[2]", "c"]]), json!({"list": ["a", "b"]}), json!({"list": ["a", "b", "c"]}), &[true]),
        (json!([["SET", "list[-1]", "z"]]), json!({"list": ["a", "b"]}), json!({"list": ["a", "z"]}), &[true]),
        (json!([["SET", "list.0", "z"]]), json!({"list": ["a"]}), json!({"list": ["z"]}), &[true]),
        (
            json!([["SET", "items[0].name", "剑"]]),
            json!({"items": [{"name": "x"}]}),
            json!({"items": [{"name": "剑"}]}),
            &[true],
        ),
        (json!([["SET", "a[\"x.y\"]", 1]]), json!({"a": {}}), json!({"a": {"x.y": 1}}), &[true]),
        // SET failures change nothing.
        (json!([["SET", "list[5]", 1]]), json!({"list": []}), json!({"list": []}), &[false]),
        (json!([["SET", "gold.x", 1]]), json!({"gold": 5}), json!({"gold": 5}), &[false]),
        (json!([["SET", "s.len", 1]]), json!({"s": "text"}), json!({"s": "text"}), &[false]),
        (json!([["SET", "new.list[0]", 1]]), json!({}), json!({}), &[false]),
        (json!([["SET", "obj[0]", 1]]), json!({"obj": {}}), json!({"obj": {}}), &[false]),
        // Arithmetic.
        (
            json!([["ADD", "hp", 5], ["SUB", "mp", 2], ["MUL", "x", 3], ["DIV", "y", 4]]),
            json!({"hp": 1, "mp": 10, "x": 2, "y": 8}),
            json!({"hp": 6, "mp": 8, "x": 6, "y": 2}),
            &[true, true, true, true],
        ),
        (json!([["DIV", "y", 2]]), json!({"y": 7}), json!({"y": 3.5}), &[true]),
        (json!([["ADD", "f", 0.5]]), json!({"f": 1}), json!({"f": 1.5}), &[true]),
        (json!([["MUL", "big", 10]]), json!({"big": i64::MAX}), json!({"big": (i64::MAX as f64) * 10.0}), &[true]),
        (json!([["DIV", "y", 0], ["ADD", "y", 1]]), json!({"y": 7}), json!({"y": 8}), &[false, true]),
        (json!([["DIV", "y", 0.0]]), json!({"y": 7.5}), json!({"y": 7.5}), &[false]),
        (json!([["ADD", "missing", 1]]), json!({}), json!({}), &[false]),
        (json!([["ADD", "name", 1]]), json!({"name": "x"}), json!({"name": "x"}), &[false]),
        (json!([["ADD", "a.b.c", 1]]), json!({"a": 3}), json!({"a": 3}), &[false]),
        // PUSH / POP.
        (
            json!([["PUSH", "log", "a"], ["PUSH", "log", {"b": 1}]]),
            json!({}),
            json!({"log": ["a", {"b": 1}]}),
            &[true, true],
        ),
        (json!([["PUSH", "deep.log", 1]]), json!({}), json!({"deep": {"log": [1]}}), &[true]),
        (json!([["PUSH", "s", 1]]), json!({"s": "text"}), json!({"s": "text"}), &[false]),
        (
            json!([["POP", "log"], ["POP", "log"], ["POP", "log"]]),
            json!({"log": [1, 2]}),
            json!({"log": []}),
            &[true, true, false],
        ),
        (json!([["POP", "missing"]]), json!({}), json!({}), &[false]),
        (json!([["POP", "n"]]), json!({"n": 1}), json!({"n": 1}), &[false]),
        // DELETE.
        (json!([["DELETE", "a.b"]]), json!({"a": {"b": 1, "c": 2}}), json!({"a": {"c": 2}}), &[true]),
        (json!([["DELETE", "list[0]"]]), json!({"list": [1, 2]}), json!({"list": [2]}), &[true]),
        (json!([["DELETE", "a.missing"], ["DELETE", "nope.x"]]), json!({"a": {}}), json!({"a": {}}), &[false, false]),
        (json!([["DELETE", "list[9]"]]), json!({"list": [1]}), json!({"list": [1]}), &[false]),
    ];
    for (ops_json, before, after, oks) in cases {
        let ops: Vec<Op> = ops_json.as_array().map(|a| a.iter().map(|v| op(v.clone())).collect()).unwrap_or_default();
        let mut state = before.clone();
        let outcomes = apply(&mut state, &ops);
        assert_eq!(state, after, "{ops_json} on {before}");
        let got: Vec<bool> = outcomes.iter().map(|o| o.is_ok()).collect();
        assert_eq!(got, oks, "{ops_json} on {before}: {outcomes:?}");
        for (i, o) in outcomes.iter().enumerate() {
            assert_eq!(o.index, i);
            let line = o.to_string();
            assert!(line.starts_with(o.op.code.as_str()), "{line}");
            if !o.is_ok() {
                assert!(line.contains("failed: "), "{line}");
            }
        }
    }
}

#[test]
fn errors_name_the_problem() {
    let cases: &[(Value, Value, &str)] = &[
        (json!(["DIV", "y", 0]), json!({"y": 1}), "division by zero"),
        (json!(["ADD", "x.y", 1]), json!({"x": "s"}), "the path goes through a string at x"),
        (json!(["POP", "a"]), json!({}), "nothing at a"),
        (json!(["DELETE", "a.b"]), json!({"a": {}}), "nothing at a.b"),
        (json!(["SET", "l[3]", 1]), json!({"l": [1]}), "index 3 is out of range at l (length 1)"),
        (json!(["ADD", "n", 1]), json!({"n": [1]}), "n holds an array, not a number"),
        (json!(["PUSH", "n", 1]), json!({"n": 1}), "n holds a number, not an array"),
        (json!(["POP", "n"]), json!({"n": []}), "n is an empty array"),
    ];
    for (o, before, message) in cases {
        let mut state = before.clone();
        let err = apply_one(&mut state, &op(o.clone())).expect_err("must fail");
        assert_eq!(err.to_string(), *message, "{o}");
        assert_eq!(&state, before);
    }
    // The root itself is not a container.
    let mut scalar = json!(3);
    assert!(matches!(apply_one(&mut scalar, &op(json!(["SET", "a", 1]))), Err(ApplyError::NotAContainer { .. })));

    // A state nests no deeper than it can be read back: by the path, or
    // by the value.
    let deep_path = vec!["k"; 100_000].join(".");
    let mut state = json!({});
    let err = apply_one(&mut state, &op(json!(["SET", deep_path, 1]))).expect_err("too deep");
    assert_eq!(err.to_string(), "the state would nest 100000 levels deep (at most 100, so that it reads back as JSON)");
    let mut nested = json!(1);
    for _ in 0..100 {
        nested = json!([nested]);
    }
    let err = apply_one(&mut state, &op(json!(["PUSH", "log", nested]))).expect_err("too deep");
    assert!(matches!(err, ApplyError::TooDeep { depth: 101 }), "{err}");
    assert_eq!(state, json!({}));
    apply_one(&mut state, &op(json!(["SET", vec!["k"; 100].join("."), 1]))).expect("at the limit");
    let text = serde_json::to_string(&state).unwrap();
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), state, "reads back");
}

#[test]
fn op_validation() {
    let cases: &[(Value, &str)] = &[
        (json!(["SET", "a"]), "SET takes 3 elements ([OP, path, value]), found 2"),
        (json!(["POP", "a", 1]), "POP takes 2 elements ([OP, path]), found 3"),
        (json!(["DELETE"]), "DELETE takes 2 elements ([OP, path]), found 1"),
        (json!(["SET", "a", 1, 2]), "SET takes 3 elements ([OP, path, value]), found 4"),
        (json!(["ADD", "a", "5"]), "ADD needs a number, found a string"),
        (json!(["MUL", "a", null]), "MUL needs a number, found null"),
        (json!(["SET", 5, 1]), "the path of SET must be a string, found a number"),
        (json!(["SET", "", 1]), "the path of SET is empty"),
        (json!(["JUMP", "a", 1]), "unknown op \"JUMP\" (known: SET ADD SUB MUL DIV PUSH POP DELETE)"),
        (json!([]), "an op is an array [OP, path, value?], found an empty array"),
        (json!("SET a 1"), "an op is an array [OP, path, value?], found a string"),
    ];
    for (v, message) in cases {
        let e = Op::from_json(v).expect_err("invalid");
        assert_eq!(e.to_string(), *message, "{v}");
    }
    assert!(matches!(Op::from_json(&json!(["SET", "a..b", 1])), Err(OpError::BadPath(_))));
    assert_eq!(op(json!(["set", "a", 1])).code, OpCode::Set);
    assert_eq!(op(json!(["Delete", "a"])).to_json(), json!(["DELETE", "a"]));
    // Ops built by hand are checked when applied.
    let mut state = json!({});
    let bad = Op::new(OpCode::Add, "x", Some(json!("1")));
    assert!(matches!(apply(&mut state, &[bad])[0].result, Err(ApplyError::Invalid(OpError::NotANumber { .. }))));
}

#[test]
fn delete_keeps_key_order() {
    let mut state = json!({"a": 1, "b": 2, "c": 3, "d": 4});
    apply(&mut state, &[op(json!(["DELETE", "b"]))]);
    let keys: Vec<&String> = state.as_object().map(|m| m.keys().collect()).unwrap_or_default();
    assert_eq!(keys, ["a", "c", "d"]);
}

#[test]
fn ops_from_a_payload() {
    let payload = json!({"analysis": null, "ops": [["SET", "a", 1], ["bogus"], ["POP", "b"]], "invalid": []});
    let ops = ops_from_payload(&payload);
    assert_eq!(ops.len(), 2);
    assert!(ops_from_payload(&json!({"error": "x"})).is_empty());
}

#[test]
fn outcomes_serialise() {
    let mut state = json!({"hp": 1});
    let out = apply(&mut state, &[op(json!(["ADD", "hp", 2])), op(json!(["POP", "x"]))]);
    let v = serde_json::to_value(&out).unwrap_or_default();
    assert_eq!(
        v,
        json!([
            {"index": 0, "op": ["ADD", "hp", 2], "ok": true, "old": 1, "new": 3},
            {"index": 1, "op": ["POP", "x"], "ok": false, "error": "nothing at x"}
        ])
    );
}
