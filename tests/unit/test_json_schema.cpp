// test_json_schema.cpp — the server's JSON Schema to GBNF converter (tools/server/
// json_schema_grammar.h) against llama.cpp's own grammar sampler with a real vocabulary (the
// tiny synth model's: one token per byte, so any text is a token sequence):
//   - every schema of the set gives a grammar llama.cpp parses;
//   - hand-written valid instances pass the grammar and invalid ones (wrong type, missing
//     required property, extra property, bounds, enum misses, broken JSON) do not;
//   - random walks through the grammar (a token drawn among those the grammar allows) end in
//     JSON that a schema validator written here accepts;
//   - unsupported keywords are refused with their JSON pointer.
// Negative controls: a broken GBNF is refused by llama.cpp; the validator refuses the invalid
// instances; the grammar refuses them.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <cmath>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "chat_format.h"
#include "json_schema_grammar.h"
#include "llama.h"
#include "moestream/utf8.h"
#include "test_util.h"

namespace moestream::test {
namespace {

using ojson = nlohmann::ordered_json;
using chat::json_schema_to_gbnf;
using chat::SchemaError;

struct ModelFree {
    void operator()(llama_model * m) const { llama_model_free(m); }
};
struct SamplerFree {
    void operator()(llama_sampler * s) const { llama_sampler_free(s); }
};
using SamplerPtr = std::unique_ptr<llama_sampler, SamplerFree>;

const llama_vocab * vocab() {
    static std::unique_ptr<llama_model, ModelFree> model = [] {
        llama_model_params mp = llama_model_default_params();
        mp.vocab_only = true;
        return std::unique_ptr<llama_model, ModelFree>(llama_model_load_from_file(
            synth_model("tiny", "qwen3moe", "q4_k").c_str(), mp));
    }();
    return model ? llama_model_get_vocab(model.get()) : nullptr;
}

std::string gbnf_of(const ojson & schema) {
    std::string g;
    SchemaError err;
    EXPECT_TRUE(json_schema_to_gbnf(schema, &g, &err)) << schema.dump() << ": " << err.message;
    return g;
}

SamplerPtr grammar_sampler(const std::string & gbnf) {
    return SamplerPtr(llama_sampler_init_grammar(vocab(), gbnf.c_str(), "root"));
}

// Whether the grammar lets token t come next.
bool allows(llama_sampler * g, llama_token t) {
    llama_token_data d{t, 0.0f, 0.0f};
    llama_token_data_array a{&d, 1, -1, false};
    llama_sampler_apply(g, &a);
    return d.logit != -INFINITY;
}

// Whether the grammar accepts `text` as a whole output (then the end-of-generation token).
bool accepts(const std::string & gbnf, const std::string & text) {
    SamplerPtr g = grammar_sampler(gbnf);
    if (!g) return false;
    std::vector<llama_token> toks(text.size() + 8);
    int n = llama_tokenize(vocab(), text.data(), int32_t(text.size()), toks.data(),
                           int32_t(toks.size()), false, false);
    if (n < 0) return false;
    for (int i = 0; i < n; ++i) {
        if (!allows(g.get(), toks[size_t(i)])) return false;
        llama_sampler_accept(g.get(), toks[size_t(i)]);
    }
    return allows(g.get(), llama_vocab_eos(vocab()));
}

// A random output of the grammar: tokens drawn among those it allows, structural characters
// and the end weighted up so that walks end. "" when it did not end within max_tokens.
std::string walk(const std::string & gbnf, std::mt19937 * rng, int max_tokens = 4000) {
    SamplerPtr g = grammar_sampler(gbnf);
    if (!g) return "";
    const llama_vocab * v = vocab();
    const int n_vocab = llama_vocab_n_tokens(v);
    const llama_token eos = llama_vocab_eos(v);
    std::string out;
    std::vector<llama_token_data> cur(static_cast<size_t>(n_vocab));
    for (int step = 0; step < max_tokens; ++step) {
        for (int t = 0; t < n_vocab; ++t) cur[size_t(t)] = {t, 0.0f, 0.0f};
        llama_token_data_array a{cur.data(), cur.size(), -1, false};
        llama_sampler_apply(g.get(), &a);
        std::vector<llama_token> ok;
        std::vector<double> w;
        for (size_t i = 0; i < a.size; ++i) {
            if (a.data[i].logit == -INFINITY) continue;
            const llama_token t = a.data[i].id;
            if (llama_vocab_is_control(v, t) && t != eos) continue;
            char buf[16];
            const int pn = llama_token_to_piece(v, t, buf, sizeof buf, 0, false);
            const std::string piece = pn > 0 ? std::string(buf, size_t(pn)) : "";
            // llama.cpp's grammar decodes UTF-8 without refusing overlong forms or lead bytes
            // above F4: the engine's sampler excludes such tokens with any grammar
            // (test_sampling GrammarOutputIsValidUtf8), and so does the walk.
            if (utf8_valid_upto(out + piece) < 0) continue;
            double weight = 1.0;
            if (t == eos)
                weight = 1000.0;
            else if (piece == "\"" || piece == "}" || piece == "]" || piece == ",")
                weight = 30.0;
            ok.push_back(t);
            w.push_back(weight);
        }
        if (ok.empty()) return "";
        std::discrete_distribution<size_t> pick(w.begin(), w.end());
        const llama_token t = ok[pick(*rng)];
        if (t == eos) return out;
        char buf[16];
        const int pn = llama_token_to_piece(v, t, buf, sizeof buf, 0, false);
        if (pn > 0) out.append(buf, size_t(pn));
        llama_sampler_accept(g.get(), t);
    }
    return "";
}

// ---- a validator of the same JSON Schema subset, written independently of the converter ----

size_t code_points(const std::string & s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

bool is_type(const ojson & v, const std::string & t) {
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "string") return v.is_string();
    if (t == "array") return v.is_array();
    if (t == "object") return v.is_object();
    if (t == "number") return v.is_number();
    if (t == "integer")
        return v.is_number_integer() ||
               (v.is_number_float() && v.get<double>() == double(int64_t(v.get<double>())));
    return false;
}

// The formats by their RFC 3339 / RFC 4122 / HTML email definitions, the calendar checked
// with arithmetic (not with the converter's expressions).
bool format_ok(const std::string & f, const std::string & v) {
    auto date_ok = [](const std::string & d) {
        std::smatch m;
        if (!std::regex_match(d, m, std::regex(R"((\d{4})-(\d{2})-(\d{2}))"))) return false;
        const int y = std::stoi(m[1]), mo = std::stoi(m[2]), day = std::stoi(m[3]);
        const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        const int days[] = {31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
        return mo >= 1 && mo <= 12 && day >= 1 && day <= days[mo - 1];
    };
    auto time_ok = [](const std::string & t) {
        std::smatch m;
        if (!std::regex_match(t, m, std::regex(R"((\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|z|[+-](\d{2}):(\d{2})))")))
            return false;
        const bool tz_ok = m[6].length() == 0 || (std::stoi(m[6]) < 24 && std::stoi(m[7]) < 60);
        return std::stoi(m[1]) < 24 && std::stoi(m[2]) < 60 && std::stoi(m[3]) < 60 && tz_ok;
    };
    if (f == "date") return date_ok(v);
    if (f == "time") return time_ok(v);
    if (f == "date-time") {
        const size_t t = v.find_first_of("Tt");
        return t != std::string::npos && date_ok(v.substr(0, t)) && time_ok(v.substr(t + 1));
    }
    if (f == "uuid") return std::regex_match(v, std::regex("[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"));
    if (f == "ipv4") {  // four dot-separated numbers 0..255 without leading zeros
        std::smatch m;
        if (!std::regex_match(v, m, std::regex(R"((\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3}))"))) return false;
        for (int i = 1; i <= 4; ++i)
            if (std::stoi(m[i]) > 255 || (m[i].length() > 1 && m[i].str()[0] == '0')) return false;
        return true;
    }
    if (f == "hostname") {  // RFC 1123: at most 253 characters, labels of 1..63, no edge hyphen
        if (v.empty() || v.size() > 253) return false;
        const std::regex label("[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?");
        for (size_t a = 0, d; (d = v.find('.', a)), true; a = d + 1) {
            const std::string l = v.substr(a, d == std::string::npos ? std::string::npos : d - a);
            if (l.size() > 63 || !std::regex_match(l, label)) return false;
            if (d == std::string::npos) break;
        }
        return true;
    }
    if (f == "email") {
        const size_t at = v.find('@');
        if (at == std::string::npos || at == 0 || v.find('@', at + 1) != std::string::npos) return false;
        const std::string local = v.substr(0, at), domain = v.substr(at + 1);
        const std::regex atom("[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+");
        size_t a = 0;  // local: atoms separated by single dots
        for (size_t d; (d = local.find('.', a)), true; a = d + 1) {
            if (!std::regex_match(local.substr(a, d == std::string::npos ? std::string::npos : d - a), atom)) return false;
            if (d == std::string::npos) break;
        }
        const std::regex label("[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?");
        int labels = 0;
        a = 0;
        for (size_t d; (d = domain.find('.', a)), true; a = d + 1) {
            if (!std::regex_match(domain.substr(a, d == std::string::npos ? std::string::npos : d - a), label)) return false;
            ++labels;
            if (d == std::string::npos) break;
        }
        return labels >= 2;
    }
    return false;
}

bool validate(const ojson & root, const ojson & s, const ojson & v, std::string * why);

bool validate_all(const ojson & root, const ojson & s, const ojson & v, std::string * why) {
    auto no = [&](const std::string & w) {
        *why = w + " (value " + v.dump() + ", schema " + s.dump() + ")";
        return false;
    };
    if (s.contains("$ref")) {
        const std::string r = s["$ref"].get<std::string>();
        const ojson & target = r == "#" ? root : root.at(ojson::json_pointer(r.substr(1)));
        return validate(root, target, v, why);
    }
    if (s.contains("type")) {
        bool ok = false;
        if (s["type"].is_string())
            ok = is_type(v, s["type"].get<std::string>());
        else
            for (const auto & t : s["type"]) ok = ok || is_type(v, t.get<std::string>());
        if (!ok) return no("wrong type");
    }
    if (s.contains("const") && s["const"] != v) return no("not the const");
    if (s.contains("enum")) {
        bool ok = false;
        for (const auto & e : s["enum"]) ok = ok || e == v;
        if (!ok) return no("not in the enum");
    }
    if (s.contains("anyOf")) {
        bool ok = false;
        std::string w;
        for (const auto & b : s["anyOf"]) ok = ok || validate(root, b, v, &w);
        if (!ok) return no("no anyOf branch");
    }
    if (s.contains("oneOf")) {
        int n = 0;
        std::string w;
        for (const auto & b : s["oneOf"]) n += validate(root, b, v, &w);
        if (n != 1) return no(std::to_string(n) + " oneOf branches");
    }
    if (v.is_number()) {
        const double x = v.get<double>();
        auto num = [&](const char * k) { return s[k].get<double>(); };
        if (s.contains("minimum") && x < num("minimum")) return no("below minimum");
        if (s.contains("maximum") && x > num("maximum")) return no("above maximum");
        if (s.contains("exclusiveMinimum") && x <= num("exclusiveMinimum")) return no("not above exclusiveMinimum");
        if (s.contains("exclusiveMaximum") && x >= num("exclusiveMaximum")) return no("not below exclusiveMaximum");
    }
    if (v.is_string() && s.contains("pattern") &&
        !std::regex_search(v.get<std::string>(), std::regex(s["pattern"].get<std::string>())))
        return no("does not match the pattern");
    if (v.is_string() && s.contains("format") && !format_ok(s["format"].get<std::string>(), v.get<std::string>()))
        return no("not a " + s["format"].get<std::string>());
    if (v.is_string()) {
        const size_t n = code_points(v.get<std::string>());
        if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return no("too short");
        if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return no("too long");
    }
    if (v.is_array()) {
        if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return no("too few items");
        if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return no("too many items");
        if (s.contains("items"))
            for (const auto & e : v)
                if (!validate(root, s["items"], e, why)) return false;
    }
    if (v.is_object()) {
        if (s.contains("minProperties") && v.size() < s["minProperties"].get<size_t>()) return no("too few properties");
        if (s.contains("maxProperties") && v.size() > s["maxProperties"].get<size_t>()) return no("too many properties");
        if (s.contains("required"))
            for (const auto & r : s["required"])
                if (!v.contains(r.get<std::string>())) return no("missing " + r.get<std::string>());
        for (auto it = v.begin(); it != v.end(); ++it) {
            if (s.contains("properties") && s["properties"].contains(it.key())) {
                if (!validate(root, s["properties"][it.key()], it.value(), why)) return false;
            } else if (s.value("additionalProperties", true) == false) {
                return no("extra property " + it.key());
            }
        }
    }
    return true;
}

bool validate(const ojson & root, const ojson & s, const ojson & v, std::string * why) {
    if (s.is_boolean()) return s.get<bool>();
    return validate_all(root, s, v, why);
}

struct Case {
    const char * name;
    ojson schema;
    std::vector<std::string> valid;    // instances the grammar must take
    std::vector<std::string> invalid;  // instances the grammar and the validator must refuse
};

std::vector<Case> cases() {
    return {
        {"string", R"({"type":"string"})"_json, {R"("hi")", R"("a\"b\\ \u00e9 é")", R"("")"},
         {"hi", "1", R"("a)", "\"\x01\""}},
        {"bounded string", ojson::parse(R"({"type":"string","minLength":2,"maxLength":4})"),
         {R"("ab")", R"("abcd")", R"("éé")", R"("a\nb")"},
         {R"("a")", R"("abcde")"}},
        {"number", R"({"type":"number"})"_json, {"0", "-1.5", "3e10", "12.25E-3"},
         {"01", "1.", "+1", "\"1\"", "- 1"}},
        {"integer", R"({"type":"integer"})"_json, {"0", "-42", "7"}, {"1.5", "true", "\"7\""}},
        {"boolean", R"({"type":"boolean"})"_json, {"true", "false"}, {"null", "1", "True"}},
        {"null", R"({"type":"null"})"_json, {"null"}, {"0", "\"null\""}},
        {"nullable string", ojson::parse(R"({"type":["string","null"],"maxLength":3})"),
         {"null", R"("abc")"}, {"1", R"("abcd")"}},
        {"enum", ojson::parse(R"({"enum":["red","green",3,null,{"a":[1]}]})"),
         {R"("red")", "3", "null", R"({"a":[1]})"}, {R"("blue")", "4", R"("Red")"}},
        {"typed enum", ojson::parse(R"({"type":"string","enum":["a","b"]})"), {R"("a")"}, {R"("c")"}},
        {"const", ojson::parse(R"({"const":"fixed"})"), {R"("fixed")"}, {R"("fixe")", R"("fixed!")"}},
        {"array", ojson::parse(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})"),
         {"[1]", "[1, 2,3]", "[ 1 ]"},
         {"[]", "[1,2,3,4]", R"(["a"])", "[1,]"}},
        {"any array", ojson::parse(R"({"type":"array"})"), {"[]", R"([1,"a",{"b":null}])"}, {"{}", "[1"}},
        {"object", ojson::parse(R"({"type":"object","properties":{"name":{"type":"string"},
            "age":{"type":"integer"},"email":{"type":"string"}},"required":["name","age"],
            "additionalProperties":false})"),
         {R"({"name":"Ann","age":3})", R"({"name": "Ann", "age": 3, "email": "a@b"})",
          R"({"name":"Ann","age":3,"email":"x"})"},
         {R"({"name":"Ann"})", R"({"age":3,"name":"Ann","x":1})", R"({"name":"Ann","age":"3"})",
          R"({"name":"Ann","age":3,"x":1})", R"({"name":"Ann","age":3,})", "[]"}},
        {"all optional", ojson::parse(R"({"type":"object","properties":{"a":{"type":"integer"},
            "b":{"type":"boolean"}},"additionalProperties":false})"),
         {"{}", R"({"b":true})", R"({"a":1,"b":false})", R"({"a":1})"},
         {R"({"c":1})", R"({,"b":true})", R"({"a":"1"})"}},
        {"min and max properties", ojson::parse(R"({"type":"object","properties":{"a":{"type":"integer"},
            "b":{"type":"integer"},"c":{"type":"integer"},"d":{"type":"integer"}},"required":["b"],
            "minProperties":2,"maxProperties":3})"),
         {R"({"a":1,"b":2})", R"({"b":2,"d":4})", R"({"a":1,"b":2,"c":3})", R"({"b":2,"c":3,"d":4})"},
         {R"({"b":2})", R"({"a":1,"b":2,"c":3,"d":4})", R"({"a":1,"c":3})", "{}"}},
        {"maxProperties on optional ones", ojson::parse(R"({"type":"object","properties":{"a":{"type":"integer"},
            "b":{"type":"integer"}},"maxProperties":1})"),
         {"{}", R"({"a":1})", R"({"b":2})"}, {R"({"a":1,"b":2})"}},
        {"any object", ojson::parse(R"({"type":"object"})"), {"{}", R"({"x":[1,{"y":null}]})"},
         {"[]", R"({"x"})", "{1:2}"}},
        {"nested", ojson::parse(R"({"type":"object","properties":{"user":{"type":"object",
            "properties":{"tags":{"type":"array","items":{"type":"string","maxLength":5},
            "maxItems":2}},"required":["tags"],"additionalProperties":false}},"required":["user"],
            "additionalProperties":false})"),
         {R"({"user":{"tags":[]}})", R"({"user":{"tags":["ab","cde"]}})"},
         {R"({"user":{}})", R"({"user":{"tags":["toolong"]}})", R"({"user":{"tags":["a","b","c"]}})"}},
        {"anyOf", ojson::parse(R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":2}]})"),
         {"5", R"("ab")"}, {"true", R"("abc")", "1.5"}},
        {"oneOf", ojson::parse(R"({"oneOf":[{"type":"object","properties":{"kind":{"const":"a"},
            "n":{"type":"integer"}},"required":["kind","n"],"additionalProperties":false},
            {"type":"object","properties":{"kind":{"const":"b"},"s":{"type":"string"}},
            "required":["kind","s"],"additionalProperties":false}]})"),
         {R"({"kind":"a","n":1})", R"({"kind":"b","s":"x"})"},
         {R"({"kind":"a","s":"x"})", R"({"kind":"c","n":1})"}},
        {"$defs and recursion", ojson::parse(R"({"$defs":{"node":{"type":"object","properties":{
            "v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"},
            "maxItems":2}},"required":["v"],"additionalProperties":false}},"$ref":"#/$defs/node"})"),
         {R"({"v":1})", R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"},
         {R"({"kids":[]})", R"({"v":1,"kids":[{}]})"}},
        {"definitions", ojson::parse(R"({"type":"object","definitions":{"color":{"enum":["r","g"]}},
            "properties":{"c":{"$ref":"#/definitions/color"}},"required":["c"],
            "additionalProperties":false})"),
         {R"({"c":"r"})"}, {R"({"c":"b"})", "{}"}},
        {"untyped with annotations", ojson::parse(R"({"title":"anything","description":"d"})"),
         {"1", R"("s")", "[]", "{}", "null"}, {"[1", "nul"}},
        {"bounded integer", ojson::parse(R"({"type":"integer","minimum":0,"maximum":120})"),
         {"0", "7", "99", "100", "120"}, {"-1", "121", "1000", "007", "12.5"}},
        {"integer, odd bounds", ojson::parse(R"({"type":"integer","minimum":-37,"exclusiveMaximum":1234})"),
         {"-37", "-9", "0", "999", "1233", "1099"}, {"-38", "-40", "1234", "1300", "99999"}},
        {"negative integers", ojson::parse(R"({"type":"integer","exclusiveMinimum":-500,"maximum":-20})"),
         {"-499", "-20", "-100", "-21"}, {"-500", "-19", "0", "5", "-1000"}},
        {"integer above", ojson::parse(R"({"type":"integer","minimum":18})"),
         {"18", "19", "25", "100", "123456789"}, {"17", "0", "-18", "9"}},
        {"bounded number", ojson::parse(R"({"type":"number","minimum":0,"maximum":10})"),
         {"0", "0.5", "9.99", "10", "10.000", "3"}, {"-0.5", "10.01", "11", "100"}},
        {"positive number", ojson::parse(R"({"type":"number","exclusiveMinimum":0})"),
         {"0.001", "1", "42.5", "1000000"}, {"0", "0.0", "-1", "-0.5"}},
        {"number in (-2, 3)", ojson::parse(R"({"type":"number","exclusiveMinimum":-2,"exclusiveMaximum":3})"),
         {"-1.99", "-1", "0", "2.999", "-0.5"}, {"-2", "3", "3.0", "-2.0", "-2.5", "4"}},
        {"number at most -1", ojson::parse(R"({"type":"number","maximum":-1.0})"),
         {"-1", "-1.0", "-1.5", "-300"}, {"-0.99", "0", "1", "-0.5"}},
        {"pattern", ojson::parse(R"({"type":"string","pattern":"^[A-Z]{3}-\\d{2}$"})"),
         {R"("ABC-12")", R"("XYZ-00")"}, {R"("AB-12")", R"("ABC-123")", R"("abc-12")", R"(" ABC-12")"}},
        {"unanchored pattern", ojson::parse(R"({"type":"string","pattern":"[0-9]"})"),
         {R"("7")", R"("a1b")", R"("\u0001 2")"}, {R"("ab")", R"("")"}},
        {"pattern with quotes", ojson::parse(R"({"type":"string","pattern":"^(\"|\\\\|[a\\n])+$"})"),
         {R"("\"")", R"("\\a\n")"}, {R"("b")", R"("")"}},
        {"pattern and lengths", ojson::parse(R"({"type":"string","pattern":"^[a-z]*$","minLength":2,"maxLength":4})"),
         {R"("ab")", R"("abcd")"}, {R"("a")", R"("abcde")", R"("AB")"}},
        {"date", ojson::parse(R"({"type":"string","format":"date"})"),
         {R"("2024-01-31")", R"("1999-12-01")", R"("2023-02-28")"},
         {R"("2024-02-30")", R"("2024-13-01")", R"("2024-04-31")", R"("24-01-01")"}},
        {"date-time", ojson::parse(R"({"type":"string","format":"date-time"})"),
         {R"("2024-01-31T23:59:59Z")", R"("2024-06-01T00:00:00.123+05:30")"},
         {R"("2024-01-31T24:00:00Z")", R"("2024-01-31T10:00:00")", R"("2024-01-31 10:00Z")"}},
        {"time", ojson::parse(R"({"type":"string","format":"time"})"),
         {R"("12:30:00Z")", R"("23:59:59.5-08:00")"}, {R"("12:60:00Z")", R"("12:30")", R"("25:00:00Z")"}},
        {"uuid", ojson::parse(R"({"type":"string","format":"uuid"})"),
         {R"("123e4567-e89b-12d3-a456-426614174000")"},
         {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400g")"}},
        {"email", ojson::parse(R"({"type":"string","format":"email"})"),
         {R"("ann@example.com")", R"("a.b+c@x-y.co")"}, {R"("ann@")", R"("@x.com")", R"("a..b@x.com")", R"("ann@x")"}},
        {"ipv4", ojson::parse(R"({"type":"string","format":"ipv4"})"),
         {R"("192.168.0.1")", R"("0.0.0.0")", R"("255.255.255.255")"},
         {R"("256.1.1.1")", R"("1.2.3")", R"("01.2.3.4")", R"("1.2.3.4.5")"}},
        {"hostname", ojson::parse(R"({"type":"string","format":"hostname"})"),
         {R"("localhost")", R"("a-b.example.com")", R"("x1")"},
         {R"("-a.com")", R"("a-.com")", R"("a..com")", R"("a_b.com")", R"("")"}},
        {"zod uuid: format and pattern", ojson::parse(R"({"type":"string","format":"uuid","pattern":
            "^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}|00000000-0000-0000-0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$"})"),
         {R"("123e4567-e89b-12d3-a456-426614174000")", R"("00000000-0000-0000-0000-000000000000")"},
         {R"("123e4567-e89b-92d3-a456-426614174000")", R"("123e4567-e89b-12d3-c456-426614174000")"}},
        {"nullable bounded integer", ojson::parse(R"({"type":["integer","null"],"minimum":1,"maximum":5})"),
         {"null", "1", "5"}, {"0", "6", "\"1\""}},
        {"key escaping", ojson::parse(R"({"type":"object","properties":{"a\"b\\c/é":{"type":"boolean"}},
            "required":["a\"b\\c/é"],"additionalProperties":false})"),
         {R"({"a\"b\\c/é":true})"}, {R"({"ab":true})", R"({"a\"b\\c/é":null})"}},
    };
}

