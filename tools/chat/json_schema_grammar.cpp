// json_schema_grammar.cpp — see json_schema_grammar.h. A recursive walk over the schema that
// emits one GBNF rule per composite schema; $ref targets become named rules (converted once,
// so recursive schemas give recursive rules).
#include "json_schema_grammar.h"

#include <cctype>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "string_grammar.h"

namespace moestream::chat {
namespace {

using ojson = nlohmann::ordered_json;

// Keywords that describe but do not constrain: accepted anywhere and without effect.
const std::set<std::string> kAnnotations = {
    "title",    "description", "default",   "examples",  "$schema",    "$id",
    "$comment", "deprecated",  "readOnly",  "writeOnly", "$defs",      "definitions"};
// Keywords the converter enforces.
const std::set<std::string> kSupported = {
    "type",  "properties", "required", "additionalProperties", "items",     "enum",
    "const", "anyOf",      "oneOf",    "$ref",                 "minItems",  "maxItems",
    "minLength", "maxLength", "minimum",              "maximum",   "exclusiveMinimum",
    "exclusiveMaximum", "pattern", "format", "minProperties", "maxProperties"};
const std::set<std::string> kTypes = {"object", "array",   "string", "number",
                                      "integer", "boolean", "null"};

constexpr int kMaxDepth = 64;  // nesting of schemas inside schemas

// `format` values and the anchored expressions (string_grammar.h) the grammar writes for them:
// each a subset of what the format's RFC allows (dates to the 28th of February, times with
// a time zone, no leap second, host names of at most three labels of at most 63 characters,
// so never above RFC 1123's 253), so that strict validators accept every output.
const std::map<std::string, std::string> & formats() {
    static const std::string date =
        "\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|"
        "02-(?:0[1-9]|1\\d|2[0-8]))";
    static const std::string time =
        "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d{1,9})?(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)";
    static const std::string atext = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]";
    static const std::string label = "[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?";
    static const std::string label63 = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
    static const std::string octet = "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";
    static const std::map<std::string, std::string> m = {
        {"date", "^" + date + "$"},
        {"time", "^" + time + "$"},
        {"date-time", "^" + date + "T" + time + "$"},
        {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
        {"email", "^" + atext + "+(?:\\." + atext + "+)*@(?:" + label + "\\.)+" + label + "$"},
        {"ipv4", "^(?:" + octet + "\\.){3}" + octet + "$"},
        {"hostname", "^" + label63 + "(?:\\." + label63 + "){0,2}$"},
    };
    return m;
}

// The largest magnitude the number grammars write (16 integer digits).
constexpr int64_t kMaxMagnitude = 9999999999999999;

// The decimal spellings (no leading zeros) of the integers in [lo, hi], both of n digits.
std::string same_length_range(const std::string & lo, const std::string & hi) {
    if (lo == hi) return "\"" + lo + "\"";
    const size_t n = lo.size();
    if (lo[0] == hi[0])
        return "\"" + lo.substr(0, 1) + "\" " + same_length_range(lo.substr(1), hi.substr(1));
    const bool lo_zeros = lo.find_first_not_of('0', 1) == std::string::npos;
    const bool hi_nines = hi.find_first_not_of('9', 1) == std::string::npos;
    char a = lo[0], b = hi[0];
    std::vector<std::string> alts;
    const std::string rest = n > 1 ? " [0-9]{" + std::to_string(n - 1) + "}" : "";
    if (!lo_zeros) {
        alts.push_back("\"" + lo.substr(0, 1) + "\" " +
                       same_length_range(lo.substr(1), std::string(n - 1, '9')));
        ++a;
    }
    std::string last;
    if (!hi_nines) {
        last = "\"" + hi.substr(0, 1) + "\" " + same_length_range(std::string(n - 1, '0'), hi.substr(1));
        --b;
    }
    if (a <= b) alts.push_back(std::string("[") + a + "-" + b + "]" + rest);
    if (!last.empty()) alts.push_back(last);
    std::string out;
    for (const auto & x : alts) out += (out.empty() ? "" : " | ") + x;
    return alts.size() == 1 ? out : "( " + out + " )";
}

// The decimal spellings of the integers in [lo, hi], 0 <= lo <= hi <= kMaxMagnitude.
std::string uint_range(int64_t lo, int64_t hi) {
    const std::string a = std::to_string(lo), b = std::to_string(hi);
    std::vector<std::string> alts;
    for (size_t d = a.size(); d <= b.size(); ++d) {
        const std::string l = d == a.size() ? a : "1" + std::string(d - 1, '0');
        const std::string h = d == b.size() ? b : std::string(d, '9');
        alts.push_back(same_length_range(l, h));
    }
    std::string out;
    for (const auto & x : alts) out += (out.empty() ? "" : " | ") + x;
    return alts.size() == 1 ? out : "( " + out + " )";
}

// Spellings of the magnitudes m (an integer part and an optional fraction, no exponent) with
// L <= m (L < m when !l_in) and m <= H (m < H when !h_in; H < 0: no upper bound). "" if none.
std::string magnitude_range(int64_t L, bool l_in, int64_t H, bool h_in) {
    static const std::string any_frac = "( \".\" [0-9]{1,16} )?";
    static const std::string nonzero_frac = "\".\" \"0\"{0,15} [1-9] [0-9]{0,15}";
    static const std::string zero_frac = "( \".\" \"0\"{1,16} )?";
    std::vector<std::string> alts;
    if (H >= 0 && H < L) return "";
    if (H >= 0 && L == H) {
        if (l_in && h_in) alts.push_back(uint_range(L, L) + " " + zero_frac);
    } else {
        alts.push_back(uint_range(L, L) + " " + (l_in ? any_frac : nonzero_frac));
        const int64_t mid_hi = H >= 0 ? H - 1 : kMaxMagnitude;
        if (L + 1 <= mid_hi) alts.push_back(uint_range(L + 1, mid_hi) + " " + any_frac);
        if (H >= 0 && h_in) alts.push_back(uint_range(H, H) + " " + zero_frac);
    }
    std::string out;
    for (const auto & x : alts) out += (out.empty() ? "" : " | ") + x;
    return alts.size() > 1 ? "( " + out + " )" : out;
}

// A GBNF string literal for raw bytes.
std::string literal(const std::string & s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += char(c);
        } else if (c < 0x20 || c == 0x7F) {
            static const char hex[] = "0123456789ABCDEF";
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 15];
        } else {
            out += char(c);
        }
    }
    return out + "\"";
}

