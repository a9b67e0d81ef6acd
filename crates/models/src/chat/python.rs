//! The Python the chat templates expect, written in Rust: JSON values that
//! keep their key order, `tojson` as Python's `json.dumps` writes, and
//! `strftime` with its calendar (UTC).

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, Rest, ValueKind};
use minijinja::{Error as JinjaError, ErrorKind, Value};
use std::fmt::{self, Write as _};
use std::sync::Arc;

/// A map that keeps insertion order (JSON objects, the render context):
/// minijinja's own maps sort their keys unless built with `preserve_order`.
#[derive(Debug)]
pub(super) struct OrderedMap(Vec<(Value, Value)>);

impl OrderedMap {
    pub(super) fn value(entries: Vec<(Value, Value)>) -> Value {
        Value::from_object(OrderedMap(entries))
    }
}

impl Object for OrderedMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.0.iter().map(|(k, _)| k.clone()).collect())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

/// Parses JSON into a template value, keeping object key order, so `tojson`
/// of a request's tool schema prints keys as the client sent them.
pub fn json_to_value(json: &str) -> Result<Value, serde_json::Error> {
    serde_json::from_str::<JsonValue>(json).map(|v| v.0)
}

/// Converts an already parsed `serde_json::Value` (key order as parsed).
pub fn serde_to_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => number_value(n),
        J::String(s) => Value::from(s.as_str()),
        J::Array(a) => a.iter().map(serde_to_value).collect(),
        J::Object(o) => {
            OrderedMap::value(o.iter().map(|(k, v)| (Value::from(k.as_str()), serde_to_value(v))).collect())
        }
    }
}

fn number_value(n: &serde_json::Number) -> Value {
    if let Some(i) = n.as_i64() {
        Value::from(i)
    } else if let Some(u) = n.as_u64() {
        Value::from(u)
    } else {
        Value::from(n.as_f64().unwrap_or(f64::NAN))
    }
}

/// A template value deserialized straight from JSON (order-preserving).
pub struct JsonValue(pub Value);

impl<'de> serde::Deserialize<'de> for JsonValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = JsonValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E>(self, b: bool) -> Result<JsonValue, E> {
                Ok(JsonValue(Value::from(b)))
            }
            fn visit_i64<E>(self, i: i64) -> Result<JsonValue, E> {
                Ok(JsonValue(Value::from(i)))
            }
            fn visit_u64<E>(self, u: u64) -> Result<JsonValue, E> {
                Ok(JsonValue(Value::from(u)))
            }
            fn visit_f64<E>(self, x: f64) -> Result<JsonValue, E> {
                Ok(JsonValue(Value::from(x)))
            }
            fn visit_str<E>(self, s: &str) -> Result<JsonValue, E> {
                Ok(JsonValue(Value::from(s)))
            }
            fn visit_string<E>(self, s: String) -> Result<JsonValue, E> {
                Ok(JsonValue(Value::from(s)))
            }
            fn visit_unit<E>(self) -> Result<JsonValue, E> {
                Ok(JsonValue(Value::from(())))
            }
            fn visit_none<E>(self) -> Result<JsonValue, E> {
                Ok(JsonValue(Value::from(())))
            }
            fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<JsonValue, D::Error> {
                serde::Deserialize::deserialize(d)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<JsonValue, A::Error> {
                let mut v = Vec::new();
                while let Some(JsonValue(x)) = a.next_element()? {
                    v.push(x);
                }
                Ok(JsonValue(Value::from(v)))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<JsonValue, A::Error> {
                let mut v: Vec<(Value, Value)> = Vec::new();
                while let Some((k, JsonValue(x))) = a.next_entry::<String, JsonValue>()? {
                    let k = Value::from(k);
                    match v.iter_mut().find(|(old, _)| *old == k) {
                        Some(slot) => slot.1 = x, // duplicate key: the last wins, as in Python
                        None => v.push((k, x)),
                    }
                }
                Ok(JsonValue(OrderedMap::value(v)))
            }
        }
        d.deserialize_any(V)
    }
}

/// `tojson` as transformers defines it: Python's `json.dumps` with
/// `ensure_ascii=False` by default, `indent`, `separators`, `sort_keys`, and
/// no HTML escaping (minijinja's own `tojson` escapes `<`, `>`, `&`, `'`).
pub(super) fn tojson_filter(value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, JinjaError> {
    let bad = |m: &str| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {m}"));
    // positional order as json.dumps' keywords in transformers' signature
    let pos = |i: usize| args.0.get(i).cloned();
    let ensure_ascii: bool =
        kwargs.get::<Option<bool>>("ensure_ascii")?.or(pos(0).map(|v| v.is_true())).unwrap_or(false);
    let indent_v: Option<Value> = kwargs.get::<Option<Value>>("indent")?.or(pos(1));
    let separators: Option<Value> = kwargs.get::<Option<Value>>("separators")?.or(pos(2));
    let sort_keys: bool = kwargs.get::<Option<bool>>("sort_keys")?.or(pos(3).map(|v| v.is_true())).unwrap_or(false);
    kwargs.assert_all_used()?;
    let indent = match indent_v {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.max(0) as usize)),
            (_, Some(s)) => Some(s.to_string()),
            _ => return Err(bad("indent must be an integer or a string")),
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(s) if !s.is_none() && !s.is_undefined() => {
            let parts: Vec<Value> = s.try_iter()?.collect();
            match (parts.first().and_then(|p| p.as_str()), parts.get(1).and_then(|p| p.as_str())) {
                (Some(a), Some(b)) if parts.len() == 2 => (a.to_string(), b.to_string()),
                _ => return Err(bad("separators must be two strings")),
            }
        }
        _ => (if indent.is_some() { "," } else { ", " }.to_string(), ": ".to_string()),
    };
    let opts = JsonOpts { indent, item_sep, key_sep, sort_keys, ensure_ascii };
    let mut out = String::new();
    write_json(&mut out, &value, &opts, 0)?;
    Ok(Value::from(out))
}