TEST(JsonSchemaGrammar, EverySchemaGivesAGrammarLlamaParses) {
    ASSERT_NE(vocab(), nullptr) << "the synth model's vocabulary loads";
    for (const Case & c : cases()) {
        const std::string g = gbnf_of(c.schema);
        EXPECT_TRUE(grammar_sampler(g)) << c.name << ":\n" << g;
    }
    // Negative control: the same check refuses a grammar that does not parse.
    EXPECT_FALSE(grammar_sampler("root ::= (\"a\""));
    EXPECT_FALSE(grammar_sampler("root ::= value\n"));  // undefined rule
}

TEST(JsonSchemaGrammar, ValidInstancesPassInvalidOnesDoNot) {
    ASSERT_NE(vocab(), nullptr);
    for (const Case & c : cases()) {
        const std::string g = gbnf_of(c.schema);
        for (const std::string & v : c.valid) {
            EXPECT_TRUE(accepts(g, v)) << c.name << ": the grammar refuses " << v << "\n" << g;
            std::string why;
            EXPECT_TRUE(validate(c.schema, c.schema, ojson::parse(v), &why)) << c.name << ": " << why;
        }
        for (const std::string & v : c.invalid) {
            EXPECT_FALSE(accepts(g, v)) << c.name << ": the grammar takes " << v << "\n" << g;
            // The validator agrees (or the text is not JSON at all).
            const ojson parsed = ojson::parse(v, nullptr, false);
            std::string why;
            if (!parsed.is_discarded()) {
                EXPECT_FALSE(validate(c.schema, c.schema, parsed, &why)) << c.name << ": " << v;
            }
        }
    }
}