// `term{min,max}` (max < 0: unbounded), `term` a single GBNF term.
std::string repeat(const std::string & term, int min, int max) {
    if (max == 0) return "";
    if (min == 0 && max < 0) return term + "*";
    if (min == 1 && max < 0) return term + "+";
    if (min == 0 && max == 1) return term + "?";
    if (max < 0) return term + "{" + std::to_string(min) + ",}";
    if (min == max) return term + "{" + std::to_string(min) + "}";
    return term + "{" + std::to_string(min) + "," + std::to_string(max) + "}";
}

std::string pointer_escape(const std::string & key) {
    std::string out;
    for (char c : key) {
        if (c == '~')
            out += "~0";
        else if (c == '/')
            out += "~1";
        else
            out += c;
    }
    return out;
}

const char * json_type_of(const ojson & v) {
    if (v.is_null()) return "null";
    if (v.is_boolean()) return "boolean";
    if (v.is_number_integer()) return "integer";
    if (v.is_number()) return "number";
    if (v.is_string()) return "string";
    if (v.is_array()) return "array";
    return "object";
}

bool value_has_type(const ojson & v, const std::string & t) {
    const std::string vt = json_type_of(v);
    if (vt == t) return true;
    if (t == "number" && vt == "integer") return true;
    // 1.0 is an integer to JSON Schema.
    return t == "integer" && v.is_number_float() && v.get<double>() == double(int64_t(v.get<double>()));
}

class Converter {
public:
    explicit Converter(const ojson & root) : root_(root) {}

    bool run(std::string * gbnf, SchemaError * err) {
        std::string root_expr;
        if (!visit(root_, "#", "root-value", 0, &root_expr)) {
            *err = err_;
            return false;
        }
        builtin("ws");
        std::string out = "root ::= " + root_expr + " ws\n";
        for (const auto & [name, body] : rules_) out += name + " ::= " + body + "\n";
        *gbnf = out;
        return true;
    }

private:
    const ojson & root_;
    std::vector<std::pair<std::string, std::string>> rules_;  // in definition order
    std::set<std::string> names_;
    std::map<std::string, std::string> ref_rules_;  // pointer -> rule
    SchemaError err_;

    bool fail(const std::string & pointer, const std::string & message) {
        err_.pointer = pointer;
        err_.message = message;
        return false;
    }
    bool unsupported(const std::string & pointer, const std::string & keyword,
                     const std::string & why = "") {
        return fail(pointer, "keyword '" + keyword + "' at " + pointer +
                                 " is not supported" + (why.empty() ? "" : ": " + why));
    }

