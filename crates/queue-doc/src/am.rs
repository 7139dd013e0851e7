//! Small typed readers over Automerge values.
//!
//! Documents arrive from other peers, so every reader tolerates a missing key or a value of the
//! wrong type by returning `None`; callers decide whether that makes a record malformed.

use automerge::{ObjId, ObjType, ReadDoc, ScalarValue, ScalarValueRef, Value, ValueRef};

pub(crate) fn object<R: ReadDoc>(doc: &R, obj: &ObjId, key: &str, ty: ObjType) -> Option<ObjId> {
    match doc.get(obj, key).ok()?? {
        (Value::Object(t), id) if t == ty => Some(id),
        _ => None,
    }
}

pub(crate) fn scalar<R: ReadDoc>(doc: &R, obj: &ObjId, key: &str) -> Option<ScalarValue> {
    match doc.get(obj, key).ok()?? {
        (Value::Scalar(s), _) => Some(s.into_owned()),
        _ => None,
    }
}

pub(crate) fn string<R: ReadDoc>(doc: &R, obj: &ObjId, key: &str) -> Option<String> {
    match scalar(doc, obj, key)? {
        ScalarValue::Str(s) => Some(s.to_string()),
        _ => None,
    }
}

pub(crate) fn uint<R: ReadDoc>(doc: &R, obj: &ObjId, key: &str) -> Option<u64> {
    match scalar(doc, obj, key)? {
        ScalarValue::Uint(v) => Some(v),
        ScalarValue::Int(v) => u64::try_from(v).ok(),
        _ => None,
    }
}

/// The greatest of the concurrent unsigned values of `key` (0 if none).
pub(crate) fn max_uint<R: ReadDoc>(doc: &R, obj: &ObjId, key: &str) -> u64 {
    doc.get_all(obj, key)
        .map(|values| {
            values
                .into_iter()
                .filter_map(|(v, _)| match v {
                    Value::Scalar(s) => match s.as_ref() {
                        ScalarValue::Uint(v) => Some(*v),
                        ScalarValue::Int(v) => u64::try_from(*v).ok(),
                        _ => None,
                    },
                    _ => None,
                })
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

/// Every concurrent value of `key` that is an object of type `ty`.
pub(crate) fn all_objects<R: ReadDoc>(doc: &R, obj: &ObjId, key: &str, ty: ObjType) -> Vec<ObjId> {
    doc.get_all(obj, key)
        .map(|values| {
            values
                .into_iter()
                .filter_map(|(v, id)| match v {
                    Value::Object(t) if t == ty => Some(id),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The objects of type `ty` in list `list`, in list order.
pub(crate) fn list_objects<R: ReadDoc>(doc: &R, list: &ObjId, ty: ObjType) -> Vec<ObjId> {
    (0..doc.length(list))
        .filter_map(|i| match doc.get(list, i).ok()?? {
            (Value::Object(t), id) if t == ty => Some(id),
            _ => None,
        })
        .collect()
}

/// The strings in list `list`, in list order; other values are skipped.
pub(crate) fn list_strings<R: ReadDoc>(doc: &R, list: &ObjId) -> Vec<String> {
    (0..doc.length(list))
        .filter_map(|i| match doc.get(list, i).ok()?? {
            (Value::Scalar(s), _) => match s.as_ref() {
                ScalarValue::Str(s) => Some(s.to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// A string value read in a range scan.
pub(crate) fn as_str<'a>(v: &'a ValueRef<'_>) -> Option<&'a str> {
    match v {
        ValueRef::Scalar(ScalarValueRef::Str(s)) => Some(s.as_ref()),
        _ => None,
    }
}

/// A non-negative integer read in a range scan.
pub(crate) fn as_uint(v: &ValueRef<'_>) -> Option<u64> {
    match v {
        ValueRef::Scalar(ScalarValueRef::Uint(x)) => Some(*x),
        ValueRef::Scalar(ScalarValueRef::Int(x)) => u64::try_from(*x).ok(),
        _ => None,
    }
}

/// An integer read in a range scan.
pub(crate) fn as_int(v: &ValueRef<'_>) -> Option<i64> {
    match v {
        ValueRef::Scalar(ScalarValueRef::Int(x)) => Some(*x),
        ValueRef::Scalar(ScalarValueRef::Uint(x)) => i64::try_from(*x).ok(),
        _ => None,
    }
}

/// A boolean read in a range scan.
pub(crate) fn as_bool(v: &ValueRef<'_>) -> Option<bool> {
    match v {
        ValueRef::Scalar(ScalarValueRef::Boolean(b)) => Some(*b),
        _ => None,
    }
}

/// Of the concurrent values of `key`, the one Automerge would pick (the last) among those
/// `judge` counts for a write needing `need` (see `judge.rs`).
pub(crate) fn judged<R: ReadDoc>(
    doc: &R,
    obj: &ObjId,
    key: &str,
    judge: &crate::judge::Judge<'_>,
    need: crate::judge::Right,
) -> Option<Value<'static>> {
    doc.get_all(obj, key)
        .ok()?
        .into_iter()
        .rev()
        .find(|(_, id)| judge.allows(id, need))
        .map(|(v, _)| v.into_owned())
}

/// A non-negative integer value.
pub(crate) fn value_uint(v: &Value<'_>) -> Option<u64> {
    match v.as_scalar()? {
        ScalarValue::Uint(x) => Some(*x),
        ScalarValue::Int(x) => u64::try_from(*x).ok(),
        _ => None,
    }
}

/// A string value.
pub(crate) fn value_str<'v>(v: &'v Value<'_>) -> Option<&'v str> {
    match v.as_scalar()? {
        ScalarValue::Str(s) => Some(s.as_str()),
        _ => None,
    }
}

/// A boolean value.
pub(crate) fn value_bool(v: &Value<'_>) -> Option<bool> {
    match v.as_scalar()? {
        ScalarValue::Boolean(b) => Some(*b),
        _ => None,
    }
}