TEST(JsonSchemaGrammar, RandomOutputsOfTheGrammarValidate) {
    ASSERT_NE(vocab(), nullptr);
    std::mt19937 rng(7);
    for (const Case & c : cases()) {
        const std::string g = gbnf_of(c.schema);
        std::set<std::string> distinct;
        for (int i = 0; i < 25; ++i) {
            const std::string out = walk(g, &rng);
            ASSERT_FALSE(out.empty()) << c.name << ": a walk did not end\n" << g;
            const ojson v = ojson::parse(out, nullptr, false);
            ASSERT_FALSE(v.is_discarded()) << c.name << ": not JSON: " << out;
            std::string why;
            EXPECT_TRUE(validate(c.schema, c.schema, v, &why)) << c.name << ": " << out << ": " << why;
            distinct.insert(v.dump());
        }
        // The walks explore (a schema with one value aside).
        if (!c.schema.contains("const") && c.schema.value("type", ojson()) != "null") {
            EXPECT_GT(distinct.size(), 1u) << c.name;
        }
    }
}

TEST(JsonSchemaGrammar, UnsupportedKeywordsAreRefusedWithTheirPointer) {
    struct Bad {
        const char * schema;
        const char * pointer;
        const char * word;
    };
    const Bad bad[] = {
        {R"j({"type":"object","properties":{"email":{"type":"string","pattern":"^a(?=b)"}}})j",
         "#/properties/email/pattern", "look-around"},
        {R"({"type":"string","pattern":"(a)\\1"})", "#/pattern", "back-reference"},
        {R"({"type":"string","pattern":"a^b"})", "#/pattern", "'^'"},
        {R"({"type":"string","format":"ipv6"})", "#/format", "ipv6"},
        {R"({"type":"object","minProperties":1})", "#/minProperties", "only on an object with 'properties'"},
        {R"({"type":"string","format":"uuid","pattern":"^x$"})", "#/pattern", "no string"},
        {R"({"type":"number","minimum":0.5})", "#/minimum", "whole number"},
        {R"({"type":"integer","minimum":5,"maximum":4})", "#/minimum", "no integer"},
        {R"({"type":"number","multipleOf":2})", "#/multipleOf", "multipleOf"},
        {R"({"if":{"type":"string"},"then":{"maxLength":2}})", "#/if", "if"},
        {R"({"type":"array","prefixItems":[{"type":"string"}]})", "#/prefixItems", "prefixItems"},
        {R"({"type":"array","items":[{"type":"string"}]})", "#/items", "items"},
        {R"({"type":"object","additionalProperties":{"type":"string"}})", "#/additionalProperties",
         "additionalProperties"},
        {R"({"$ref":"https://example.com/s.json"})", "#/$ref", "$ref"},
        {R"({"$ref":"#/$defs/missing"})", "#/$ref", "does not resolve"},
        {R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})", "#/$ref", "itself"},
        {R"({"type":"strin"})", "#/type", "strin"},
        {R"({"type":"string","maxLength":100000})", "#/maxLength", "maxLength"},
        {R"({"type":"array","minItems":3,"maxItems":2})", "#/minItems", "minItems"},
        {R"({"type":"object","properties":{"a":{}},"required":["b"]})", "#/required", "'b'"},
        {R"({"anyOf":[{"type":"string"}],"type":"string"})", "#/type", "anyOf"},
        {R"({"type":"object","properties":{"a":{"items":{"not":{}}}}})", "#/properties/a/items/not",
         "not"},
        {"false", "#", "false"},
    };
    for (const Bad & b : bad) {
        std::string g;
        SchemaError err;
        EXPECT_FALSE(json_schema_to_gbnf(ojson::parse(b.schema), &g, &err)) << b.schema;
        EXPECT_EQ(err.pointer, b.pointer) << b.schema << ": " << err.message;
        EXPECT_NE(err.message.find(b.word), std::string::npos) << b.schema << ": " << err.message;
        EXPECT_NE(err.message.find(b.pointer), std::string::npos) << err.message;
    }
    // Control: the supported neighbours of those schemas convert.
    for (const char * ok : {R"({"type":"string"})", R"({"type":"integer"})",
                            R"({"type":"string","pattern":"^ab"})", R"({"type":"number","minimum":0})",
                            R"({"type":"array","items":{"type":"string"}})",
                            R"({"type":"object","additionalProperties":false})"}) {
        std::string g;
        SchemaError err;
        EXPECT_TRUE(json_schema_to_gbnf(ojson::parse(ok), &g, &err)) << ok << ": " << err.message;
    }
}

// The grammar of a forced tool call (chat_format.h): arguments exact for nested schemas in the
// subset, the flat rule for schemas outside it, and an optional thinking block first.
TEST(JsonSchemaGrammar, ToolCallGrammarsNestedArgumentsAndThinkingFirst) {
    ASSERT_NE(vocab(), nullptr);
    const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "put",
        "parameters": {"type": "object", "properties": {
          "item": {"type": "object", "properties": {"tags": {"type": "array",
            "items": {"type": "string", "enum": ["a", "b"]}}, "n": {"type": "integer"}},
            "required": ["tags"], "additionalProperties": false}},
        "required": ["item"]}}},
      {"type": "function", "function": {"name": "flat", "parameters": {"type": "object",
        "properties": {"x": {"type": "integer", "multipleOf": 2}}, "required": ["x"]}}},
      {"type": "function", "function": {"name": "odd", "parameters": {"type": "object",
        "properties": {"v": {"type": "object", "properties": {"n": {"type": "integer"}},
        "required": ["n"], "not": {}}}, "required": ["v"]}}}])");
    chat::ChatFormat hermes;
    hermes.family = chat::ChatFamily::kHermes;
    hermes.tools = hermes.thinking = true;
    const std::string g = chat::tool_call_grammar(hermes, tools, "put", true, false);
    const std::string call = "<tool_call>\n{\"name\": \"put\", \"arguments\": ";
    const std::string end = "}\n</tool_call>";
    EXPECT_TRUE(accepts(g, call + R"({"item": {"tags": ["a", "b"], "n": 3}})" + end)) << g;
    EXPECT_TRUE(accepts(g, call + R"({"item":{"tags":[]}})" + end)) << g;
    // Nested violations: an enum miss, a missing nested property, an extra one, a wrong type.
    for (const char * bad : {R"({"item": {"tags": ["c"]}})", R"({"item": {"n": 3}})",
                             R"({"item": {"tags": [], "z": 1}})", R"({"item": {"tags": "a"}})",
                             R"({})"})
        EXPECT_FALSE(accepts(g, call + bad + end)) << bad;
    // Thinking first: allowed only when asked for.
    const std::string think = "<think>\nhm, a < b\n</think>\n\n";
    const std::string ok = call + R"({"item": {"tags": []}})" + end;
    const std::string gt = chat::tool_call_grammar(hermes, tools, "put", true, true);
    EXPECT_TRUE(accepts(gt, think + ok)) << gt;
    EXPECT_TRUE(accepts(gt, ok));
    EXPECT_FALSE(accepts(g, think + ok)) << "control: no thinking block without think_first";
    // Value bounds the converter does not enforce (multipleOf) are left out: the structure and
    // types still hold, the bound is the model's (5 passes).
    const std::string gf = chat::tool_call_grammar(hermes, tools, "flat", true, false);
    const std::string fc = "<tool_call>\n{\"name\": \"flat\", \"arguments\": ";
    EXPECT_TRUE(accepts(gf, fc + "{\"x\": 5}" + end));
    EXPECT_TRUE(accepts(gf, fc + "{\"x\": 3}" + end));
    EXPECT_TRUE(accepts(gf, fc + "{\"x\":5}" + end)) << "the converter's grammar (the flat rule "
                                                        "writes \": \")";
    EXPECT_FALSE(accepts(gf, fc + "{\"x\": \"5\"}" + end));
    EXPECT_FALSE(accepts(gf, fc + "{\"x\": 5, \"y\": 1}" + end)) << "only declared properties";
    // Another keyword outside the subset ("not"): the flat rule (the required property, its
    // value any JSON value).
    const std::string go = chat::tool_call_grammar(hermes, tools, "odd", true, false);
    const std::string oc = "<tool_call>\n{\"name\": \"odd\", \"arguments\": ";
    EXPECT_TRUE(accepts(go, oc + "{\"v\": {\"n\": 1}}" + end));
    EXPECT_TRUE(accepts(go, oc + "{\"v\": 7}" + end)) << "v's schema is not enforced";
    EXPECT_FALSE(accepts(go, oc + "{\"w\": 1}" + end));

    chat::ChatFormat harmony;
    harmony.family = chat::ChatFamily::kHarmony;
    harmony.tools = harmony.thinking = true;
    const std::string hc = "<|channel|>commentary to=functions.put <|constrain|>json<|message|>"
                           R"({"item": {"tags": ["b"]}})";
    const std::string ht = "<|channel|>analysis<|message|>Need <b>.<|end|><|start|>assistant";
    const std::string hg = chat::tool_call_grammar(harmony, tools, "", false, true);
    EXPECT_TRUE(accepts(hg, hc)) << hg;
    EXPECT_TRUE(accepts(hg, ht + hc));
    EXPECT_FALSE(accepts(hg, hc + hc)) << "one call per reply";
    EXPECT_FALSE(accepts(chat::tool_call_grammar(harmony, tools, "", false, false), ht + hc))
        << "control: thinking off";
}