    std::string unique_name(const std::string & hint) {
        std::string base;
        for (char c : hint)
            base += (std::isalnum(static_cast<unsigned char>(c)) || c == '-') ? c : '-';
        if (base.empty()) base = "r";
        std::string name = base;
        static const std::set<std::string> reserved = {"root",    "ws",     "hex",  "char",
                                                       "string",  "number", "integer", "boolean",
                                                       "null",    "value",  "object",  "array"};
        for (int i = 2; names_.count(name) || reserved.count(name); ++i)
            name = base + "-" + std::to_string(i);
        names_.insert(name);
        return name;
    }
    std::string add_rule(const std::string & hint, const std::string & body) {
        const std::string name = unique_name(hint);
        rules_.emplace_back(name, body);
        return name;
    }
    // The shared rules (string, number, any value...), defined once on first use.
    std::string builtin(const std::string & name) {
        if (names_.count(name)) return name;
        static const std::map<std::string, std::vector<std::string>> deps = {
            {"ws", {}},
            {"hex", {}},
            {"char", {"hex"}},
            {"string", {"char"}},
            {"integer", {}},
            {"number", {}},
            {"boolean", {}},
            {"null", {}},
            {"value", {"object", "array", "string", "number", "boolean", "null"}},
            {"object", {"ws", "string", "value"}},
            {"array", {"ws", "value"}},
        };
        static const std::map<std::string, std::string> bodies = {
            {"ws", "( \" \" | \"\\n\" [ \\t]{0,20} )?"},
            {"hex", "[0-9a-fA-F]"},
            // No \u escape of a UTF-16 surrogate: a lone one is not a character.
            {"char",
             "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-C] hex{3} | "
             "[dD] [0-7] hex{2} | [e-fE-F] hex{3} ) )"},
            {"string", "\"\\\"\" char* \"\\\"\""},
            {"integer", "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} )"},
            {"number",
             "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? "
             "[0-9]{1,3} )?"},
            {"boolean", "\"true\" | \"false\""},
            {"null", "\"null\""},
            {"value", "object | array | string | number | boolean | null"},
            {"object",
             "\"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? "
             "\"}\""},
            {"array", "\"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\""},
        };
        names_.insert(name);
        rules_.emplace_back(name, bodies.at(name));
        for (const auto & d : deps.at(name)) builtin(d);
        return name;
    }

    bool count_of(const ojson & s, const char * key, const std::string & ptr, int * out) {
        auto it = s.find(key);
        if (it == s.end()) return true;
        const std::string p = ptr + "/" + key;
        if (!it->is_number_integer() || it->get<int64_t>() < 0)
            return fail(p, "'" + std::string(key) + "' at " + p + " must be a non-negative integer");
        if (it->get<int64_t>() > kMaxSchemaCount)
            return fail(p, "'" + std::string(key) + "' at " + p + " is larger than " +
                               std::to_string(kMaxSchemaCount) +
                               ", the largest count this server expands into a grammar");
        *out = int(it->get<int64_t>());
        return true;
    }

