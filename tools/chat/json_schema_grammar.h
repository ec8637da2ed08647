// json_schema_grammar.h — JSON Schema to GBNF (llama.cpp's grammar format, start rule `root`)
// for `response_format: {"type": "json_schema"}` and `json_schema` of `moestream serve`.
//
// Contract: for a schema in the supported subset (docs/server.md lists it), every string the
// grammar accepts is one JSON value that the schema accepts. The grammar is a subset of the
// schema's language where a bound keeps a model from writing forever: object properties
// come in the schema's order, only declared properties appear when `properties` is given,
// numbers have at most 16 integer and 16 fraction digits and 3 exponent digits, and at most
// one whitespace run (a space, or a newline and up to 20 spaces or tabs) separates tokens;
// a number with bounds is written without an exponent; `format` values are written as a
// subset of their RFC (string_grammar.h holds `pattern`, `format` and lengths together).
// `oneOf` is generated like `anyOf` (an output matches at least one branch; branches that
// overlap can both match). Any keyword outside the subset is refused, never ignored: the
// error names the keyword and its JSON pointer. Strings: llama.cpp's grammar decodes UTF-8
// without refusing overlong forms or lead bytes above F4; the engine's sampler excludes the
// tokens that would make a grammar's output invalid UTF-8 (src/engine/sampler.h), so lengths
// hold for what the model writes.
// Thread-safety: pure function.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace moestream::chat {

struct SchemaError {
    std::string pointer;  // JSON pointer of the offending place, "#/properties/a/pattern"
    std::string message;  // names the keyword and that pointer
};

// The largest minLength/maxLength/minItems/maxItems the converter expands (larger: refused).
constexpr int kMaxSchemaCount = 1000;

// Converts `schema` (object or boolean true) into GBNF with a `root` rule. Returns false and
// fills *err for a schema outside the supported subset or malformed.
bool json_schema_to_gbnf(const nlohmann::ordered_json & schema, std::string * gbnf,
                         SchemaError * err);

}  // namespace moestream::chat