struct JsonOpts {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

fn newline(out: &mut String, opts: &JsonOpts, depth: usize) {
    if let Some(ind) = &opts.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
    }
}

fn write_json(out: &mut String, v: &Value, opts: &JsonOpts, depth: usize) -> Result<(), JinjaError> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Undefined => {
            return Err(JinjaError::new(ErrorKind::InvalidOperation, "tojson: an undefined value is not JSON"))
        }
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let x = f64::try_from(v.clone())?;
                out.push_str(&python_float(x));
            }
        }
        ValueKind::String => write_json_str(out, v.as_str().unwrap_or(""), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, opts, depth, "[]", &items, |out, item| write_json(out, item, opts, depth + 1))?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if opts.sort_keys {
                keys.sort();
            }
            write_container(out, opts, depth, "{}", &keys, |out, k| {
                // Python turns int/float/bool/None keys into strings
                match k.as_str() {
                    Some(s) => write_json_str(out, s, opts.ensure_ascii),
                    None if k.is_none() => out.push_str("\"null\""),
                    None => write_json_str(out, &k.to_string(), opts.ensure_ascii),
                }
                out.push_str(&opts.key_sep);
                write_json(out, &v.get_item(k)?, opts, depth + 1)
            })?;
        }
        _ => {
            return Err(JinjaError::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a {} value is not JSON serializable", v.kind()),
            ))
        }
    }
    Ok(())
}

/// A JSON array or object (`brackets`: `[]` or `{}`) as `json.dumps`
/// lays it out: each item (written by `item`) on its own line under
/// `indent`, separated by `item_sep`; an empty one as the bare brackets.
fn write_container<T>(
    out: &mut String,
    opts: &JsonOpts,
    depth: usize,
    brackets: &str,
    items: &[T],
    mut item: impl FnMut(&mut String, &T) -> Result<(), JinjaError>,
) -> Result<(), JinjaError> {
    let (open, close) = brackets.split_at(1);
    out.push_str(open);
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&opts.item_sep);
        }
        newline(out, opts, depth + 1);
        item(out, x)?;
    }
    if !items.is_empty() {
        newline(out, opts, depth);
    }
    out.push_str(close);
    Ok(())
}

/// A JSON string literal as Python's `json.dumps` escapes it.
fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `repr(float)` in Python: shortest round-trip digits, `1.0` for whole
/// numbers, exponent form below 1e-4 and from 1e16, `NaN`/`Infinity` as
/// `json.dumps` writes them.
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let a = x.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        // Rust: 1e-5, 1.5e20 → Python: 1e-05, 1.5e+20
        let s = format!("{x:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = match exp.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exp),
        };
        return format!("{mant}e{sign}{digits:0>2}");
    }
    let s = format!("{x}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

/// Python's `strftime` for the common directives, in UTC (the machine's
/// time zone is not looked up). Unknown directives are kept as written.
pub(super) fn strftime(fmt: &str, unix: i64) -> String {
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = unix.div_euclid(86400);
    let secs = unix.rem_euclid(86400);
    let (y, m, d) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let (hh, mm, ss) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match it.next() {
            Some('Y') => write!(out, "{y}"),
            Some('y') => write!(out, "{:02}", y.rem_euclid(100)),
            Some('m') => write!(out, "{m:02}"),
            Some('d') => write!(out, "{d:02}"),
            Some('e') => write!(out, "{d:2}"),
            Some('j') => write!(out, "{yday:03}"),
            Some('H') => write!(out, "{hh:02}"),
            Some('I') => write!(out, "{:02}", if hh % 12 == 0 { 12 } else { hh % 12 }),
            Some('p') => write!(out, "{}", if hh < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{mm:02}"),
            Some('S') => write!(out, "{ss:02}"),
            Some('B') => write!(out, "{}", MONTHS[m as usize - 1]),
            Some('b') | Some('h') => write!(out, "{}", &MONTHS[m as usize - 1][..3]),
            Some('A') => write!(out, "{}", DAYS[weekday]),
            Some('a') => write!(out, "{}", &DAYS[weekday][..3]),
            Some('u') => write!(out, "{}", weekday + 1),
            Some('w') => write!(out, "{}", (weekday + 1) % 7),
            Some('F') => write!(out, "{y}-{m:02}-{d:02}"),
            Some('T') => write!(out, "{hh:02}:{mm:02}:{ss:02}"),
            Some('Z') => write!(out, "UTC"),
            Some('z') => write!(out, "+0000"),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// Days since 1970-01-01 → (year, month 1..=12, day 1..=31), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// (year, month, day) → days since 1970-01-01.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        assert_eq!(python_float(1e16), "1e+16");
        assert_eq!(python_float(123.25), "123.25");
        assert_eq!(python_float(-0.0001), "-0.0001");
    }

    #[test]
    fn strftime_known_dates() {
        // 2024-07-26 13:05:09 UTC was a Friday
        let t = days_from_civil(2024, 7, 26) * 86400 + 13 * 3600 + 5 * 60 + 9;
        let s = strftime("%d %b %Y|%A %H:%M:%S|%j|%y %B %a %I%p %e %%|%q", t);
        assert_eq!(s, "26 Jul 2024|Friday 13:05:09|208|24 July Fri 01PM 26 %|%q");
        assert_eq!(strftime("%Y-%m-%d %a", 0), "1970-01-01 Thu");
        assert_eq!(strftime("%F %j %A", 951_782_400), "2000-02-29 060 Tuesday");
    }
}