    // The expression for schema s at pointer ptr.
    bool visit(const ojson & s, const std::string & ptr, const std::string & hint, int depth,
               std::string * out) {
        if (depth > kMaxDepth)
            return fail(ptr, "the schema nests deeper than " + std::to_string(kMaxDepth) +
                                 " levels at " + ptr);
        if (s.is_boolean()) {
            if (!s.get<bool>()) return fail(ptr, "the schema at " + ptr + " is false: no value matches it");
            *out = builtin("value");
            return true;
        }
        if (!s.is_object()) return fail(ptr, "the schema at " + ptr + " must be an object or a boolean");
        for (auto it = s.begin(); it != s.end(); ++it) {
            const std::string & k = it.key();
            if (!kSupported.count(k) && !kAnnotations.count(k))
                return unsupported(ptr + "/" + pointer_escape(k), k);
        }
        auto has = [&](const char * k) { return s.contains(k); };
        // Keywords other than annotations, for the combinators that stand alone.
        auto others = [&](const std::set<std::string> & allowed) -> std::string {
            for (auto it = s.begin(); it != s.end(); ++it)
                if (!kAnnotations.count(it.key()) && !allowed.count(it.key())) return it.key();
            return "";
        };

        if (has("$ref")) {
            if (const std::string o = others({"$ref"}); !o.empty())
                return unsupported(ptr + "/" + pointer_escape(o), o, "next to '$ref' (put it in the referenced schema)");
            return visit_ref(s["$ref"], ptr + "/$ref", depth, out);
        }
        for (const char * comb : {"anyOf", "oneOf"}) {
            if (!has(comb)) continue;
            if (const std::string o = others({comb}); !o.empty())
                return unsupported(ptr + "/" + pointer_escape(o), o,
                                   std::string("next to '") + comb + "' (put it in each branch)");
            const ojson & branches = s[comb];
            const std::string p = ptr + "/" + comb;
            if (!branches.is_array() || branches.empty())
                return fail(p, "'" + std::string(comb) + "' at " + p + " must be a non-empty array of schemas");
            std::string alt;
            for (size_t i = 0; i < branches.size(); ++i) {
                std::string e;
                if (!visit(branches[i], p + "/" + std::to_string(i), hint, depth + 1, &e)) return false;
                alt += (i ? " | " : "") + e;
            }
            *out = add_rule(hint, alt);
            return true;
        }

        // The types this schema allows.
        std::vector<std::string> types;
        if (has("type")) {
            const ojson & t = s["type"];
            const std::string p = ptr + "/type";
            std::vector<ojson> names;
            if (t.is_string())
                names.push_back(t);
            else if (t.is_array() && !t.empty())
                names.assign(t.begin(), t.end());
            else
                return fail(p, "'type' at " + p + " must be a type name or a non-empty array of them");
            for (const ojson & n : names) {
                if (!n.is_string() || !kTypes.count(n.get<std::string>()))
                    return fail(p, "'type' at " + p + ": " + n.dump() +
                                       " is not one of object, array, string, number, integer, "
                                       "boolean, null");
                types.push_back(n.get<std::string>());
            }
        }

        if (has("const") || has("enum")) {
            if (has("const") && has("enum"))
                return unsupported(ptr + "/const", "const", "together with 'enum'");
            std::vector<ojson> values;
            if (has("const")) {
                values.push_back(s["const"]);
            } else {
                const ojson & e = s["enum"];
                if (!e.is_array() || e.empty())
                    return fail(ptr + "/enum", "'enum' at " + ptr + "/enum must be a non-empty array");
                values.assign(e.begin(), e.end());
            }
            std::string alt;
            for (const ojson & v : values) {
                bool ok = types.empty();
                for (const auto & t : types) ok = ok || value_has_type(v, t);
                if (ok) alt += (alt.empty() ? "" : " | ") + literal(v.dump());
            }
            if (alt.empty())
                return fail(ptr, "the schema at " + ptr + ": no value of '" +
                                     std::string(has("const") ? "const" : "enum") +
                                     "' has the schema's 'type'");
            *out = add_rule(hint, alt);
            return true;
        }

        if (types.empty()) {  // untyped: the types its keywords describe, else any value
            if (has("properties") || has("required") || has("additionalProperties"))
                types.push_back("object");
            if (has("items") || has("minItems") || has("maxItems")) types.push_back("array");
            if (has("minLength") || has("maxLength") || has("pattern") || has("format"))
                types.push_back("string");
            if (has("minimum") || has("maximum") || has("exclusiveMinimum") || has("exclusiveMaximum"))
                types.push_back("number");
            if (types.empty()) {
                *out = builtin("value");
                return true;
            }
        }
        if (types.size() == 1) return visit_typed(s, types[0], ptr, hint, depth, out);
        std::string alt;
        for (size_t i = 0; i < types.size(); ++i) {
            std::string e;
            if (!visit_typed(s, types[i], ptr, hint + "-" + types[i], depth, &e)) return false;
            alt += (i ? " | " : "") + e;
        }
        *out = add_rule(hint, alt);
        return true;
    }

    bool visit_typed(const ojson & s, const std::string & type, const std::string & ptr,
                     const std::string & hint, int depth, std::string * out) {
        if (type == "string") {
            int lo = 0, hi = -1;
            if (!count_of(s, "minLength", ptr, &lo) || !count_of(s, "maxLength", ptr, &hi)) return false;
            if (hi >= 0 && lo > hi)
                return fail(ptr + "/minLength", "'minLength' at " + ptr + "/minLength is larger than 'maxLength': no string matches");
            std::vector<std::string> regexes;
            std::string regex_key;  // the keyword an unsatisfiable combination is reported at
            if (s.contains("format")) {
                const ojson & f = s["format"];
                const std::string p = ptr + "/format";
                auto it = f.is_string() ? formats().find(f.get<std::string>()) : formats().end();
                if (it == formats().end())
                    return unsupported(p, "format", f.dump() +
                                                        " (supported: date, date-time, time, uuid, email, ipv4, hostname)");
                regexes.push_back(it->second);
                regex_key = "format";
            }
            if (s.contains("pattern")) {
                if (!s["pattern"].is_string())
                    return fail(ptr + "/pattern", "'pattern' at " + ptr + "/pattern must be a string");
                regexes.push_back(s["pattern"].get<std::string>());
                regex_key = "pattern";
            }
            if (!regexes.empty()) {
                std::string prefix = unique_name(hint + "-re");
                while (true) {  // a prefix no rule name starts with
                    auto it = names_.lower_bound(prefix + "-");
                    if (it == names_.end() || it->rfind(prefix + "-", 0) != 0) break;
                    prefix = unique_name(hint + "-re");
                }
                const size_t first = rules_.size();
                std::string why;
                if (!string_grammar(regexes, lo, hi, prefix, &rules_, out, &why))
                    return unsupported(ptr + "/" + regex_key, regex_key, why);
                for (size_t i = first; i < rules_.size(); ++i) names_.insert(rules_[i].first);
                return true;
            }
            if (lo == 0 && hi < 0) {
                *out = builtin("string");
                return true;
            }
            builtin("char");
            *out = add_rule(hint, "\"\\\"\" " + repeat("char", lo, hi) + " \"\\\"\"");
            return true;
        }
        if (type == "number" || type == "integer") return visit_number(s, type, ptr, hint, out);
        if (type == "boolean" || type == "null") {
            *out = builtin(type);
            return true;
        }
        if (type == "array") return visit_array(s, ptr, hint, depth, out);
        return visit_object(s, ptr, hint, depth, out);
    }