// A forced call's grammar for each family parsed between markers takes the call as the
// family writes it (which the reply parser reads back as that call), and no other function
// nor a value outside the schema (key/value families: a flat schema's required properties).
TEST(JsonSchemaGrammar, ForcedCallGrammarOfEachMarkedFamilyTakesItsCallText) {
    ASSERT_NE(vocab(), nullptr);
    const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string",
        "enum": ["Paris", "Rome"]}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "other",
        "parameters": {"type": "object", "properties": {}}}}])");
    struct Case {
        chat::ChatFamily family;
        std::string call;  // get_weather(city="Paris") as the family writes it
    };
    const std::vector<Case> cases = {
        {chat::ChatFamily::kGlm, "<tool_call>get_weather\n<arg_key>city</arg_key>\n"
                                 "<arg_value>Paris</arg_value>\n</tool_call>"},
        {chat::ChatFamily::kDeepseek, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                                      "{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
        {chat::ChatFamily::kKimi, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                                  "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>"
                                  "<|tool_calls_section_end|>"},
        {chat::ChatFamily::kMinimax, "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter "
                                     "name=\"city\">Paris</parameter>\n</invoke>\n</minimax:tool_call>"},
        {chat::ChatFamily::kDsml, "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
                                  "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
                                  "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"},
        {chat::ChatFamily::kLfm2, "<|tool_call_start|>[get_weather(city=\"Paris\")]<|tool_call_end|>"},
        {chat::ChatFamily::kSeed, "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris"
                                  "</parameter>\n</function>\n</seed:tool_call>"},
    };
    for (const Case & c : cases) {
        chat::ChatFormat f;
        f.family = c.family;
        f.tools = true;
        const std::string g = chat::tool_call_grammar(f, tools, "get_weather", true, false);
        EXPECT_TRUE(accepts(g, c.call)) << c.call << "\n" << g;
        chat::ReplyParser p(f, true, false);
        chat::ReplyDelta d = p.push(c.call);
        const chat::ReplyDelta e = p.finish();
        d.calls.insert(d.calls.end(), e.calls.begin(), e.calls.end());
        ASSERT_EQ(d.calls.size(), 1u) << c.call;
        EXPECT_EQ(d.calls[0].name, "get_weather");
        EXPECT_EQ(d.calls[0].arguments, "{\"city\":\"Paris\"}");
        std::string renamed = c.call;  // control: another function is not the forced one
        renamed.replace(renamed.find("get_weather"), 11, "other");
        EXPECT_FALSE(accepts(g, renamed)) << renamed;
        std::string elsewhere = c.call;  // control: a value outside the parameter's enum
        elsewhere.replace(elsewhere.find("Paris"), 5, "Lyon");
        EXPECT_FALSE(accepts(g, elsewhere)) << elsewhere;
    }
}

// Where the prompt opened the thinking block (DeepSeek V3.1: "<think>"), a forced call with
// thinking first must close that block, then call.
TEST(JsonSchemaGrammar, ForcedCallAfterAPromptThatOpensThinkingClosesItFirst) {
    ASSERT_NE(vocab(), nullptr);
    const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "f",
        "parameters": {"type": "object", "properties": {}}}}])");
    chat::ChatFormat f;
    f.family = chat::ChatFamily::kDeepseek;
    f.tools = f.thinking = f.think_opened = true;
    const std::string call = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}"
                             "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    const std::string g = chat::tool_call_grammar(f, tools, "", true, true);
    EXPECT_TRUE(accepts(g, "Need f.</think>\n\n" + call)) << g;
    EXPECT_FALSE(accepts(g, call)) << "the opened block is closed first";
    f.think_opened = false;  // control: a prompt that does not open it
    EXPECT_TRUE(accepts(chat::tool_call_grammar(f, tools, "", true, true), call));
}

}  // namespace
}  // namespace moestream::test
