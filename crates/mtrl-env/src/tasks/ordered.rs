//! A JSON object that keeps its keys in file order (so "the first column" is well defined without
//! serde_json's `preserve_order` feature), and a row type that accepts any JSON value.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

/// Keys and values in file order.
#[derive(Debug, Default)]
pub(crate) struct OrderedObject(Vec<(String, Value)>);

impl OrderedObject {
    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub(crate) fn first(&self) -> Option<&Value> {
        self.0.first().map(|(_, v)| v)
    }
}

/// One row of a JSON task file: an object, or the kind of the non-object found.
#[derive(Debug)]
pub(crate) enum JsonRow {
    Object(OrderedObject),
    Other(&'static str),
}

struct RowVisitor;

impl<'de> Visitor<'de> for RowVisitor {
    type Value = JsonRow;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonRow, A::Error> {
        let mut out = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Value>()? {
            out.push((k, v));
        }
        Ok(JsonRow::Object(OrderedObject(out)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JsonRow, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(JsonRow::Other("an array"))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<JsonRow, E> {
        Ok(JsonRow::Other("a boolean"))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<JsonRow, E> {
        Ok(JsonRow::Other("a number"))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<JsonRow, E> {
        Ok(JsonRow::Other("a number"))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<JsonRow, E> {
        Ok(JsonRow::Other("a number"))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<JsonRow, E> {
        Ok(JsonRow::Other("a string"))
    }

    fn visit_unit<E: de::Error>(self) -> Result<JsonRow, E> {
        Ok(JsonRow::Other("null"))
    }
}

impl<'de> Deserialize<'de> for JsonRow {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<JsonRow, D::Error> {
        d.deserialize_any(RowVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_key_order() {
        let JsonRow::Object(o) = serde_json::from_str(r#"{"z":1,"a":2}"#).unwrap() else {
            panic!("not an object")
        };
        assert_eq!(o.first(), Some(&Value::from(1)));
        assert_eq!(o.get("a"), Some(&Value::from(2)));
        assert!(matches!(
            serde_json::from_str::<JsonRow>("[1,[2]]").unwrap(),
            JsonRow::Other("an array")
        ));
        assert!(serde_json::from_str::<JsonRow>("{").is_err());
    }
}