    // A lower or upper bound of a number: minimum/maximum and their exclusive forms (numbers,
    // or draft 4's booleans that make minimum/maximum exclusive); the stronger one wins.
    struct Bound {
        bool set = false;
        double v = 0;
        bool excl = false;
        std::string key;
    };
    bool bound_of(const ojson & s, const std::string & ptr, bool lower, Bound * b) {
        const std::string inc = lower ? "minimum" : "maximum";
        const std::string exc = lower ? "exclusiveMinimum" : "exclusiveMaximum";
        const bool old_excl = s.contains(exc) && s[exc].is_boolean() && s[exc].get<bool>();
        for (const std::string & k : {inc, exc}) {
            if (!s.contains(k) || (k == exc && s[k].is_boolean())) continue;
            const std::string p = ptr + "/" + k;
            if (!s[k].is_number()) return fail(p, "'" + k + "' at " + p + " must be a number");
            const double v = s[k].get<double>();
            const bool excl = k == exc || old_excl;
            const bool stronger = !b->set || (lower ? v > b->v : v < b->v) || (v == b->v && excl);
            if (stronger) *b = {true, v, excl, k};
        }
        return true;
    }

    bool visit_number(const ojson & s, const std::string & type, const std::string & ptr,
                      const std::string & hint, std::string * out) {
        Bound lo, hi;
        if (!bound_of(s, ptr, true, &lo) || !bound_of(s, ptr, false, &hi)) return false;
        if (!lo.set && !hi.set) {
            *out = builtin(type);
            return true;
        }
        const double cap = double(kMaxMagnitude);
        const bool integer = type == "integer";
        for (const Bound * b : {&lo, &hi}) {
            if (!integer && b->set && std::fabs(b->v) <= cap && std::floor(b->v) != b->v)
                return unsupported(ptr + "/" + b->key, b->key,
                                   "a bound that is not a whole number on a 'number' (a grammar "
                                   "enforces whole-number bounds exactly; use one, or 'integer')");
        }
        // Whole-number bounds; beyond the 16 digits the grammar writes, a bound is no limit.
        const double lo_v = !lo.set ? -HUGE_VAL : integer ? (lo.excl ? std::floor(lo.v) + 1 : std::ceil(lo.v)) : lo.v;
        const double hi_v = !hi.set ? HUGE_VAL : integer ? (hi.excl ? std::ceil(hi.v) - 1 : std::floor(hi.v)) : hi.v;
        const bool lo_ex = !integer && lo.excl, hi_ex = !integer && hi.excl;
        const bool has_lo = lo_v >= -cap, has_hi = hi_v <= cap;
        const std::string where = ptr + "/" + (lo.set ? lo.key : hi.key);
        if (lo_v > hi_v || (lo_v == hi_v && (lo_ex || hi_ex)) || lo_v > cap || hi_v < -cap)
            return fail(where, "'" + (lo.set ? lo.key : hi.key) + "' at " + where + ": the bounds leave no " +
                                   type + " a grammar can write (at most 16 integer digits)");
        const int64_t L = has_lo ? int64_t(lo_v) : 0, H = has_hi ? int64_t(hi_v) : 0;
        std::vector<std::string> alts;
        if (integer) {
            if (!has_hi || H >= 0) alts.push_back(uint_range(has_lo && L > 0 ? L : 0, has_hi ? H : kMaxMagnitude));
            if (!has_lo || L < 0)
                alts.push_back("\"-\" " + uint_range(has_hi && H < 0 ? -H : 1, has_lo ? -L : kMaxMagnitude));
        } else {
            if (!has_hi || H > 0 || (H == 0 && !hi_ex)) {
                const bool pos_lo = has_lo && L >= 0;
                const std::string m = magnitude_range(pos_lo ? L : 0, pos_lo ? !lo_ex : true,
                                                      has_hi ? H : -1, !hi_ex);
                if (!m.empty()) alts.push_back(m);
            }
            if (!has_lo || L < 0) {
                const bool neg_lo = has_hi && H < 0;
                const std::string m = magnitude_range(neg_lo ? -H : 0, neg_lo ? !hi_ex : false,
                                                      has_lo ? -L : -1, !lo_ex);
                if (!m.empty()) alts.push_back("\"-\" " + m);
            }
        }
        if (alts.empty())
            return fail(where, "'" + (lo.set ? lo.key : hi.key) + "' at " + where + ": the bounds leave no " +
                                   type + " a grammar can write");
        std::string body;
        for (const auto & a : alts) body += (body.empty() ? "" : " | ") + a;
        *out = add_rule(hint, body);
        return true;
    }

