// string_grammar.h — the GBNF of a JSON string whose value satisfies, all at once, a set of
// regular expressions (JSON Schema `pattern`, ECMAScript syntax, search semantics: the value
// contains a match unless the expression is anchored with ^ and $) and a length range in code
// points (`minLength`/`maxLength`). Used by json_schema_grammar.h for `pattern`, `format` (each
// format is an anchored expression here) and their combination with lengths.
//
// Contract: every string the rules accept is a JSON string literal (the quotes included) whose
// decoded value matches every expression and has a length within the range. The value's
// characters are written unescaped where JSON allows it; `"`, `\` and control characters as
// their JSON escapes. Characters a value cannot hold in UTF-8 (surrogates) are never written.
// Expressions outside the supported subset are refused with a reason, never approximated.
// Supported: literals, `.`, classes `[...]`/`[^...]` with ranges, `\d \D \w \W \s \S`, escapes
// (`\t \n \r \f \v \0 \xHH \uHHHH`, escaped punctuation), groups `(...)`, `(?:...)`,
// `(?<name>...)`, alternation, quantifiers `* + ? {n} {n,} {n,m}` (lazy forms too: they match
// the same strings), `^` at the start and `$` at the end of a top-level alternative.
// Refused: back-references, look-arounds, word boundaries, `\p{...}`, anchors elsewhere, and
// expressions whose automaton exceeds kMaxStringStates states.
// Thread-safety: pure function.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace moestream::chat {

// The most automaton states one string schema may need (more: refused).
constexpr int kMaxStringStates = 10000;

// Appends rules named `prefix`-N to *rules and sets *expr to the expression of the whole
// string. max_len < 0: unbounded. Returns false with *why (naming the problem, without a
// pointer) when an expression is outside the subset, no string satisfies everything, or the
// automaton is too large.
bool string_grammar(const std::vector<std::string> & regexes, int min_len, int max_len,
                    const std::string & prefix,
                    std::vector<std::pair<std::string, std::string>> * rules, std::string * expr,
                    std::string * why);

}  // namespace moestream::chat