    bool visit_array(const ojson & s, const std::string & ptr, const std::string & hint, int depth,
                     std::string * out) {
        int lo = 0, hi = -1;
        if (!count_of(s, "minItems", ptr, &lo) || !count_of(s, "maxItems", ptr, &hi)) return false;
        if (hi >= 0 && lo > hi)
            return fail(ptr + "/minItems", "'minItems' at " + ptr + "/minItems is larger than 'maxItems': no array matches");
        std::string item;
        if (s.contains("items")) {
            if (s["items"].is_array())
                return unsupported(ptr + "/items", "items", "an array of schemas (tuples); give one schema");
            if (!visit(s["items"], ptr + "/items", hint + "-item", depth + 1, &item)) return false;
        } else {
            item = builtin("value");
        }
        const std::string ws = builtin("ws");
        std::string body;
        if (hi == 0) {
            body = "\"[\" ws \"]\"";
        } else {
            const std::string more = "( \",\" ws " + item + " ws )";
            const std::string rest = repeat(more, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
            const std::string seq = item + " ws " + rest;
            body = "\"[\" ws " + (lo == 0 ? "( " + seq + " )?" : seq) + " \"]\"";
        }
        *out = add_rule(hint, body);
        return true;
    }

    bool visit_object(const ojson & s, const std::string & ptr, const std::string & hint, int depth,
                      std::string * out) {
        const bool has_props = s.contains("properties");
        if (s.contains("additionalProperties")) {
            const ojson & ap = s["additionalProperties"];
            const std::string p = ptr + "/additionalProperties";
            if (!ap.is_boolean())
                return unsupported(p, "additionalProperties", "only false (or absent) is supported, not a schema");
            if (ap.get<bool>() && (has_props || s.contains("required")))
                return unsupported(p, "additionalProperties",
                                   "true next to 'properties' or 'required' (only false or absent)");
        }
        const bool closed = s.contains("additionalProperties") && !s["additionalProperties"].get<bool>();
        int min_p = 0, max_p = -1;
        if (!count_of(s, "minProperties", ptr, &min_p) || !count_of(s, "maxProperties", ptr, &max_p)) return false;
        const bool counted = s.contains("minProperties") || s.contains("maxProperties");
        const std::string count_key = s.contains("minProperties") ? "minProperties" : "maxProperties";
        if (!has_props && !s.contains("required") && !closed) {
            if (counted)  // the free-form object grammar does not count its members
                return unsupported(ptr + "/" + count_key, count_key, "only on an object with 'properties'");
            *out = builtin("object");
            return true;
        }
        if (max_p >= 0 && min_p > max_p)
            return fail(ptr + "/minProperties", "'minProperties' at " + ptr +
                                                    "/minProperties is larger than 'maxProperties': no object matches");
        const ojson empty = ojson::object();
        const ojson & props = has_props ? s["properties"] : empty;
        if (!props.is_object())
            return fail(ptr + "/properties", "'properties' at " + ptr + "/properties must be an object");
        std::set<std::string> required;
        if (s.contains("required")) {
            const ojson & r = s["required"];
            const std::string p = ptr + "/required";
            if (!r.is_array()) return fail(p, "'required' at " + p + " must be an array of property names");
            for (const ojson & n : r) {
                if (!n.is_string()) return fail(p, "'required' at " + p + " must hold strings");
                if (!props.contains(n.get<std::string>()))
                    return unsupported(p, "required", "it names '" + n.get<std::string>() +
                                                          "', which is not in 'properties'");
                required.insert(n.get<std::string>());
            }
        }
        // kv[i]: `"name" : value`, each followed by ws.
        std::vector<std::string> kv;
        std::vector<bool> req;
        builtin("ws");
        for (auto it = props.begin(); it != props.end(); ++it) {
            std::string v;
            const std::string p = ptr + "/properties/" + pointer_escape(it.key());
            if (!visit(it.value(), p, hint + "-" + it.key(), depth + 1, &v)) return false;
            kv.push_back(add_rule(hint + "-" + it.key() + "-kv",
                                  literal(ojson(it.key()).dump()) + " ws \":\" ws " + v + " ws"));
            req.push_back(required.count(it.key()) > 0);
        }
        const size_t n = kv.size();
        if (counted) return counted_object(kv, req, min_p, max_p, ptr, count_key, hint, out);
        // tail(i): properties i.. after at least one was written, each with its comma; the
        // optional ones may be left out. One rule per property, each naming the next, so the
        // grammar grows linearly with the properties (spelled out, n optional properties
        // took n^2 / 2 terms: 5000 of them, hundreds of MB and minutes of CPU per request).
        std::vector<std::string> tail_rule(n + 1);
        for (size_t i = n; i-- > 1;) {
            std::string t = req[i] ? "\",\" ws " + kv[i] : "( \",\" ws " + kv[i] + " )?";
            if (!tail_rule[i + 1].empty()) t += " " + tail_rule[i + 1];
            tail_rule[i] = add_rule(hint + "-tail" + std::to_string(i), t);
        }
        auto tail = [&](size_t i) { return tail_rule[i].empty() ? std::string() : " " + tail_rule[i]; };
        // The first property written is some k with every property before it optional.
        std::string alt;
        bool all_optional = true;
        for (size_t k = 0; k < n; ++k) {
            alt += (alt.empty() ? "" : " | ") + kv[k] + tail(k + 1);
            if (req[k]) {
                all_optional = false;
                break;
            }
        }
        std::string body;
        if (n == 0)
            body = "\"{\" ws \"}\"";
        else
            body = "\"{\" ws ( " + alt + " )" + (all_optional ? "?" : "") + " \"}\"";
        *out = add_rule(hint, body);
        return true;
    }

    // An object of the properties kv (req: required) that writes at least min_p and at most
    // max_p (-1: any) of them, in their order. tail(i, c): properties i.. after c (>= 1) were
    // written; only states from which a count in range is reachable get a rule, and there
    // are at most n x (max + 1) of them (refused above kMaxCountedStates).
    bool counted_object(const std::vector<std::string> & kv, const std::vector<bool> & req, int min_p,
                        int max_p, const std::string & ptr, const std::string & key,
                        const std::string & hint, std::string * out) {
        const size_t n = kv.size();
        const int hi = max_p < 0 ? int(n) : std::min(max_p, int(n));
        std::vector<int> r(n + 1, 0), o(n + 1, 0);  // required / optional properties at i..
        for (size_t i = n; i-- > 0;) {
            r[i] = r[i + 1] + (req[i] ? 1 : 0);
            o[i] = o[i + 1] + (req[i] ? 0 : 1);
        }
        auto feasible = [&](size_t i, int c) { return c + r[i] <= hi && c + r[i] + o[i] >= min_p; };
        if (!feasible(0, 0))
            return fail(ptr + "/" + key, "'" + key + "' at " + ptr + "/" + key + ": no object of these "
                                         "properties (" + std::to_string(r[0]) + " required, " +
                                         std::to_string(o[0]) + " optional) matches");
        constexpr size_t kMaxCountedStates = 20000;
        if (n * size_t(hi + 1) > kMaxCountedStates)
            return unsupported(ptr + "/" + key, key, "with " + std::to_string(n) +
                                                         " properties (at most " +
                                                         std::to_string(kMaxCountedStates) +
                                                         " properties x (maxProperties + 1))");
        const std::string ws = builtin("ws");
        std::map<std::pair<size_t, int>, std::string> memo;
        // The expression for state (i, c), "" when nothing more is written. Iterative from the
        // end (i = n .. 1) so deep property lists do not recurse.
        auto expr = [&](size_t i, int c) -> std::string {
            if (i == n) return "";
            auto it = memo.find({i, c});
            return it == memo.end() ? std::string() : it->second;
        };
        for (size_t i = n; i-- > 1;) {
            for (int c = 1; c <= std::min<int>(int(i), hi); ++c) {
                if (!feasible(i, c)) continue;
                std::string write, skip;
                const bool can_write = c + 1 <= hi && feasible(i + 1, c + 1);
                const bool can_skip = !req[i] && feasible(i + 1, c);
                if (can_write) {
                    const std::string t = expr(i + 1, c + 1);
                    write = "\",\" ws " + kv[i] + (t.empty() ? "" : " " + t);
                }
                if (can_skip) skip = expr(i + 1, c);
                std::string e;
                if (can_write && can_skip)
                    e = skip.empty() ? "( " + write + " )?" : "( " + write + " | " + skip + " )";
                else
                    e = can_write ? write : skip;
                if (!e.empty())
                    memo[{i, c}] = add_rule(hint + "-n" + std::to_string(i) + "-" + std::to_string(c), e);
            }
        }
        // The first property written is some k with every property before it optional.
        std::string alt;
        for (size_t k = 0; k < n && hi >= 1; ++k) {
            if (feasible(k + 1, 1)) {
                const std::string t = expr(k + 1, 1);
                alt += (alt.empty() ? "" : " | ") + kv[k] + (t.empty() ? "" : " " + t);
            }
            if (req[k]) break;
        }
        const bool may_be_empty = r[0] == 0 && min_p == 0;
        std::string body;
        if (alt.empty())
            body = "\"{\" ws \"}\"";
        else
            body = "\"{\" ws ( " + alt + " )" + (may_be_empty ? "?" : "") + " \"}\"";
        *out = add_rule(hint, body);
        return true;
    }

    bool visit_ref(const ojson & ref, const std::string & ptr, int depth, std::string * out) {
        if (!ref.is_string() || ref.get<std::string>().rfind('#', 0) != 0)
            return unsupported(ptr, "$ref", "only references into this schema (\"#/$defs/...\", \"#/definitions/...\", \"#\")");
        const std::string target = ref.get<std::string>();
        if (auto it = ref_rules_.find(target); it != ref_rules_.end()) {
            *out = it->second;
            return true;
        }
        // Resolve the JSON pointer after '#'.
        const ojson * node = &root_;
        std::string rest = target.substr(1), last = "root";
        if (!rest.empty() && rest[0] != '/')
            return unsupported(ptr, "$ref", "'" + target + "' is not a JSON pointer (anchors are not supported)");
        size_t pos = 0;
        while (pos < rest.size()) {
            size_t next = rest.find('/', pos + 1);
            std::string tok = rest.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
            pos = next == std::string::npos ? rest.size() : next;
            std::string key;
            for (size_t i = 0; i < tok.size(); ++i) {
                if (tok[i] == '~' && i + 1 < tok.size() && (tok[i + 1] == '0' || tok[i + 1] == '1')) {
                    key += tok[i + 1] == '0' ? '~' : '/';
                    ++i;
                } else {
                    key += tok[i];
                }
            }
            if (node->is_object() && node->contains(key)) {
                node = &(*node)[key];
            } else if (node->is_array() && !key.empty() &&
                       key.find_first_not_of("0123456789") == std::string::npos &&
                       std::stoull(key) < node->size()) {
                node = &(*node)[size_t(std::stoull(key))];
            } else {
                return fail(ptr, "'$ref' at " + ptr + ": '" + target + "' does not resolve in this schema");
            }
            last = key;
        }
        // A chain of bare references that comes back to itself describes nothing.
        std::set<const ojson *> seen{node};
        for (const ojson * n = node; n->is_object() && n->contains("$ref") && (*n)["$ref"].is_string();) {
            const std::string r = (*n)["$ref"].get<std::string>();
            if (r == target || seen.size() > 64)
                return fail(ptr, "'$ref' at " + ptr + ": '" + target + "' refers to itself without describing a value");
            if (r.rfind("#/", 0) != 0) break;
            const ojson * m = nullptr;
            try {
                m = &root_.at(ojson::json_pointer(r.substr(1)));
            } catch (const std::exception &) {
                break;  // reported when that reference is converted
            }
            if (!seen.insert(m).second)
                return fail(ptr, "'$ref' at " + ptr + ": '" + target + "' is a cycle of references");
            n = m;
        }
        const std::string name = unique_name("ref-" + last);
        ref_rules_[target] = name;
        const size_t slot = rules_.size();
        rules_.emplace_back(name, "");  // filled below; recursion finds the name
        std::string body;
        if (!visit(*node, target, name + "-body", depth + 1, &body)) return false;
        rules_[slot].second = body;
        *out = name;
        return true;
    }
};

}  // namespace

bool json_schema_to_gbnf(const nlohmann::ordered_json & schema, std::string * gbnf,
                         SchemaError * err) {
    Converter c(schema);
    return c.run(gbnf, err);
}

}  // namespace moestream::chat
